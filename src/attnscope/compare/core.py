"""The comparison itself: two sides in, a :class:`Comparison` out, and the folder it writes.

:func:`compare` is the library function behind ``attnscope compare A B --out DIR``;
:func:`compare_models` runs two models over the same inputs first (at word level) and then
compares their stores.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.analyses.family_result import FamilyResult
from attnscope.compare.pairing import (
    MANIFEST,
    Pairing,
    Side,
    check_pairing,
    common_units,
    open_sides,
    paired_maps,
    run_stores,
)
from attnscope.compare.report import write_compare, write_tables_compare
from attnscope.compare.stats import (
    JS_ROUNDING,
    ROUNDING,
    CrossDistances,
    PairedHeadStats,
    match_heads,
)
from attnscope.data.depparse import iter_depparse
from attnscope.data.io import file_fingerprint, read_examples
from attnscope.errors import AttnscopeError
from attnscope.extract.runner import ExtractOptions
from attnscope.families import load_families
from attnscope.jobs import extract_to_store
from attnscope.models import load_model
from attnscope.progress import Step
from attnscope.store.results import ResultsFolder

Progress = Callable[[str, int, "int | None"], None]


@dataclass
class Comparison:
    """Everything compared. Heads are 0-indexed; flat head indices are layer-major."""

    a: Side
    b: Side
    pairing: Pairing
    stats: dict[str, Any]  # PairedHeadStats.finalize(): a, b, diff, low, high [S L H]; n [S]
    distances: np.ndarray  # [Pa Pb] mean JS per row, nats
    matching: list[tuple[int, int]]
    shape_a: tuple[int, int]
    shape_b: tuple[int, int]
    params: dict[str, Any]
    rows: int = 0  # rows (units) over which distances were averaged
    run_tables: dict[str, list[dict]] = field(default_factory=dict)
    run_captions: dict[str, str] = field(default_factory=dict)  # caption of each run table
    notes: list[str] = field(default_factory=list)
    max_diff: float = float("inf")  # the largest |A - B| of any attention weight, same head and unit

    @property
    def same_shape(self) -> bool:
        return self.shape_a == self.shape_b

    def same_head(self) -> np.ndarray | None:
        """``[L H]``: JS between each head of A and the same head of B (None when the models
        have different numbers of layers or heads)."""
        if not self.same_shape:
            return None
        return np.diagonal(self.distances).reshape(self.shape_a).copy()

    def layer_distance(self) -> np.ndarray | None:
        """``[L]``: the mean over heads of :meth:`same_head` (Kovaleva et al. 2019, Figure 5)."""
        d = self.same_head()
        return None if d is None else d.mean(1)

    def identical(self) -> bool:
        """A and B hold the same maps within float rounding: same heads, and no attention weight
        of any head differs by more than :data:`~attnscope.compare.stats.ROUNDING` (e.g. a store
        compared with itself)."""
        return self.same_shape and self.max_diff <= ROUNDING

    def changed(self) -> np.ndarray:
        """``[S L H]`` bool: the 95% paired interval of the difference excludes 0 and the change
        is larger than float rounding (:data:`~attnscope.compare.stats.ROUNDING`)."""
        if not self.stats:
            return np.zeros((0,) + self.shape_a, dtype=bool)
        lo, hi, diff = self.stats["low"], self.stats["high"], self.stats["diff"]
        with np.errstate(invalid="ignore"):
            return ((lo > 0) | (hi < 0)) & (np.abs(diff) > ROUNDING)

    def changed_layers(self) -> list[int]:
        """0-indexed layers whose mean same-head distance exceeds float rounding
        (:data:`~attnscope.compare.stats.JS_ROUNDING`), most changed first."""
        d = self.layer_distance()
        if d is None:
            return []
        return [int(i) for i in np.argsort(-d, kind="stable") if d[i] > JS_ROUNDING]


def compare(a: str | Path, b: str | Path, out_dir: str | Path | None = None, *,
            which: str | None = None, level: str = "auto", n_boot: int = 1000, seed: int = 0,
            smoothing: float = 0.001, overwrite: bool = False, progress: Progress | None = None,
            command: str | None = None) -> Comparison:
    """Compare two stores (or two run folders' saved maps) of the same inputs, head by head.

    Refuses, before writing anything, sides that are not of the same inputs (one line, an
    :class:`~attnscope.errors.AttnscopeError`). With ``out_dir`` it writes the tables,
    figures, ``results/compare.json`` and ``report.html`` there.

    >>> c = compare("pretrained.store", "finetuned.store", "cmp/")   # doctest: +SKIP
    >>> c.layer_distance()                                           # doctest: +SKIP
    """
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        check_out_dir(out, overwrite=overwrite)
    if results_only(Path(a)) and results_only(Path(b)):
        return compare_results(a, b, out, clear=overwrite, command=command)
    return _compare(a, b, out, which=which, level=level, n_boot=n_boot, seed=seed,
                    smoothing=smoothing, clear=overwrite, progress=progress, command=command)


def _compare(a, b, out: Path | None, *, which, level, n_boot, seed, smoothing, clear: bool,
             progress, command) -> Comparison:
    t0 = time.perf_counter()
    if n_boot < 100:
        raise AttnscopeError(f"n_boot must be at least 100, not {n_boot}", params=("n_boot",))
    side_a, side_b = open_sides(a, b, which)
    pairing = check_pairing(side_a, side_b, level)
    result = compute(side_a, side_b, pairing, n_boot=n_boot, seed=seed, smoothing=smoothing,
                     progress=progress)
    if out is not None:
        if clear and out.exists():
            _clear(out)
        write_compare(result, out, command=command, elapsed_s=time.perf_counter() - t0)
    return result


def compute(a: Side, b: Side, pairing: Pairing, *, n_boot: int = 1000, seed: int = 0,
            smoothing: float = 0.001, progress: Progress | None = None) -> Comparison:
    """One pass over the paired examples feeding both accumulators."""
    paired = PairedHeadStats(n_boot=n_boot, seed=seed)
    cross = CrossDistances(smoothing=smoothing)
    total = len(pairing.indices)
    shape_a = shape_b = None
    for done, (ma, mb) in enumerate(paired_maps(a, b, pairing), start=1):
        shape_a, shape_b = tuple(ma.attn.shape[:2]), tuple(mb.attn.shape[:2])
        if shape_a == shape_b:
            paired.add(ma.index, ma, mb)
        ua, ub, _ = common_units(ma, mb, pairing.layout)
        cross.add(ua, ub)
        if progress is not None:
            progress(Step("compare", "examples"), done, total)
    notes = list(pairing.notes)
    if shape_a != shape_b:
        notes.append(f"the models have different heads ({shape_a[0]}x{shape_a[1]} vs "
                     f"{shape_b[0]}x{shape_b[1]}): only the cross-model distances and matching apply")
        stats = {}
    else:
        stats = paired.finalize()
    distances = cross.distances()
    params = {"level": pairing.level, "units": pairing.layout, "examples": len(pairing.indices),
              "bootstrap": paired.params(), "distances": cross.params(),
              "rounding": {"weights_and_statistics": ROUNDING, "js_nats_per_unit": JS_ROUNDING},
              "matching": "scipy.optimize.linear_sum_assignment on the A x B distances, maximize=False",
              "maps": {"A": str(a.store.path), "B": str(b.store.path)}}
    return Comparison(a=a, b=b, pairing=pairing, stats=stats, distances=distances,
                      matching=match_heads(distances), shape_a=shape_a, shape_b=shape_b,
                      params=params, rows=cross.rows, run_tables=_run_tables(a, b), notes=notes,
                      run_captions={t.name: t.caption for t in _compare_tables()},
                      max_diff=cross.max_diff)


def _compare_tables() -> list:
    """Every registered family's :class:`~attnscope.families.base.CompareTable`, with its key."""
    return [t for fam in load_families() for t in fam.compare_tables]


def _run_tables(a: Side, b: Side) -> dict[str, list[dict]]:
    """The tables the families declare for comparison (Tables 1, 2 and 3), of two run folders, in
    one table each with the change (B - A); read through each run's results folder."""
    if a.run_dir is None or b.run_dir is None:
        return {}
    return results_tables(a.run_dir, b.run_dir)


def results_tables(a: Path, b: Path) -> dict[str, list[dict]]:
    """Every family's :class:`~attnscope.families.base.CompareTable` that both output folders'
    results hold, by name, with the change (B - A)."""
    out: dict[str, list[dict]] = {}
    ra, rb = ({r.family: r for r in FamilyResult.read_all(ResultsFolder(side))} for side in (a, b))
    for fam in load_families():
        ta, tb = (r[fam.key].tables if fam.key in r else {} for r in (ra, rb))
        for t in fam.compare_tables:
            if isinstance(ta.get(t.table), list) and isinstance(tb.get(t.table), list):
                out[t.name] = combine_rows(ta[t.table], tb[t.table], t.key, t.values, selection=t.selection)
    return out


def combine_rows(rows_a: Sequence[dict], rows_b: Sequence[dict], key: str, values: Sequence[str],
                 selection: str | None = None) -> list[dict]:
    """One row per key present on either side: ``<value>_a``, ``<value>_b`` and, for numbers,
    ``<value>_change`` (B - A). Rows with a ``selection`` column keep only that selection.

    >>> combine_rows([{"model": "x", "uas": 60.0}], [{"model": "x", "uas": 70.5}], "model", ["uas"])
    [{'model': 'x', 'uas_a': 60.0, 'uas_b': 70.5, 'uas_change': 10.5}]
    """
    def keep(r):
        return selection is None or r.get("selection", selection) == selection

    by_a = {r.get(key): r for r in rows_a if keep(r)}
    by_b = {r.get(key): r for r in rows_b if keep(r)}
    keys = list(by_a) + [k for k in by_b if k not in by_a]
    rows = []
    for k in keys:
        ra, rb = by_a.get(k, {}), by_b.get(k, {})
        row: dict[str, Any] = {key: k}
        for v in values:
            xa, xb = ra.get(v), rb.get(v)
            row[f"{v}_a"], row[f"{v}_b"] = xa, xb
            if _num(xa) and _num(xb):
                row[f"{v}_change"] = float(xb) - float(xa)
        rows.append(row)
    return rows


def results_only(path: Path) -> bool:
    """An output folder (of ``run`` or ``analyze``) with results but no saved maps."""
    return (path / "results").is_dir() and not (path / MANIFEST).is_file() and not run_stores(path)


@dataclass
class TablesComparison:
    """Two output folders without saved maps: only their families' comparison tables."""

    a: Path
    b: Path
    run_tables: dict[str, list[dict]]
    run_captions: dict[str, str]


def compare_results(a: str | Path, b: str | Path, out: Path | None = None, *, clear: bool = False,
                    command: str | None = None) -> TablesComparison:
    """The comparison tables (``Family.compare_tables``) of two output folders that kept no
    maps (e.g. two head atlases): each table both hold, side by side with the
    change (B - A). With ``out``, writes them, ``results/compare.json`` and ``report.html``."""
    pa, pb = Path(a), Path(b)
    tables = results_tables(pa, pb)
    if not any(tables.values()):
        raise AttnscopeError(f"{pa} and {pb} hold no results that attnscope compare can set side by "
                             "side (and no saved maps: keep them with 'attnscope run ... --save-maps')")
    cmp = TablesComparison(pa, pb, tables, {t.name: t.caption for t in _compare_tables()})
    if out is not None:
        if clear and out.exists():
            _clear(out)
        write_tables_compare(cmp, out, command=command)
    return cmp


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x)


def check_out_dir(out: Path, *, overwrite: bool) -> None:
    """A missing or empty folder is fine; an earlier comparison needs ``overwrite``; anything
    else is refused (and never deleted)."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not (out / "results" / "compare.json").is_file():
        raise AttnscopeError(f"{out}: already holds other files (choose another out_dir)", params=("out_dir",))
    if not overwrite:
        raise AttnscopeError(f"{out}: already holds a comparison (use overwrite to replace it)",
                             params=("overwrite",))


def _clear(out: Path) -> None:
    for p in out.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def compare_models(model_a: str, model_b: str, inputs: str | Path, out_dir: str | Path, *,
                   max_seq_len: int = 128, batch_size: int = 16, n_boot: int = 1000, seed: int = 0,
                   smoothing: float = 0.001, overwrite: bool = False, progress: Progress | None = None,
                   command: str | None = None) -> Comparison:
    """Run both models over ``inputs`` at word level (stores in ``out_dir/stores/a`` and
    ``/b``), then :func:`compare` them. A refusal removes whatever this call wrote."""
    out = Path(out_dir)
    check_out_dir(out, overwrite=overwrite)
    inputs = Path(inputs)
    if not inputs.is_file():
        raise AttnscopeError(f"{inputs}: no such file")
    conll = inputs.suffix.lower() in (".conllu", ".conll")
    examples = list(iter_depparse(inputs)) if conll else read_examples(inputs)
    if not examples:
        raise AttnscopeError(f"{inputs}: no examples")
    lms = [load_model(m, seed=seed) for m in (model_a, model_b)]
    options = ExtractOptions(max_seq_len=max_seq_len, batch_size=batch_size, word_level=True, seed=seed)
    source = {"path": str(inputs), "file_sha256": file_fingerprint(inputs)}
    created = not out.exists()
    if out.exists() and overwrite:
        _clear(out)
    try:
        for label, lm in zip("ab", lms):
            def step(done, _tokens, label=label):
                if progress is not None:
                    progress(Step(f"extract {label.upper()}", "examples"), done, len(examples))

            extract_to_store(examples, out / "stores" / label, lm, options=options, source=source,
                             command=command, progress=step)
            step(len(examples), 0)  # every example read (the too long ones skipped)
        return _compare(out / "stores" / "a", out / "stores" / "b", out, which=None, level="word",
                        n_boot=n_boot, seed=seed, smoothing=smoothing, clear=False,
                        progress=progress, command=command)
    except AttnscopeError:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
