"""Benchmark: probe training (Table 3) time and UAS, for comparing two versions side by side.

Trains the attention-only, attention + GloVe and distance + GloVe probes together (as the
syntax family does) on a word-level train store for a fixed number of epochs, scores them on
a dev store, and prints wall seconds per epoch, the total wall and CPU seconds (compare CPU
time on a shared machine), and each probe's best dev UAS. It only
uses the API that attnscope 0.1 already had, so the same script measures an older checkout:

    git archive cbeaf95 src | tar -x -C /tmp/old      # the version before the speed-up
    PYTHONPATH=/tmp/old/src python benchmarks/probes.py --train TRAIN_STORE --dev DEV_STORE
    PYTHONPATH=src          python benchmarks/probes.py --train TRAIN_STORE --dev DEV_STORE

Stores: ``attnscope prepare depparse en_ewt-ud-train.conllu --limit 2000 --out t.json`` then
``attnscope extract t.json --word-level --out TRAIN_STORE`` (and the same for dev).
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", required=True, help="word-level store of the train sentences")
    ap.add_argument("--dev", required=True, help="word-level store of the dev sentences")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=None, help="default: the version's own")
    ap.add_argument("--lr", type=float, default=None, help="default: the version's own")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--random-batches", action="store_true", help="no length buckets (new versions only)")
    ap.add_argument("--probes", default="attn,attn+glove,distance+glove")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args()

    import torch

    import attnscope
    from attnscope.analyses.probes.features import SentenceSource
    from attnscope.analyses.probes.models import (
        AttentionGloveProbe,
        AttentionProbe,
        DistanceGloveMLP,
    )
    from attnscope.analyses.probes.training import TrainConfig, train_probes
    from attnscope.data.glove import load_glove
    from attnscope.store import open_store

    train_store, dev_store = open_store(args.train), open_store(args.dev)
    glove = load_glove()
    K = train_store.num_layers * train_store.num_heads
    cfg = TrainConfig(epochs=args.epochs, patience=args.epochs + 1, seed=args.seed)
    if args.batch_size:
        cfg.batch_size = args.batch_size
    if args.lr:
        cfg.lr = args.lr
        if hasattr(cfg, "attn_lr"):
            cfg.attn_lr = None  # one learning rate for every probe
    if args.random_batches:
        cfg.by_length = False
    torch.manual_seed(args.seed)
    make = {"attn": lambda: AttentionProbe(K), "attn+glove": lambda: AttentionGloveProbe(K, glove.vectors),
            "distance+glove": lambda: DistanceGloveMLP(glove.vectors)}
    mods = {n: make[n]() for n in args.probes.split(",")}
    train = SentenceSource(train_store.batches, glove)
    dev = SentenceSource(dev_store.batches, glove)
    t0, c0 = time.perf_counter(), time.process_time()
    runs = train_probes(mods, train, dev, cfg)
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    secs = [h["seconds"] for h in next(iter(runs.values())).history]
    out = {"attnscope": attnscope.__file__, "train_sentences": train.num_sentences,
           "dev_sentences": dev.num_sentences, "config": cfg.as_dict(), "torch_threads": torch.get_num_threads(),
           "seconds_total": total, "cpu_seconds_total": cpu, "seconds_training_per_epoch": secs,
           "uas": {n: 100 * r.uas for n, r in runs.items()},
           "best_epoch": {n: r.best_epoch for n, r in runs.items()},
           "dev_uas_by_epoch": {n: [round(100 * h["dev_uas"], 2) for h in r.history] for n, r in runs.items()}}
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
