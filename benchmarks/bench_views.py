"""Page size and render time of a view at 512 tokens x 12 layers x 12 heads.

attnscope embeds every head as 1/255-quantised, deflated bytes; the obvious alternative (what
BertViz does) embeds the attention as JSON number lists. Both are built here in one run from
the same map, and the ratio of their sizes and build times is printed. With Chromium present,
the attnscope page is also opened headless and the time until each view is drawn is printed.

    python benchmarks/bench_views.py [--tokens 512] [--layers 12] [--heads 12]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def synthetic_map(L: int, H: int, n: int, seed: int = 0):
    """Peaked attention like a trained model's: softmax of scaled random scores plus a few
    fixed patterns (previous token, [SEP])."""
    from attnscope.data.records import Example
    from attnscope.maps import AttentionMap

    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(L, H, n, n)).astype(np.float32) * 3.0
    idx = np.arange(n)
    scores[:, ::3, idx[1:], idx[:-1]] += 8.0  # previous-token heads
    scores[:, 1::3, :, n - 1] += 6.0  # heads on the final [SEP]
    scores -= scores.max(-1, keepdims=True)
    attn = np.exp(scores)
    attn /= attn.sum(-1, keepdims=True)
    tokens = ["[CLS]"] + [f"w{i}" for i in range(n - 2)] + ["[SEP]"]
    special = np.zeros(n, bool)
    special[[0, -1]] = True
    return AttentionMap(0, attn, tokens, special, np.zeros(n, np.int64),
                        np.where(special, -1, np.cumsum(~special) - 1), "token",
                        Example(tokens=tokens))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    args = ap.parse_args()
    from attnscope.viz.pages import view_html

    amap = synthetic_map(args.layers, args.heads, args.tokens)
    t0 = time.perf_counter()
    html = view_html(amap, "head", heads=[0, 1, 2])
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    alt = json.dumps({"tokens": amap.tokens, "attn": np.round(amap.attn, 6).tolist()})
    t_alt = time.perf_counter() - t0
    ours_b, alt_b = len(html.encode()), len(alt.encode())
    print(f"map: {args.layers} layers x {args.heads} heads x {args.tokens} tokens")
    print(f"attnscope page (HTML, JS, data): {ours_b / 1e6:8.2f} MB, built in {t_ours:6.2f} s")
    print(f"JSON number lists (data only):   {alt_b / 1e6:8.2f} MB, built in {t_alt:6.2f} s")
    print(f"size ratio JSON / attnscope: {alt_b / ours_b:.1f}x; build-time ratio: {t_alt / t_ours:.1f}x")
    try:
        from attnscope.viz.export import offline_page, wait_ready
    except ImportError:
        return
    try:
        with tempfile.TemporaryDirectory() as tmp, offline_page() as page:
            path = Path(tmp) / "bench.html"
            path.write_text(html, encoding="utf-8")
            t0 = time.perf_counter()
            page.goto(path.as_uri())
            wait_ready(page)
            print(f"Chromium: page loaded, data inflated, head view (3 heads) drawn in "
                  f"{time.perf_counter() - t0:.2f} s "
                  f"({page.get_attribute('#attnscope-root', 'data-status')})")
            for state in ({"view": "model"}, {"view": "heatmap", "head": 0},
                          {"view": "head", "heads": list(range(args.heads))}):
                t0 = time.perf_counter()
                page.evaluate("(s) => window.attnscope.setState(s).then(() => null)", state)
                print(f"  {json.dumps(state)}: {time.perf_counter() - t0:.2f} s "
                      f"({page.get_attribute('#attnscope-root', 'data-status')})")
    except Exception as exc:  # no Chromium here: sizes above still stand
        print(f"(browser timing skipped: {exc})")


if __name__ == "__main__":
    main()
