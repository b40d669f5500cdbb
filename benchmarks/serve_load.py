"""Load test of the viewer (``attnscope serve``), loopback only and bounded in time.

    python benchmarks/serve_load.py                      # 20 clients, 60 s, 10,000 examples
    python benchmarks/serve_load.py --clients 4 --seconds 10 --examples 500   # a quick look

Builds a synthetic store (random row-normalised maps, no model needed) in a temporary folder,
starts the real ``attnscope serve`` command on 127.0.0.1 with a free port in a child process,
and runs ``--clients`` threads, each with its own keep-alive connection, for ``--seconds``:
a mix of example pages (``/api/example/<pos>`` with a random view), searches
(``/api/examples?q=``) and results (``/api/results``). Prints the requests served, the errors
(any answer other than 200, or a failed connection), median and p99 latency, and the server's
resident memory (VmRSS) before and after the load. Nothing is asserted; the folder is removed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

WORDS = ("the cat dog sat ran on a mat house red old man woman said it was who saw to and of in "
         "attention head layer token word model sentence story paper analysis").split()


def build_store(root: Path, n: int, layers: int = 2, heads: int = 4, seed: int = 0) -> None:
    """A complete store of ``n`` synthetic token-level examples (6 to 24 tokens each)."""
    import numpy as np

    from attnscope.data.io import atomic_write_text
    from attnscope.data.records import Example
    from attnscope.maps import AttentionMap
    from attnscope.store.format import FORMAT_NAME, FORMAT_VERSION, MANIFEST, SHARDS
    from attnscope.store.writer import ShardWriter, _write_index, versions

    rng = np.random.default_rng(seed)
    shard_size = 128
    (root / SHARDS).mkdir(parents=True)
    manifest = {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "status": "incomplete",
        "model": {"name": "synthetic", "source": "benchmarks/serve_load.py", "weights_sha256": "none",
                  "family": "bert", "num_layers": layers, "num_heads": heads},
        "level": "token", "from_word": None, "dtype": "float16", "seed": seed,
        "arguments": {"options": {"max_seq_len": 26}, "dtype": "float16", "shard_size": shard_size},
        "input": {"examples": n}, "versions": versions(), "command": None,
    }
    atomic_write_text(root / MANIFEST, json.dumps(manifest))
    writer = ShardWriter(root, shard_size, "float16", set())
    for i in range(n):
        words = [WORDS[k] for k in rng.integers(0, len(WORDS), rng.integers(4, 23))]
        tokens = ["[CLS]", *words, "[SEP]"]
        t = len(tokens)
        attn = rng.random((layers, heads, t, t)).astype(np.float32)
        attn /= attn.sum(-1, keepdims=True)
        special = np.array([k in (0, t - 1) for k in range(t)])
        word_ids = np.where(special, -1, np.arange(t) - 1)
        writer.add(i, AttentionMap(i, attn, tokens, special, np.zeros(t, dtype=np.int64), word_ids,
                                   "token", Example(words=words)))
    writer.finish()
    _write_index(root, shard_size)
    manifest["status"] = "complete"
    manifest["summary"] = {"examples_in": n, "examples_out": n, "skipped": []}
    atomic_write_text(root / MANIFEST, json.dumps(manifest))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def start_server(store: Path) -> tuple[subprocess.Popen, int]:
    """``attnscope serve STORE --host 127.0.0.1 --port 0`` in a child; returns it and its port."""
    src = Path(__file__).resolve().parents[1] / "src"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "attnscope", "serve", str(store), "--host", "127.0.0.1",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env)
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit("the viewer did not start")


def client(port: int, n: int, stop_at: float, seed: int, out: list, lock: threading.Lock) -> None:
    rng = random.Random(seed)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    lat: dict[str, list[float]] = {"example": [], "search": [], "results": []}
    errors = 0
    while time.time() < stop_at:
        kind = rng.choices(("example", "search", "results"), weights=(6, 3, 1))[0]
        if kind == "example":
            url = f"/api/example/{rng.randrange(n)}?view={rng.choice(['head', 'model', 'heatmap'])}"
        elif kind == "search":
            url = f"/api/examples?q={rng.choice(WORDS)}+{rng.choice(WORDS)}&offset={rng.randrange(n)}&limit=20"
        else:
            url = "/api/results"
        t0 = time.perf_counter()
        try:
            conn.request("GET", url)
            r = conn.getresponse()
            r.read()
            ok = r.status == 200
        except (OSError, http.client.HTTPException):
            ok = False
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        lat[kind].append(time.perf_counter() - t0)
        errors += not ok
    conn.close()
    with lock:
        out.append((lat, errors))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--examples", type=int, default=10_000)
    args = ap.parse_args()
    if args.seconds > 600:
        raise SystemExit("--seconds: at most 600 (this is a bounded test)")

    tmp = Path(tempfile.mkdtemp(prefix="attnscope-load-"))
    proc = None
    try:
        t0 = time.perf_counter()
        build_store(tmp / "store", args.examples)
        size = sum(f.stat().st_size for f in (tmp / "store").rglob("*") if f.is_file())
        print(f"store: {args.examples:,} examples, {size / 2**20:.1f} MiB, built in "
              f"{time.perf_counter() - t0:.1f} s")
        proc, port = start_server(tmp / "store")
        before = rss_kib(proc.pid)
        results: list = []
        lock = threading.Lock()
        stop_at = time.time() + args.seconds
        threads = [threading.Thread(target=client, args=(port, args.examples, stop_at, k, results, lock))
                   for k in range(args.clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        after = rss_kib(proc.pid)
        every = sorted(x for lat, _ in results for v in lat.values() for x in v)
        errors = sum(e for _, e in results)
        print(f"{args.clients} clients for {wall:.1f} s against 127.0.0.1:{port}")
        print(f"requests served: {len(every):,} ({len(every) / wall:.1f}/s), errors: {errors}")
        if every:
            p99 = every[min(len(every) - 1, int(0.99 * len(every)))]
            print(f"latency: median {1000 * statistics.median(every):.1f} ms, p99 {1000 * p99:.1f} ms")
        for kind in ("example", "search", "results"):
            xs = sorted(x for lat, _ in results for x in lat[kind])
            if xs:
                print(f"  {kind:8s} {len(xs):7,} requests, median {1000 * statistics.median(xs):.1f} ms, "
                      f"p99 {1000 * xs[min(len(xs) - 1, int(0.99 * len(xs)))]:.1f} ms")
        print(f"server RSS: {before / 1024:.1f} MiB before, {after / 1024:.1f} MiB after")
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
