"""Where a family's passes run, and the one loop that runs them.

A family never loops over a corpus: it hands the pipeline a *pass* (a source, the analyses to
feed, how the maps are made) and gets back the finalized results (:func:`run_pass`, reached as
:meth:`attnscope.families.base.Passes.run`). The pipeline owns everything else:

- the executor (:class:`LocalExecutor`, or :class:`RayExecutor` behind ``--ray``), handed to
  the family in its context, decides where the forward passes run; no family asks which one
  it has;
- the extractor plans length-bucketed batches (the same plan on every executor), counts what
  was skipped, and reports progress;
- maps analyses (:class:`~attnscope.analyses.base.MapsAnalysis`) are folded where the maps are
  made (on Ray: on the workers; the maps never come back), and encoded analyses
  (:class:`~attnscope.analyses.base.EncodedAnalysis`) run here on the same planned batches; one
  that reads the forward pass through hook points (``hooks(batch)``, e.g. key vectors) rides
  along on the maps pass when the maps are made here, and runs its own pass otherwise;
- a store is read back shard by shard, and an empty pass is refused with one message;
- a step made of units of its own (the atlas's tasks: a prefill and greedy answers each) runs
  unit by unit through :meth:`LocalExecutor.tasks`, here or on the workers, each finished
  unit kept in a resumable log (:class:`~attnscope.store.checkpoints.UnitLog`).

Results do not depend on the executor: the Ray tests compare both on every family that uses it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from attnscope.analyses.base import Analysis, Result, check_requirements
from attnscope.engines.plan import Plan
from attnscope.engines.streaming import stream_stats
from attnscope.errors import AttnscopeError
from attnscope.extract.encode import Encoder
from attnscope.extract.runner import ExtractOptions, Extractor, ExtractStats, small_matrix_threads
from attnscope.maps import AttentionBatch
from attnscope.on_ray.cluster import RayBatchRunner, ray_session
from attnscope.progress import Progress, check_stop, with_unit
from attnscope.store import Store
from attnscope.store.checkpoints import UnitLog
from attnscope.store.writer import ShardWriter


class LocalExecutor:
    """Every forward pass in this process."""

    name = "local"
    workers = 1
    remote = False  # the forward passes (and maps analyses) run in this process

    def run_batches(self, extractor, planned: Iterable[list]) -> Iterator[tuple[list, AttentionBatch]]:
        """``(planned batch, its maps)`` for each planned batch of encoded examples, in order."""
        for p in planned:
            yield p, extractor.run_batch(p)

    def write_store(self, job, progress: Callable[[int, int], None] | None = None) -> None:
        """Write the shards of ``job`` (a store opened by
        :func:`~attnscope.store.writer.open_store_job`) that are not on disk yet, from its plan;
        ``progress(examples_done, tokens_done)`` after each batch. :func:`attnscope.jobs.extract_to_store`
        is the job around it (it opens the store and writes its index and manifest last)."""
        extractor, stats = job.extractor, job.stats
        writer = ShardWriter(job.root, job.shard_size, job.dtype, job.done)
        positions: dict[int, list[int]] = {}  # id of a planned batch -> its plan positions

        def todo():
            pos = 0
            for planned in extractor.plan(job.examples):
                where = list(range(pos, pos + len(planned)))
                pos += len(planned)
                if all(writer.shard_of(p) in writer.done for p in where):
                    extractor.count(planned)
                    if progress is not None:
                        progress(stats.examples_out, stats.tokens)
                    continue
                positions[id(planned)] = where
                yield planned

        with small_matrix_threads():
            for planned, batch in self.run_batches(extractor, todo()):
                for p, item in zip(positions.pop(id(planned)), batch.items):
                    writer.add(p, item)
                if progress is not None:
                    progress(stats.examples_out, stats.tokens)
        writer.finish()

    def batches(self, extractor, examples: Iterable) -> Iterator[tuple[list, AttentionBatch]]:
        """``(planned batch of encoded examples, its maps)`` in plan order."""
        return self.run_batches(extractor, extractor.plan(examples))

    def fold(self, extractor, examples: Iterable, analyses: list, *,
             on_unit: Callable[[list[list]], None],
             hooks: Callable[[list], dict] | None = None) -> None:
        """Fold the maps of ``examples`` into the maps ``analyses``; ``on_unit(batches)`` after
        each batch with the planned batches just folded. ``hooks(planned)``: the forward
        helper's hook points to call during each batch's pass (here only)."""
        for planned in extractor.plan(examples):
            batch = extractor.run_batch(planned, hooks=hooks(planned) if hooks else None)
            for a in analyses:
                a.update(batch)
            on_unit([planned])

    def stream(self, lm, sequences: Sequence[Sequence[int]], stats, *, chunk: int = 0,
               batch_size: int = 1, targets: Sequence | None = None, units=None,
               progress: Callable[[int], None] | None = None, plan: Plan | None = None) -> int:
        """The long-context statistics of ``sequences`` folded into ``stats`` inside attention
        (:func:`~attnscope.engines.streaming.stream_stats`, as ``plan`` says: its engine, backend
        and scores' dtype; None: the streaming engine's choice); returns the number of workers that
        ran them (0: this process)."""
        stream_stats(lm, sequences, stats, chunk=chunk, batch_size=batch_size, targets=targets,
                     progress=progress, units=units, plan=plan)
        return 0

    def call(self, lm, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(lm, *args, **kwargs)``: one small pass (one example's maps, a timing probe), in
        this process on every executor (shipping the model to a worker would cost more)."""
        return fn(lm, *args, **kwargs)

    def tasks(self, lm, step: Callable[[Any, Any], dict], items: Sequence, *, log: UnitLog,
              progress: Callable[[int], None] | None = None) -> list[dict]:
        """``step(lm, item)``, a JSON-able record, for every item, in item order (a task's
        prefill and answers, a document's pass): an item whose record ``log`` holds from an
        earlier run of the same job is not run again, and each new record is kept in ``log`` as
        soon as it is made. ``step`` is a picklable callable (it travels to Ray workers)."""
        return _resumed(items, log, progress, lambda item, out: step(lm, item))

    def chain(self, lm, step: Callable[[Any, Any, dict | None], dict], items: Sequence, *, log: UnitLog,
              progress: Callable[[int], None] | None = None) -> list[dict]:
        """``step(lm, item, previous)`` for every item in order, ``previous`` the record of the
        item before (None for the first): one sequence (a training run in chunks), so it runs
        in this process on every executor. Resumes like :meth:`tasks`: the records ``log``
        holds are not made again."""
        return _resumed(items, log, progress, lambda item, out: step(lm, item, out[-1] if out else None))


def _resumed(items: Sequence, log: UnitLog, progress: Callable[[int], None] | None,
             make: Callable[[Any, list[dict]], dict]) -> list[dict]:
    """``make(item, records so far)`` for every item in order, but those whose record ``log``
    holds from an earlier run of the same job; each new record kept in ``log`` as it is made."""
    out: list[dict] = []
    for i, item in enumerate(items):
        record = log.done.get(i)
        if record is None:
            check_stop()
            record = log.add(i, make(item, out))
        out.append(record)
        if progress is not None:
            progress(1)
    return out


class RayExecutor(LocalExecutor):
    """The forward passes on ``workers`` Ray workers (``--ray``, ``docs/scale.md``); open it
    with :func:`executor`. Maps analyses fold on the workers; what needs this process's model
    (gradients) runs here, unit by unit, while the workers go on."""

    name = "ray"
    remote = True

    def __init__(self, runner):
        self.runner = runner
        self.workers = runner.workers

    def run_batches(self, extractor, planned: Iterable[list]) -> Iterator[tuple[list, AttentionBatch]]:
        """The workers run the batches ahead of the caller; the maps come back in order."""
        planned = list(planned)
        if planned:
            for p, batch in zip(planned, self.runner.maps(extractor, planned)):
                extractor.count(p)
                yield p, batch

    def fold(self, extractor, examples: Iterable, analyses: list, *,
             on_unit: Callable[[list[list]], None], hooks=None) -> None:
        """``hooks`` cannot reach the workers: the pass gives none here (see :func:`run_pass`)."""
        self.runner.fold(extractor, examples, analyses, on_unit=on_unit)

    def stream(self, lm, sequences, stats, *, chunk: int = 0, batch_size: int = 1, targets=None,
               units=None, progress: Callable[[int], None] | None = None, plan: Plan | None = None) -> int:
        if units is not None or (plan is not None and plan.here):
            # where the plan says so (word level, eager maps, a backend or scores' dtype asked
            # for, autocast: plan.here_reason), the pass runs here
            return super().stream(lm, sequences, stats, chunk=chunk, batch_size=batch_size,
                                  targets=targets, units=units, progress=progress, plan=plan)
        self.runner.stream(lm, sequences, stats, chunk=chunk, batch_size=batch_size, targets=targets)
        if progress is not None:
            progress(len(sequences))
        return self.workers

    def write_store(self, job, progress: Callable[[int, int], None] | None = None) -> None:
        """The workers run ``job``'s plan and write its shards themselves (the maps never come
        back here): :meth:`~attnscope.on_ray.cluster.RayBatchRunner.write_store`."""
        self.runner.write_store(job.extractor, job.examples, root=job.root, shard_size=job.shard_size,
                                dtype=job.dtype, done=job.done, progress=progress,
                                unit_examples=job.shard_size)

    def tasks(self, lm, step, items: Sequence, *, log: UnitLog,
              progress: Callable[[int], None] | None = None) -> list[dict]:
        """The items ``log`` does not hold yet run on the workers (each loads the model once);
        the records are kept in ``log`` as they arrive and returned in item order."""
        todo = [i for i in range(len(items)) if i not in log.done]
        if progress is not None and len(todo) < len(items):
            progress(len(items) - len(todo))
        for i, record in self.runner.tasks(lm, step, [items[i] for i in todo], todo):
            log.add(i, record)
            if progress is not None:
                progress(1)
        return [log.done[i] for i in range(len(items))]


@contextmanager
def executor(ray: bool = False, workers: int = 1):
    """The executor of a job: local, or (``ray``) a Ray session with ``workers`` workers that
    stays open for the whole block."""
    if not ray:
        yield LocalExecutor()
        return
    with ray_session(workers) as session:
        yield RayExecutor(RayBatchRunner(session, workers))


# ---------------------------------------------------------------------------------------------
# The pass


@dataclass
class PassOutcome:
    """What a pass gave: each analysis's result by name, how many examples were analysed, the
    extraction's counts (skipped examples, warnings; None for a store) and the time each
    analysis took (the maps analyses on Ray together, as the workers' wall time)."""

    results: dict[str, Result]
    analysed: int
    stats: Any = None
    seconds: float = 0.0
    analysis_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def skipped(self) -> int:
        return len(self.stats.skipped) if self.stats is not None else 0


def available(source, model=None, options=None) -> set[str]:
    """What a pass over ``source`` with ``model`` has, in the words an analysis ``requires``
    (:data:`~attnscope.analyses.base.REQUIREMENTS`): the model and whether it is causal, word-level
    maps (the options, or the store's level), and the annotations some example carries (a store's
    examples are read from its shard headers, not its maps)."""
    out = set()
    if model is not None:
        out |= {"model"} | ({"causal"} if model.facts.causal else set())
    if isinstance(source, Store):
        word_level = source.level == "word"
        annotations = ((r["example"].get("heads"), r["example"].get("relns"), r["example"].get("coref"))
                       for shard in source.shards() for r in source.shard_records(shard.name))
    else:
        word_level = bool(options is not None and options.word_level)
        annotations = ((e.heads, e.relns, e.fields.get("coref")) for e in source)
    out |= {"word_level"} if word_level else set()
    for heads, relns, coref in annotations:
        out |= {"dependencies"} if heads is not None and relns is not None else set()
        out |= {"coreference"} if coref is not None else set()
        if {"dependencies", "coreference"} <= out:
            break
    return out


def run_pass(source, analyses: Sequence[Analysis], *, model=None, options=None,
             executor: LocalExecutor | None = None, step: str = "analyse",
             progress: Progress | None = None, note: str | None = None, family: str = "") -> PassOutcome:
    """Feed every analysis once from ``source`` and finalize them.

    ``source``: examples (a list of :class:`~attnscope.data.records.Example`; ``model`` runs
    them with ``options``, an :class:`~attnscope.extract.runner.ExtractOptions`) or an opened
    store (its maps are read back; encoded analyses then need ``model``). ``progress(step,
    done, total)`` is called after every batch. Refuses a pass that analysed nothing (with
    ``note``, one line on why that may be, e.g. examples packed for another tokenizer), and,
    before any forward pass, an analysis whose ``requires`` the pass lacks (naming ``family``).
    """
    if any(a.requires for a in analyses):
        check_requirements(analyses, available(source, model, options), family)
    executor = executor or LocalExecutor()
    maps_side = [a for a in analyses if a.consumes == "maps"]
    encoded_side = [a for a in analyses if a.consumes == "encoded"]
    timings = {a.name: 0.0 for a in analyses}
    total = len(source)
    done = 0

    def feed(targets: Sequence[Analysis], batch) -> None:
        for a in targets:
            t = time.perf_counter()
            a.update(batch)
            timings[a.name] += time.perf_counter() - t

    def advance(k: int) -> None:
        nonlocal done
        check_stop()
        done += k
        if progress is not None:
            progress(with_unit(step, "examples"), done, total)

    t0 = time.perf_counter()
    if isinstance(source, Store):  # the maps are on disk
        if encoded_side and model is None:
            raise AttnscopeError(f"analysis '{encoded_side[0].name}' runs the model; a store holds "
                                 "only the maps (give model)", params=("model",))
        encoder = Encoder(model) if encoded_side else None
        for batch in source.batches():
            feed(maps_side, batch)
            if encoded_side:
                feed(encoded_side, [encoder.encode(m.example, m.index) for m in batch])
            advance(len(batch))
        stats = None
    else:
        if model is None:
            raise AttnscopeError("examples need a model (or pass a store)", params=("model",))
        stats = ExtractStats()
        extractor = Extractor(model, options or ExtractOptions(), stats)
        # an encoded analysis that reads the forward pass through hook points rides along on the
        # maps pass where the maps are made here; elsewhere it runs its own pass in on_unit
        riders = ([a for a in encoded_side if hasattr(a, "hooks")]
                  if maps_side and not executor.remote else [])
        rest = [a for a in encoded_side if a not in riders]

        def on_unit(batches: list[list]) -> None:
            for planned in batches:
                feed(rest, planned)
                advance(len(planned))

        def hooks(planned: list) -> dict[str, list]:
            out: dict[str, list] = {}
            for a in riders:
                for point, fn in a.hooks(planned).items():
                    out.setdefault(point, []).append(fn)
            return out

        if not maps_side:  # the analyses run the model themselves: no maps are made
            for planned in extractor.plan(source):
                on_unit([planned])
        else:
            tw = time.perf_counter()
            executor.fold(extractor, source, maps_side, on_unit=on_unit, hooks=hooks if riders else None)
            if executor.remote:  # the maps analyses ran on the workers: their wall time
                wall = time.perf_counter() - tw - sum(timings[a.name] for a in encoded_side)
                for a in maps_side:
                    timings.pop(a.name, None)
                timings["maps analyses on the workers (wall)"] = wall
    if progress is not None and done < total:  # every example was read; the rest were skipped
        progress(with_unit(step, "examples"), total, total)
    if done == 0:
        raise AttnscopeError("no examples to analyse (all were empty"
                             + (f" or longer than max_seq_len {options.max_seq_len})" if options else ")")
                             + (f"; {note}" if note else ""), params=("max_seq_len",))
    results = {a.name: a.finalize() for a in analyses}
    return PassOutcome(results, done, stats, time.perf_counter() - t0, timings)
