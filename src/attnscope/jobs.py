"""Jobs that write: a corpus's attention maps into a store (:func:`extract_to_store`).

The store package is the format (its reader, its shard writer, the folder checks); writing a
store is a job, so it lives here, above the executor whose passes make the maps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from attnscope.data.records import Example
from attnscope.executor import LocalExecutor
from attnscope.extract.runner import ExtractOptions, Extractor, ExtractStats, small_matrix_threads
from attnscope.models.loading import LoadedModel
from attnscope.store.writer import ShardWriter, open_store_job


def extract_to_store(examples: Iterable[Example], out: str | Path, model: LoadedModel | str = "default",
                     *, options: ExtractOptions | None = None, dtype: str = "float16",
                     shard_size: int = 128, resume: bool = False, overwrite: bool = False,
                     source: dict | None = None, command: str | None = None,
                     progress: Callable[[int, int], None] | None = None,
                     executor=None) -> ExtractStats:
    """Extract ``examples`` into the store folder ``out`` and return what happened.

    ``progress(examples_done, tokens_done)`` is called after each batch. A store that exists
    is refused unless ``resume`` (same inputs and options: continue) or ``overwrite``.
    ``executor``: where the forward passes run (:mod:`attnscope.executor`; default here).
    """
    job = open_store_job(examples, out, model, options=options, dtype=dtype, shard_size=shard_size,
                         resume=resume, overwrite=overwrite, source=source, command=command)
    start = time.perf_counter()
    writer = ShardWriter(job.root, shard_size, dtype, job.done)
    with job.cleanup_on_error():
        with small_matrix_threads():
            _run_plan(job.extractor, job.examples, writer, job.stats, progress, executor)
    writer.finish()
    job.finish()
    job.stats.elapsed_s = time.perf_counter() - start  # type: ignore[attr-defined]
    return job.stats


def _run_plan(extractor: Extractor, examples: list[Example], writer: ShardWriter, stats: ExtractStats,
              progress: Callable[[int, int], None] | None, executor=None) -> None:
    """Run every planned batch whose shard is not on disk yet on ``executor``; hand the maps to
    the writer."""
    positions: dict[int, list[int]] = {}  # id of a planned batch -> its plan positions

    def todo():
        pos = 0
        for planned in extractor.plan(examples):
            where = list(range(pos, pos + len(planned)))
            pos += len(planned)
            if all(writer.shard_of(p) in writer.done for p in where):
                extractor.count(planned)
                if progress is not None:
                    progress(stats.examples_out, stats.tokens)
                continue
            positions[id(planned)] = where
            yield planned

    for planned, batch in (executor or LocalExecutor()).run_batches(extractor, todo()):
        for p, item in zip(positions.pop(id(planned)), batch.items):
            writer.add(p, item)
        if progress is not None:
            progress(stats.examples_out, stats.tokens)
