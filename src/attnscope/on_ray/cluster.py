"""Extraction and analyses on a Ray cluster, merged exactly (``docs/scale.md``).

The driver (this process) reads and encodes the inputs and makes the same plan as the
single-process extractor (:meth:`attnscope.extract.runner.Extractor.plan`: length-bucketed
batches in a fixed order, so plan position ``p`` is the same number in every run). It cuts the
plan into *units*: runs of whole batches that end on a shard boundary, so every shard belongs
to exactly one unit. Ray Data maps a callable class over the units (``map_batches``, one actor
per worker, each loading the model once); a worker runs its unit's batches and

- writes the unit's shards into the store folder itself, named by plan position
  (``shards/<p // shard_size>.safetensors``), so two workers can never write the same file;
- folds the unit's maps into fresh copies of the requested analyses and returns them.

The driver merges the partial analyses in unit order (so the result does not depend on the
number of workers or on which worker ran what), and writes the index and the completed
manifest last, exactly as :func:`attnscope.jobs.extract_to_store` does: the store is the
same in content as the single-process one. A killed worker is restarted by Ray and its unit
run again (shards are written atomically, so a half-written shard never appears); a killed
driver leaves whole shards and an ``incomplete`` manifest, which ``--resume`` (on Ray or not)
completes. A bad example stops the job with the same one-line error as a local run, and a
store this job started is removed.

Ray is imported only inside these functions: ``import attnscope`` never imports it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import pickle
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.engines.streaming import stream_stats
from attnscope.errors import AttnscopeError
from attnscope.extract.runner import ExtractOptions, Extractor, ExtractStats, small_matrix_threads
from attnscope.maps import AttentionBatch, AttentionMap
from attnscope.models import forward as fw
from attnscope.models.loading import LoadedModel, as_loaded
from attnscope.on_ray import RAY_EXTRA
from attnscope.store.format import SHARDS, array_key, shard_name
from attnscope.store.writer import ShardWriter, StoreJob, WriteError, open_store_job

#: Object store of a local cluster started by attnscope (Ray's default is 30% of memory; on a
#: shared machine that is too greedy). Larger objects spill to disk.
LOCAL_OBJECT_STORE_BYTES = 512 << 20

#: Examples per unit of work when no store is written (a store's units are its shards).
UNIT_EXAMPLES = 64


def require_ray():
    """The ``ray`` module, or one line naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise AttnscopeError(f"ray needs Ray, which is not installed: {RAY_EXTRA}", params=("ray",)) from None
    return ray


def check_workers(workers: int) -> None:
    if not isinstance(workers, int) or workers < 1:
        raise AttnscopeError(f"workers must be at least 1, not {workers!r}", params=("workers",))


def worker_runtime_env() -> dict[str, Any]:
    """Ship this process's attnscope package to the workers (``py_modules``), so a cluster runs
    the very code the driver runs, whatever attnscope its nodes have installed."""
    return {"py_modules": [str(Path(__file__).resolve().parents[1])]}  # the attnscope package


def _quiet_logs() -> None:
    """Ray's own chatter (cluster start, each dataset's plan and stats) stays in Ray's log
    files; its warnings and errors still reach the terminal."""
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")
    for name in ("ray", "ray.data"):
        logging.getLogger(name).setLevel(logging.WARNING)


@contextmanager
def ray_session(workers: int = 1, *, address: str | None = None):
    """Connect to Ray for the duration of the block and yield the ``ray`` module.

    Order: an already initialised Ray (e.g. a notebook's ``ray.init``); ``address`` or the
    ``RAY_ADDRESS`` environment variable; a cluster running on this machine (``"auto"``);
    else a local cluster with enough CPUs for ``workers``, shut down at the end (a cluster
    attnscope did not start is left running).
    """
    ray = require_ray()
    check_workers(workers)
    started = False
    if not ray.is_initialized():
        _quiet_logs()
        address = address or os.environ.get("RAY_ADDRESS")
        common = {"runtime_env": worker_runtime_env(), "log_to_driver": False,
                  "logging_level": logging.WARNING}
        try:
            ray.init(address=address or "auto", **common)
        except ConnectionError:
            if address:
                raise AttnscopeError(f"RAY_ADDRESS={address}: no Ray cluster answers there") from None
            ray.init(num_cpus=max(workers, os.cpu_count() or 1), include_dashboard=False,
                     object_store_memory=LOCAL_OBJECT_STORE_BYTES, **common)
        started = True
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


# ---------------------------------------------------------------------------------------------
# Units of work


@dataclass
class Unit:
    """Whole planned batches with their plan positions; ends on a shard boundary."""

    uid: int
    batches: list[tuple[list[int], list]] = field(default_factory=list)  # (positions, [Encoded])
    examples: int = 0
    tokens: int = 0

    def shards(self, shard_size: int) -> set[int]:
        return {p // shard_size for positions, _ in self.batches for p in positions}


def plan_units(extractor, examples: Iterable, shard_size: int, unit_examples: int) -> list[Unit]:
    """The extractor's plan cut into units of at least ``unit_examples`` examples that end where
    a shard ends (plan position a multiple of ``shard_size``), or at the end of the plan."""
    units: list[Unit] = []
    cur = Unit(0)
    pos = 0
    for planned in extractor.plan(examples):
        positions = list(range(pos, pos + len(planned)))
        pos += len(planned)
        cur.batches.append((positions, planned))
        cur.examples += len(planned)
        cur.tokens += sum(len(e) for e in planned)
        if cur.examples >= unit_examples and pos % shard_size == 0:
            units.append(cur)
            cur = Unit(len(units))
    if cur.batches:
        units.append(cur)
    return units


def _stored(batch, dtype: str):
    """The batch as a reader of a ``dtype`` store sees it (float16 rounding, back to float32)."""
    return AttentionBatch([dataclasses.replace(m, attn=m.attn.astype(dtype).astype(np.float32))
                           for m in batch.items])


def _shard_maps(root: Path, sid: int) -> dict[int, Any]:
    """The maps of a finished shard, by plan position (float32, as the store reader gives them)."""
    from safetensors import safe_open

    with safe_open(str(root / SHARDS / shard_name(sid)), framework="np") as sf:
        records = json.loads(sf.metadata()["records"])
        return {r["pos"]: AttentionMap.from_record(r, sf.get_tensor(array_key(r["pos"])).astype(np.float32))
                for r in records}


@dataclass
class ModelParcel:
    """A loaded model as it travels to the workers: its class, config, weights and tokenizer,
    never the live module (hooks, patched methods or closures that other code attached to it
    in the driver would not pickle, and have no business on a worker)."""

    model_class: type
    config: Any
    state: dict
    dtype: Any
    fields: dict
    device: str = "cpu"  # the driver's device type; a worker uses the GPU Ray gave it (cuda:0)

    @classmethod
    def pack(cls, lm) -> "ModelParcel":
        fields = {f.name: getattr(lm, f.name) for f in dataclasses.fields(lm) if f.name not in ("model", "kept")}
        state = {k: v.detach().cpu() for k, v in lm.model.state_dict().items()}
        return cls(type(lm.model), lm.model.config, state, next(lm.model.parameters()).dtype, fields,
                   lm.model.device.type)

    def unpack(self):
        if getattr(self.config, "_attn_implementation", None) == fw.ATTN_IMPLEMENTATION:
            fw._register()  # the attention function is registered per process
        model = self.model_class(self.config).to(self.dtype)
        fw.install(model)  # (an adapted family's modules are adapted per process too)
        model.load_state_dict(self.state)
        model.to(self.device)
        model.eval()
        return LoadedModel(model=model, **self.fields)


class UnitWorker:
    """The callable class Ray Data runs on each actor: the model is loaded (unpickled) once per
    actor, then each call runs the units of one Ray Data batch.

    ``mode``: ``"extract"`` (maps: write shards and/or fold analyses), ``"maps"`` (send the maps
    back: the Ray executor behind ``analyze/run --ray``), ``"stream"`` (long-context statistics
    computed inside attention, :func:`attnscope.engines.streaming.stream_stats`), ``"tasks"``
    (``step(lm, item)`` for each item: :meth:`attnscope.executor.RayExecutor.tasks`).
    """

    def __init__(self, model, options: dict, mode: str = "extract", root: str | None = None,
                 shard_size: int = 128, dtype: str = "float16", done: Sequence[int] = (),
                 analyses: list | None = None, stream: dict | None = None, step=None):
        if isinstance(model, ModelParcel):
            model = model.unpack()
        self.lm = model
        self.extractor = Extractor(model, ExtractOptions(**options), ExtractStats())
        self.mode = mode
        self.root = None if root is None else Path(root)
        self.shard_size, self.dtype, self.done = shard_size, dtype, set(done)
        self.analyses = analyses or []
        self.stream = stream or {}
        self.step = step

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from ray import cloudpickle  # analyses defined in a notebook or script travel by value

        out = []
        with small_matrix_threads():
            for payload in batch["payload"]:
                # the payload is bytes this job's driver pickled a moment ago, never a file
                unit = pickle.loads(payload)
                try:
                    result = self.run(unit)
                except AttnscopeError as exc:
                    result = {"error": str(exc), "kind": type(exc).__name__}
                out.append(cloudpickle.dumps(result))
        return {"uid": np.asarray(batch["uid"]), "result": np.array(out, dtype=object)}

    def run(self, unit) -> dict:
        if self.mode == "stream":
            return self._stream(unit)
        if self.mode == "tasks":  # one item of a step of units (attnscope.executor.LocalExecutor.tasks)
            return {"record": self.step(self.lm, unit)}

        partial = [copy.deepcopy(a) for a in self.analyses]
        writer = ShardWriter(self.root, self.shard_size, self.dtype, set(self.done)) if self.root else None
        maps = []
        stored: dict[int, dict[int, Any]] = {}
        for positions, planned in unit.batches:
            if writer is not None and all(writer.shard_of(p) in writer.done for p in positions):
                if partial:  # resumed: the analyses read this batch back from its shards

                    items = []
                    for p in positions:
                        sid = writer.shard_of(p)
                        if sid not in stored:
                            stored[sid] = _shard_maps(self.root, sid)
                        items.append(stored[sid][p])
                    for a in partial:
                        a.update(AttentionBatch(items))
                continue
            batch = self.extractor.run_batch(planned)
            if writer is not None:
                for p, item in zip(positions, batch.items):
                    writer.add(p, item)
            seen = _stored(batch, self.dtype) if writer is not None else batch
            for a in partial:
                a.update(seen)
            if self.mode == "maps":
                maps.append(batch)
        if writer is not None:
            writer.finish()
        return {"analyses": partial, "maps": maps}

    def _stream(self, unit) -> dict:
        stats = copy.deepcopy(self.analyses[0])
        sequences, targets = unit
        stream_stats(self.lm, sequences, stats, chunk=self.stream.get("chunk", 0),
                     batch_size=self.stream.get("batch_size", 1), targets=targets)
        return {"analyses": [stats], "maps": []}


def _num_gpus() -> float:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0
    return 1 if torch.cuda.is_available() else 0


def map_units(ray, units: Sequence[Any], uids: Sequence[int], worker: dict, workers: int,
              *, ordered: bool = False) -> Iterator[tuple[int, dict]]:
    """Run ``UnitWorker(**worker)`` over ``units`` with Ray Data on ``workers`` actors; yield
    ``(uid, result)`` as results arrive (in ``uids`` order when ``ordered``). A worker's
    :class:`AttnscopeError` is raised here with the same message."""
    import ray.data
    from ray import cloudpickle
    from ray.data import ActorPoolStrategy

    if not units:
        return
    ctx = ray.data.DataContext.get_current()
    names = ("enable_progress_bars", "print_on_execution_start", "enable_auto_log_stats")
    saved = [getattr(ctx, n) for n in names] + [ctx.execution_options.preserve_order]
    for n in names:  # the driver shows one bar of its own
        setattr(ctx, n, False)
    ctx.execution_options.preserve_order = ordered
    data_log = logging.getLogger("ray.data")
    level = data_log.level
    data_log.setLevel(logging.ERROR)
    try:
        items = [{"uid": uid, "payload": cloudpickle.dumps(u)} for uid, u in zip(uids, units)]
        ds = ray.data.from_items(items, override_num_blocks=min(len(items), 10_000))
        ds = ds.map_batches(UnitWorker, fn_constructor_kwargs=worker, batch_size=1,
                            compute=ActorPoolStrategy(size=min(workers, len(units))), num_cpus=1,
                            num_gpus=_num_gpus(), batch_format="numpy")
        for row in ds.iter_rows():
            result = pickle.loads(row["result"])  # bytes a worker of this job pickled
            if "error" in result:
                cls = WriteError if result["kind"] == "WriteError" else AttnscopeError
                raise cls(result["error"])
            yield int(row["uid"]), result
    finally:
        for n, v in zip(names, saved):
            setattr(ctx, n, v)
        ctx.execution_options.preserve_order = saved[-1]
        data_log.setLevel(level)


class RayJobError(WriteError):
    """Ray itself failed (a worker lost for good, the cluster gone): like a refused write, the
    whole shards are kept for ``--resume``."""


def _ray_failure(exc: Exception, where: str, *, store: bool = False) -> AttnscopeError:
    """One line for a failure of Ray itself or of code on a worker: the innermost error.
    ``store``: the job writes a store, whose finished shards ``--resume`` keeps."""
    lines = [ln.strip() for ln in str(exc).splitlines()]
    cause = next((ln for ln in lines if re.match(r"^[\w.]*(Error|Exception)\b.*: ", ln)
                  and not ln.startswith("ray.")), None) or type(exc).__name__
    then = ("finished shards are kept: run the same command with resume" if store
            else "run the same command again")
    return RayJobError(f"{where}: the Ray job failed ({cause[:300]}); {then}",
                       params=("resume",) if store else ())


# ---------------------------------------------------------------------------------------------
# Extraction (and analyses) on Ray


@dataclass
class RayOutcome:
    """What :func:`extract_on_ray` did: the extraction's statistics, the merged analyses (the
    objects that were passed in, now holding every unit's sums), and its timings."""

    stats: Any  # ExtractStats
    analyses: list
    workers: int
    units: int
    units_run: int
    elapsed_s: float
    connect_s: float


def extract_on_ray(examples: Iterable, out: str | Path | None = None, model: Any = "default", *,
                   options=None, analyses: list | None = None, workers: int = 1,
                   dtype: str = "float16", shard_size: int = 128, resume: bool = False,
                   overwrite: bool = False, source: dict | None = None, command: str | None = None,
                   progress: Callable[[int, int], None] | None = None,
                   unit_examples: int | None = None) -> RayOutcome:
    """Run the model over ``examples`` on ``workers`` Ray actors in a session of its own.

    ``out``: a store folder to write (the same as :func:`attnscope.jobs.extract_to_store` with
    the Ray executor, which runs :meth:`RayBatchRunner.write_store` too; ``resume``/``overwrite``
    as there), or None. ``analyses``: fresh analysis objects (maps analyses, e.g.
    ``[RelativePosition(), Entropy()]``); every unit folds into copies of them and they are
    merged back into these objects, in unit order. With a store, the analyses see the maps as
    the store holds them (``dtype``), as a run over the written store would.
    ``progress(examples_done, tokens_done)`` after each unit.

    >>> from attnscope.analyses.entropy import Entropy
    >>> out = extract_on_ray(examples, "store/", "debug:bert", analyses=[Entropy()],
    ...                      workers=2)  # doctest: +SKIP
    >>> out.analyses[0].finalize()  # doctest: +SKIP
    """
    require_ray()
    check_workers(workers)
    options = options or ExtractOptions()
    analyses = list(analyses or [])
    t0 = time.perf_counter()
    job: StoreJob | None = None
    if out is not None:
        job = open_store_job(examples, out, model, options=options, dtype=dtype, shard_size=shard_size,
                             resume=resume, overwrite=overwrite, source=source, command=command)
        extractor, examples = job.extractor, job.examples
        where = {"root": job.root, "shard_size": shard_size, "dtype": dtype, "done": job.done}
    else:
        extractor = Extractor(as_loaded(model, seed=options.seed), options, ExtractStats())
        examples, where = list(examples), {}
    with job.cleanup_on_error() if job is not None else _nothing():
        t1 = time.perf_counter()
        with ray_session(workers) as ray:
            connect_s = time.perf_counter() - t1
            units, run = RayBatchRunner(ray, workers).write_store(
                extractor, examples, **where, progress=progress, analyses=analyses,
                unit_examples=unit_examples or (shard_size if job is not None else UNIT_EXAMPLES))
    if job is not None:
        job.finish()
    elapsed = time.perf_counter() - t0
    extractor.stats.elapsed_s = elapsed  # type: ignore[attr-defined]
    return RayOutcome(stats=extractor.stats, analyses=analyses, workers=workers, units=units,
                      units_run=run, elapsed_s=elapsed, connect_s=connect_s)


@contextmanager
def _nothing():
    yield


def stream_stats_on_ray(lm, sequences: Sequence[Sequence[int]], stats, *, workers: int = 1,
                        chunk: int = 0, batch_size: int = 1, targets: Sequence | None = None,
                        per_unit: int = 4) -> None:
    """:func:`attnscope.engines.streaming.stream_stats` on Ray: ``per_unit`` sequences per unit,
    each folded into a copy of the (empty) ``stats`` on a worker; merged into ``stats`` in order.
    """
    require_ray()
    check_workers(workers)
    seqs = [list(map(int, s)) for s in sequences]
    tg = list(targets) if targets is not None else None
    units = [(seqs[i:i + per_unit], None if tg is None else tg[i:i + per_unit])
             for i in range(0, len(seqs), per_unit)]

    worker = {"model": ModelParcel.pack(lm), "options": ExtractOptions(max_seq_len=min(lm.max_positions, 128)).as_dict(),
              "mode": "stream", "analyses": [stats], "stream": {"chunk": chunk, "batch_size": batch_size}}
    partials = {}
    with ray_session(workers) as ray:
        try:
            for uid, result in map_units(ray, units, list(range(len(units))), worker, workers):
                partials[uid] = result["analyses"][0]
        except AttnscopeError:
            raise
        except Exception as exc:
            raise _ray_failure(exc, "long-context statistics") from None
    for uid in sorted(partials):
        stats.merge(partials[uid])


# ---------------------------------------------------------------------------------------------
# The executor behind ``attnscope analyze ... --ray`` and ``attnscope run --ray``


class RayBatchRunner:
    """Runs an :class:`~attnscope.extract.runner.Extractor`'s planned batches on Ray actors,
    for :class:`attnscope.executor.RayExecutor` (``--ray``): :meth:`fold` folds mergeable maps
    analyses where the maps are made (they never leave the workers), :meth:`maps` returns the
    maps of planned batches in plan order, :meth:`stream` folds the streaming statistics.
    """

    def __init__(self, ray, workers: int):
        self.ray, self.workers = ray, workers

    def stream(self, lm, sequences, stats, *, chunk: int = 0, batch_size: int = 1,
               targets=None) -> None:
        """The streaming long-context statistics of ``sequences`` on the workers, merged into
        ``stats`` in order (:func:`stream_stats_on_ray`)."""
        stream_stats_on_ray(lm, sequences, stats, workers=self.workers, chunk=chunk,
                            batch_size=batch_size, targets=targets)

    def tasks(self, lm, step, items: Sequence, uids: Sequence[int]) -> Iterator[tuple[int, dict]]:
        """``(uid, step(lm, item))`` for each item, run on the workers, as the records arrive."""
        worker = {"model": ModelParcel.pack(lm), "mode": "tasks", "step": step,
                  "options": ExtractOptions(max_seq_len=min(lm.max_positions, 128)).as_dict()}
        try:
            for uid, result in map_units(self.ray, list(items), list(uids), worker, self.workers):
                yield uid, result["record"]
        except AttnscopeError:
            raise
        except Exception as exc:
            raise _ray_failure(exc, "tasks") from None

    def maps(self, extractor, planned: list[list]) -> Iterator:
        """The maps of each planned batch, run on the workers ahead of the caller and returned
        in plan order (one unit per batch)."""
        units = [Unit(i, [(list(range(len(b))), b)]) for i, b in enumerate(planned)]
        worker = {"model": ModelParcel.pack(extractor.lm), "options": extractor.options.as_dict(),
                  "mode": "maps"}
        try:
            for uid, (k, result) in enumerate(map_units(self.ray, units, [u.uid for u in units], worker,
                                                        self.workers, ordered=True)):
                assert k == uid, (k, uid)
                yield result["maps"][0]
        except AttnscopeError:
            raise
        except Exception as exc:
            raise _ray_failure(exc, "analysis") from None

    def write_store(self, extractor, examples: list, *, root: Path | None = None, shard_size: int = 1,
                    dtype: str = "float16", done: Iterable[int] = (),
                    progress: Callable[[int, int], None] | None = None, analyses: Sequence = (),
                    unit_examples: int | None = None) -> tuple[int, int]:
        """Run ``extractor``'s plan of ``examples`` on the workers, which write the shards of the
        store folder ``root`` (opened by :func:`~attnscope.store.writer.open_store_job`; those
        in ``done`` are on disk already; None: no store) themselves, and fold the maps, as the
        store holds them, into copies of ``analyses``, merged back here in unit order. Returns
        ``(units, units run)``; ``progress(examples_done, tokens_done)`` after each unit."""
        for a in analyses:
            if getattr(a, "consumes", "maps") != "maps":
                raise AttnscopeError(f"analysis '{a.name}' runs the model itself; it cannot be "
                                     "distributed over maps")
        size, stats, done = shard_size, extractor.stats, set(done)
        units = plan_units(extractor, examples, size, unit_examples or size)
        todo = [u for u in units if not (root is not None and u.shards(size) <= done and not analyses)]
        stats.examples_out = sum(u.examples for u in units)
        stats.tokens = sum(u.tokens for u in units)
        run_ids = {u.uid for u in todo}
        ex_done = sum(u.examples for u in units if u.uid not in run_ids)
        tok_done = sum(u.tokens for u in units if u.uid not in run_ids)
        if progress is not None:
            progress(ex_done, tok_done)
        worker = {"model": ModelParcel.pack(extractor.lm), "options": extractor.options.as_dict(),
                  "mode": "extract", "root": str(root) if root is not None else None,
                  "shard_size": size, "dtype": dtype, "done": sorted(done), "analyses": list(analyses)}
        partials: dict[int, list] = {}
        by_id = {u.uid: u for u in todo}
        try:
            for uid, result in map_units(self.ray, todo, [u.uid for u in todo], worker, self.workers):
                partials[uid] = result["analyses"]
                ex_done += by_id[uid].examples
                tok_done += by_id[uid].tokens
                if progress is not None:
                    progress(ex_done, tok_done)
        except AttnscopeError:
            raise
        except Exception as exc:  # a Ray failure (worker lost for good, cluster gone)
            raise _ray_failure(exc, str(root) if root is not None else "extraction",
                               store=root is not None) from None
        for uid in sorted(partials):  # unit order: the result does not depend on who ran what
            for a, p in zip(analyses, partials[uid]):
                a.merge(p)
        return len(units), len(todo)

    def fold(self, extractor, examples: Iterable, analyses: list, *,
             on_unit: Callable[[list[list]], None] | None = None,
             unit_examples: int | None = None) -> None:
        """Fold the maps of ``examples`` into ``analyses`` on the workers; no map comes back.

        The driver plans (``extractor``'s plan; its ``stats`` count what a local run counts)
        and cuts the plan into units of whole batches (at least ``unit_examples`` examples,
        default :data:`UNIT_EXAMPLES`);
        each worker runs a unit's batches and folds them into fresh copies of ``analyses``
        (mergeable accumulators of maps: ``update`` / ``merge``). The driver merges the copies
        into ``analyses`` in unit order (never arrival order, so the result does not depend on
        the number of workers), and after each merge calls ``on_unit(batches)`` with that unit's
        planned batches (lists of encoded examples, in plan order): the place for progress and
        for what has to run in this process, batched as a local run batches it (e.g. gradients
        through this process's model), while the workers go on with the later units.
        """
        for a in analyses:
            if getattr(a, "consumes", "maps") != "maps":
                raise AttnscopeError(f"analysis '{a.name}' runs the model itself; it cannot be "
                                     "folded on the workers")
        units = plan_units(extractor, examples, 1, unit_examples or UNIT_EXAMPLES)
        stats = extractor.stats
        stats.examples_out += sum(u.examples for u in units)
        stats.tokens += sum(u.tokens for u in units)
        worker = {"model": ModelParcel.pack(extractor.lm), "options": extractor.options.as_dict(),
                  "mode": "extract", "analyses": analyses}
        waiting: dict[int, list] = {}  # partial analyses of units that arrived ahead of their turn
        turn = 0
        try:
            for uid, result in map_units(self.ray, units, [u.uid for u in units], worker, self.workers):
                waiting[uid] = result["analyses"]
                while turn in waiting:
                    for a, p in zip(analyses, waiting.pop(turn)):
                        a.merge(p)
                    if on_unit is not None:
                        on_unit([planned for _, planned in units[turn].batches])
                    turn += 1
        except AttnscopeError:
            raise
        except Exception as exc:
            raise _ray_failure(exc, "analysis") from None
