"""Head atlas benchmark: the whole KV-cache sweep against one full-cache evaluation of the same
tasks, and against the sweep done the obvious way.

On the same generated tasks (WikiText-2 haystack from ../shared/data, the packaged SmolLM2),
in one process, one after the other:

  full      one full-cache evaluation: for each task, transformers' own greedy
            ``model.generate`` on context + question (sdpa attention, its own cache)
  sweep     attnscope's sweep: each task's context prefilled once, the full-cache answer, then
            every (ranking, fraction) row answered on that one prefill, up to --batch rows at a
            time (:func:`attnscope.analyses.atlas.sweep`)
  naive     the sweep as a press library runs it: every row prefills the context again and
            answers alone (timed on --naive-rows rows per task, scaled to all rows)

and prints each time, the sweep's time over one full evaluation, and the naive sweep's time
over attnscope's. Scores and rankings come from seeded random rankings (the sweep's cost does
not depend on which ranking it follows).

    PYTHONPATH=src python benchmarks/atlas.py --tasks 6 --length 2048
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIKITEXT = ROOT.parent / "shared" / "data" / "wikitext-2" / "valid.sentences.txt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=6)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--rankings", type=int, default=10, help="rankings swept (seeded random)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--naive-rows", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not WIKITEXT.is_file():
        raise SystemExit(f"{WIKITEXT}: the shared corpora are missing")
    import numpy as np
    import torch

    from attnscope.analyses import atlas as A
    from attnscope.data import tasks as T
    from attnscope.engines import press as P
    from attnscope.extract.tasks import encode_task
    from attnscope.models import load_model
    from attnscope.models.generation import causal_lm_for

    torch.set_num_threads(args.threads)
    lm = load_model("smollm2")
    model = causal_lm_for(lm)
    tok = lm.tokenizer
    hay = T.haystack_sentences(WIKITEXT.read_text(encoding="utf-8"))
    tasks = T.generate_tasks(tok, count=args.tasks, length=args.length, kinds=T.DEFAULT_KINDS,
                             haystack=hay, seed=0)
    encs = [encode_task(tok, t) for t in tasks]
    kv = lm.num_kv_heads
    rankings = {f"random_{i}": np.random.default_rng(i).permutation(lm.num_layers * kv)
                for i in range(args.rankings)}
    fractions = [0, 0.1, 0.25, 0.5, 0.75, 1]
    configs, masks = A.configs_for(rankings, fractions, (lm.num_layers, kv))

    t0 = time.perf_counter()
    right = 0
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        for e, t in zip(encs, tasks):
            out = model.generate(torch.tensor([e.context + e.question]), max_new_tokens=e.max_new,
                                 do_sample=False)
            right += t.correct(tok.decode(out[0, len(e.context) + len(e.question):], skip_special_tokens=True))
    full_s = time.perf_counter() - t0
    from attnscope.models.forward import ATTN_IMPLEMENTATION

    model.set_attn_implementation(ATTN_IMPLEMENTATION)

    t0 = time.perf_counter()
    step = A.SweepStep(masks, configs, sink=4, window=64, batch=args.batch)
    sw = A.sweep(configs, [step(lm, e) for e in encs])
    sweep_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    for e in encs:
        for c in range(args.naive_rows):
            ctx = P.prefill(lm, model, e)
            P.answer(lm, model, ctx, e, masks[c:c + 1], sink=4, window=64, eos=A.eos_ids(model))
    naive_s = (time.perf_counter() - t0) * len(configs) / args.naive_rows

    print(f"SmolLM2-135M, {len(encs)} tasks of {args.length} context tokens, {len(configs)} sweep rows "
          f"({args.rankings} rankings x 4 fractions + whole cache + all streaming), "
          f"{torch.get_num_threads()} threads")
    print(f"full-cache evaluation (model.generate): {full_s:8.1f} s   ({right}/{len(encs)} correct)")
    print(f"attnscope sweep:                        {sweep_s:8.1f} s   ({int(sw.full_correct.sum())}/{len(encs)} "
          f"correct with the whole cache; f = 1 identical on {int(sw.f1_identical.sum())})")
    print(f"naive sweep (prefill per row), scaled:  {naive_s:8.1f} s   (from {args.naive_rows} rows per task)")
    print(f"sweep / one full evaluation:  {sweep_s / full_s:.1f}x")
    print(f"naive / attnscope sweep:      {naive_s / sweep_s:.1f}x")


if __name__ == "__main__":
    main()
