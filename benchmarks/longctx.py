"""Long-context benchmark: the streaming engine against eager maps and the bare sdpa forward.

For each length, on the same document (consecutive WikiText-2 articles from ../shared/data,
joined in order and cut to the length; a repeated demo text when that folder is absent), each
mode runs in its own process:

  maps       eager attention with every layer's [B H n n] maps returned (output_attentions),
             then the same statistics computed from the maps
  streaming  attnscope's streaming engine, one pass: the statistics and each layer's output
             (the model's own sdpa does not run), through the backend the engine picks for the
             device (engines/backends.py): on CUDA fused FlexAttention (engines/flex.py), on the
             CPU one call of the compiled kernel per layer (engines/native.py)
  streaming-flex   the same through the FlexAttention backend on any device (off CUDA it runs
             eagerly, torch's reference implementation, which holds each call's [H n n] scores:
             a check of the mathematics, not a speed)
  streaming-tiles  the same with tiles of whole rows (backend "tiles"; on the CPU with the
             compiled row kernel, ATTNSCOPE_NATIVE=tiles; on a GPU tiles sized from its memory)
  streaming-torch  the tiles without a compiled kernel (ATTNSCOPE_NATIVE=0), as on a machine
             with no C compiler
  streaming-onepass  the same through attnscope's one-pass Triton kernel (engines/onepass.py;
             on CUDA, or under TRITON_INTERPRET=1 on the CPU: the interpreter, not a speed)
  sdpa       the bare forward pass (sdpa, no hooks, no statistics)

and reports wall time, CPU time (user + system) and peak resident memory (ru_maxrss) of the
measured step, and the memory right after loading the model. ``maps`` is skipped when its maps
alone would exceed --mem-cap-gb; any mode is stopped after --timeout seconds. Each streaming
mode first runs the engine on the document's first 256 tokens (on CUDA that compiles the fused
kernels, whose dynamic shapes then serve every length): its seconds are ``warmup_s``, outside
the measured step.

    PYTHONPATH=src python benchmarks/longctx.py --lengths 512 1024 2048 4096
    PYTHONPATH=src python benchmarks/longctx.py --lengths 4096 --bf16-diff
    PYTHONPATH=src python benchmarks/longctx.py --device cuda --lengths 8192 32768 131072
    PYTHONPATH=src python benchmarks/longctx.py --device cuda --lengths 4096 --compare flex tiles
    PYTHONPATH=src python benchmarks/longctx.py --device cuda --lengths 32768 --modes sdpa streaming streaming-onepass
    PYTHONPATH=src python benchmarks/longctx.py --device cuda --dtype bfloat16 --attention-dtype bfloat16 \
        --lengths 32768 131072 --modes sdpa streaming-onepass

``--jsonl FILE`` runs instead every length and mode in this one process (the model loaded once;
not streaming-tiles or streaming-torch, which need a process of their own): each mode warmed at
the measured length under the autocast it is timed with, then timed as the best of ``--repeat``
(3) runs, each row appended to FILE (one JSON line) the moment it is measured, so a run killed
by the shell's ``timeout`` keeps its rows (benchmarks/gpu_session.sh):

    PYTHONPATH=src python benchmarks/longctx.py --device cuda --model .gpu/llama1b --dtype bfloat16 \
        --attention-dtype bfloat16 --lengths 4096 32768 --modes sdpa streaming-onepass --jsonl rows.jsonl

``--device cuda`` also reports torch.cuda.max_memory_allocated (every mode, sdpa included);
the streaming modes there run the fused FlexAttention backend (streaming, streaming-flex) or the
GPU-sized tiles (streaming-tiles). ``--compare A B`` runs the streaming engine through backends
A and B in their own processes and reports the largest difference of every statistic (on CUDA,
``flex tiles`` holds the fused backend to the tiles, which equal the eager maps there). None of
this has been run on a GPU yet (none was available when the fused backend was written).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from rowfile import RowFile, usage_error  # benchmarks/rowfile.py, beside this script

MODES = ["sdpa", "streaming", "streaming-flex", "streaming-tiles", "streaming-torch", "streaming-onepass", "maps"]
#: the streaming engine's backend per mode (engines/backends.py)
BACKEND = {"streaming": "auto", "streaming-flex": "flex", "streaming-tiles": "tiles", "streaming-torch": "tiles",
           "streaming-onepass": "onepass"}
ROOT = Path(__file__).resolve().parents[1]
WIKITEXT = ROOT.parent / "shared" / "data" / "wikitext-2" / "valid.sentences.txt"
if not WIKITEXT.is_file():
    WIKITEXT = Path("/work/shared/data/wikitext-2/valid.sentences.txt")


def document(lm, n: int) -> list[int]:
    from attnscope.data.unlabeled import prepare_documents

    if WIKITEXT.is_file():
        docs = prepare_documents(WIKITEXT, lm.tokenizer, max_seq_len=n, join=True, num_docs=1)
        ids = docs[0].ids
    else:
        demo = (ROOT / "src" / "attnscope" / "demo_data" / "text.txt").read_text()
        ids = lm.tokenizer(demo * (n // 50 + 1))["input_ids"][:n]
    if len(ids) < n:
        raise SystemExit(f"only {len(ids)} tokens of text for length {n}")
    return ids


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def worker(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    from attnscope.analyses.longctx import LongContextStats
    from attnscope.engines.streaming import maps_update, stream_stats
    from attnscope.models import load_model
    from attnscope.models.forward import forward, pad_batch

    lm = load_model(args.model)
    lm.model.to(args.device)
    ids = document(lm, args.length)
    # warm-up on 16 tokens: the weights are memory-mapped and only become resident when first
    # used, which would otherwise be counted (and timed) as the measured step's
    warm = pad_batch(lm, [ids[:16]])
    warm.input_ids = warm.input_ids.to(args.device)
    warm.attention_mask = warm.attention_mask.to(args.device)
    forward(lm, warm, lean_mask=True)
    backend = args.backend or BACKEND.get(args.worker, "auto")
    warmup = 0.0
    if args.worker.startswith("streaming"):  # compiles the fused kernels on CUDA
        w0 = time.perf_counter()
        stream_stats(lm, [ids[:256]], LongContextStats(js_rows=args.js_rows), backend=backend,
                     attention_dtype=args.attention_dtype)
        warmup = time.perf_counter() - w0
    after_load = current_rss_mb()
    peak_before = rss_mb()
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    autocast = torch.autocast(device_type=args.device, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16")
    t0, c0 = time.perf_counter(), time.process_time()
    stats = LongContextStats(js_rows=args.js_rows)
    with autocast:
        if args.worker == "maps":
            maps_update(lm, [ids], stats, keep_all=True)
        elif args.worker.startswith("streaming"):
            stream_stats(lm, [ids], stats, chunk=args.chunk, backend=backend,
                         attention_dtype=args.attention_dtype)
        else:
            inputs = pad_batch(lm, [ids])
            inputs.input_ids = inputs.input_ids.to(args.device)
            inputs.attention_mask = inputs.attention_mask.to(args.device)
            forward(lm, inputs, lean_mask=True)
    if args.device == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = {"mode": args.worker, "length": args.length, "dtype": args.dtype, "device": args.device,
           "threads": args.threads, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
           "rss_after_load_mb": round(after_load), "peak_rss_mb": round(rss_mb()),
           "peak_rss_before_step_mb": round(peak_before)}
    if args.device == "cuda":
        out["cuda_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2 ** 20)
    if args.worker != "sdpa":
        from attnscope.engines import native
        from attnscope.engines.backends import choose

        if args.worker.startswith("streaming"):
            out["attention_dtype"] = args.attention_dtype
            out["backend"] = choose(backend, args.device, token_level=True, probe=False, tokens=len(ids))
            out["warmup_s"] = round(warmup, 2)
            out["kernel"] = (out["backend"] if out["backend"] in ("flex", "onepass") else
                             ("flash" if out["backend"] == "compiled" else "tiles")
                             if args.worker != "streaming-torch" and native.available(args.device) else "torch")
        means = stats.means()
        out["sink_heads"] = int((means["sink"] > 0.3).sum())
        if args.save_means:
            import numpy as np

            np.savez(args.save_means, **{k: v for k, v in means.items()})
    return out


def in_process(args) -> None:
    """``--jsonl``: the model loaded once, every length and mode measured in turn in this process,
    each row appended to ``args.jsonl`` the moment it is measured (rowfile.RowFile).

    Each mode runs once at the measured length under the autocast it is timed with (``warmup_s``:
    the weights made resident, sdpa's and the fused kernels' first-use costs, the kernels'
    compiling), then ``--repeat`` times: ``times_s`` all of them, ``wall_s`` the best and
    ``cpu_s`` that run's CPU time. On CUDA ``cuda_peak_mb`` is the peak of the warm-up and the
    runs. A mode that raises (out of GPU memory, say) gives a ``failed`` row and the next goes on.
    """
    import torch

    from attnscope.analyses.longctx import LongContextStats
    from attnscope.engines.backends import choose
    from attnscope.engines.streaming import maps_update, stream_stats
    from attnscope.models import load_model
    from attnscope.models.forward import forward, pad_batch

    torch.set_num_threads(args.threads)
    emit = RowFile(args.jsonl)
    cuda = args.device == "cuda"

    def clock(fn):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        if cuda:
            torch.cuda.synchronize()
        return out, time.perf_counter() - t0, time.process_time() - c0

    def load():
        lm = load_model(args.model)
        lm.model.to(args.device)
        return lm

    lm, load_s, _ = clock(load)
    base = {"script": "longctx", "model": Path(args.model).name or args.model, "device": args.device,
            "dtype": args.dtype}
    emit({**base, "mode": "load", "load_s": round(load_s, 2), "torch": torch.__version__,
          "gpu": torch.cuda.get_device_name() if cuda else None})
    autocast = torch.autocast(device_type=args.device, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16")
    for n in args.lengths:
        ids = document(lm, n)
        sdpa = {}
        for mode in args.modes:
            row = {**base, "mode": mode, "length": n}
            backend = args.backend or BACKEND.get(mode, "auto")
            if mode == "streaming-onepass" and not cuda and os.environ.get("TRITON_INTERPRET") != "1":
                emit({**row, "skipped": "the one-pass kernel needs CUDA or TRITON_INTERPRET=1"})
                continue
            if mode.startswith("streaming"):
                row.update(attention_dtype=args.attention_dtype,
                           backend=choose(backend, args.device, token_level=True, probe=False, tokens=n))
            if mode == "maps" and maps_gb(lm, n) > args.mem_cap_gb:
                emit({**row, "skipped": f"maps alone need {maps_gb(lm, n):.1f} GB > --mem-cap-gb {args.mem_cap_gb}"})
                continue

            def once(mode=mode, backend=backend):
                stats = LongContextStats(js_rows=args.js_rows)
                with autocast:
                    if mode == "maps":
                        maps_update(lm, [ids], stats, keep_all=True)
                    elif mode.startswith("streaming"):
                        stream_stats(lm, [ids], stats, chunk=args.chunk, backend=backend,
                                     attention_dtype=args.attention_dtype)
                    else:
                        forward(lm, inputs, lean_mask=True)
                return stats

            inputs = pad_batch(lm, [ids])
            inputs.input_ids = inputs.input_ids.to(args.device)
            inputs.attention_mask = inputs.attention_mask.to(args.device)
            try:
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                _, warm, _ = clock(once)
                runs = [clock(once) for _ in range(args.repeat)]
            except Exception as exc:  # noqa: BLE001 (the row says what failed; the next mode goes on)
                emit({**row, "failed": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"})
                if cuda:
                    torch.cuda.empty_cache()
                continue
            stats, wall, cpu = min(runs, key=lambda r: r[1])
            row.update(warmup_s=round(warm, 3), times_s=[round(r[1], 3) for r in runs], wall_s=round(wall, 3),
                       cpu_s=round(cpu, 3))
            if cuda:
                row["cuda_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2 ** 20)
            if mode == "sdpa":
                sdpa = row
            elif "wall_s" in sdpa:
                row["over_sdpa_wall"] = _ratio(wall, sdpa["wall_s"])
                if cuda:
                    row["over_sdpa_cuda_peak"] = round(row["cuda_peak_mb"] / max(1, sdpa["cuda_peak_mb"]), 2)
            if mode != "sdpa":
                row["sink_heads"] = int((stats.means()["sink"] > 0.3).sum())
            emit(row)


def maps_gb(lm, n: int) -> float:
    """What the eager maps of every layer take at ``n`` tokens, float32."""
    return lm.num_layers * lm.num_heads * n * n * 4 / 2 ** 30


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None  # (a tiny model's step can round to 0.0 s)


def run_one(args, mode: str, n: int, dtype: str, save: str | None = None, backend: str | None = None,
            attention: str | None = None) -> dict:
    cmd = [sys.executable, __file__, "--worker", mode, "--length", str(n), "--model", args.model,
           "--device", args.device, "--dtype", dtype, "--threads", str(args.threads),
           "--chunk", str(args.chunk), "--js-rows", str(args.js_rows),
           "--attention-dtype", attention or args.attention_dtype]
    if save:
        cmd += ["--save-means", save]
    if backend:
        cmd += ["--backend", backend]
    if mode == "maps":
        import math

        need = 30 * 9 * n * n * 4 / 2 ** 30 if args.model == "smollm2" else math.nan
        if need > args.mem_cap_gb:
            return {"mode": mode, "length": n, "dtype": dtype,
                    "skipped": f"maps alone need {need:.1f} GB > --mem-cap-gb {args.mem_cap_gb}"}
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=str(ROOT / "src"))
    if mode in ("streaming-tiles", "streaming-torch"):
        env["ATTNSCOPE_NATIVE"] = "0" if mode == "streaming-torch" else "tiles"
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"mode": mode, "length": n, "dtype": dtype, "stopped": f"over {args.timeout} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"mode": mode, "length": n, "dtype": dtype, "failed": f"exit {p.returncode}: {tail}"}
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--modes", nargs="+", default=["sdpa", "streaming", "maps"],
                    choices=MODES)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--attention-dtype", default="float32", choices=["float32", "bfloat16"],
                    help="what the streaming modes' scores are made of (stream_stats' attention_dtype): "
                         "float32 attention modules under --dtype bfloat16, or q, k, v rounded to "
                         "bfloat16 as the bare sdpa forward multiplies them")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=0, help="rows per tile; 0: automatic (tiled.auto_tile)")
    ap.add_argument("--js-rows", type=int, default=8)
    ap.add_argument("--timeout", type=int, default=480)
    ap.add_argument("--mem-cap-gb", type=float, default=12.0)
    ap.add_argument("--bf16-diff", action="store_true",
                    help="streaming in float32, in bfloat16 (float32 attention modules) and in "
                         "bfloat16 with q, k, v rounded to bfloat16 at each length: time ratios, the "
                         "largest difference of each statistic to the float32 run")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"),
                    help="the streaming engine through backends A and B (flex, compiled, onepass, tiles) at each "
                         "length: times, largest difference of each statistic")
    ap.add_argument("--load-times", action="store_true",
                    help="time load_model(--model) twice in fresh processes with an empty cache "
                         "folder: the first load converts (GGUF), the second reads the cache")
    ap.add_argument("--out", type=Path, help="also write the rows as JSON here")
    ap.add_argument("--jsonl", type=Path,
                    help="one process: the model loaded once, every length and mode measured in turn (warmed "
                         "at the measured length, best of --repeat), each row appended to this JSON Lines "
                         "file the moment it is measured (--timeout does not apply: use the shell's timeout)")
    ap.add_argument("--repeat", type=int, default=3, help="with --jsonl: timed runs per mode, the best reported")
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--length", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--save-means", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return
    if args.jsonl:
        other = [f for f, on in (("--compare", args.compare), ("--bf16-diff", args.bf16_diff),
                                 ("--load-times", args.load_times), ("--out", args.out)) if on]
        own = [m for m in args.modes if m in ("streaming-tiles", "streaming-torch")]
        if other:
            usage_error("longctx.py", f"--jsonl measures --modes in one process; it does not take {other[0]}")
        if own:
            usage_error("longctx.py", f"--jsonl: {own[0]} needs a process of its own (ATTNSCOPE_NATIVE); "
                                      "leave out --jsonl")
        if args.repeat < 1:
            usage_error("longctx.py", f"--repeat must be at least 1, not {args.repeat}")
        in_process(args)
        return
    if args.load_times:
        import tempfile

        code = ("import time; t = time.perf_counter(); from attnscope.models import load_model; "
                f"lm = load_model({args.model!r}); print(round(time.perf_counter() - t, 1))")
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, ATTNSCOPE_CACHE=cache, PYTHONPATH=str(ROOT / "src"))
            for which in ("first (empty cache)", "second (cached)"):
                p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
                print(json.dumps({"model": args.model, "load": which,
                                  "seconds": p.stdout.strip().splitlines()[-1] if p.stdout.strip() else None}))
        return
    rows = []
    for n in args.lengths:
        if args.compare:
            import tempfile

            import numpy as np

            a_name, b_name = args.compare
            with tempfile.TemporaryDirectory() as tmp:
                a = run_one(args, "streaming", n, args.dtype, f"{tmp}/a.npz", a_name)
                b = run_one(args, "streaming", n, args.dtype, f"{tmp}/b.npz", b_name)
                row = {"length": n, a_name: a, b_name: b}
                if Path(f"{tmp}/a.npz").is_file() and Path(f"{tmp}/b.npz").is_file():
                    fa, fb = np.load(f"{tmp}/a.npz"), np.load(f"{tmp}/b.npz")
                    row["max_abs_diff"] = {k: float(np.nanmax(np.abs(fa[k] - fb[k]))) for k in fa.files}
            print(json.dumps(row), flush=True)
            rows.append(row)
            continue
        if args.bf16_diff:
            import tempfile

            import numpy as np

            with tempfile.TemporaryDirectory() as tmp:
                a = run_one(args, "streaming", n, "float32", f"{tmp}/f32.npz", attention="float32")
                b = run_one(args, "streaming", n, "bfloat16", f"{tmp}/bf16.npz", attention="float32")
                c = run_one(args, "streaming", n, "bfloat16", f"{tmp}/att.npz", attention="bfloat16")
                row = {"length": n, "float32": a, "bfloat16": b, "bfloat16_attention": c}
                fa = np.load(f"{tmp}/f32.npz") if Path(f"{tmp}/f32.npz").is_file() else None
                for name, run, file in (("bf16", b, "bf16"), ("bf16_attention", c, "att")):
                    if fa is not None and Path(f"{tmp}/{file}.npz").is_file():
                        fb = np.load(f"{tmp}/{file}.npz")
                        row[f"max_abs_diff_{name}"] = {k: float(np.nanmax(np.abs(fa[k] - fb[k]))) for k in fa.files}
                        row[f"time_ratio_{name}_over_f32"] = round(run["wall_s"] / a["wall_s"], 2)
            print(json.dumps(row), flush=True)
            rows.append(row)
            continue
        got = {m: run_one(args, m, n, args.dtype) for m in args.modes}
        for m in args.modes:
            print(json.dumps(got[m]), flush=True)
            rows.append(got[m])
        c = got.get("sdpa", {})
        for mode in [m for m in MODES if m.startswith("streaming")]:
            b = got.get(mode, {})
            if "wall_s" in b and "wall_s" in c:
                name = mode.replace("-", "_")
                ratio = {"length": n, f"{name}_over_sdpa_wall": _ratio(b["wall_s"], c["wall_s"]),
                         f"{name}_over_sdpa_cpu": _ratio(b["cpu_s"], c["cpu_s"]),
                         f"{name}_over_sdpa_peak_rss": round(b["peak_rss_mb"] / c["peak_rss_mb"], 2),
                         f"{name}_over_sdpa_step_rss": round(
                             (b["peak_rss_mb"] - b["rss_after_load_mb"]) / max(1, c["peak_rss_mb"] - c["rss_after_load_mb"]), 2)}
                if "cuda_peak_mb" in b and "cuda_peak_mb" in c:
                    ratio[f"{name}_over_sdpa_cuda_peak"] = round(b["cuda_peak_mb"] / max(1, c["cuda_peak_mb"]), 2)
                print(json.dumps(ratio), flush=True)
                rows.append(ratio)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
