"""Benchmark: extraction + analyses in one process against Ray with 1 and 2 workers.

Same inputs (UD EWT dev sentences as ``words``, token level, the packaged model "default"),
same plan (length-sorted batches of 16, shards of 128), same analyses (every registered
analysis that folds maps and needs nothing else), each run writing a float16 store:

(a) one process: the Ray worker's own code (:class:`attnscope.on_ray.cluster.UnitWorker`) called
    here over the same units, no Ray at all: the work itself;
(b) Ray, 1 worker: :func:`attnscope.on_ray.cluster.extract_on_ray` on a local cluster;
(c) Ray, 2 workers: the same with two actors (one model each).

Ray's fixed start-up cost is shown in two parts: starting the local cluster (``ray.init``),
and a job's fixed cost (actors started, model shipped and unpickled, Ray Data's plan), taken
as the time of a one-unit job of 16 sentences, next to what its work alone costs in (a). Every run's store must have the same index (the sha256 of every
shard) and every analysis the same result (to 1e-9 relative); the script says so.

    python benchmarks/ray_scale.py                # 2,001 EWT dev sentences
    python benchmarks/ray_scale.py --limit 300    # a quick look

Timings are wall time, on whatever else the machine is doing: note ``uptime`` alongside.
This machine has 2 cores, so it cannot show scaling past 2 workers (docs/scale.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one torch thread per process, as each actor has

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "ud-ewt" / "en_ewt-ud-dev.conllu"


def analyses_for(lm) -> list:
    import importlib
    import pkgutil

    import attnscope.analyses as pkg
    from attnscope.analyses.base import ANALYSES

    for info in pkgutil.walk_packages(pkg.__path__, prefix="attnscope.analyses."):
        importlib.import_module(info.name)
    return [cls.for_model(lm, seed=0) for _, cls in sorted(ANALYSES.items())
            if cls.consumes == "maps" and not cls.requires]


def one_process(examples, out: Path, lm, options, shard_size: int) -> tuple[float, list, int]:
    """The workers' code in this process: plan, units, run each unit, merge in unit order."""
    from attnscope.on_ray.cluster import UnitWorker, plan_units
    from attnscope.store.writer import open_store_job

    t0 = time.perf_counter()
    analyses = analyses_for(lm)
    job = open_store_job(examples, out, lm, options=options, shard_size=shard_size)
    units = plan_units(job.extractor, job.examples, shard_size, shard_size)
    worker = UnitWorker(lm, options.as_dict(), root=str(out), shard_size=shard_size, analyses=analyses)
    from attnscope.extract.runner import small_matrix_threads

    with small_matrix_threads():
        partials = [worker.run(u)["analyses"] for u in units]
    for part in partials:
        for a, p in zip(analyses, part):
            a.merge(p)
    job.stats.examples_out = sum(u.examples for u in units)
    job.stats.tokens = sum(u.tokens for u in units)
    job.finish()
    return time.perf_counter() - t0, analyses, job.stats.tokens


def on_ray(examples, out: Path, lm, options, shard_size: int, workers: int) -> tuple[float, list]:
    from attnscope.on_ray.cluster import extract_on_ray

    t0 = time.perf_counter()
    res = extract_on_ray(examples, out, lm, options=options, shard_size=shard_size, workers=workers,
                         analyses=analyses_for(lm))
    return time.perf_counter() - t0, res.analyses


def fixed_tokens(examples, lm, options) -> int:
    from attnscope.extract import Extractor

    return sum(len(e) for b in Extractor(lm, options).plan(examples) for e in b)


def same_results(a: list, b: list) -> bool:
    import numpy as np

    for x, y in zip(a, b):
        rx, ry = x.finalize(), y.finalize()
        for k in rx.arrays:
            u, v = rx.arrays[k], ry.arrays[k]
            if u.dtype.kind == "f":
                if not np.allclose(u, v, rtol=1e-9, atol=0, equal_nan=True):
                    return False
            elif not np.array_equal(u, v):
                return False
    return len(a) == len(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--limit", type=int, default=None, help="first N sentences only")
    ap.add_argument("--model", default="default")
    ap.add_argument("--shard-size", type=int, default=128)
    ap.add_argument("--keep", action="store_true", help="keep the stores (printed path)")
    args = ap.parse_args()
    if not args.data.is_file():
        sys.exit(f"{args.data}: not found (the shared EWT corpus); pass --data")

    import logging

    import ray

    from attnscope.data.depparse import iter_depparse
    from attnscope.extract import ExtractOptions
    from attnscope.models import load_model
    from attnscope.on_ray.cluster import worker_runtime_env

    examples = list(iter_depparse(args.data))[: args.limit]
    lm = load_model(args.model)
    options = ExtractOptions(batch_size=16)
    tmp = Path(tempfile.mkdtemp(prefix="ray-scale-"))
    try:
        t_one, ref, tokens = one_process(examples, tmp / "one", lm, options, args.shard_size)
        t0 = time.perf_counter()
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 object_store_memory=512 << 20, runtime_env=worker_runtime_env(),
                 logging_level=logging.WARNING)
        t_init = time.perf_counter() - t0
        fixed = on_ray(examples[:16], tmp / "fixed", lm, options, args.shard_size, 1)[0]
        t_r1, res1 = on_ray(examples, tmp / "ray1", lm, options, args.shard_size, 1)
        t_r2, res2 = on_ray(examples, tmp / "ray2", lm, options, args.shard_size, 2)
        ray.shutdown()
        index = {k: json.loads((tmp / k / "index.json").read_text()) for k in ("one", "ray1", "ray2")}
        stores_same = index["one"] == index["ray1"] == index["ray2"]
        results_same = same_results(ref, res1) and same_results(ref, res2)

        print(f"ray_scale: {len(examples)} sentences, {tokens:,} tokens, model {lm.name} "
              f"({lm.num_layers} layers x {lm.num_heads} heads), {len(ref)} analyses, "
              f"shards of {args.shard_size}, {os.cpu_count()} CPUs, OMP_NUM_THREADS="
              f"{os.environ.get('OMP_NUM_THREADS')}")
        print(f"{'run':<34}{'wall s':>9}{'tokens/s':>11}{'vs 1 process':>14}")
        for name, t in (("(a) 1 process (no Ray)", t_one), ("(b) Ray, 1 worker", t_r1),
                        ("(c) Ray, 2 workers", t_r2)):
            print(f"{name:<34}{t:>9.1f}{tokens / t:>11.0f}{t_one / t:>13.2f}x")
        print(f"Ray 2 workers vs 1 worker: {t_r1 / t_r2:.2f}x faster")
        print(f"Ray fixed start-up: local cluster (ray.init) {t_init:.1f} s; a job of one unit "
              f"(16 sentences, 1 worker) {fixed:.1f} s, of which the work itself is about "
              f"{t_one * fixed_tokens(examples[:16], lm, options) / tokens:.1f} s")
        print(f"per-token cost, 1 process: {1e6 * t_one / tokens:.0f} us/token "
              f"({1e6 * t_one / tokens / (lm.num_layers * lm.num_heads):.2f} us per token per head)")
        print(f"stores identical (index with every shard's sha256): {stores_same}; "
              f"analyses equal (1e-9 relative): {results_same}")
        if args.keep:
            print(f"stores kept in {tmp}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
