"""Fine-tune the packaged MiniLM on UPOS tagging, then compare it with the original head by head.

A real pair for ``attnscope compare``, offline and on CPU in a few minutes:

1. train a linear tagger on the first piece of each word of ``--train-sentences`` EWT training
   sentences (one epoch, seeded; the encoder is fine-tuned with it), stopping early after
   ``--max-train-seconds``;
2. report tagging accuracy on the EWT dev set;
3. save the encoder and its tokenizer as a local model folder (``--model-out``, outside the
   repository);
4. compare it with the original on ``--compare-sentences`` EWT dev sentences and as many
   WikiText-2 pairs (``attnscope.compare.compare_models``: word level, same inputs).

    OMP_NUM_THREADS=1 PYTHONPATH=src python examples/finetune_upos.py \\
        --data ../shared/data --model-out /tmp/minilm-upos --out /tmp/compare-upos

Prints every measured number; the report is ``OUT/ewt/report.html`` and ``OUT/wikitext/report.html``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path


def read_tagged(path: Path, limit: int | None = None) -> list[tuple[list[str], list[str]]]:
    """(words, UPOS tags) per sentence of a CoNLL-U file (multi-word token lines skipped)."""
    from attnscope.data.conllu import iter_conllu

    out = []
    for sent in iter_conllu(path):
        words = [t.form for t in sent.tokens]
        tags = [t.upos for t in sent.tokens]
        out.append((words, tags))
        if limit is not None and len(out) >= limit:
            break
    return out


def encode(tokenizer, batch, tag_ids, max_len: int = 128):
    """Token ids, and per token the tag of the word it starts (-100 elsewhere: not scored)."""
    import torch

    enc = tokenizer([w for w, _ in batch], is_split_into_words=True, truncation=True,
                    max_length=max_len, padding=True, return_tensors="pt")
    labels = torch.full(enc["input_ids"].shape, -100, dtype=torch.long)
    for b, (_, tags) in enumerate(batch):
        prev = None
        for t, w in enumerate(enc.word_ids(b)):
            if w is not None and w != prev:
                labels[b, t] = tag_ids[tags[w]]
            prev = w
    return enc, labels


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    p.add_argument("--model-out", type=Path, default=Path("/tmp/attnscope-minilm-upos"))
    p.add_argument("--out", type=Path, default=Path("/tmp/attnscope-compare-upos"))
    p.add_argument("--train-sentences", type=int, default=2000)
    p.add_argument("--compare-sentences", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-train-seconds", type=float, default=200.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    import torch

    from attnscope.compare import compare_models
    from attnscope.data.io import write_examples
    from attnscope.data.unlabeled import prepare_unlabeled
    from attnscope.models import load_model

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    ewt = args.data / "ud-ewt"
    train = read_tagged(ewt / "en_ewt-ud-train.conllu")
    random.Random(args.seed).shuffle(train)
    train = train[: args.train_sentences]
    dev = read_tagged(ewt / "en_ewt-ud-dev.conllu")
    tagset = sorted({t for _, tags in train + dev for t in tags})
    tag_ids = {t: i for i, t in enumerate(tagset)}

    lm = load_model("default", seed=args.seed)
    encoder, tok = lm.model, lm.tokenizer
    head = torch.nn.Linear(encoder.config.hidden_size, len(tagset))
    opt = torch.optim.AdamW([{"params": encoder.parameters(), "lr": 5e-5},
                             {"params": head.parameters(), "lr": 1e-3}], weight_decay=0.01)
    encoder.train()
    t0 = time.perf_counter()
    steps = seen = 0
    for i in range(0, len(train), args.batch_size):
        batch = train[i:i + args.batch_size]
        enc, labels = encode(tok, batch, tag_ids)
        hidden = encoder(**enc).last_hidden_state
        loss = torch.nn.functional.cross_entropy(head(hidden).flatten(0, 1), labels.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        seen += len(batch)
        if steps % 20 == 0:
            print(f"step {steps}: loss {loss.item():.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
        if time.perf_counter() - t0 > args.max_train_seconds:
            break
    train_s = time.perf_counter() - t0
    encoder.eval()
    correct = total = 0
    with torch.no_grad():
        for i in range(0, len(dev), 64):
            enc, labels = encode(tok, dev[i:i + 64], tag_ids)
            pred = head(encoder(**enc).last_hidden_state).argmax(-1)
            scored = labels != -100
            correct += int((pred[scored] == labels[scored]).sum())
            total += int(scored.sum())
    summary = {"train_sentences_seen": seen, "steps": steps, "train_seconds": round(train_s, 1),
               "dev_words": total, "dev_upos_accuracy": round(100.0 * correct / total, 2),
               "tags": len(tagset), "seed": args.seed}
    print(json.dumps(summary), flush=True)

    args.model_out.mkdir(parents=True, exist_ok=True)
    encoder.save_pretrained(args.model_out)
    tok.save_pretrained(args.model_out)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "finetune.json").write_text(json.dumps(summary, indent=1) + "\n")

    # the same inputs for both models: words from EWT dev, and WikiText-2 pairs built with the
    # (shared) tokenizer, written to files so that the comparison records their hashes
    inputs = args.out / "inputs"
    inputs.mkdir(exist_ok=True)
    write_examples([{"words": w} for w, _ in dev[: args.compare_sentences]], inputs / "ewt-dev.json")
    pairs = prepare_unlabeled(args.data / "wikitext-2" / "valid.sentences.txt", tok, max_seq_len=64,
                              seed=args.seed, num_examples=args.compare_sentences)
    write_examples(pairs, inputs / "wikitext-pairs.json")
    for name, path, max_len in (("ewt", inputs / "ewt-dev.json", 128),
                                ("wikitext", inputs / "wikitext-pairs.json", 64)):
        t1 = time.perf_counter()
        cmp = compare_models("default", str(args.model_out), path, args.out / name, max_seq_len=max_len,
                             seed=args.seed, overwrite=True)
        layer = cmp.layer_distance()
        print(json.dumps({"inputs": name, "examples": len(cmp.pairing.indices), "level": cmp.pairing.level,
                          "layer_js": [round(float(x), 4) for x in layer],
                          "changed_outside_ci": int(cmp.changed().sum()), "of": int(cmp.changed().size),
                          "heads_moved": sum(1 for i, j in cmp.matching if i != j),
                          "seconds": round(time.perf_counter() - t1, 1)}), flush=True)


if __name__ == "__main__":
    main()
