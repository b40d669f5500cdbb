"""The attribution family: beyond raw attention weights (issue 13).

Inputs: sentence-per-line text (built into pairs as for the general family) or examples JSON /
JSON Lines. Over the first ``--attribution-examples`` examples it runs the selected methods:

- ``importance``: head importance (Michel et al. 2019; ``--importance-norm`` picks the paper's
  equation or their released code's normalisation), :mod:`attnscope.analyses.importance`;
- ``ablation``: per-head zero and mean ablation, :mod:`attnscope.analyses.ablation`;
- ``pruning``: pruning curves by importance vs a seeded random order (needs ``importance``);
- ``rollout``: rollout/flow agreement with raw attention and saliency over ``--attribution-map-examples``
  examples, and the maps of one example, :mod:`attnscope.analyses.rollout`;
- ``norms``: weight vs norm shares per layer, :mod:`attnscope.analyses.norms`;
- ``value-zeroing``: the value-zeroing maps of one example, :mod:`attnscope.analyses.value_zeroing`.

Methods that need a loss (importance, ablation, pruning, the saliency half of rollout) need a
masked-LM head for encoders (``--attribution-fit-head`` trains one on the frozen encoder) or a causal
model; without one they are skipped with a note. On a model whose attention does not go through
transformers' ``AttentionInterface`` (MPNet) the methods that gate heads or read their values
(importance, ablation, pruning, norms, value zeroing) are skipped with a one-line note and rollout
and flow run on its attention maps. Results go to ``results/attribution.json``.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.errors import AttnscopeError
from attnscope.families.base import Context, Family, Input, Prepared, option, register_family

ALL_METHODS = ("importance", "ablation", "pruning", "rollout", "norms", "value-zeroing")
LOSS_METHODS = ("importance", "ablation", "pruning")
#: Methods that gate heads or read values and head outputs through the forward helper's hook
#: points; rollout, flow and their agreement need only the attention maps.
HOOK_METHODS = ("importance", "ablation", "pruning", "norms", "value-zeroing")
#: A method estimated to take longer than this many seconds says so before it starts.
ANNOUNCE_S = 10.0


@dataclass
class AttributionOptions:
    attribution_methods: str = option(",".join(ALL_METHODS), "Comma-separated methods: " + ", ".join(ALL_METHODS) + ".")
    attribution_examples: int = option(100, "Examples for importance, ablation, pruning and norm shares.")
    attribution_map_examples: int = option(20, "Examples for the rollout/flow agreement (Spearman).")
    attribution_example: int = option(-1, "Index (among the analysed examples) of the example whose maps "
                                      "are drawn; -1: the shortest.")
    ablation: str = option("both", "Which ablation: zero, mean or both.", choices=("zero", "mean", "both"))
    importance_norm: str = option("paper", "Head importance: paper (Michel et al.'s equation, |dL/d gate| "
                                  "per example) or released (their code: |dL/d gate| per token, divided "
                                  "by the tokens).", choices=("paper", "released"))
    flow_max_tokens: int = option(32, "Longest input attention flow is computed for.")
    attribution_fit_head: bool = option(False, "Encoders without a masked-LM head: train an output layer on "
                                "the frozen encoder so the loss-based methods can run.")

    def method_list(self) -> list[str]:
        chosen = [m.strip() for m in self.attribution_methods.split(",") if m.strip()]
        bad = [m for m in chosen if m not in ALL_METHODS]
        if bad or not chosen:
            raise AttnscopeError(f"--attribution-methods: unknown {', '.join(bad) or '(none given)'}; "
                                 f"choose from {', '.join(ALL_METHODS)}")
        if "pruning" in chosen and "importance" not in chosen:
            chosen.insert(0, "importance")
        return [m for m in ALL_METHODS if m in chosen]


def hook_free(lm, methods: list[str]) -> tuple[list[str], str | None]:
    """The methods that can run on ``lm`` and a one-line note on those skipped (None if none).

    A model whose attention does not go through transformers' ``AttentionInterface`` (MPNet)
    gives its attention maps but no hook points, so gate- and value-based methods cannot run.
    """
    from attnscope.models.forward import supports_hooks

    if supports_hooks(lm):
        return methods, None
    skipped = [m for m in methods if m in HOOK_METHODS]
    if not skipped:
        return methods, None
    return [m for m in methods if m not in skipped], (
        f"{', '.join(skipped)} skipped: {lm.name} does not route attention through transformers' "
        "AttentionInterface, so its heads cannot be gated or hooked (rollout and flow use its "
        "attention maps)")


def _objective(lm, options: AttributionOptions, encoded, seed: int, notes: list[str]):
    from attnscope.analyses.gradients import FitOptions, fit_mlm_head
    from attnscope.analyses.lm_objective import Objective

    if lm.family.causal or lm.has_mlm_head:
        return Objective(lm, seed=seed)
    if not options.attribution_fit_head:
        notes.append(f"{lm.name} has no masked-LM head: importance, ablation, pruning and saliency "
                     "were skipped (--attribution-fit-head trains an output layer on the frozen encoder)")
        return None
    fit_inputs = [(e.tokens, np.asarray(e.special), np.asarray(e.segment), e.index) for e in encoded]
    head = fit_mlm_head(lm, fit_inputs, FitOptions(seed=seed))
    rep = head.report
    notes.append(f"{lm.name} has no masked-LM head: the loss is that of an output layer fitted on the "
                 f"frozen encoder ({rep['steps']} steps, seed {seed}, held-out masked-token accuracy "
                 f"{rep['heldout_accuracy']:.3f})")
    return Objective(lm, head=head, seed=seed)


def _forward_seconds_per_token(lm, encoded, batch_size: int, objective=None) -> float:
    """Measured seconds per token of a forward pass over the first batch: a plain one, or with
    ``objective`` its loss pass (what each ablation variant costs)."""
    from attnscope.analyses.lm_objective import loss_inputs
    from attnscope.models.forward import forward, pad_batch

    chunk = encoded[:batch_size]
    t = time.perf_counter()
    if objective is None:
        forward(lm, pad_batch(lm, [e.input_ids for e in chunk], [e.token_type_ids for e in chunk]))
    else:
        objective.run(loss_inputs(objective, chunk))
    return (time.perf_counter() - t) / max(1, sum(len(e) for e in chunk))


def _announce(name: str, method: str, passes: float, tokens: int, per_token: float) -> None:
    seconds = passes * tokens * per_token
    if seconds >= ANNOUNCE_S:
        print(f"attribution: {name} takes about {seconds:.0f} s ({passes:.0f} forward passes of "
              f"{tokens} tokens); --attribution-methods without {method} skips it", file=sys.stderr)


def run_attribution(examples, lm, out_dir: Path, options: AttributionOptions, *, seed: int = 0,
                    max_seq_len: int = 128, batch_size: int = 16, progress=None):
    """Run the selected methods and write tables, figures and ``results/attribution.json``."""
    from attnscope.analyses.ablation import (
        AblationEffect,
        HeadMeans,
        PruningCurve,
        importance_order,
        random_order,
    )
    from attnscope.analyses.agreement import AttributionAgreement
    from attnscope.analyses.importance import HeadImportance
    from attnscope.analyses.lm_objective import encode_examples
    from attnscope.analyses.norms import NormDecomposer, NormShares, example_norm_maps
    from attnscope.analyses.rollout import attention_flow, attention_rollout
    from attnscope.analyses.value_zeroing import MAX_VZ_TOKENS, forward_passes, value_zeroing
    from attnscope.models.loading import seed_everything
    from attnscope.report.attribution import write_attribution
    from attnscope.report.results import family_results, write_json

    def step(name, done, total):
        if progress is not None:
            progress(name, done, total)

    seed_everything(seed)
    methods, skipped = hook_free(lm, options.method_list())
    notes: list[str] = [skipped] if skipped else []
    encoded, dropped = encode_examples(lm, list(examples)[: options.attribution_examples], max_len=max_seq_len)
    if dropped:
        notes.append(f"{dropped} examples longer than {max_seq_len} tokens were skipped")
    if not encoded:
        raise AttnscopeError("no examples to analyse (all were longer than --max-seq-len)")
    pick = options.attribution_example
    if pick == -1:
        pick = min(range(len(encoded)), key=lambda i: (len(encoded[i]), i))
    if not 0 <= pick < len(encoded):
        raise AttnscopeError(f"--attribution-example {options.attribution_example}: only {len(encoded)} examples were analysed")
    tokens = sum(len(e) for e in encoded)
    needs_loss = any(m in methods for m in LOSS_METHODS) or "rollout" in methods
    objective = _objective(lm, options, encoded, seed, notes) if needs_loss else None
    results: dict[str, Any] = {}
    if objective is not None:
        notes.append(f"loss: {objective.describe()['loss']}")
        if "importance" in methods:
            imp = HeadImportance(objective, batch_size=max(1, batch_size // 2), norm=options.importance_norm)
            imp.update(encoded)
            results["head-importance"] = imp.finalize()
            step("attribution: importance", 1, 1)
        if "ablation" in methods:
            modes = ["zero", "mean"] if options.ablation == "both" else [options.ablation]
            means = None
            if "mean" in modes:
                hm = HeadMeans(lm, batch_size=batch_size)
                hm.update(encoded)
                means = hm.finalize().arrays["mean"]
            for mode in modes:
                ab = AblationEffect(objective, mode=mode, means=means, batch_size=batch_size)
                _announce(f"{mode} ablation", "ablation", ab.forward_passes(), tokens,
                          _forward_seconds_per_token(lm, encoded, batch_size, objective))
                ab.update(encoded)
                results[f"ablation-{mode}"] = ab.finalize()
                step(f"attribution: {mode} ablation", 1, 1)
        if "pruning" in methods and "head-importance" in results:
            orders = {"importance": importance_order(results["head-importance"].arrays["importance"]),
                      "random": random_order(lm.num_layers, lm.num_heads, seed)}
            pc = PruningCurve(objective, orders, batch_size=batch_size)
            pc.update(encoded)
            results["pruning-curve"] = pc.finalize()
            step("attribution: pruning", 1, 1)
        if "rollout" in methods:
            ag = AttributionAgreement(objective, max_flow_tokens=options.flow_max_tokens)
            ag.update(encoded[: options.attribution_map_examples])
            results["attribution-agreement"] = ag.finalize()
    if "norms" in methods:
        ns = NormShares(lm, batch_size=batch_size)
        ns.update(encoded)
        results["norm-shares"] = ns.finalize()
        step("attribution: norms", 1, 1)
    example = None
    if any(m in methods for m in ("rollout", "norms", "value-zeroing")):
        e = encoded[pick]
        maps = example_norm_maps(NormDecomposer(lm), e) if "norms" in methods else None
        weights = maps["weights"] if maps is not None else _example_attention(lm, e)  # [L H n n]
        example = {"index": e.index, "tokens": list(e.tokens), "weights": weights.mean(1),
                   "norms": maps["layer_norms"] if maps is not None else None}
        if "rollout" in methods:
            example["rollout"] = attention_rollout(weights)
            if len(e) <= options.flow_max_tokens:
                example["flow"] = attention_flow(weights, max_tokens=options.flow_max_tokens)
            else:
                notes.append(f"attention flow of example {e.index} skipped: {len(e)} tokens is above "
                             f"--flow-max-tokens {options.flow_max_tokens}")
        if "value-zeroing" in methods:
            if len(e) <= MAX_VZ_TOKENS:
                _announce("value zeroing", "value-zeroing", forward_passes(lm, len(e)), len(e),
                          _forward_seconds_per_token(lm, [e], 1))
                example["value_zeroing"] = value_zeroing(lm, e)
            else:
                notes.append(f"value zeroing of example {e.index} skipped: {len(e)} tokens is above "
                             f"{MAX_VZ_TOKENS}")
    sec = write_attribution(results, out_dir, model_name=lm.name, notes=notes, example=example)
    payload = family_results(
        "attribution", sec, {"seed": seed, **dataclasses.asdict(options)},
        family="attribution", model=lm.describe(), seed=seed, methods=methods, examples=len(encoded),
        notes=notes, findings=sec.findings, analyses={k: r.to_json() for k, r in results.items()},
        example=None if example is None else
        {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in example.items()})
    (Path(out_dir) / "results").mkdir(parents=True, exist_ok=True)
    write_json(Path(out_dir) / "results" / "attribution.json", payload)
    return sec


def _example_attention(lm, encoded) -> np.ndarray:
    """One example's attention maps ``[L H n n]`` float64 (the model's own, no hook needed)."""
    from attnscope.models.forward import forward, pad_batch

    out = forward(lm, pad_batch(lm, [encoded.input_ids], [encoded.token_type_ids]), attentions=True)
    return np.stack([a[0].double().cpu().numpy() for a in out.attentions])


@register_family
class Attribution(Family):
    key = "attribution"
    title = "Beyond attention weights: importance, ablation, rollout, norms"
    help = "Head importance and ablation, attention rollout and flow, norm-based and value-zeroing maps."
    inputs = (Input("attribution", "Sentence-per-line text (blank lines between documents; built into "
                    "pairs) or examples JSON / JSON Lines: the attribution analyses.", argument="input",
                    sample="text.txt"),)
    Options = AttributionOptions
    default_model = "default"
    order = 60
    demo = False  # beyond the paper; the demo reproduces the paper's analyses

    def wants_mlm_head(self, options: AttributionOptions) -> bool:
        return True

    def view(self, results: dict, source: str, problems: list[str]) -> dict:
        """One example's maps by every method that ran, side by side."""
        from attnscope.viz.results_views import attribution_payload

        return {"attribution": attribution_payload(results, source, problems)}

    def prepare(self, inputs, options: AttributionOptions, ctx: Context) -> Prepared:
        from attnscope.data.io import read_examples
        from attnscope.data.unlabeled import prepare_unlabeled
        from attnscope.errors import InputError

        methods = options.method_list()  # refuse a bad --attribution-methods before anything runs
        for name in ("attribution_examples", "attribution_map_examples", "flow_max_tokens"):
            if getattr(options, name) < 1:
                raise AttnscopeError(f"--{name.replace('_', '-')} must be at least 1")
        if ctx.model is None:
            raise AttnscopeError("the attribution family needs --model (it runs the model)")
        if not hook_free(ctx.model, methods)[0]:
            raise AttnscopeError(f"{ctx.model.name} does not route attention through transformers' "
                                 f"AttentionInterface, so none of the chosen methods ({', '.join(methods)}) "
                                 "can run on it; rollout uses its attention maps")
        path = Path(inputs["attribution"])
        if path.is_dir():
            raise InputError(path, "is a folder; the attribution family reads text or examples JSON")
        if path.suffix.lower() in (".json", ".jsonl"):
            examples = read_examples(path)[: options.attribution_examples]
        else:
            examples = prepare_unlabeled(path, ctx.model.tokenizer, max_seq_len=ctx.max_seq_len,
                                         seed=ctx.seed, num_examples=options.attribution_examples)
        return Prepared({"examples": examples}, weight=len(examples),
                        counts={"attribution examples": len(examples)})

    def run(self, prepared: Prepared, options: AttributionOptions, ctx: Context):
        return run_attribution(prepared.data["examples"], ctx.model, ctx.out_dir, options, seed=ctx.seed,
                               max_seq_len=ctx.max_seq_len, batch_size=ctx.batch_size,
                               progress=ctx.progress)
