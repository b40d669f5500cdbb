"""Every streaming backend this machine runs against the eager maps: the largest difference per statistic.

On the tiny decoders of the tests (debug Llama, Qwen2, Gemma, GPT-2; Qwen2 with a 4-token sliding
window and Gemma 2 soft-capped at 1.0, from tests/engines/test_longctx.py), each with three documents and
two induction probes in padded batches of 2, the per-head statistics of the streaming engine
through each backend (engines/backends.py), in float32 and under bfloat16 autocast, against the
same statistics computed independently (numpy loops) from float32 eager maps
(``tests/engines/test_longctx.reference``). Prints one JSON row per model, backend and dtype, then the
largest difference per statistic over the models.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/engines.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' tiny models and their independent reference

MODELS = ["llama", "qwen2", "gemma", "gpt2", "tiny-qwen2", "tiny-gemma2"]


def main() -> None:
    import torch
    from test_longctx import _docs, _tiny, reference

    from attnscope.analyses.longctx import LongContextStats
    from attnscope.engines import backends
    from attnscope.engines.streaming import stream_stats
    from attnscope.models import load_model

    torch.set_num_threads(1)
    here = [b.name for b in backends.BACKENDS if backends.usable(b.name, "cpu")]
    worst: dict[tuple[str, str], dict[str, float]] = {}
    for name in MODELS:
        torch.manual_seed(0)
        lm = _tiny(name.split("-")[1]) if name.startswith("tiny-") else load_model(f"debug:{name}")
        seqs, targets = _docs(lm)
        ref = reference(lm, seqs, targets, js_rows=3)
        for backend in here:
            for dtype in ("float32", "bfloat16"):
                st = LongContextStats(js_rows=3)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
                    stream_stats(lm, seqs, st, batch_size=2, targets=targets, backend=backend)
                got = st.means()
                diff = {k: float(np.nanmax(np.abs(got[k] - v))) for k, v in ref.items()}
                print(json.dumps({"model": name, "backend": backend, "dtype": dtype, "max_abs_diff": diff}),
                      flush=True)
                acc = worst.setdefault((backend, dtype), {})
                for k, v in diff.items():
                    acc[k] = max(acc.get(k, 0.0), v)
    for (backend, dtype), diff in worst.items():
        print(json.dumps({"models": MODELS, "backend": backend, "dtype": dtype,
                          "max_abs_diff": {k: float(f"{v:.2g}") for k, v in diff.items()}}))


if __name__ == "__main__":
    main()
