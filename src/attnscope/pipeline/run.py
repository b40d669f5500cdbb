"""The run itself: the families in the order they need each other, :func:`run_pipeline` (every
family the inputs allow, checkpointed, then the report), :func:`run_family` (one family) and
:func:`atlas`."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnscope.data.io import check_writable, file_fingerprint, fingerprint, to_plain
from attnscope.data.records import layer_numbering, recorded_layers
from attnscope.engines.memory import gpu_memory_errors
from attnscope.errors import AttnscopeError, InputError
from attnscope.executor import executor
from attnscope.families import FAMILIES, Context, Family, Prepared, check_options, load_families
from attnscope.models import LoadedModel, load_model
from attnscope.models.loaded import display_name
from attnscope.models.loading import resolve_device
from attnscope.on_ray import check_ray
from attnscope.pipeline.config import (
    RunConfig,
    RunOutcome,
    check_config,
    data_files,
)
from attnscope.pipeline.outdir import (
    STATE_FILE,
    check_out_dir,
    interrupted,
    now,
    refused_writes,
    replace_stores,
    take_out_dir,
)
from attnscope.pipeline.progress import ProgressRouter, prefixed
from attnscope.pipeline.sections import section_from_json, section_to_json
from attnscope.progress import Progress
from attnscope.report.html import write_head_views, write_report
from attnscope.report.section import Section
from attnscope.store import Store
from attnscope.store.checkpoints import STATE_DIR, drop_unit_logs
from attnscope.store.format import MANIFEST
from attnscope.store.results import ResultsFolder, read_json, write_json
from attnscope.store.writer import versions


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
                 workers: int = 1, explain: bool = False) -> RunOutcome | dict[str, list[str]]:
    """Run every family the inputs allow and write the report; see the module docstring.

    ``progress(step, done, total)`` is called as work advances: ``step`` is ``"overall"``
    (in examples, for one ETA over the whole run), ``"load model"``, ``"prepare inputs"``,
    ``"report"`` or ``"<family>: <step>"``. ``model`` may be an already loaded
    :class:`~attnscope.models.LoadedModel` (then ``config.model`` only names it). ``ray``: run
    the forward passes on ``workers`` Ray workers (``docs/scale.md``). ``explain``: read and
    check everything, then return each family's lines on how its pass would run
    (:meth:`~attnscope.families.base.Family.explain`) instead of running; nothing is written.
    """
    t0 = time.perf_counter()
    started = now()
    out_dir = Path(out_dir)
    cfg = config
    check_config(cfg)
    where = resolve_device(cfg.device)  # a bad --device is refused before anything is written
    check_ray(ray, workers)
    check_writable(out_dir, folder=True)
    old_run = check_out_dir(out_dir, resume=resume, overwrite=overwrite)
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
    if explain:
        return {fam.key: fam.explain(prepared[fam.key], cfg.options[fam.key], base) for fam in families}

    model_info = lm.describe()
    arguments = cfg.as_dict()
    path_args = {role.replace("-", "_") for role, _ in cfg.paths()} | set(cfg.inputs)
    # the device is recorded but not fingerprinted: a run may be resumed on another device
    run_fp = fingerprint({"arguments": {k: v for k, v in arguments.items()
                                         if k not in path_args and k != "device"},
                           "data": [(d["role"], d["sha256"]) for d in files],
                           "weights": model_info["weights_sha256"],
                           "model": {k: v for k, v in model_info.items() if k != "device"}})
    old_state = take_out_dir(out_dir, old_run, run_fp, overwrite=overwrite)
    # out of GPU memory: one line naming max_seq_len (the finished families stay checkpointed)
    with refused_writes(out_dir), gpu_memory_errors(cfg.max_seq_len, where), executor(ray, workers) as ex:
        base = dataclasses.replace(base, executor=ex)
        (out_dir / STATE_DIR).mkdir(parents=True, exist_ok=True)
        state = {"fingerprint": run_fp, "status": "running", "started": started,
                 "arguments": arguments}
        write_json(out_dir / STATE_DIR / STATE_FILE, state)

        router = ProgressRouter(progress, {f.key: prepared[f.key].weight for f in families})
        sections: list[Section] = []
        links: dict[str, list[dict]] = {}
        times: dict[str, float] = {}
        counts: dict[str, int] = {}
        written: dict[str, dict] = {}  # what this job's families wrote, for those that use them
        current: str | None = None
        try:
            for fam in run_order(families):
                current = fam.key
                counts.update(prepared[fam.key].counts)
                ckpt_path = out_dir / STATE_DIR / f"{fam.key}.json"
                family_fp = fingerprint(run_fp, fam.key, fam.fingerprint(cfg.options[fam.key]))
                old = read_json(ckpt_path) if old_state is not None else None
                router.start(fam.key)
                if old is not None and old.get("fingerprint") == family_fp and old.get("status") == "done":
                    sections.append(section_from_json(old["section"], out_dir))
                    links[fam.key] = old.get("views", [])
                    times[fam.key] = old.get("elapsed_s", 0.0)
                    status[fam.key] = "resumed"
                    drop_unit_logs(out_dir, fam.key)  # a kill just after its checkpoint left them
                    router.finish(fam.key, resumed=True)
                    written[fam.key] = ResultsFolder(out_dir).get(fam.key)
                    continue
                tf = time.perf_counter()
                ctx = dataclasses.replace(base, progress=router.family_progress(fam.key), family=fam.key, job=family_fp,
                                          save_maps=out_dir / "maps" / fam.key if cfg.save_maps else None,
                                          results={k: written[k] for k in fam.uses if written.get(k) is not None})
                with layer_numbering(lm.facts.attention_layers):
                    section = fam.run(prepared[fam.key], cfg.options[fam.key], ctx).section
                    views = write_head_views(section, out_dir)
                times[fam.key] = time.perf_counter() - tf
                write_json(ckpt_path, {"fingerprint": family_fp, "status": "done", "elapsed_s": times[fam.key],
                                       "section": section_to_json(section, out_dir), "views": views})
                drop_unit_logs(out_dir, fam.key)  # the checkpoint holds the family now
                sections.append(section)
                links[fam.key] = views
                status[fam.key] = "done"
                router.finish(fam.key)
                written[fam.key] = ResultsFolder(out_dir).get(fam.key)

            current = None
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
            with layer_numbering(lm.facts.attention_layers):
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
            state["finished"] = now()
            write_json(out_dir / STATE_DIR / STATE_FILE, state)
            say("report", 1, 1)
        except KeyboardInterrupt:
            raise interrupted(out_dir, finished=[k for k, v in status.items() if v in ("done", "resumed")],
                              current=current, then="run the same command with --resume",
                              state=state) from None
    return RunOutcome(out_dir=out_dir, report=report, results=results_path, status=status, notes=notes,
                      elapsed_s=time.perf_counter() - t0, results_json=to_plain(results))


def run_family(key: str, inputs: dict[str, Any], out_dir: str | Path, *, model: Any = None,
               seed: int = 0, max_seq_len: int | None = None, batch_size: int = 16,
               save_maps: str | Path | None = None, progress: Progress | None = None,
               device: str = "cpu", ray: bool = False, workers: int = 1, attention: str | None = None,
               explain: bool = False, **options: Any) -> Section | list[str]:
    """One family on its own (``attnscope analyze <key>``), and the one entry from Python: read and
    check its ``inputs`` (by input name), load the model when one is needed, run it and return
    its Section.

    ``inputs`` hold paths, or what Python has read already: an opened store or a list of
    :class:`~attnscope.data.records.Example` (general, patterns, syntax: with trees), a list of
    :class:`~attnscope.data.coref.Document` (coref).

    ``model``: a name to load, an already loaded model, or None (then the family's
    ``default_model`` is loaded for files, and no model for stores). ``options`` are the
    fields of the family's ``Options``. ``max_seq_len``: None for the family's
    ``default_max_seq_len`` (128, long context 4096), at most the model's positions.
    ``explain``: read and check everything, then return the lines that say how the family's pass
    would run (its engine, backend and why: :meth:`~attnscope.families.base.Family.explain`)
    instead of running it; nothing is written.
    ``device``: where a loaded model runs (see
    :func:`attnscope.models.loading.resolve_device`). ``ray``: run the forward passes on
    ``workers`` Ray workers. ``save_maps``: a folder for the family's stores; stores already
    there (an earlier run's) are replaced once the inputs are read. ``attention``: the kind an
    encoder-decoder store is read as, "encoder" (its default) or "decoder".

    >>> run_family("coref", {"coref": ["doc.conllu"]}, "out/", window="sliding")  # doctest: +SKIP
    >>> run_family("general", {"text": [Example(text="the cat sat.")]}, "out/",
    ...            model=load_model("default"), general_engine="maps")  # doctest: +SKIP
    """
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
    known = [f.name for f in dataclasses.fields(fam.Options)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise AttnscopeError(f"{key}: no option {', '.join(map(repr, unknown))}; its options: "
                             + (", ".join(known) or "none"), params=tuple(unknown))
    opts = fam.Options(**options)
    check_options(opts)
    check_ray(ray, workers)
    strange = sorted(set(inputs) - {inp.name for inp in fam.inputs})
    if strange:
        raise AttnscopeError(f"{key}: no input {', '.join(map(repr, strange))}; its inputs: "
                             + ", ".join(inp.name for inp in fam.inputs), params=tuple(strange))
    inputs = {inp.name: inputs.get(inp.name) for inp in fam.inputs}
    given = []
    for inp in fam.inputs:
        for v in inp.given(inputs[inp.name]):
            if not (isinstance(v, Path) or inp.kinds or isinstance(v, inp.objects)):
                raise AttnscopeError(f"{inp.name}: the {key} family reads this input from a file: give "
                                     f"its path, not {type(v).__name__}", params=(inp.name,))
            given.append(v)
    files = [v for v in given if isinstance(v, Path)]
    for p in files:
        if not p.exists():
            raise InputError(p, "no such file")
    if attention is not None and not fam.reads_attention_kinds:
        raise AttnscopeError(f"attention {attention}: the {key} family does not read encoder-decoder "
                             "stores by kind (general and patterns do)", params=("attention",))
    if isinstance(model, LoadedModel):
        lm = model
    elif model is not None or (fam.default_model and not all(_is_store(v) for v in given)):
        lm = load_model(model or fam.default_model, seed=seed, device=device,
                        mlm_head="if-present" if fam.wants_mlm_head(opts) else False)
    else:
        lm = None
    if lm is not None:
        check_model_of_stores(lm, given)
    if max_seq_len is None:
        max_seq_len = fam.default_max_seq_len if lm is None else min(fam.default_max_seq_len, lm.max_positions)
    # what decides the family's numbers: a killed run's finished units are read back under it
    job = fingerprint({"family": key, "options": fam.fingerprint(opts), "seed": seed,
                       "max_seq_len": max_seq_len, "batch_size": batch_size, "attention": attention,
                       "model": None if lm is None else {k: v for k, v in lm.describe().items() if k != "device"},
                       "data": [_data_fingerprint(v) for v in given]})
    ctx = Context(model=lm, out_dir=Path(out_dir), seed=seed, max_seq_len=max_seq_len,
                  batch_size=batch_size, progress=prefixed(progress, key),
                  save_maps=Path(save_maps) if save_maps is not None else None, attention=attention,
                  family=key, job=job)
    prepared = fam.prepare(inputs, opts, ctx)
    if explain:
        return fam.explain(prepared, opts, ctx)
    if ctx.save_maps is not None:
        replace_stores(ctx.save_maps)
    # out of GPU memory: one line naming max_seq_len, before anything is written
    with refused_writes(Path(out_dir), resumable=False), gpu_memory_errors(max_seq_len, where), \
            executor(ray, workers) as ex:
        try:
            with layer_numbering(lm.facts.attention_layers if lm is not None else _stores_layers(given)):
                section = fam.run(prepared, opts, dataclasses.replace(ctx, executor=ex)).section
        except KeyboardInterrupt:
            raise interrupted(Path(out_dir), finished=[], current=key, then="run the same command again") from None
    drop_unit_logs(Path(out_dir), key)  # the results are written: nothing is left to resume
    return section


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


def _collect_results(out_dir: Path) -> dict[str, Any]:
    """Every family's results in ``out_dir``, by key (:class:`~attnscope.store.results.ResultsFolder`)."""
    return {key: d for key, _, d in ResultsFolder(out_dir).items()}


def check_model_of_stores(lm: LoadedModel, given: Sequence[Any]) -> None:
    """A store's maps are its own model's: refuse ``model`` when it is another model (not the
    same name and source, nor the same weights sha256), rather than analyse the store's maps
    while the outputs name ``model``. Nothing has been written yet."""
    for v in given:
        if isinstance(v, Store):
            path, desc = v.path, v.manifest.get("model") or {}
        elif isinstance(v, Path) and (v / MANIFEST).is_file():
            path, desc = v, read_json(v / MANIFEST).get("model") or {}
        else:
            continue
        known = [h for h in (desc.get("weights_sha256"), lm.weights_hash) if h not in (None, "", "unknown")]
        same = ((desc.get("name"), desc.get("source")) == (lm.name, lm.source)
                or (len(known) == 2 and known[0] == known[1]))
        if not same:
            mine, theirs = _called(lm.name, lm.display_name), _called(desc.get("name"), display_name(desc))
            raise AttnscopeError(
                f"model {mine}: {path} holds the maps of {theirs}, not of {lm.name}; leave model out to "
                f"analyse those maps, or give {desc.get('name')}", params=("model",))


def _stores_layers(given: Sequence[Any]) -> tuple[int, ...] | None:
    """The attention layers the first store among ``given`` records (for naming its heads)."""
    for v in given:
        if _is_store(v):
            return recorded_layers((v if isinstance(v, Store) else Store(v)).manifest.get("model"))
    return None


def _called(name: Any, shown: str) -> str:
    """``name``, with the real name behind it where they differ (``default``)."""
    return str(name) if shown == str(name) else f"{name} ({shown})"


def _is_store(given: Any) -> bool:
    """An input that holds maps already: a store folder, or an opened store."""
    return isinstance(given, Store) or (isinstance(given, Path) and given.is_dir())


def _data_fingerprint(given: Any) -> str:
    """A file's sha256; a store folder's by its manifest (which holds its inputs' sha256); data
    given from Python already read, by its contents."""
    if isinstance(given, Store):
        given = given.path
    if not isinstance(given, Path):
        return fingerprint(given)
    target = given / MANIFEST if given.is_dir() else given
    return file_fingerprint(target) if target.is_file() else "missing"


def atlas(source: str | Path, out_dir: str | Path, *, model: Any = "smollm2", seed: int = 0,
          max_seq_len: int | None = None, **options: Any):
    """The head atlas from Python: the report :class:`~attnscope.report.section.Section`, with
    tables, figures and ``results/atlas.json`` under ``out_dir`` (``options``: the fields of
    :class:`attnscope.families.atlas.Options`, e.g. ``atlas_tasks=12``).

    >>> atlas("wiki.txt", "out/", atlas_tasks=12, max_seq_len=1024)  # doctest: +SKIP
    """
    return run_family("atlas", {"atlas": source}, out_dir, model=model, seed=seed,
                      max_seq_len=max_seq_len, **options)
