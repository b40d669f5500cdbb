"""Benchmark: per-head dependency accuracy (Table 1) and probe training time.

1. Every head, both directions, every relation on EWT dev: attnscope's vectorised
   ``DependencyHeads`` against a straightforward loop over sentences, heads and words like the
   paper's notebook, on the same maps held in memory; checks that the counts are identical
   and prints the ratio.
2. Probe training time per epoch on a train store (the attention-only, attention + GloVe and
   distance + GloVe probes trained together, as the syntax family does): the first epoch streams
   the store and builds features, later ones may come from the in-memory cache.

    python benchmarks/syntax.py --dev-store DEV_STORE [--train-store TRAIN_STORE]
    python benchmarks/syntax.py --dev ../shared/data/ud-ewt/en_ewt-ud-dev.conllu   # extracts first
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np


def naive_counts(maps):
    """The notebook way: per sentence and head, argmax of the word-only matrix, then a Python
    loop over words that counts hits per relation."""
    correct = collections.defaultdict(lambda: None)
    for m in maps:
        ex = m.example
        pos = m.word_positions()
        L, H = m.attn.shape[:2]
        for layer in range(L):
            for head in range(H):
                a = m.attn[layer, head][np.ix_(pos, pos)].copy()
                np.fill_diagonal(a, -np.inf)
                for d, pred in enumerate((a.argmax(-1), a.argmax(0))):
                    for w in range(len(pos)):
                        g = ex.heads[w] - 1
                        if g < 0:
                            continue
                        for key in (ex.relns[w], "all"):
                            if correct[key] is None:
                                correct[key] = np.zeros((L, H, 2), np.int64)
                            correct[key][layer, head, d] += int(pred[w] == g)
    return dict(correct)


def bench_heads(maps, repeats: int = 3) -> None:
    from attnscope.analyses.syntax import DependencyHeads
    from attnscope.maps import AttentionBatch

    batches = [AttentionBatch(maps[i:i + 128]) for i in range(0, len(maps), 128)]
    # CPU time (process_time) is what to compare on a shared machine; wall time is shown too
    fast_cpu, fast_wall = [], []
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        d = DependencyHeads(possessive_rule=False, ties="lowest")  # the naive loop's np.argmax
        for b in batches:
            d.update(b)
        c = d.counts()
        fast_cpu.append(time.process_time() - c0)
        fast_wall.append(time.perf_counter() - w0)
    c0, w0 = time.process_time(), time.perf_counter()
    ref = naive_counts(maps)
    naive_cpu, naive_wall = time.process_time() - c0, time.perf_counter() - w0
    same = set(ref) == set(c.relations) and all(
        np.array_equal(ref[r], c.correct[c.get(r)]) for r in ref)
    words = int(c.total[-1])
    L, H = d.shape
    print(f"per-head accuracy, {len(maps)} sentences, {words} dependents, {L}x{H} heads, "
          f"2 directions, {len(c.relations) - 1} relations")
    print(f"  naive loop : {naive_cpu:8.2f} s CPU ({naive_wall:.2f} s wall)")
    print(f"  attnscope  : {min(fast_cpu):8.3f} s CPU ({min(fast_wall):.3f} s wall), best of {repeats}")
    print(f"  ratio      : {naive_cpu / min(fast_cpu):8.1f}x CPU, {naive_wall / min(fast_wall):.1f}x wall;"
          f" identical counts: {same}")


def bench_probes(train_store, dev_store, epochs: int = 2) -> None:
    import torch

    from attnscope.analyses.probes.features import SentenceSource
    from attnscope.analyses.probes.models import (
        AttentionGloveProbe,
        AttentionProbe,
        DistanceGloveMLP,
    )
    from attnscope.analyses.probes.training import TrainConfig, train_probes
    from attnscope.data.glove import load_glove

    glove = load_glove()
    K = train_store.num_layers * train_store.num_heads
    train = SentenceSource(train_store.batches, glove)
    dev = SentenceSource(dev_store.batches, glove)
    torch.manual_seed(0)
    mods = {"attn": AttentionProbe(K), "attn+glove": AttentionGloveProbe(K, glove.vectors),
            "distance+glove": DistanceGloveMLP(glove.vectors)}
    t0 = time.perf_counter()
    runs = train_probes(mods, train, dev, TrainConfig(epochs=epochs, patience=epochs + 1, seed=0))
    total = time.perf_counter() - t0
    secs = [h["seconds"] for h in runs["attn"].history]
    print(f"probe training on {train.num_sentences} train sentences ({len(train_store)} in store), "
          f"3 probes together, torch threads {torch.get_num_threads()}")
    for e, s in enumerate(secs, start=1):
        print(f"  epoch {e}: {s:7.1f} s training ({'streamed from the store' if e == 1 else 'cached features' if train._cache is not None else 'streamed'})")
    print(f"  total incl. dev evaluation: {total:.1f} s; dev UAS after {epochs} epochs: "
          + ", ".join(f"{n} {100 * r.uas:.1f}" for n, r in runs.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dev-store", help="word-level store of the dev split")
    ap.add_argument("--dev", help="CoNLL-U dev file (extracted with --model when no store)")
    ap.add_argument("--train-store", help="word-level store of the train split (probe timing)")
    ap.add_argument("--model", default="default")
    ap.add_argument("--limit", type=int, default=None, help="use only this many dev sentences")
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    from attnscope.store import open_store

    if args.dev_store:
        dev_store = open_store(args.dev_store)
        maps = []
        for m in dev_store:
            maps.append(m)
            if args.limit and len(maps) >= args.limit:
                break
    else:
        import itertools

        from attnscope.data.depparse import iter_depparse
        from attnscope.extract.runner import extract

        examples = list(itertools.islice(iter_depparse(args.dev), args.limit))
        maps = [m for b in extract(examples, args.model, word_level=True) for m in b]
        dev_store = None
    bench_heads(maps)
    if args.train_store and dev_store is not None:
        bench_probes(open_store(args.train_store), dev_store, args.epochs)


if __name__ == "__main__":
    main()
