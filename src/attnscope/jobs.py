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
from attnscope.extract.runner import ExtractOptions, ExtractStats
from attnscope.models.loading import LoadedModel
from attnscope.store.writer import open_store_job


def extract_to_store(examples: Iterable[Example], out: str | Path, model: LoadedModel | str = "default",
                     *, options: ExtractOptions | None = None, dtype: str = "float16",
                     shard_size: int = 128, resume: bool = False, overwrite: bool = False,
                     source: dict | None = None, command: str | None = None,
                     progress: Callable[[int, int], None] | None = None,
                     executor=None) -> ExtractStats:
    """Extract ``examples`` into the store folder ``out`` and return what happened: the one
    store-writing job, wherever its forward passes run.

    ``progress(examples_done, tokens_done)`` is called after each batch (each unit of batches
    on Ray). A store that exists is refused unless ``resume`` (same inputs and options:
    continue) or ``overwrite``. ``executor``: where the forward passes run and the shards are
    written (:mod:`attnscope.executor`: this process by default; the Ray executor's workers
    write their shards themselves).
    """
    job = open_store_job(examples, out, model, options=options, dtype=dtype, shard_size=shard_size,
                         resume=resume, overwrite=overwrite, source=source, command=command)
    start = time.perf_counter()
    with job.cleanup_on_error():
        (executor or LocalExecutor()).write_store(job, progress)
    job.finish()
    job.stats.elapsed_s = time.perf_counter() - start  # type: ignore[attr-defined]
    return job.stats
