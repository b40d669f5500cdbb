"""The general family: the paper's sections 3 and 6 as one job.

One streamed pass over the maps (from a store, or straight from the model) feeds relative
position, special tokens, entropy and head distances (and, when the model has a masked-LM
head, gradient importance); :func:`attnscope.report.general.write_general` then labels and
places the heads and writes the tables, figures (Figures 1, 2, 3, 4 and 6 of the paper) and
``results/general.json``. Only one map (the example drawn in Figure 1) is kept in memory.
With ``--ray`` the maps analyses and that example's keeper fold on the Ray workers and the
driver merges them (:func:`_fold_on_workers`); the maps stay on the workers.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from attnscope.analyses.clustering import general_clusters
from attnscope.analyses.distances import HeadDistances
from attnscope.analyses.entropy import Entropy
from attnscope.analyses.family_result import FamilyResult
from attnscope.analyses.figure_example import Figure1Example
from attnscope.analyses.gradients import (
    FitOptions,
    GradientImportance,
    MlmScorer,
    fit_inputs,
    fit_mlm_head,
)
from attnscope.analyses.relative_position import RelativePosition
from attnscope.analyses.special_tokens import SpecialTokens
from attnscope.analyses.streamed_general import STREAM_JS_ROWS, StreamedGeneral
from attnscope.analyses.token_classes import TokenClasser
from attnscope.data.unlabeled import PACKINGS, UnlabeledStats
from attnscope.engines.plan import ENGINES, choose_engine, maps_bytes
from attnscope.errors import AttnscopeError
from attnscope.families.base import (
    Context,
    Family,
    Input,
    Prepared,
    option,
    register_family,
)
from attnscope.models.loading import seed_everything
from attnscope.report.general import (
    write_general,
)
from attnscope.report.section import Section
from attnscope.sources import read_source
from attnscope.store import Store
from attnscope.viz.results_views import head_scatter

GRADIENT_MODES = ("auto", "off", "on", "fit-head")


def general_analyses(*, classer: TokenClasser, causal: bool, scorer: MlmScorer | None = None,
                     seed: int = 0, grad_batch_size: int = 8) -> list:
    """The analyses of one general pass, with their parameters."""
    out = [RelativePosition(seed=seed), SpecialTokens(classer, seed=seed), Entropy(causal=causal, seed=seed),
           HeadDistances()]
    if scorer is not None:
        out.append(GradientImportance(scorer, seed=seed, classer=classer, batch_size=grad_batch_size))
    return out


def _scorer_for(ctx: Context, gradients: str, classer_examples, notes: list[str]) -> MlmScorer | None:
    if gradients not in GRADIENT_MODES:
        raise AttnscopeError(f"gradients must be one of {', '.join(GRADIENT_MODES)}, not {gradients!r}",
                             params=("gradients",))
    if gradients == "off":
        notes.append("gradient importance (Figure 3) was turned off")
        return None
    model, seed = ctx.model, ctx.seed
    if model is None:
        notes.append("gradient importance (Figure 3) needs the model; a store alone has only the maps")
        if gradients == "on":
            raise AttnscopeError("gradient importance needs model (a store holds only the maps)",
                                 params=("model",))
        return None
    if model.facts.causal:
        msg = f"{model.name} is causal: no masked-LM objective, so no gradient importance (Figure 3)"
        if gradients in ("on", "fit-head"):
            raise AttnscopeError(msg)
        notes.append(msg)
        return None
    if model.has_mlm_head:
        if gradients == "fit-head":
            notes.append(f"{model.name} has a pre-trained masked-LM head; it is used (nothing fitted)")
        return MlmScorer(model)
    if gradients == "auto":
        notes.append(f"{model.name} has no masked-LM head, so gradient importance (Figure 3) was "
                     "skipped; --general-gradients fit-head trains an output layer on the frozen encoder first")
        return None
    if gradients == "on":
        raise AttnscopeError(f"{model.name}: the model has no masked-LM head; gradients fit-head "
                             "trains one on the frozen encoder", params=("gradients",))
    head = ctx.passes.call(fit_mlm_head, classer_examples(), FitOptions(seed=seed), progress=ctx.progress)
    rep = head.report
    notes.append(f"{model.name} has no masked-LM head: an output layer was trained on the frozen "
                 f"encoder ({rep['steps']} steps, {rep['masked_tokens']} masked tokens from "
                 f"{rep['examples']} examples, seed {seed}); held-out masked-token accuracy "
                 f"{rep['heldout_accuracy']:.3f} (train {rep['train_accuracy']:.3f})")
    return MlmScorer(model, head)


# -- the streaming engine (no maps) ------------------------------------------------------------
#: Outputs of the maps path that need whole maps; the streaming engine lists them as skipped.
NEEDS_MAPS = (
    "Figure 1 (token-to-token lines of example heads: needs one whole map)",
    "saving the maps (--save-maps)",
)


def _general(source, options: "GeneralOptions", ctx: Context, text: "UnlabeledStats | None" = None,
             note: str | None = None) -> Section:
    """Every general analysis over ``source`` (a list of :class:`Example`, whose maps are never all
    held, or an opened :class:`~attnscope.store.Store`); writes ``tables/``, ``figures/`` and
    ``results/general.json`` under ``ctx.out_dir``.

    ``options.gradients``: "auto" (only if the model has a masked-LM head), "off", "on",
    "fit-head" (train an output layer on the frozen encoder when there is no head).
    ``options.general_engine``: where the statistics come from: "maps" (the attention maps, as
    the paper), "streaming" (computed inside attention without ``[n n]`` maps,
    :class:`~attnscope.analyses.streamed_general.StreamedGeneral`; decoders only) or "auto"
    (streaming when one batch's maps would take more than ``general_maps_budget_gb``).
    ``ctx.save_maps``: also write the maps to this store folder (the analyses then read them back
    from it). ``text``: how sentence-per-line text became the examples (in the results and the
    findings). ``note``: one line about the examples (that they were packed for another
    tokenizer: :func:`~attnscope.data.unlabeled.packing_mismatch`), among the findings and in the
    error when none fits."""
    seed_everything(ctx.seed)
    model, engine, notes = ctx.model, options.general_engine, [note] if note else []
    is_store = isinstance(source, Store)
    if is_store and engine == "streaming":
        raise AttnscopeError("general_engine streaming needs model and text: a store already "
                             "holds the maps", params=("general_engine", "model"))
    if not is_store:
        if model is None:
            raise AttnscopeError("general: examples need a model (or pass a store)", params=("model",))
        source = list(source)
        if engine == "streaming" or (engine == "auto" and model.facts.causal):  # encoders: maps only
            chosen, line = _pick_engine(source, model, engine, ctx, options, saving=ctx.save_maps is not None)
            if chosen == "streaming":
                if ctx.progress is not None:  # one line on the console (a rich display shows it above its bars)
                    print(line, file=sys.stderr)
                return _run_streaming(source, ctx, options, line=line, text=text, note=note)
            notes.append(line)
        if ctx.save_maps is not None:
            source, is_store = ctx.passes.save_store(source, ctx.save_maps, step="extract"), True
            notes.append(f"maps saved to {ctx.save_maps}; the analyses read them back from there")
    if is_store and source.level != "token":
        notes.append("the store holds word-level maps: statistics are per word, not per token")
    model_desc, causal = ctx.made_by(source)
    classer, classes_note = TokenClasser.for_model(model)
    notes += [classes_note] if classes_note else []
    scorer = _scorer_for(ctx, options.gradient_mode, fit_inputs(source, model, ctx.max_seq_len, 512), notes)
    keeper = Figure1Example()
    analyses = general_analyses(classer=classer, causal=causal, scorer=scorer, seed=ctx.seed) + [keeper]
    out = ctx.passes.run(source, analyses, step="maps and statistics", note=note)
    notes += ctx.skipped(out.skipped)
    results = {a.name: out.results[a.name] for a in analyses if a is not keeper}
    return write_general(results, ctx.out_dir, model_desc=model_desc,
                         example_map=keeper.best, notes=notes, seed=ctx.seed, clusters=general_clusters(results),
                         run=_run_record(out, ctx, options, "maps", text,
                                         analysis_seconds={k: v for k, v in out.analysis_seconds.items()
                                                           if k != keeper.name}))


def _pick_engine(source, model, engine: str, ctx: Context, options: "GeneralOptions", *,
                 saving: bool) -> tuple[str, str]:
    """``(engine, one line saying which and why)`` for ``engine`` auto or streaming."""
    batch_size, budget_gb = ctx.batch_size, options.general_maps_budget_gb
    lengths = [len(e) for e in ctx.passes.encoded(source)]
    longest = max(lengths, default=0)
    bs = max(1, min(batch_size, len(lengths)))
    gb = maps_bytes(model, longest, bs) / 2 ** 30
    why = (f"the attention maps of a batch of {bs} examples of up to {longest} tokens would take "
           f"{gb:.2f} GB (--general-maps-budget-gb {budget_gb:g})")
    chosen = choose_engine(model, longest, bs, int(budget_gb * 2 ** 30), engine)
    if chosen == "streaming" and not model.facts.causal:
        raise AttnscopeError(f"general_engine streaming: {model.name} is not causal; the streaming "
                             "engine of the general family handles decoders only", params=("general_engine",))
    if chosen == "streaming" and saving:
        if engine == "streaming":
            raise AttnscopeError("save_maps needs the maps engine, not general_engine streaming",
                                 params=("save_maps", "general_engine"))
        raise AttnscopeError(f"save_maps needs the maps engine, but {why}; raise "
                             "general_maps_budget_gb or drop save_maps",
                             params=("save_maps", "general_maps_budget_gb"))
    how = "forced" if engine == "streaming" else "chosen"
    what = ("statistics computed inside attention, no n x n maps" if chosen == "streaming"
            else "attention maps")
    return chosen, f"Engine: {chosen} ({how}: {why}; {what})."


def _run_streaming(source: list, ctx: Context, options: "GeneralOptions", *, line: str, text=None,
                   note: str | None = None) -> Section:
    """The general statistics of a decoder from the streaming engine (no ``[n n]`` maps):
    :class:`~attnscope.analyses.streamed_general.StreamedGeneral` handed to the pass."""
    model, seed, gradients = ctx.model, ctx.seed, options.gradient_mode
    notes = ([note] if note else []) + [line]
    classer, classes_note = TokenClasser.for_model(model)
    notes += [classes_note] if classes_note else []
    _scorer_for(ctx, gradients, lambda: [], notes)
    streamed = StreamedGeneral(model, classer, seed=seed, js_rows=STREAM_JS_ROWS)
    out = ctx.passes.run(source, [streamed], step="maps and statistics", note=note)
    skipped = list(NEEDS_MAPS) + [
        f"head distances over every row (here: {STREAM_JS_ROWS} seeded rows per example, scaled to "
        "the example's rows)"]
    notes.append("Streaming engine: not computed, because they need whole attention maps: "
                 + "; ".join(skipped) + ".")
    limit = getattr(model.model.config, "max_position_embeddings", None)
    longest = streamed.longest
    if limit and longest > limit:
        notes.append(f"Inputs run to {longest} tokens, past the {limit} positions the model was "
                     "configured for; statistics beyond that length describe extrapolation.")
    notes += ctx.skipped(out.skipped)
    parts = streamed.finalized_parts
    return write_general(parts, ctx.out_dir, model_desc=model.describe(), example_map=None,
                         notes=notes, seed=seed, clusters=general_clusters(parts),
                         run=_run_record(out, ctx, options, "streaming", text, analysis_seconds={},
                                         js_rows=STREAM_JS_ROWS, skipped_outputs=skipped))


def _run_record(out, ctx: Context, options: "GeneralOptions", engine: str, text, **extra) -> dict:
    """How the pass ran, for the results' ``run``: the same record from either engine."""
    return {"examples": out.analysed, "seconds": out.seconds, **extra, "skipped": out.skipped,
            "max_seq_len": ctx.max_seq_len, "batch_size": ctx.batch_size, "gradients": options.gradient_mode,
            "engine": engine, **_text_run(text)}


def _text_run(text) -> dict:
    """How the pairs were built from text (lengths, one-segment share, ``<unk>``), for ``run``."""
    if text is None:
        return {}
    return {"text": {"summary": text.summary(), "examples": text.examples, "documents": text.documents,
                     "sentences": text.sentences, "packing": text.packing, "shorter": text.short,
                     "unk_replaced": text.unk_replaced, **text.distribution()}}


# -- the family ------------------------------------------------------------------------------
@dataclass
class GeneralOptions:
    gradients: str = option("auto", "Gradient importance (Figure 3): auto = only with a masked-LM "
                            "head; fit-head trains an output layer on the frozen encoder when the "
                            "model has none.", choices=GRADIENT_MODES)
    num_text_examples: int = option(1000, "Pairs built from sentence-per-line text (the paper "
                                    "uses 1000).", minimum=1)
    packing: str = option("bert", "How sentence-per-line text becomes pairs: bert (filled to "
                          "--max-seq-len as BERT's pre-training data) or greedy (attnscope 0.1).",
                          choices=PACKINGS)
    keep_unk: bool = option(False, "Keep WikiText's literal '<unk>' instead of the tokenizer's own "
                            "unknown token.")
    general_engine: str = option("auto", "Where the statistics come from: the attention maps, the "
                                 "streaming engine (inside attention, no n x n maps; decoders only; "
                                 "skips what needs whole maps), or auto (streaming when one batch's "
                                 "maps would not fit in --general-maps-budget-gb).", choices=ENGINES)
    general_maps_budget_gb: float = option(2.0, "Largest size of one batch's attention maps for "
                                           "--general-engine auto to use them.", minimum=0.0)

    @property
    def gradient_mode(self) -> str:  # one spelling of fit-head now (kept for its callers)
        return self.gradients


@register_family
class General(Family):
    key = "general"
    title = "What do the heads attend to? (paper sections 3 and 6)"
    help = "Relative position, special tokens, entropy, gradients, head distances and clusters."
    inputs = (Input("text", "Sentence-per-line text (blank lines between documents; built into "
                    "pairs), examples JSON / JSON Lines, or a store folder: the general analyses.",
                    kinds=("store", "examples", "text"), argument="input", sample="text.txt"),)
    Options = GeneralOptions
    saves_maps = True
    order = 10
    reads_attention_kinds = True

    def wants_mlm_head(self, options: GeneralOptions) -> bool:
        return options.gradient_mode != "off"

    def view(self, result: FamilyResult, source: str, problems: list[str]) -> dict:
        """The heads placed by the clustering's MDS (Figure 6), labelled by behaviour."""
        return {"scatter": head_scatter(result, "general_heads", "mds_x", "mds_y", "behaviour", source)}

    def prepare(self, inputs, options: GeneralOptions, ctx: Context) -> Prepared:
        source = read_source(inputs["text"], self.inputs[0].kinds, model=ctx.model,
                             max_seq_len=ctx.max_seq_len, seed=ctx.seed,
                             num_examples=options.num_text_examples, packing=options.packing,
                             keep_unk=options.keep_unk, require_model=True, attention=ctx.attention)
        return Prepared({"source": source}, weight=len(source), counts={"text examples": len(source)})

    def explain(self, prepared: Prepared, options: GeneralOptions, ctx: Context) -> list[str]:
        """The engine the pass would take (maps, or the streaming engine for a decoder whose
        batch's maps would not fit) and why, as the run says it."""
        data, engine = prepared.data["source"].data, options.general_engine
        if isinstance(data, Store):
            return ["Engine: maps (the store holds them)."]
        if engine == "maps" or (engine == "auto" and not ctx.model.facts.causal):
            return [f"Engine: maps ({'asked for' if engine == 'maps' else 'an encoder: the maps engine only'})."]
        return [_pick_engine(list(data), ctx.model, engine, ctx, options, saving=ctx.save_maps is not None)[1]]

    def run(self, prepared: Prepared, options: GeneralOptions, ctx: Context) -> FamilyResult:
        source = prepared.data["source"]
        return ctx.result(_general(source.data, options, ctx, source.text if source.text and source.text.examples else None,
                        source.note))
