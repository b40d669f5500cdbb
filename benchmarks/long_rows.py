"""A click in the long-document viewer against the forward pass it saves (issue 48).

SmolLM2-135M over one WikiText-2 input of ``--tokens`` tokens (articles joined, as
``analyze longctx --join``): (a) the document's one pass (:meth:`DocumentRows.read`, which
keeps every layer's queries and keys), then (b) what the viewer answers a click on a token
with: ``GET /api/long/row`` of ``attnscope serve --long`` through Flask's test client (one
head's row at that token, O(n), and its summary), for ``--clicks`` tokens drawn with a fixed
seed over the document, across layers and heads. The obvious alternative to keeping q and k is
to run the model again for each click (the pass is the floor of that), so the ratio printed is
click / forward. Also printed: the memory kept and the page's size.

    python benchmarks/long_rows.py                   # 16,384 tokens, 20 clicks
    python benchmarks/long_rows.py --tokens 2048     # a quick look
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WIKITEXT = ROOT.parent / "shared" / "data" / "wikitext-2" / "valid.sentences.txt"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--clicks", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not WIKITEXT.is_file():
        print(f"{WIKITEXT} is absent (the shared corpora)", file=sys.stderr)
        return 2
    import torch

    from attnscope.serve.app import create_app
    from attnscope.views import LongDocumentView

    print(f"torch threads: {torch.get_num_threads()}")
    start = time.perf_counter()
    view = LongDocumentView(WIKITEXT, model="smollm2", layer=14, head=4, queries=[args.tokens - 1],
                            max_seq_len=args.tokens)
    total = time.perf_counter() - start
    forward = view.payload["seconds"]["forward"]
    client = create_app(None, None, document=view).test_client()
    L, H = view.doc.shape
    rng = np.random.default_rng(args.seed)
    picks = [(int(rng.integers(L)), int(rng.integers(H)), int(rng.integers(view.doc.n)))
             for _ in range(args.clicks)]
    times = []
    for layer, head, q in picks:
        t = time.perf_counter()
        r = client.get(f"/api/long/row?layer={layer}&head={head}&query={q}")
        times.append(time.perf_counter() - t)
        assert r.status_code == 200 and r.get_json()["query"] == q
    html = view.html()
    click = float(np.median(times))
    print(f"document: {view.doc.n:,} tokens of {WIKITEXT.name}; SmolLM2-135M, {L} layers x {H} heads")
    print(f"(a) forward pass, queries and keys kept: {forward:.2f} s "
          f"({view.doc.nbytes / 2 ** 30:.2f} GiB kept); page with profiles: {total:.2f} s in all")
    print(f"(b) click -> row, {len(times)} clicks: median {click * 1000:.1f} ms, max {max(times) * 1000:.1f} ms")
    print(f"ratio click / forward: {click / forward:.5f} (a click costs {forward / click:,.0f}x less "
          "than running the model again)")
    print(f"page for one head and one query: {len(html.encode('utf-8')) / 2 ** 20:.2f} MiB")
    print(f"goal: a click under 2 s -> {'met' if max(times) < 2 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
