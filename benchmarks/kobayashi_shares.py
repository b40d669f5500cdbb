"""attnscope's norm shares against Kobayashi et al.'s averaging (issue 23, item 4), same inputs.

attnscope (:class:`attnscope.analyses.norms.NormShares`) pools rows over examples and divides
each row's norms ``||alpha_ij f(x_j)||`` by the row's total; Kobayashi et al.'s
``emnlp2020/exp1_bert/re-examine.py`` takes per example and head the mean over rows of the class
sums of the weights and of the raw norms, then averages over examples and heads. Prints the
largest difference per layer and class of the weight shares, and of the norm shares against
their mean raw norms expressed as a share of the four classes' total.

    OMP_NUM_THREADS=1 python benchmarks/kobayashi_shares.py [--num-examples 20] [--sentences]

Default inputs: WikiText-2 validation pairs built as the general family builds them (seed 0, up
to 128 tokens); ``--sentences``: the first non-blank lines of the file, one example each.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from attnscope.analyses.lm_objective import encode_examples
from attnscope.analyses.norms import SHARE_CLASSES, NormDecomposer, NormShares
from attnscope.data.records import Example
from attnscope.data.unlabeled import prepare_unlabeled
from attnscope.models import load_model
from attnscope.models.forward import pad_batch

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2" / "valid.sentences.txt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-examples", type=int, default=20)
    ap.add_argument("--model", default="default")
    ap.add_argument("--sentences", action="store_true", help="single sentences (lengths vary)")
    ap.add_argument("--data", type=Path, default=DATA)
    args = ap.parse_args()
    lm = load_model(args.model)
    if args.sentences:
        lines = [ln.strip() for ln in args.data.read_text(encoding="utf-8").splitlines() if ln.strip()]
        examples = [Example(text=ln) for ln in lines[: args.num_examples]]
    else:
        examples = prepare_unlabeled(args.data, lm.tokenizer, max_seq_len=128, seed=0,
                                     num_examples=args.num_examples)
    enc, dropped = encode_examples(lm, examples, max_len=128)
    ns = NormShares(lm)
    ns.update(enc)
    res = ns.finalize()
    dec = NormDecomposer(lm)
    weights, norms = [], []  # per example [L H C]: mean over rows of the class sums
    for e in enc:
        k = ns.classer.classify(e.tokens, np.asarray(e.special, dtype=bool))
        first = k.first.copy()
        if lm.facts.causal and not first[0]:  # the same classes as NormShares
            first[0] = True
        cols = np.stack([first, k.separator & ~first, k.punct & ~first, k.other & ~first]).astype(float).T
        layers = dec.run(pad_batch(lm, [e.input_ids], [e.token_type_ids]))
        weights.append(np.stack([ln.attn[0].double().cpu().numpy() @ cols for ln in layers]).mean(2))
        norms.append(np.stack([ln.norms()[0].double().cpu().numpy() @ cols for ln in layers]).mean(2))
    kw = np.mean(weights, 0).mean(1)  # [L C]: over examples, then heads
    kn = np.mean(norms, 0).mean(1)
    kn_share = kn / kn.sum(-1, keepdims=True)
    lengths = [len(e) for e in enc]
    print(f"{len(enc)} examples ({dropped} dropped), {min(lengths)}-{max(lengths)} tokens, "
          f"mean {np.mean(lengths):.1f}; classes {', '.join(SHARE_CLASSES)}")
    for name, ours, theirs in (("weight share", res.arrays["weight_share"], kw),
                               ("norm share vs raw-norm share", res.arrays["norm_share"], kn_share)):
        gap = np.abs(ours - theirs)
        layer, c = np.unravel_index(gap.argmax(), gap.shape)
        print(f"{name}: largest difference {gap.max():.2e} (layer {layer + 1}, {SHARE_CLASSES[c]}: "
              f"attnscope {ours[layer, c]:.4f}, Kobayashi et al. {theirs[layer, c]:.4f})")


if __name__ == "__main__":
    main()
