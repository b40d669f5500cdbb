"""The attribution family: beyond raw attention weights (issue 13).

Inputs: sentence-per-line text (built into pairs as for the general family) or examples JSON /
JSON Lines. Over the first ``--attribution-examples`` examples it runs the selected methods:

- ``importance``: head importance (Michel et al. 2019; ``importance_norm`` picks the paper's
  equation or their released code's normalisation), :mod:`attnscope.analyses.importance`;
- ``ablation``: per-head zero and mean ablation, :mod:`attnscope.analyses.ablation` (only when
  named, or with ``all``: it takes longer than the other methods together);
- ``pruning``: pruning curves by importance vs a seeded random order (needs ``importance``);
- ``rollout``: rollout/flow agreement with raw attention and saliency over ``--attribution-map-examples``
  examples, and the maps of one example, :mod:`attnscope.analyses.rollout`;
- ``norms``: weight vs norm shares per layer, :mod:`attnscope.analyses.norms`;
- ``value-zeroing``: the value-zeroing maps of one example, :mod:`attnscope.analyses.value_zeroing`.

Methods that need a loss (importance, ablation, pruning, the saliency half of rollout) need a
masked-LM head for encoders (``--attribution-fit-head`` trains one on the frozen encoder) or a causal
model; without one they are skipped with a note. On a model whose attention does not go through
transformers' ``AttentionInterface`` (LUKE) the methods that gate heads or read their values
(importance, ablation, pruning, norms, value zeroing) are skipped with a one-line note and rollout
and flow run on its attention maps. Results go to ``results/attribution.json``.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnscope.analyses.ablation import importance_order, random_order
from attnscope.analyses.base import get_analysis
from attnscope.analyses.example_maps import example_maps, seconds_per_token
from attnscope.analyses.family_result import FamilyResult
from attnscope.analyses.gradients import FitOptions, fit_mlm_head
from attnscope.analyses.lm_objective import Objective, encode_examples
from attnscope.errors import AttnscopeError
from attnscope.families.base import Context, Family, Input, Prepared, option, register_family
from attnscope.models.forward import supports_hooks
from attnscope.models.loading import seed_everything
from attnscope.report.attribution import write_attribution
from attnscope.sources import read_source
from attnscope.viz.results_views import attribution_payload

ALL_METHODS = ("importance", "ablation", "pruning", "rollout", "norms", "value-zeroing")
#: Every method but per-head ablation, whose two modes alone take longer than all the others
#: together (``2 (1 + H (L + 1) / 2)`` forward passes; ``all`` or naming it runs it).
DEFAULT_METHODS = tuple(m for m in ALL_METHODS if m != "ablation")
LOSS_METHODS = ("importance", "ablation", "pruning")
#: Methods that gate heads or read values and head outputs through the forward helper's hook
#: points; rollout, flow and their agreement need only the attention maps.
HOOK_METHODS = ("importance", "ablation", "pruning", "norms", "value-zeroing")
#: A method estimated to take longer than this many seconds says so before it starts.
ANNOUNCE_S = 10.0


@dataclass
class AttributionOptions:
    attribution_methods: str = option(",".join(DEFAULT_METHODS), "Comma-separated methods from "
                                      + ", ".join(ALL_METHODS) + ", or all. The default leaves out "
                                      "ablation, which takes longer than the others together.")
    attribution_examples: int = option(100, "Examples for importance, ablation, pruning and norm shares.")
    attribution_map_examples: int = option(20, "Examples for the rollout/flow agreement (Spearman).")
    attribution_example: int = option(-1, "Index (among the analysed examples) of the example whose maps "
                                      "are drawn; -1: the shortest.")
    ablation: str = option("both", "Which ablation, when the ablation method runs: zero, mean or both.",
                           choices=("zero", "mean", "both"))
    importance_norm: str = option("paper", "Head importance: paper (Michel et al.'s equation, |dL/d gate| "
                                  "per example) or released (their code: |dL/d gate| per token, divided "
                                  "by the tokens).", choices=("paper", "released"))
    flow_max_tokens: int = option(32, "Longest input attention flow is computed for.")
    attribution_fit_head: bool = option(False, "Encoders without a masked-LM head: train an output layer on "
                                "the frozen encoder so the loss-based methods can run.")

    def method_list(self) -> list[str]:
        chosen = [m.strip() for m in self.attribution_methods.split(",") if m.strip()]
        chosen = [n for m in chosen for n in (ALL_METHODS if m == "all" else (m,))]
        bad = [m for m in chosen if m not in ALL_METHODS]
        if bad or not chosen:
            raise AttnscopeError(f"attribution_methods names {', '.join(bad) or 'no method'}; "
                                 f"choose from {', '.join(ALL_METHODS)} or all", params=("attribution_methods",))
        if self.ablation != "both" and "ablation" not in chosen:  # a choice that would do nothing
            raise AttnscopeError(f"ablation {self.ablation} needs the 'ablation' method in attribution_methods "
                                 "(add 'ablation', or all)", params=("ablation", "attribution_methods"))
        if "pruning" in chosen and "importance" not in chosen:
            chosen.insert(0, "importance")
        return [m for m in ALL_METHODS if m in chosen]


def hook_free(lm, methods: list[str]) -> tuple[list[str], str | None]:
    """The methods that can run on ``lm`` and a one-line note on those skipped (None if none).

    A model whose attention does not go through transformers' ``AttentionInterface`` (LUKE)
    gives its attention maps but no hook points, so gate- and value-based methods cannot run.
    """
    if supports_hooks(lm):
        return methods, None
    skipped = [m for m in methods if m in HOOK_METHODS]
    if not skipped:
        return methods, None
    return [m for m in methods if m not in skipped], (
        f"{', '.join(skipped)} skipped: {lm.name} does not route attention through transformers' "
        "AttentionInterface, so its heads cannot be gated or hooked (rollout and flow use its "
        "attention maps)")


def _objective(ctx: Context, options: AttributionOptions, encoded, notes: list[str]):
    lm, seed = ctx.model, ctx.seed
    if lm.facts.causal or lm.has_mlm_head:
        return Objective(lm, seed=seed)
    if not options.attribution_fit_head:
        notes.append(f"{lm.name} has no masked-LM head: importance, ablation, pruning and saliency "
                     "were skipped (--attribution-fit-head trains an output layer on the frozen encoder)")
        return None
    fit_inputs = [(e.tokens, np.asarray(e.special), np.asarray(e.segment), e.index) for e in encoded]
    head = ctx.passes.call(fit_mlm_head, fit_inputs, FitOptions(seed=seed), progress=ctx.progress)
    rep = head.report
    notes.append(f"{lm.name} has no masked-LM head: the loss is that of an output layer fitted on the "
                 f"frozen encoder ({rep['steps']} steps, seed {seed}, held-out masked-token accuracy "
                 f"{rep['heldout_accuracy']:.3f})")
    return Objective(lm, head=head, seed=seed)


def _announce(name: str, method: str, cost: tuple[float, int], tokens: int,
              per_token: tuple[float, float]) -> None:
    """One line on stderr before a method estimated at :data:`ANNOUNCE_S` seconds or more,
    naming the option that skips it. ``cost``: its forward passes and loss passes over
    ``tokens`` (``cost()`` of the analysis); ``per_token``:
    :func:`~attnscope.analyses.example_maps.seconds_per_token`."""
    passes, losses = cost
    seconds = tokens * (passes * per_token[0] + losses * per_token[1])
    if seconds >= ANNOUNCE_S:
        loss = f" and {losses} loss passes" if losses else ""
        print(f"attribution: {name} takes about {seconds:.0f} s ({passes:.0f} forward passes{loss} over "
              f"{tokens} tokens); --attribution-methods without {method} skips it", file=sys.stderr)


#: What each result's pass is called in the progress display (a pass runs several).
STEPS = {"head-importance": "importance", "ablation-zero": "zero ablation", "head-means": "head means",
         "ablation-mean": "mean ablation", "pruning-curve": "pruning", "norm-shares": "norms",
         "attribution-agreement": "agreement of the maps with gradients"}

#: Analyses that say how long they will take before they start: result key -> (name, method).
ANNOUNCED = {"ablation-zero": ("zero ablation", "ablation"), "ablation-mean": ("mean ablation", "ablation"),
             "pruning-curve": ("pruning", "pruning")}


#: The analyses each method runs: ``(result key, registry name, pass)``. Pass 0 needs nothing;
#: pass 1 reads pass 0's results (the heads' mean outputs, the importance order); pass 2 runs
#: on the first ``attribution_map_examples`` examples. Which ablations run follows ``ablation``.
METHOD_ANALYSES: dict[str, tuple[tuple[str, str, int], ...]] = {
    "importance": (("head-importance", "head-importance", 0),),
    "ablation": (("ablation-zero", "ablation", 0), ("head-means", "head-means", 0),
                 ("ablation-mean", "ablation", 1)),
    "pruning": (("pruning-curve", "pruning-curve", 1),),
    "rollout": (("attribution-agreement", "attribution-agreement", 2),),
    "norms": (("norm-shares", "norm-shares", 0),),
    "value-zeroing": (),
}
#: Results that feed a later pass only (not reported).
INTERMEDIATE = ("head-means",)


def _arguments(key: str, lm, objective, options: AttributionOptions, ctx: Context,
               earlier: dict[str, Any]) -> dict[str, Any] | None:
    """The constructor arguments of the analysis behind result ``key`` (None: it cannot run,
    because it needs a loss and the model has none)."""
    bs = ctx.batch_size
    loss = {
        "head-importance": lambda: dict(batch_size=max(1, bs // 2), norm=options.importance_norm),
        "ablation-zero": lambda: dict(mode="zero", batch_size=bs),
        "ablation-mean": lambda: dict(mode="mean", means=earlier["head-means"].arrays["mean"], batch_size=bs),
        "pruning-curve": lambda: dict(batch_size=bs, orders={
            "importance": importance_order(earlier["head-importance"].arrays["importance"]),
            "random": random_order(lm.num_layers, lm.num_heads, ctx.seed)}),
        "attribution-agreement": lambda: dict(max_flow_tokens=options.flow_max_tokens),
    }
    if key in loss:
        return None if objective is None else {"objective": objective, **loss[key]()}
    return {"lm": lm, "batch_size": bs}  # head-means, norm-shares: the model alone


def _run_passes(examples, agreement: list, methods: list[str], objective, options: AttributionOptions,
                ctx: Context, encoded: list) -> dict[str, Any]:
    """Each method's analyses (by registry name, :data:`METHOD_ANALYSES`) handed to the
    pipeline's passes (the agreement pass on ``agreement``, a head of ``examples``); returns
    result key -> Result."""
    ablations = {"both": ("ablation-zero", "head-means", "ablation-mean"), "zero": ("ablation-zero",),
                 "mean": ("head-means", "ablation-mean")}[options.ablation]
    wanted = [w for m in methods for w in METHOD_ANALYSES[m] if m != "ablation" or w[0] in ablations]
    results: dict[str, Any] = {}
    tokens, per_token = sum(len(e) for e in encoded), None  # per_token: measured once, when needed
    for p, source in ((0, examples), (1, examples), (2, agreement)):
        built = []
        for key, name, q in wanted:
            args = _arguments(key, ctx.model, objective, options, ctx, results) if q == p else None
            if args is not None:
                built.append((key, get_analysis(name)(**args)))
        for key, a in built:
            if key in ANNOUNCED:
                if per_token is None:
                    per_token = ctx.passes.call(seconds_per_token, encoded, ctx.batch_size, objective)
                _announce(*ANNOUNCED[key], a.cost(), tokens, per_token)
        if built:
            step = " and ".join(STEPS[key] for key, _ in built)
            out = ctx.passes.run(source, [a for _, a in built], step=step)
            results.update({key: out.results[a.name] for key, a in built})
    return {k: r for k, r in results.items() if k not in INTERMEDIATE}


@register_family
class Attribution(Family):
    key = "attribution"
    title = "Beyond attention weights: importance, ablation, rollout, norms"
    help = "Head importance and ablation, attention rollout and flow, norm-based and value-zeroing maps."
    inputs = (Input("attribution", "Sentence-per-line text (blank lines between documents; built into "
                    "pairs) or examples JSON / JSON Lines: the attribution analyses.", argument="input",
                    kinds=("examples", "text"), sample="text.txt"),)
    Options = AttributionOptions
    default_model = "default"
    order = 60
    uses = ("general",)  # each head's behaviour label, when the general family runs in the same job
    demo = False  # beyond the paper; the demo reproduces the paper's analyses

    def wants_mlm_head(self, options: AttributionOptions) -> bool:
        return True

    def view(self, result: FamilyResult, source: str, problems: list[str]) -> dict:
        """One example's maps by every method that ran, side by side."""
        return {"attribution": attribution_payload(result, source, problems)}

    def prepare(self, inputs, options: AttributionOptions, ctx: Context) -> Prepared:
        methods = options.method_list()  # refuse a bad --attribution-methods before anything runs
        for name in ("attribution_examples", "attribution_map_examples", "flow_max_tokens"):
            if getattr(options, name) < 1:
                raise AttnscopeError(f"{name} must be at least 1", params=(name,))
        if ctx.model is None:
            raise AttnscopeError("the attribution family needs model (it runs the model)", params=("model",))
        if not hook_free(ctx.model, methods)[0]:
            raise AttnscopeError(f"attribution_methods {','.join(methods)}: {ctx.model.name} does not route "
                                 "attention through transformers' AttentionInterface, so none of them can run "
                                 "on it; rollout uses its attention maps", params=("attribution_methods",))
        source = read_source(inputs["attribution"], self.inputs[0].kinds, model=ctx.model,
                             max_seq_len=ctx.max_seq_len, seed=ctx.seed,
                             num_examples=options.attribution_examples, limit=options.attribution_examples)
        examples = source.data
        return Prepared({"examples": examples}, weight=len(examples),
                        counts={"attribution examples": len(examples)})

    def run(self, prepared: Prepared, options: AttributionOptions, ctx: Context) -> FamilyResult:
        """Hand the chosen methods' analyses to the pipeline's passes, draw one example's maps,
        and write tables, figures and ``results/attribution.json``."""
        lm, examples = ctx.model, prepared.data["examples"]
        seed_everything(ctx.seed)
        methods, skipped = hook_free(lm, options.method_list())
        notes: list[str] = [skipped] if skipped else []
        encoded, dropped = encode_examples(lm, examples, max_len=ctx.max_seq_len)  # to pick and fit on
        notes += ctx.skipped(dropped)
        if not encoded:
            raise AttnscopeError(f"no examples to analyse (all were longer than max_seq_len {ctx.max_seq_len})",
                                 params=("max_seq_len",))
        pick = options.attribution_example
        if pick == -1:
            pick = min(range(len(encoded)), key=lambda i: (len(encoded[i]), i))
        if not 0 <= pick < len(encoded):
            raise AttnscopeError(f"attribution_example {options.attribution_example}: only {len(encoded)} "
                                 "examples were analysed", params=("attribution_example",))
        needs_loss = any(m in methods for m in LOSS_METHODS) or "rollout" in methods
        objective = _objective(ctx, options, encoded, notes) if needs_loss else None
        if objective is not None:
            notes.append(f"loss: {objective.describe()['loss']}")
            if options.attribution_methods == ",".join(DEFAULT_METHODS) and not skipped:  # it could run
                notes.append("per-head ablation did not run: it is not in the default methods, since it "
                             "takes longer than all of them together; --attribution-methods all runs it")
        # the agreement pass: the examples up to the attribution_map_examples-th that fits
        last = encoded[min(options.attribution_map_examples, len(encoded)) - 1].index
        results = _run_passes(examples, examples[: last + 1], methods, objective, options, ctx, encoded)
        example = ctx.passes.call(example_maps, encoded[pick], methods, flow_max_tokens=options.flow_max_tokens,
                           notes=notes, announce=_announce)
        return ctx.result(write_attribution(results, ctx.out_dir, notes=notes, example=example,
                                 general=ctx.results.get("general"),
                                 params={"seed": ctx.seed, **dataclasses.asdict(options)},
                                 model=lm.describe(), seed=ctx.seed, methods=methods, examples=len(encoded)))
