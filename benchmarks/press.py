"""The atlas's press on its two paths, side by side: torch (tiles of rows, ``[rows x n]`` products)
against fused (FlexAttention, no row of scores), with the model's own sdpa forward as the floor.

On the same generated tasks (WikiText-2 haystack from ../shared/data), in one process, for each
path in turn:

  sdpa       the model's own forward over each task's context (what any cache needs once)
  calibrate  a recorded prefill and a recorded greedy answer (the atlas's calibration per task)
  rows       ``--rows`` sweep rows scored teacher-forced on one prefill (half of the KV heads kept,
             seeded per row), the sweep's and the greedy search's inner pass

and prints each time, each over sdpa's, fused over torch, and the largest difference between the
two paths' recorded statistics and log-probabilities. sdpa is warmed on the first task's whole
context under the autocast it is timed with, then timed as the best of three; each path's
calibration is warmed on the first task. With ``--jsonl FILE`` each measurement is also appended
to FILE as one JSON line the moment it is measured (benchmarks/rowfile.py). Off CUDA the fused path runs FlexAttention
eagerly (torch's reference implementation, which holds each call's scores): there it proves the
numbers, not the speed.

    PYTHONPATH=src python benchmarks/press.py --length 1024 --tasks 2
    PYTHONPATH=src python benchmarks/press.py --model .gpu/llama1b --device cuda --dtype bfloat16 --length 32768
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rowfile import RowFile  # benchmarks/rowfile.py, beside this script

ROOT = Path(__file__).resolve().parents[1]
WIKITEXT = ROOT.parent / "shared" / "data" / "wikitext-2" / "valid.sentences.txt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--jsonl", type=Path, help="append one JSON line per measurement to this file as it is measured")
    args = ap.parse_args()
    if not WIKITEXT.is_file():
        raise SystemExit(f"{WIKITEXT}: the shared corpora are missing")
    import numpy as np
    import torch

    from attnscope.data import tasks as T
    from attnscope.engines import press as P
    from attnscope.extract.tasks import encode_task
    from attnscope.models import load_model
    from attnscope.models.forward import ATTN_IMPLEMENTATION
    from attnscope.models.generation import causal_lm_for

    torch.set_num_threads(args.threads)
    emit = RowFile(args.jsonl) if args.jsonl else (lambda row: None)
    base = {"script": "press", "model": Path(args.model).name or args.model, "device": args.device,
            "dtype": args.dtype, "length": args.length, "tasks": args.tasks}
    t0 = time.perf_counter()
    lm = load_model(args.model)
    lm.model.to(args.device)
    model = causal_lm_for(lm).to(args.device)
    emit({**base, "mode": "load", "load_s": round(time.perf_counter() - t0, 2)})
    tok = lm.tokenizer
    hay = T.haystack_sentences(WIKITEXT.read_text(encoding="utf-8"))
    encs = [encode_task(tok, t) for t in T.generate_tasks(tok, count=args.tasks, length=args.length,
                                                           kinds=T.DEFAULT_KINDS, haystack=hay, seed=0)]
    masks = np.stack([np.random.default_rng(r).random((lm.num_layers, lm.num_kv_heads)) < 0.5
                      for r in range(args.rows)])
    dev = torch.device(args.device)

    def clock(fn):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return out, time.perf_counter() - t0

    model.set_attn_implementation("sdpa")
    with torch.no_grad(), torch.autocast(device_type=dev.type, dtype=torch.bfloat16,
                                         enabled=args.dtype == "bfloat16"):
        _, warm = clock(lambda: model(input_ids=torch.tensor([encs[0].context], device=dev)))
        sdpa = [clock(lambda: [model(input_ids=torch.tensor([e.context], device=dev)) for e in encs])[1]
                for _ in range(3)]
    sdpa_s = min(sdpa)
    emit({**base, "mode": "sdpa", "warmup_s": round(warm, 3), "times_s": [round(t, 3) for t in sdpa],
          "wall_s": round(sdpa_s, 3)})
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    ctxs = [P.prefill(lm, model, e) for e in encs]  # the sweep's prefill: the model's own attention
    golds = [tok(" " + ", ".join(e.task.answer), add_special_tokens=False)["input_ids"] for e in encs]

    def calibrate(fused: bool, encs=encs) -> list:
        recs = []
        for e in encs:
            rec = P.Recorder(lm.num_layers, lm.num_heads)
            ctx = P.prefill(lm, model, e, rec, fused=fused)
            P.answer(lm, model, ctx, e, None, sink=4, window=64, recorder=rec, fused=fused)
            recs.append(rec)
        return recs

    def rows(fused: bool) -> list:
        return [P.score(lm, model, c, e, masks, g, sink=4, window=64, fused=fused)[1]
                for c, e, g in zip(ctxs, encs, golds)]

    times, got = {}, {}
    with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16"):
        for fused in (False, True):
            path = "fused" if fused else "torch"
            _, warm = clock(lambda f=fused: calibrate(f, encs[:1]))  # on CUDA the fused path compiles here
            recs, cal_s = clock(lambda f=fused: calibrate(f))
            emit({**base, "mode": f"calibrate-{path}", "warmup_s": round(warm, 3), "wall_s": round(cal_s, 3),
                  "over_sdpa_wall": round(cal_s / sdpa_s, 2)})
            logp, rows_s = clock(lambda f=fused: rows(f))
            emit({**base, "mode": f"rows-{path}", "rows": args.rows, "wall_s": round(rows_s, 3),
                  "over_sdpa_wall": round(rows_s / sdpa_s, 2)})
            times[fused], got[fused] = (cal_s, rows_s), (recs, logp)

    def worst(a, b):
        return max(float(np.abs(x - y).max()) for x, y in zip(a, b))

    rec_diff = max(worst([getattr(r, k) / max(r.rows, 1) for r in got[False][0]],
                         [getattr(r, k) / max(r.rows, 1) for r in got[True][0]])
                   for k in ("streaming", "sink_mass", "previous"))
    emit({**base, "mode": "difference", "recorded_max_abs": rec_diff,
          "logp_max_abs": worst(got[False][1], got[True][1])})
    print(f"{args.model} on {args.device} ({args.dtype}), {len(encs)} tasks of {args.length} context tokens, "
          f"{args.rows} rows, {torch.get_num_threads()} threads")
    print(f"sdpa forward over the contexts: {sdpa_s:8.2f} s")
    for name, k in (("calibrate", 0), ("rows", 1)):
        t, f = times[False][k], times[True][k]
        print(f"{name:10s} torch {t:8.2f} s ({t / sdpa_s:5.1f}x sdpa)   fused {f:8.2f} s ({f / sdpa_s:5.1f}x sdpa)"
              f"   fused / torch {f / t:.2f}x")
    print(f"largest difference: recorded statistics (per row) {rec_diff:.2e}, "
          f"log-probabilities {worst(got[False][1], got[True][1]):.2e}")


if __name__ == "__main__":
    main()
