"""Benchmark of the general analyses, in one run, printing the ratios.

1. Head distances: attnscope's vectorised Jensen-Shannon (``js_matrix``) against a
   straightforward NumPy loop over examples and heads as in the paper's ``head_distances.py``
   (each head against all heads, ``KL`` terms with two logarithms and divisions), on the same
   maps (float32, read from a store written once); checks the values agree to 1e-5 (nats per
   token) and prints the speed-up. Only the computation is timed, not the reading.
2. The whole general pass (extraction + relative position, special tokens, entropy, head
   distances) against extraction alone, and the same without head distances.

    python benchmarks/general.py [--num-examples 1000] [--model default]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "wikitext-2" / "valid.sentences.txt"


def paper_style_js(attn: np.ndarray, smoothing: float = 0.001) -> np.ndarray:
    """The obvious implementation: for each head, JS against every head, summed over rows."""
    L, H, n, _ = attn.shape
    flat = attn.reshape(L * H, n, n)
    out = np.zeros((L * H, L * H))
    smoothed_all = smoothing / n + flat * (1 - smoothing)
    for head in range(L * H):
        p = smoothed_all[head][None]
        m = (p + smoothed_all) / 2
        js = -p * np.log(m / p) - smoothed_all * np.log(m / smoothed_all)
        out[head] += (js / 2).sum(-1).sum(-1)
    return out


def main() -> None:
    from attnscope.analyses.distances import js_matrix
    from attnscope.analyses.token_classes import TokenClasser
    from attnscope.data.unlabeled import prepare_unlabeled
    from attnscope.extract.runner import ExtractOptions, Extractor
    from attnscope.families.general import general_analyses
    from attnscope.jobs import extract_to_store
    from attnscope.models import load_model
    from attnscope.store import open_store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-examples", type=int, default=1000)
    ap.add_argument("--model", default="default")
    ap.add_argument("--baseline-examples", type=int, default=None,
                    help="Run the slow baseline on only this many of the examples (default: all).")
    args = ap.parse_args()
    if not DATA.is_file():
        raise SystemExit(f"{DATA} is absent")
    lm = load_model(args.model)
    examples = prepare_unlabeled(DATA, lm.tokenizer, max_seq_len=128, seed=0, num_examples=args.num_examples)
    options = ExtractOptions(max_seq_len=128, batch_size=16)
    print(f"{len(examples)} examples, model {lm.name} ({lm.num_layers} x {lm.num_heads} heads)")

    # 2. whole pass vs extraction alone (run first, before the store fills the page cache)
    def timed_pass(with_analyses: bool, with_distances: bool = True) -> tuple[float, float]:
        extractor = Extractor(lm, options)
        analyses = general_analyses(classer=TokenClasser.from_tokenizer(lm.tokenizer), causal=False)
        if not with_distances:
            analyses = [a for a in analyses if a.name != "head-distances"]
        t, c = time.perf_counter(), time.process_time()
        for planned in extractor.plan(examples):
            batch = extractor.run_batch(planned)
            if with_analyses:
                for a in analyses:
                    a.update(batch)
        if with_analyses:
            for a in analyses:
                a.finalize()
        return time.perf_counter() - t, time.process_time() - c

    # wall-clock and CPU time (the CPU time is steadier on a shared machine)
    (w_ex, c_ex), (w_all, c_all), (w_nd, c_nd) = (timed_pass(False), timed_pass(True),
                                                  timed_pass(True, with_distances=False))
    print(f"extraction alone:                   {w_ex:8.1f} s wall {c_ex:8.1f} s CPU")
    print(f"extraction + general analyses:      {w_all:8.1f} s wall {c_all:8.1f} s CPU "
          f"(analyses add {w_all / w_ex - 1:+.0%} wall, {c_all / c_ex - 1:+.0%} CPU)")
    print(f"  ... without head distances:       {w_nd:8.1f} s wall {c_nd:8.1f} s CPU "
          f"(analyses add {w_nd / w_ex - 1:+.0%} wall, {c_nd / c_ex - 1:+.0%} CPU)")

    # 1. head distances on the same maps
    with tempfile.TemporaryDirectory() as tmp:
        extract_to_store(examples, Path(tmp) / "maps", lm, options=options, dtype="float32")
        store = open_store(Path(tmp) / "maps")
        t_ours = t_base = 0.0  # CPU seconds of the computation alone
        ours = None
        base = None
        tokens = 0
        limit = args.baseline_examples or len(store)
        for k, m in enumerate(store):
            L, H, n, _ = m.attn.shape
            t = time.process_time()
            d = js_matrix(m.attn.reshape(L * H, n, n))
            t_ours += time.process_time() - t
            if k >= limit:
                continue
            t = time.process_time()
            b = paper_style_js(m.attn)
            t_base += time.process_time() - t
            ours = d if ours is None else ours + d
            base = b if base is None else base + b
            tokens += n
        diff = np.abs(ours / tokens - base / tokens).max()
        per_ex_ours = t_ours / len(store)
        per_ex_base = t_base / limit
        print(f"head distances, attnscope:          {t_ours:8.1f} s CPU for {len(store)} examples "
              f"({per_ex_ours * 1e3:.1f} ms each)")
        print(f"head distances, paper-style loop:   {t_base:8.1f} s CPU for {limit} examples "
              f"({per_ex_base * 1e3:.1f} ms each)")
        print(f"speed-up: {per_ex_base / per_ex_ours:.1f}x; max |difference| of the per-token mean "
              f"over {limit} examples: {diff:.2e} nats (goal <= 1e-5)")


if __name__ == "__main__":
    main()
