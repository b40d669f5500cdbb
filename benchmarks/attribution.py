"""Benchmark of the attribution methods: seconds per 1,000 tokens of each against one plain
forward pass over the same examples (the ratio is what carries over between machines).

Examples are WikiText-2 validation segments built as the general family builds them (pairs of up
to ``--max-seq-len`` tokens). The packaged MiniLM has no masked-LM head, so for the loss-based
methods (importance, ablation, pruning, saliency) an output layer is first fitted on the frozen
encoder (:func:`attnscope.analyses.gradients.fit_mlm_head`, seeded; its held-out accuracy is
printed, its fitting time is not part of any method's time). Attention flow is refused above 32
tokens, so it is timed on single WikiText sentences of at most 32 tokens and compared with a
forward pass over those same sentences. Value zeroing and the rollout/saliency agreement are
per example and timed on ``--map-examples`` segments; the ablations (``L*H + 1`` passes) and the
pruning curves on ``--ablation-examples``. Every method is compared with a forward pass over
exactly the examples it ran on. ``--only`` times a subset, so a slow machine can run the
benchmark in parts. ``before`` times zero ablation and value zeroing one head / one zeroed token
per pass of the whole model (``batched=False``, the code before they were batched) next to
their batched rows.

With ``--command N`` it instead times the command itself (``attnscope analyze attribution`` with
``--attribution-fit-head``) on the first N segments with ``--attribution-methods importance``,
with its default methods and with ``all``, each in its own process (CPU seconds, model load
included), and prints the default's and all's time against importance alone.

    OMP_NUM_THREADS=1 python benchmarks/attribution.py [--num-examples 100] [--model default] \
        [--only importance,norms] [--head-cache /tmp/minilm_head]

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


TIMED = ("importance", "zero-ablation", "mean-ablation", "pruning", "norms", "rollout", "value-zeroing",
         "agreement", "flow", "before")


def _fitted_head(lm, encoded, args):
    """Fit (seeded) or reload the masked-LM head of an encoder without one."""
    from safetensors.torch import load_file, save_file

    from attnscope.analyses.gradients import (
        FitOptions,
        FittedHead,
        _fitted_head_class,
        fit_mlm_head,
    )
    from attnscope.analyses.lm_objective import encode_examples
    from attnscope.data.unlabeled import prepare_unlabeled

    cache = args.head_cache
    if cache is not None and cache.with_suffix(".safetensors").is_file():
        report = json.loads(cache.with_suffix(".json").read_text())
        emb = lm.model.get_input_embeddings().weight.detach().float()
        module = _fitted_head_class()(emb, getattr(lm.model.config, "layer_norm_eps", 1e-12))
        module.load_state_dict(load_file(str(cache.with_suffix(".safetensors"))))
        module.eval()
        for p in module.parameters():
            p.requires_grad_(False)
        return FittedHead(module, report["report"]), {"seconds": report["seconds"], "cached": True,
                                                       **report["report"]}
    fit_on = encoded
    if args.fit_examples:
        exs = prepare_unlabeled(DATA, lm.tokenizer, max_seq_len=args.max_seq_len, seed=0,
                                num_examples=args.fit_examples)
        fit_on, _ = encode_examples(lm, exs, max_len=args.max_seq_len)
    t = time.perf_counter()
    head = fit_mlm_head(lm, [(e.tokens, e.special, e.segment, e.index) for e in fit_on], FitOptions(seed=0))
    seconds = time.perf_counter() - t
    if cache is not None:
        save_file({k: v.contiguous() for k, v in head.module.state_dict().items()},
                  str(cache.with_suffix(".safetensors")))
        cache.with_suffix(".json").write_text(json.dumps({"seconds": seconds, "report": head.report}))
    return head, {"seconds": seconds, **head.report}


def _forward_all(lm, encoded, batch_size: int) -> None:
    from attnscope.models.forward import forward, pad_batch

    for i in range(0, len(encoded), batch_size):
        chunk = encoded[i:i + batch_size]
        forward(lm, pad_batch(lm, [e.input_ids for e in chunk], [e.token_type_ids for e in chunk]))


def _timed(fn) -> float:
    """CPU seconds of ``fn()`` (the benchmark runs one thread; on a shared machine wall time
    measures the other jobs too)."""
    t = time.process_time()
    fn()
    return time.process_time() - t


def main() -> None:
    import numpy as np

    from attnscope.analyses.ablation import (
        AblationEffect,
        HeadMeans,
        PruningCurve,
        random_order,
    )
    from attnscope.analyses.agreement import AttributionAgreement
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
    ap.add_argument("--agreement", action="store_true",
                    help="Print the rollout/flow agreement (Spearman) on --map-examples segments and "
                         "--flow-sentences single sentences of at most 32 tokens, instead of timings.")
    ap.add_argument("--only", default=None, help="Comma-separated subset of: " + ", ".join(TIMED))
    ap.add_argument("--ablation-examples", type=int, default=16,
                    help="Segments the ablations and pruning curves are timed on (they are slow).")
    ap.add_argument("--head-cache", type=Path, default=None,
                    help="Keep the fitted masked-LM head here (safetensors + JSON) and reuse it.")
    ap.add_argument("--fit-examples", type=int, default=None,
                    help="Segments the head is fitted on (default: the benchmarked ones).")
    ap.add_argument("--command", type=int, default=None, metavar="N",
                    help="Time the family's default run against importance alone on N segments.")
    args = ap.parse_args()
    if args.command is not None:
        command(args)
        return
    if not DATA.is_file():
        raise SystemExit(f"{DATA} is absent")
    lm = load_model(args.model, mlm_head=False)
    examples = prepare_unlabeled(DATA, lm.tokenizer, max_seq_len=args.max_seq_len, seed=0,
                                 num_examples=args.num_examples)
    encoded, _ = encode_examples(lm, examples, max_len=args.max_seq_len)
    tokens = sum(len(e) for e in encoded)
    bs = args.batch_size
    fit_note = None
    if lm.facts.causal or lm.has_mlm_head:
        objective = Objective(lm, seed=0)
    else:
        head, fit_note = _fitted_head(lm, encoded, args)
        objective = Objective(lm, head=head, seed=0)
    if args.numbers is not None:
        numbers(lm, objective, encoded, args, fit_note)
        return
    if args.agreement:
        agreement(lm, objective, encoded, args)
        return
    only = set(args.only.split(",")) if args.only else set(TIMED)
    unknown = only - set(TIMED)
    if unknown:
        raise SystemExit(f"--only: unknown {', '.join(sorted(unknown))}; choose from {', '.join(TIMED)}")
    L, H = lm.num_layers, lm.num_heads
    _forward_all(lm, encoded[:bs], bs)  # warm-up
    rows = {}
    bases: dict[int, float] = {}

    def record(name, fn, subset):
        # each method is compared with a forward pass over exactly the examples it ran on
        key = len(subset)
        if key not in bases:
            bases[key] = _timed(lambda: _forward_all(lm, subset, bs))
        seconds = _timed(fn)
        ntok = sum(len(e) for e in subset)
        rows[name] = {"seconds": seconds, "examples": len(subset), "tokens": ntok,
                      "s_per_1k_tokens": 1000 * seconds / ntok, "ratio_to_forward": seconds / bases[key],
                      "forward_s_per_1k_tokens": 1000 * bases[key] / ntok}

    small = encoded[: args.ablation_examples]
    few = encoded[: args.map_examples]
    if "importance" in only:
        record("importance", lambda: HeadImportance(objective, batch_size=bs).update(encoded), encoded)
    if "zero-ablation" in only:
        record("zero ablation (all heads)",
               lambda: AblationEffect(objective, mode="zero", batch_size=bs).update(small), small)
    if "before" in only:
        record("zero ablation, before: one head per whole-model pass",
               lambda: AblationEffect(objective, mode="zero", batch_size=bs, batched=False).update(small), small)

    def mean_ablation():
        hm = HeadMeans(lm, batch_size=bs)
        hm.update(small)
        AblationEffect(objective, mode="mean", means=hm.finalize().arrays["mean"], batch_size=bs).update(small)

    if "mean-ablation" in only:
        record("mean ablation (all heads, incl. the means pass)", mean_ablation, small)
    orders = {"first": [(i, j) for i in range(L) for j in range(H)], "random": random_order(L, H, 0)}
    if "pruning" in only:
        record("pruning curves (2 orders x 11 fractions)",
               lambda: PruningCurve(objective, orders, batch_size=bs).update(small), small)
    if "norms" in only:
        record("norm shares", lambda: NormShares(lm, batch_size=bs).update(encoded), encoded)

    def rollout_all():
        for i in range(0, len(encoded), bs):
            chunk = encoded[i:i + bs]
            out = forward(lm, pad_batch(lm, [e.input_ids for e in chunk], [e.token_type_ids for e in chunk]),
                          attentions=True)
            for b, e in enumerate(chunk):
                n = len(e)
                attention_rollout(np.stack([a[b, :, :n, :n].numpy() for a in out.attentions]))

    if "rollout" in only:
        record("rollout (incl. a forward with attentions)", rollout_all, encoded)
    if "value-zeroing" in only:
        record("value zeroing (per example, all layers)", lambda: [value_zeroing(lm, e) for e in few], few)
    if "before" in only:
        record("value zeroing, before: one token per whole-model pass",
               lambda: [value_zeroing(lm, e, batched=False) for e in few], few)
    if "agreement" in only:
        record("saliency + rollout agreement (4 rows per example, no flow)",
               lambda: AttributionAgreement(objective, max_flow_tokens=0).update(few), few)
    if "flow" in only:
        sents = []
        for line in DATA.read_text(encoding="utf-8").splitlines():
            if line.strip():
                sents.append(Example(text=line.strip()))
            if len(sents) >= 20 * args.flow_sentences:
                break
        short, _ = encode_examples(lm, sents, max_len=32)
        short = short[: args.flow_sentences]

        def flow_all():
            for e in short:
                out = forward(lm, pad_batch(lm, [e.input_ids], [e.token_type_ids]), attentions=True)
                attention_flow(np.stack([a[0].numpy() for a in out.attentions]))

        if short:
            record("attention flow (single sentences <= 32 tokens)", flow_all, short)
    print(f"model {lm.name}: {len(encoded)} segments, {tokens} tokens; {L} layers x {H} heads; "
          f"torch threads {__import__('torch').get_num_threads()}")
    if fit_note:
        print(f"loss: fitted masked-LM head ({fit_note['steps']} steps, {fit_note['seconds']:.1f} s, "
              f"held-out masked-token accuracy {fit_note['heldout_accuracy']:.3f})")
    else:
        print(f"loss: {objective.describe()['loss']}")
    print(f"{'method':<58} {'examples':>8} {'s/1k tok':>9} {'fwd s/1k':>9} {'x forward':>10}")
    for name, r in rows.items():
        print(f"{name:<58} {r['examples']:8d} {r['s_per_1k_tokens']:9.3f} {r['forward_s_per_1k_tokens']:9.3f} "
              f"{r['ratio_to_forward']:10.1f}")
    if args.json:
        args.json.write_text(json.dumps({"model": lm.name, "segments": len(encoded), "tokens": tokens,
                                         "fitted_head": fit_note, "rows": rows}, indent=1))


def command(args) -> None:
    """``attnscope analyze attribution`` on the first N segments (with ``--attribution-fit-head``)
    with ``--attribution-methods importance``, with its default methods and with ``all``: the
    command itself, each run in its own process one after the other, timed as the CPU seconds of
    that process (model load and the head fit included in each); its notes on how long each long
    method should take (its lines with "takes about") are printed as they came."""
    import os
    import resource
    import subprocess
    import sys
    import tempfile

    times = {}
    for label in ("importance", "default", "all"):
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, "-m", "attnscope", "analyze", "attribution", str(DATA), "--model", args.model,
                   "--attribution-examples", str(args.command), "--attribution-fit-head",
                   "--max-seq-len", str(args.max_seq_len), "--batch-size", str(args.batch_size), "--out", out]
            if label != "default":
                cmd += ["--attribution-methods", label]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            wall = time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.perf_counter() - wall
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if p.returncode:
                raise SystemExit(f"{label}: exit {p.returncode}: {p.stderr.strip()[-2000:]}")
            methods = json.loads((Path(out) / "results" / "attribution.json").read_text())["methods"]
        times[label] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        notes = [ln.strip() for ln in p.stderr.splitlines() + p.stdout.splitlines() if "takes about" in ln]
        print(f"{label}: {times[label]:.1f} CPU s, {wall:.1f} s wall ({','.join(methods)})", flush=True)
        for ln in notes:
            print(f"  {ln}")
    print(f"model {args.model}, {args.command} segments, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}: "
          + ", ".join(f"{label} {times[label]:.1f} CPU s / importance alone {times['importance']:.1f} CPU s = "
                      f"{times[label] / times['importance']:.2f}x" for label in ("default", "all")))


def short_sentences(lm, count: int, max_tokens: int = 32):
    """The first ``count`` WikiText-2 sentences that encode to at most ``max_tokens`` tokens."""
    from attnscope.analyses.lm_objective import encode_examples
    from attnscope.data.records import Example

    sents = []
    for line in DATA.read_text(encoding="utf-8").splitlines():
        if line.strip():
            sents.append(Example(text=line.strip()))
        if len(sents) >= 20 * count:
            break
    short, _ = encode_examples(lm, sents, max_len=max_tokens)
    return short[:count]


def agreement(lm, objective, encoded, args) -> None:
    from attnscope.analyses.agreement import AttributionAgreement

    for label, exs in (("segments", encoded[: args.map_examples]),
                       ("sentences <= 32 tokens", short_sentences(lm, args.flow_sentences))):
        t = time.perf_counter()
        ag = AttributionAgreement(objective, rows=4, max_flow_tokens=32)
        ag.update(exs)
        res = ag.finalize()
        print(f"{lm.name}, {len(exs)} {label} ({sum(len(e) for e in exs)} tokens, "
              f"{time.perf_counter() - t:.0f} s, flow skipped for {res.meta['flow_skipped']}):")
        for r in res.tables["agreement"]:
            print(f"  {r['pair']:<18} Spearman {r['spearman']:.3f} over {r['rows']} rows "
                  f"({r['undefined_rows']} undefined)")


def numbers(lm, objective, encoded, args, fit_note) -> None:
    from attnscope.analyses.ablation import PruningCurve, importance_order, random_order
    from attnscope.analyses.importance import HeadImportance
    from attnscope.analyses.norms import SHARE_CLASSES, NormShares
    from attnscope.report.attribution import general_behaviours
    from attnscope.store.results import ResultsFolder

    labels = general_behaviours(ResultsFolder(args.numbers).get("general"))
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
        from attnscope.store.results import write_json

        write_json(args.json, {"segments": len(encoded), "seconds": seconds, "fitted_head": fit_note,
                               "importance": res.to_json(), "pruning": curve.to_json(),
                               "norm_shares": shares.to_json()})


if __name__ == "__main__":
    main()
