"""The whole job in one call: raw inputs -> every analysis they allow -> one HTML report.

:func:`run_pipeline` is the library function behind ``attnscope run`` (and ``attnscope demo``).
It loops over the registered families (:mod:`attnscope.families`): each family whose first
input is given is run. The pipeline reads and checks every input before it writes anything
(each family's ``prepare``), loads the model once (with its masked-LM head when a family wants
it and the weights have one), then calls each family's ``run``, which writes its tables,
figures and ``results/<family>.json`` under the output folder and returns a
:class:`~attnscope.report.section.Section`. The pipeline then writes the head views of the best
heads (``views/``), a checkpoint per family (``run/<family>.json``: the section without its
maps, plus a fingerprint of everything that decides its numbers), the report
(``report.html``) and ``results.json`` (all results and the provenance), all through the one
strict-JSON serialisation of :mod:`attnscope.report.results`.

Resuming: a run that was interrupted is continued with ``resume=True``; families whose
checkpoint has the same fingerprint are not run again.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import shutil
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from attnscope.data.io import check_writable, file_fingerprint, to_plain
from attnscope.engines.memory import gpu_memory_errors
from attnscope.errors import AttnscopeError, InputError
from attnscope.executor import executor
from attnscope.families import Context, Family, Prepared, check_options, load_families
from attnscope.on_ray import check_ray
from attnscope.report.results import ResultsFolder, read_json, write_json
from attnscope.report.section import FigureArtifact, Section, TableArtifact

#: Name of the folder (inside the output folder) holding the run's state and checkpoints.
STATE_DIR = "run"
STATE_FILE = "state.json"
#: The shortest maximum length accepted: room for the special tokens and a few words.
MIN_MAX_SEQ_LEN = 8

Progress = Callable[[str, int, "int | None"], None]

#: Settings every family shares (they reach a family through its Context).
SHARED = {"model": "default", "max_seq_len": 128, "batch_size": 16, "seed": 0, "save_maps": False,
          "device": "cpu"}


class RunConfig:
    """Every argument that decides what a run computes.

    The shared settings (``model``, ``max_seq_len``, ``batch_size``, ``seed``, ``save_maps``)
    plus, by name, each registered family's inputs (``text``, ``deps``, ``deps_train``,
    ``coref``, ...) and options (``gradients``, ``window``, ``glove``, ``min_count``, ...); see
    ``attnscope run --help``. An unknown name is refused.

    >>> RunConfig(text="wiki.txt", window="sliding").options["coref"].window
    'sliding'
    """

    def __init__(self, model: str = "default", *, max_seq_len: int = 128, batch_size: int = 16,
                 seed: int = 0, save_maps: bool = False, families: Sequence[type[Family]] | None = None,
                 device: str = "cpu", **named: Any):
        self.model, self.max_seq_len, self.batch_size = model, max_seq_len, batch_size
        self.device = device  # where the model runs ("auto": CUDA when present); see load_model
        self.seed, self.save_maps = seed, save_maps
        self.families = list(families) if families is not None else load_families()
        self.inputs: dict[str, Any] = {}
        self.options: dict[str, Any] = {}
        known: set[str] = set()
        for fam in self.families:
            for inp in fam.inputs:
                value = named.pop(inp.name, None)
                if inp.multiple:
                    value = [Path(p) for p in (value or [])]
                elif value is not None:
                    value = Path(value)
                self.inputs[inp.name] = value
                known.add(inp.name)
            fields = {f.name for f in dataclasses.fields(fam.Options)}
            self.options[fam.key] = fam.Options(**{k: named.pop(k) for k in list(named) if k in fields})
            known |= fields
        if named:
            raise AttnscopeError(f"unknown run argument(s) {', '.join(sorted(named))}; known: "
                                 f"{', '.join(sorted(known | set(SHARED)))}")

    def selected(self) -> list[type[Family]]:
        """The families whose first input is given, in report order."""
        return [f for f in self.families if self.inputs.get(f.inputs[0].name)]

    def paths(self) -> list[tuple[str, Path]]:
        """Every input file and every path-valued option, as ``(role, path)``."""
        out: list[tuple[str, Path]] = []
        for fam in self.families:
            for inp in fam.inputs:
                out += [(inp.name.replace("_", "-"), p) for p in inp.paths(self.inputs.get(inp.name))]
            for f in dataclasses.fields(fam.Options):
                value = getattr(self.options[fam.key], f.name)
                if isinstance(value, Path):
                    out.append((f.name.replace("_", "-"), value))
        return out

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"model": self.model, "max_seq_len": self.max_seq_len,
                             "batch_size": self.batch_size, "seed": self.seed, "save_maps": self.save_maps,
                             "device": self.device}
        for name, value in self.inputs.items():
            d[name] = [str(p) for p in value] if isinstance(value, list) else (
                None if value is None else str(value))
        for options in self.options.values():
            d.update(to_plain(dataclasses.asdict(options)))
        return d


@dataclass
class RunOutcome:
    """What a run produced: paths, the status of each family, and how long it took."""

    out_dir: Path
    report: Path
    results: Path
    status: dict[str, str]  # family -> "done" | "resumed" | "unavailable"
    notes: list[dict[str, str]]
    elapsed_s: float
    results_json: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Checking and preparing the inputs (before anything is written)


def check_config(cfg: RunConfig) -> None:
    """Refuse arguments that cannot work, with one line naming the argument or file."""
    for fam in cfg.families:
        first = fam.inputs[0]
        for inp in fam.inputs[1:]:
            if cfg.inputs.get(inp.name) and not cfg.inputs.get(first.name):
                raise AttnscopeError(f"{inp.name} needs {first.name}", params=(inp.name, first.name))
    if not cfg.selected():
        flags = ", ".join(f.inputs[0].flag for f in cfg.families)
        raise AttnscopeError(f"nothing to do: give at least one of {flags}")
    for fam in cfg.families:  # a bad value is refused even for a family that will not run
        check_options(cfg.options[fam.key])
    if cfg.max_seq_len < MIN_MAX_SEQ_LEN:
        raise AttnscopeError(f"max_seq_len must be at least {MIN_MAX_SEQ_LEN}, not {cfg.max_seq_len}",
                             params=("max_seq_len",))
    if cfg.batch_size < 1:
        raise AttnscopeError(f"batch_size must be at least 1, not {cfg.batch_size}", params=("batch_size",))
    for _role, p in cfg.paths():
        if not p.exists():
            raise InputError(p, "no such file")


def data_files(cfg: RunConfig) -> list[dict[str, Any]]:
    """Provenance of every input file: role, path, sha256 and size (a store folder: its
    manifest's)."""
    out = []
    for role, p in cfg.paths():
        target = p / "manifest.json" if p.is_dir() else p
        if target.is_file():
            out.append({"role": role, "path": str(p), "sha256": file_fingerprint(target),
                        "bytes": target.stat().st_size})
    return out


# ---------------------------------------------------------------------------------------------
# Checkpoints: a section without its maps, as JSON


def section_to_json(section: Section, out_dir: Path) -> dict[str, Any]:
    """The section as JSON, file paths relative to ``out_dir``; ``maps`` are left out."""
    def rel(p: Path) -> str:
        try:
            return Path(p).resolve().relative_to(out_dir.resolve()).as_posix()
        except ValueError:
            return str(p)

    return to_plain({
        "key": section.key, "title": section.title, "findings": list(section.findings),
        "tables": [{"name": t.name, "caption": t.caption, "rows": t.rows, "columns": list(t.columns),
                    "paths": [rel(p) for p in t.paths]} for t in section.tables],
        "figures": [{"name": f.name, "caption": f.caption, "paths": [rel(p) for p in f.paths]}
                    for f in section.figures],
        "methods": list(section.methods), "paper": list(section.paper),
        "best_heads": [list(b) for b in section.best_heads],
    })


def section_from_json(d: dict[str, Any], out_dir: Path) -> Section:
    def path(p: str) -> Path:
        q = Path(p)
        return q if q.is_absolute() else out_dir / q

    return Section(
        key=d["key"], title=d["title"], findings=list(d.get("findings", [])),
        tables=[TableArtifact(t["name"], t["caption"], t["rows"], t["columns"], [path(p) for p in t["paths"]])
                for t in d.get("tables", [])],
        figures=[FigureArtifact(f["name"], f["caption"], [path(p) for p in f["paths"]])
                 for f in d.get("figures", [])],
        methods=list(d.get("methods", [])), paper=list(d.get("paper", [])),
        best_heads=[tuple(b) for b in d.get("best_heads", [])])


def _fingerprint(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Progress: every family's steps, plus one overall bar weighted by each family's work


class _ProgressRouter:
    """Turns each family's ``progress(step, done, total)`` calls into prefixed step names and
    an ``overall`` count in units of examples, so a display can show one ETA for the run."""

    def __init__(self, progress: Progress | None, weights: dict[str, int]):
        self.progress = progress
        self.weights = {k: max(1, int(v)) for k, v in weights.items()}
        self.total = sum(self.weights.values()) or 1
        self.done = 0.0  # weight of finished families
        self.current = 0.0  # fraction of the family in progress, never decreasing
        self.key: str | None = None
        self.steps: dict[str, float] = {}

    def start(self, key: str) -> None:
        self.key, self.current, self.steps = key, 0.0, {}
        self._overall()

    def finish(self, key: str) -> None:
        self.done += self.weights.get(key, 0)
        self.current = 0.0
        self._overall()

    def family_progress(self, key: str) -> Progress:
        def report(step: str, done: int, total: int | None) -> None:
            if self.progress is not None:
                self.progress(f"{key}: {step}", done, total)
            if total:
                self.steps[step] = min(1.0, done / total)
                # Steps seen so far share the family's weight; at least two are assumed so
                # that the first step does not claim the whole family.
                frac = sum(self.steps.values()) / max(2, len(self.steps) + 1)
                self.current = max(self.current, min(0.99, frac))
                self._overall()

        return report

    def _overall(self) -> None:
        if self.progress is None:
            return
        w = self.weights.get(self.key or "", 0)
        self.progress("overall", int(round(self.done + self.current * w)), self.total)


# ---------------------------------------------------------------------------------------------
# The run


#: A write the disk refuses for these reasons is the user's to fix (then ``--resume``).
DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


@contextmanager
def refused_writes(out_dir: Path, *, resumable: bool = True):
    """Turn a write the disk refuses (full, read-only, no permission) into one line naming the
    folder; ``resumable`` (a run): the finished families are kept as checkpoints, so ``resume``
    continues."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in DISK_ERRORS:
            raise
        reason = (exc.strerror or type(exc).__name__).lower()
        if not resumable:
            raise AttnscopeError(f"{out_dir}: cannot write ({reason}); make room (or fix the "
                                 "folder) and run it again") from None
        raise AttnscopeError(f"{out_dir}: cannot write ({reason}); the finished families are kept: "
                             "make room (or fix the folder) and run the same command with resume",
                             params=("resume",)) from None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _check_out_dir(out_dir: Path, *, resume: bool, overwrite: bool) -> dict | None:
    """Refuse an output folder that cannot be used, before any work; return its run state.

    A missing or empty folder is fine; a folder holding a run needs ``resume`` or
    ``overwrite``; a folder holding anything else is refused (and never deleted).
    """
    if not out_dir.exists() or not any(out_dir.iterdir()):
        return None
    state_path = out_dir / STATE_DIR / STATE_FILE
    old = read_json(state_path) if state_path.exists() else None
    if old is None:
        what = "is not an attnscope run; refusing to delete it" if overwrite else "already holds other files"
        raise AttnscopeError(f"{out_dir}: {what} (choose another out_dir)", params=("out_dir",))
    if not resume and not overwrite:
        raise AttnscopeError(f"{out_dir}: already holds a run (use resume to continue it or "
                             "overwrite to replace it)", params=("resume", "overwrite"))
    return old


def _take_out_dir(out_dir: Path, old: dict | None, run_fp: str, *, overwrite: bool) -> dict | None:
    """After the inputs are read: clear the folder for ``overwrite``, or check that the run
    to resume is the same job. Returns the state of the run being resumed, if any."""
    if old is None:
        return None
    if overwrite:
        shutil.rmtree(out_dir)
        return None
    if old.get("fingerprint") != run_fp:
        raise AttnscopeError(f"{out_dir}: cannot resume: that run was made with other arguments, "
                             "inputs or weights (use overwrite to start again)", params=("overwrite",))
    return old


def run_order(families: Sequence[Family]) -> list[Family]:
    """``families`` (in report order) in the order they run: each after the families it
    :attr:`~attnscope.families.base.Family.uses` that are among them, otherwise as given."""
    by_key = {f.key: f for f in families}
    out: list[Family] = []

    def place(fam: Family, seen: tuple[str, ...]) -> None:
        if fam in out:
            return
        if fam.key in seen:
            raise ValueError(f"families use each other in a cycle: {' -> '.join(seen + (fam.key,))}")
        for key in fam.uses:
            if key in by_key:
                place(by_key[key], seen + (fam.key,))
        out.append(fam)

    for fam in families:
        place(fam, ())
    return out


def run_pipeline(config: RunConfig, out_dir: str | Path, *, resume: bool = False,
                 overwrite: bool = False, progress: Progress | None = None,
                 command: str | None = None, model=None, ray: bool = False,
                 workers: int = 1) -> RunOutcome:
    """Run every family the inputs allow and write the report; see the module docstring.

    ``progress(step, done, total)`` is called as work advances: ``step`` is ``"overall"``
    (in examples, for one ETA over the whole run), ``"load model"``, ``"prepare inputs"``,
    ``"report"`` or ``"<family>: <step>"``. ``model`` may be an already loaded
    :class:`~attnscope.models.LoadedModel` (then ``config.model`` only names it). ``ray``: run
    the forward passes on ``workers`` Ray workers (``docs/scale.md``).
    """
    from attnscope.models import load_model
    from attnscope.models.loading import resolve_device
    from attnscope.report.html import write_head_views, write_report
    from attnscope.store.writer import versions

    t0 = time.perf_counter()
    started = _now()
    out_dir = Path(out_dir)
    cfg = config
    check_config(cfg)
    resolve_device(cfg.device)  # a bad --device is refused before anything is written
    check_ray(ray, workers)
    check_writable(out_dir, folder=True)
    old_run = _check_out_dir(out_dir, resume=resume, overwrite=overwrite)
    files = data_files(cfg)

    def say(step: str, done: int, total: int | None) -> None:
        if progress is not None:
            progress(step, done, total)

    families = [fam() for fam in cfg.selected()]
    notes: list[dict[str, str]] = []
    status: dict[str, str] = {}
    for fam in list(families):
        reason = fam.unavailable()
        if reason is not None:
            families.remove(fam)
            status[fam.key] = "unavailable"
            notes.append({"key": fam.key, "title": fam.title,
                          "message": f"not available in this installation ({reason}), so it was not run"})
    say("load model", 0, 1)
    mlm = any(fam.wants_mlm_head(cfg.options[fam.key]) for fam in families)
    lm = model if model is not None else load_model(cfg.model, seed=cfg.seed, device=cfg.device,
                                                   mlm_head="if-present" if mlm else False)
    say("load model", 1, 1)
    say("prepare inputs", 0, 1)
    base = Context(model=lm, out_dir=out_dir, seed=cfg.seed, max_seq_len=cfg.max_seq_len,
                   batch_size=cfg.batch_size)
    prepared: dict[str, Prepared] = {}
    for fam in families:
        prepared[fam.key] = fam.prepare(dict(cfg.inputs), cfg.options[fam.key], base)
    say("prepare inputs", 1, 1)

    model_info = lm.describe()
    arguments = cfg.as_dict()
    path_args = {role.replace("-", "_") for role, _ in cfg.paths()} | set(cfg.inputs)
    # the device is recorded but not fingerprinted: a run may be resumed on another device
    run_fp = _fingerprint({"arguments": {k: v for k, v in arguments.items()
                                         if k not in path_args and k != "device"},
                           "data": [(d["role"], d["sha256"]) for d in files],
                           "weights": model_info["weights_sha256"],
                           "model": {k: v for k, v in model_info.items() if k != "device"}})
    old_state = _take_out_dir(out_dir, old_run, run_fp, overwrite=overwrite)
    with refused_writes(out_dir), executor(ray, workers) as ex:
        base = dataclasses.replace(base, executor=ex)
        (out_dir / STATE_DIR).mkdir(parents=True, exist_ok=True)
        state = {"fingerprint": run_fp, "status": "running", "started": started,
                 "arguments": arguments}
        write_json(out_dir / STATE_DIR / STATE_FILE, state)

        router = _ProgressRouter(progress, {f.key: prepared[f.key].weight for f in families})
        sections: list[Section] = []
        links: dict[str, list[dict]] = {}
        times: dict[str, float] = {}
        counts: dict[str, int] = {}
        written: dict[str, dict] = {}  # what this job's families wrote, for those that use them
        for fam in run_order(families):
            counts.update(prepared[fam.key].counts)
            ckpt_path = out_dir / STATE_DIR / f"{fam.key}.json"
            family_fp = _fingerprint({"run": run_fp, "family": fam.key})
            old = read_json(ckpt_path) if old_state is not None else None
            router.start(fam.key)
            if old is not None and old.get("fingerprint") == family_fp and old.get("status") == "done":
                sections.append(section_from_json(old["section"], out_dir))
                links[fam.key] = old.get("views", [])
                times[fam.key] = old.get("elapsed_s", 0.0)
                status[fam.key] = "resumed"
                router.finish(fam.key)
                written[fam.key] = ResultsFolder(out_dir).get(fam.key)
                continue
            tf = time.perf_counter()
            ctx = dataclasses.replace(base, progress=router.family_progress(fam.key),
                                      save_maps=out_dir / "maps" / fam.key if cfg.save_maps else None,
                                      results={k: written[k] for k in fam.uses if written.get(k) is not None})
            section = fam.run(prepared[fam.key], cfg.options[fam.key], ctx)
            views = write_head_views(section, out_dir)
            times[fam.key] = time.perf_counter() - tf
            write_json(ckpt_path, {"fingerprint": family_fp, "status": "done", "elapsed_s": times[fam.key],
                                   "section": section_to_json(section, out_dir), "views": views})
            sections.append(section)
            links[fam.key] = views
            status[fam.key] = "done"
            router.finish(fam.key)
            written[fam.key] = ResultsFolder(out_dir).get(fam.key)

        say("report", 0, 1)
        in_report = {f.key: i for i, f in enumerate(families)}
        sections.sort(key=lambda s: in_report.get(s.key, len(in_report)))
        elapsed = time.perf_counter() - t0
        provenance = {
            "model": model_info, "data": files, "counts": counts,
            "seeds": {"run": cfg.seed, "model loading (torch)": cfg.seed, "sentence pairs (A/B split)": cfg.seed,
                      "analyses (bootstrap, probes, MDS)": cfg.seed},
            "arguments": arguments, "inputs": sorted(cfg.inputs), "versions": versions(),
            "command": command,
            "started": started, "elapsed_s": round(elapsed, 3),
            "family_times_s": {k: round(v, 3) for k, v in times.items()},
            # With --resume, elapsed_s is this invocation only; the families' own times come
            # from their checkpoints, so their sum is the analysis time of the whole job.
            "analysis_time_s": round(sum(times.values()), 3),
            "status": status,
        }
        report = write_report(sections, out_dir, provenance=provenance, links=links, notes=notes)
        results = {
            "attnscope_results": 1,
            "provenance": provenance,
            "families": {s.key: {"status": status.get(s.key), "section": section_to_json(s, out_dir),
                                 "views": links.get(s.key, [])} for s in sections},
            "unavailable": notes,
            "results": _collect_results(out_dir),
        }
        results_path = out_dir / "results.json"
        write_json(results_path, results)
        state["status"] = "complete"
        state["finished"] = _now()
        write_json(out_dir / STATE_DIR / STATE_FILE, state)
        say("report", 1, 1)
    return RunOutcome(out_dir=out_dir, report=report, results=results_path, status=status, notes=notes,
                      elapsed_s=time.perf_counter() - t0, results_json=to_plain(results))


def run_family(key: str, inputs: dict[str, Any], out_dir: str | Path, *, model: Any = None,
               seed: int = 0, max_seq_len: int | None = None, batch_size: int = 16,
               save_maps: str | Path | None = None, progress: Progress | None = None,
               device: str = "cpu", ray: bool = False, workers: int = 1, attention: str | None = None,
               **options: Any) -> Section:
    """One family on its own (``attnscope analyze <key>``): read and check its ``inputs`` (by
    input name), load the model when one is needed, run it and return its Section.

    ``model``: a name to load, an already loaded model, or None (then the family's
    ``default_model`` is loaded for files, and no model for stores). ``options`` are the
    fields of the family's ``Options``. ``max_seq_len``: None for the family's
    ``default_max_seq_len`` (128, long context 4096), at most the model's positions.
    ``device``: where a loaded model runs (see
    :func:`attnscope.models.loading.resolve_device`). ``ray``: run the forward passes on
    ``workers`` Ray workers. ``save_maps``: a folder for the family's stores; stores already
    there (an earlier run's) are replaced once the inputs are read. ``attention``: the kind an
    encoder-decoder store is read as, "encoder" (its default) or "decoder".

    >>> run_family("coref", {"coref": ["doc.conllu"]}, "out/", window="sliding")  # doctest: +SKIP
    """
    from attnscope.families import FAMILIES
    from attnscope.models import LoadedModel, load_model
    from attnscope.models.loading import resolve_device

    load_families()
    try:
        fam = FAMILIES[key]()
    except KeyError:
        raise AttnscopeError(f"unknown family {key!r}; known: {', '.join(sorted(FAMILIES))}") from None
    reason = fam.unavailable()
    if reason is not None:
        raise AttnscopeError(f"{key}: not available in this installation ({reason})")
    where = resolve_device(device)  # a bad --device is refused before anything is read or written
    check_attention(attention)
    check_writable(out_dir, folder=True)
    opts = fam.Options(**options)
    check_options(opts)
    check_ray(ray, workers)
    inputs = {inp.name: inputs.get(inp.name) for inp in fam.inputs}
    files = [p for inp in fam.inputs for p in inp.paths(inputs[inp.name])]
    for p in files:
        if not p.exists():
            raise InputError(p, "no such file")
    if attention is not None and not fam.reads_attention_kinds:
        raise AttnscopeError(f"attention {attention}: the {key} family does not read encoder-decoder "
                             "stores by kind (general and patterns do)", params=("attention",))
    if isinstance(model, LoadedModel):
        lm = model
    elif model is not None or (fam.default_model and not all(p.is_dir() for p in files)):
        lm = load_model(model or fam.default_model, seed=seed, device=device,
                        mlm_head="if-present" if fam.wants_mlm_head(opts) else False)
    else:
        lm = None
    if max_seq_len is None:
        max_seq_len = fam.default_max_seq_len if lm is None else min(fam.default_max_seq_len, lm.max_positions)
    ctx = Context(model=lm, out_dir=Path(out_dir), seed=seed, max_seq_len=max_seq_len,
                  batch_size=batch_size, progress=progress,
                  save_maps=Path(save_maps) if save_maps is not None else None, attention=attention)
    prepared = fam.prepare(inputs, opts, ctx)
    if ctx.save_maps is not None:
        _replace_stores(ctx.save_maps)
    # out of GPU memory: one line naming max_seq_len, before anything is written
    with refused_writes(Path(out_dir), resumable=False), gpu_memory_errors(max_seq_len, where), \
            executor(ray, workers) as ex:
        return fam.run(prepared, opts, dataclasses.replace(ctx, executor=ex))


def check_attention(attention: str | None) -> None:
    """The kinds of an encoder-decoder store that the analyses read: its two self-attentions."""
    if attention in (None, "encoder", "decoder"):
        return
    if attention == "cross":
        raise AttnscopeError("attention cross: cross-attention maps are decoder x encoder, and the "
                             "analyses are defined on self-attention (encoder or decoder); view "
                             "cross-attention with 'attnscope view STORE --kind cross'",
                             params=("attention",))
    raise AttnscopeError(f"attention {attention!r}: choose encoder or decoder", params=("attention",))


def _replace_stores(folder: Path) -> None:
    """Clear ``folder`` of the stores an earlier ``analyze --save-maps`` kept there: they are
    replaced, as its tables and results are. A folder holding anything but attnscope stores is
    refused, and nothing in it is deleted."""
    from attnscope.store.format import MANIFEST

    if not folder.exists():
        return
    stores = [m.parent for m in folder.rglob(MANIFEST)]
    others = [p for p in folder.rglob("*") if p.is_file() and not any(s in p.parents for s in stores)]
    if not folder.is_dir() or others:
        raise AttnscopeError(f"{folder}: holds files that are not attnscope stores; refusing to "
                             "replace them (choose another save_maps)", params=("save_maps",))
    shutil.rmtree(folder)


def _collect_results(out_dir: Path) -> dict[str, Any]:
    """Every family's results in ``out_dir``, by key (:class:`~attnscope.report.results.ResultsFolder`)."""
    return {key: d for key, _, d in ResultsFolder(out_dir).items()}


# ---------------------------------------------------------------------------------------------
# The demo: the packaged model on the small sample that ships inside the package

def demo_inputs() -> dict[str, Path]:
    """The packaged sample of every input of the demo's families (those with ``Family.demo``),
    by input name (written for attnscope, see ``demo_data/README.md``)."""
    from importlib.resources import files

    root = Path(str(files("attnscope") / "demo_data"))
    return {inp.name: root / inp.sample for fam in load_families() if fam.demo
            for inp in fam.inputs if inp.sample}


def demo_config(model: str = "default", seed: int = 0) -> RunConfig:
    multiple = {inp.name for fam in load_families() for inp in fam.inputs if inp.multiple}
    return RunConfig(model=model, seed=seed, **{name: [p] if name in multiple else p
                                               for name, p in demo_inputs().items()})


def run_demo(out_dir: str | Path, *, model: str = "default", resume: bool = False,
             progress: Progress | None = None, command: str | None = None) -> RunOutcome:
    """The whole pipeline on the packaged sample; replaces an earlier demo run in ``out_dir``
    unless ``resume`` (a folder that is not an attnscope run is never deleted)."""
    out_dir = Path(out_dir)
    state = out_dir / STATE_DIR / STATE_FILE
    overwrite = not resume and state.exists()
    return run_pipeline(demo_config(model), out_dir, resume=resume, overwrite=overwrite,
                        progress=progress, command=command)
