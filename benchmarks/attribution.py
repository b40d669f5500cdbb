"""Benchmark of the attribution methods: seconds per 1,000 tokens of each against one plain
forward pass over the same examples (the ratio is what carries over between machines).

Examples are WikiText-2 validation segments built as the general family builds them (pairs of up
to ``--max-seq-len`` tokens). The packaged MiniLM has no masked-LM head, so for the loss-based
methods (importance, ablation, pruning, saliency) an output layer is first fitted on the frozen
encoder (:func:`attnscope.analyses.gradients.fit_mlm_head`, seeded; its held-out accuracy is
printed, its fitting time is not part of any method's time). Attention flow is refused above 32
tokens, so it is timed on single WikiText sentences of at most 32 tokens and compared with a
forward pass over those same sentences. Value zeroing and the rollout/saliency agreement are
per example and timed on ``--map-examples`` segments.

    OMP_NUM_THREADS=1 python benchmarks/attribution.py [--num-examples 100] [--model default]

With ``--numbers GENERAL_OUT`` it instead computes the numbers issue 13 asks for on the first
``--num-examples`` segments: the 5 most and least important heads with the behaviour labels of
the general family's run in ``GENERAL_OUT`` (``results/general.json``, made on the same
segments), the loss and accuracy after removing 10/30/50% of the heads by importance vs a seeded
random order, and the weight vs norm share of the special tokens per layer.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "wikitext-2" / "valid.sentences.txt"


def _forward_all(lm, encoded, batch_size: int) -> None:
    from attnscope.models.forward import forward, pad_batch

    for i in range(0, len(encoded), batch_size):
        chunk = encoded[i:i + batch_size]
        forward(lm, pad_batch(lm, [e.input_ids for e in chunk], [e.token_type_ids for e in chunk]))


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    import numpy as np

    from attnscope.analyses.ablation import (
        AblationEffect,
        HeadMeans,
        PruningCurve,
        importance_order,
        random_order,
    )
    from attnscope.analyses.agreement import AttributionAgreement
    from attnscope.analyses.gradients import FitOptions, fit_mlm_head
    from attnscope.analyses.importance import HeadImportance
    from attnscope.analyses.lm_objective import Objective, encode_examples
    from attnscope.analyses.norms import NormShares
    from attnscope.analyses.rollout import attention_flow, attention_rollout
    from attnscope.analyses.value_zeroing import value_zeroing
    from attnscope.data.records import Example
    from attnscope.data.unlabeled import prepare_unlabeled
    from attnscope.models import load_model
    from attnscope.models.forward import forward, pad_batch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-examples", type=int, default=100)
    ap.add_argument("--map-examples", type=int, default=3)
    ap.add_argument("--flow-sentences", type=int, default=10)
    ap.add_argument("--model", default="default")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-seq-len", type=int, default=128)
    ap.add_argument("--json", type=Path, default=None, help="Also write the timings here.")
    ap.add_argument("--numbers", type=Path, default=None, metavar="GENERAL_OUT",
                    help="Compute the issue's numbers instead of timings (labels from this run folder).")
    args = ap.parse_args()
    if not DATA.is_file():
        raise SystemExit(f"{DATA} is absent")
    lm = load_model(args.model, mlm_head=False)
    examples = prepare_unlabeled(DATA, lm.tokenizer, max_seq_len=args.max_seq_len, seed=0,
                                 num_examples=args.num_examples)
    encoded, _ = encode_examples(lm, examples, max_len=args.max_seq_len)
    tokens = sum(len(e) for e in encoded)
    bs = args.batch_size
    fit_note = None
    if lm.family.causal or lm.has_mlm_head:
        objective = Objective(lm, seed=0)
    else:
        t = time.perf_counter()
        head = fit_mlm_head(lm, [(e.tokens, e.special, e.segment, e.index) for e in encoded], FitOptions(seed=0))
        fit_note = {"seconds": time.perf_counter() - t, **head.report}
        objective = Objective(lm, head=head, seed=0)
    if args.numbers is not None:
        numbers(lm, objective, encoded, args, fit_note)
        return
    _forward_all(lm, encoded[:bs], bs)  # warm-up
    base = _timed(lambda: _forward_all(lm, encoded, bs))
    rows = {}

    def record(name, seconds, ntok, base_seconds):
        rows[name] = {"seconds": seconds, "tokens": ntok, "s_per_1k_tokens": 1000 * seconds / ntok,
                      "ratio_to_forward": seconds / base_seconds}

    record("forward", base, tokens, base)
    imp = HeadImportance(objective, batch_size=bs)
    record("importance", _timed(lambda: imp.update(encoded)), tokens, base)
    L, H = lm.num_layers, lm.num_heads
    record("zero ablation (all heads)", _timed(lambda: AblationEffect(objective, mode="zero",
                                                                      batch_size=bs).update(encoded)), tokens, base)
    means = {}

    def mean_ablation():
        hm = HeadMeans(lm, batch_size=bs)
        hm.update(encoded)
        means["m"] = hm.finalize().arrays["mean"]
        AblationEffect(objective, mode="mean", means=means["m"], batch_size=bs).update(encoded)

    record("mean ablation (all heads, incl. means pass)", _timed(mean_ablation), tokens, base)
    orders = {"importance": importance_order(imp.finalize().arrays["importance"]),
              "random": random_order(L, H, 0)}
    record("pruning curves (2 orders x 11 fractions)",
           _timed(lambda: PruningCurve(objective, orders, batch_size=bs).update(encoded)), tokens, base)
    record("norm shares", _timed(lambda: NormShares(lm, batch_size=bs).update(encoded)), tokens, base)

    def rollout_all():
        for i in range(0, len(encoded), bs):
            chunk = encoded[i:i + bs]
            out = forward(lm, pad_batch(lm, [e.input_ids for e in chunk], [e.token_type_ids for e in chunk]),
                          attentions=True)
            for b, e in enumerate(chunk):
                n = len(e)
                attention_rollout(np.stack([a[b, :, :n, :n].numpy() for a in out.attentions]))

    record("rollout (incl. a forward with attentions)", _timed(rollout_all), tokens, base)
    few = encoded[: args.map_examples]
    few_tokens = sum(len(e) for e in few)
    few_base = _timed(lambda: _forward_all(lm, few, bs))
    record("value zeroing (per example, all layers)",
           _timed(lambda: [value_zeroing(lm, e) for e in few]), few_tokens, few_base)
    record("rollout/flow agreement with saliency (4 rows per example)",
           _timed(lambda: AttributionAgreement(objective, max_flow_tokens=0).update(few)), few_tokens, few_base)
    sents = []
    for line in DATA.read_text(encoding="utf-8").splitlines():
        if line.strip():
            sents.append(Example(text=line.strip()))
        if len(sents) >= 20 * args.flow_sentences:
            break
    short, _ = encode_examples(lm, sents, max_len=32)
    short = short[: args.flow_sentences]
    short_tokens = sum(len(e) for e in short)
    short_base = _timed(lambda: _forward_all(lm, short, bs))

    def flow_all():
        for e in short:
            out = forward(lm, pad_batch(lm, [e.input_ids], [e.token_type_ids]), attentions=True)
            attention_flow(np.stack([a[0].numpy() for a in out.attentions]))

    if short:
        record("attention flow (sentences <= 32 tokens)", _timed(flow_all), short_tokens, short_base)
    print(f"model {lm.name}: {len(encoded)} segments, {tokens} tokens; {L} layers x {H} heads")
    if fit_note:
        print(f"loss: fitted masked-LM head ({fit_note['steps']} steps, {fit_note['seconds']:.1f} s, "
              f"held-out masked-token accuracy {fit_note['heldout_accuracy']:.3f})")
    else:
        print(f"loss: {objective.describe()['loss']}")
    print(f"{'method':<62} {'s/1k tok':>9} {'x forward':>10}")
    for name, r in rows.items():
        print(f"{name:<62} {r['s_per_1k_tokens']:9.3f} {r['ratio_to_forward']:10.1f}")
    if args.json:
        args.json.write_text(json.dumps({"model": lm.name, "segments": len(encoded), "tokens": tokens,
                                         "fitted_head": fit_note, "rows": rows}, indent=1))


def numbers(lm, objective, encoded, args, fit_note) -> None:
    from attnscope.analyses.ablation import PruningCurve, importance_order, random_order
    from attnscope.analyses.importance import HeadImportance
    from attnscope.analyses.norms import SHARE_CLASSES, NormShares
    from attnscope.report.attribution import behaviour_labels

    labels = behaviour_labels(args.numbers)
    t0 = time.perf_counter()
    imp = HeadImportance(objective, batch_size=args.batch_size)
    imp.update(encoded)
    res = imp.finalize()
    rows = sorted(res.tables["head_importance"], key=lambda r: r["rank"])
    L, H = lm.num_layers, lm.num_heads
    orders = {"importance": importance_order(res.arrays["importance"]), "random": random_order(L, H, 0)}
    pc = PruningCurve(objective, orders, fractions=(0.0, 0.1, 0.3, 0.5), batch_size=args.batch_size)
    pc.update(encoded)
    curve = pc.finalize()
    ns = NormShares(lm, batch_size=args.batch_size)
    ns.update(encoded)
    shares = ns.finalize()
    seconds = time.perf_counter() - t0
    print(f"model {lm.name}: {len(encoded)} segments, {sum(len(e) for e in encoded)} tokens, "
          f"{seconds:.0f} s; behaviour labels from {args.numbers / 'results' / 'general.json'}"
          + ("" if labels else " (absent)"))
    if fit_note:
        print(f"loss: fitted masked-LM head ({fit_note['steps']} steps on {fit_note['examples']} segments, "
              f"held-out masked-token accuracy {fit_note['heldout_accuracy']:.3f})")
    else:
        print(f"loss: {objective.describe()['loss']}")

    def fmt(r):
        return f"{r['name']} ({labels.get((r['layer'], r['head']), '?')}, {r['importance']:.3f})"

    print("most important (1-indexed layer-head, behaviour, normalised importance):",
          ", ".join(fmt(r) for r in rows[:5]))
    print("least important:", ", ".join(fmt(r) for r in rows[::-1][:5]))
    print("fraction removed | loss by importance | loss random | acc by importance | acc random")
    for f, frac in enumerate(pc.fractions):
        print(f"{frac:.1f} | {curve.arrays['loss'][0, f]:.3f} | {curve.arrays['loss'][1, f]:.3f} | "
              f"{curve.arrays['accuracy'][0, f]:.3f} | {curve.arrays['accuracy'][1, f]:.3f}")
    w, n = shares.arrays["weight_share"], shares.arrays["norm_share"]
    print("layer | weight first | norm first | weight separators | norm separators  (classes: "
          + ", ".join(SHARE_CLASSES) + ")")
    for layer in range(L):
        print(f"{layer + 1} | {w[layer, 0]:.3f} | {n[layer, 0]:.3f} | {w[layer, 1]:.3f} | {n[layer, 1]:.3f}")
    if args.json:
        from attnscope.report.results import write_json

        write_json(args.json, {"segments": len(encoded), "seconds": seconds, "fitted_head": fit_note,
                               "importance": res.to_json(), "pruning": curve.to_json(),
                               "norm_shares": shares.to_json()})


if __name__ == "__main__":
    main()
