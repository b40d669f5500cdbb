"""The ``patterns`` family: Vig's attention patterns per head, and the [SEP]-key signature.

Input: examples (JSON list or JSON Lines), sentence-per-line text (made into
``[CLS] A [SEP] B [SEP]`` pairs with :func:`attnscope.data.unlabeled.prepare_unlabeled`), or a
store folder written by ``attnscope extract`` (token level). One streamed pass feeds
:class:`~attnscope.analyses.patterns.VigPatterns` together with the section 3 analyses it
refers to (relative position for patterns 1 and 2, special tokens for pattern 6, entropy for
the section 6 labels shown beside). When the model is run, the same pass over each batch
collects the keys through the forward helper's ``"k"`` hook for
:class:`~attnscope.analyses.patterns.KeyConcentration` (a store holds no keys, and a model
whose attention does not go through transformers' ``AttentionInterface``, such as LUKE, gives
its maps but no hook points: key concentration is then skipped with a note).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from attnscope.analyses.entropy import Entropy
from attnscope.analyses.family_result import FamilyResult
from attnscope.analyses.patterns import KeyConcentration, PatternThresholds, VigPatterns
from attnscope.analyses.relative_position import RelativePosition
from attnscope.analyses.special_tokens import SpecialTokens
from attnscope.analyses.token_classes import TokenClasser
from attnscope.errors import AttnscopeError, InputError
from attnscope.families.base import (
    Context,
    Family,
    Input,
    Prepared,
    check_options,
    option,
    register_family,
)
from attnscope.models.forward import supports_hooks
from attnscope.models.loading import seed_everything
from attnscope.report.patterns import write_patterns
from attnscope.sources import read_source

_D = PatternThresholds()


@register_family
class PatternsFamily(Family):
    key = "patterns"
    title = "Vig's patterns"
    help = "Vig's attention patterns (repeats, word pieces, bag of words, delimiters) and key signatures per head."
    inputs = (Input("patterns", "Examples (JSON / JSON Lines), sentence-per-line text (made into "
                                "A/B pairs), or a token-level store folder.",
                    kinds=("store", "examples", "text"),
                    sample="text.txt"),)
    order = 40
    reads_attention_kinds = True
    demo = False  # beyond the paper; the demo reproduces the paper's analyses
    default_model = "default"  # for files; a store alone gives everything but the key signature

    @dataclasses.dataclass
    class Options:
        delimiter: float = option(_D.delimiter, "Label 'delimiter' above this attention to [CLS]/[SEP].", minimum=0)
        position: float = option(_D.position, "Label 'previous'/'next' above this attention.", minimum=0)
        repeat: float = option(_D.repeat, "Label a repeat pattern above this mass on repeated tokens.", minimum=0)
        pieces: float = option(_D.pieces, "Label 'word pieces' above this mass on the word's earlier or "
                                          "later pieces.", minimum=0)
        lift: float = option(_D.lift, "Repeat and pieces labels also need this many times the chance level.", minimum=0)
        bag_within: float = option(_D.bag_within, "Label 'bag of words' above this mass within the own "
                                                  "segment ...", minimum=0)
        bag_evenness: float = option(_D.bag_evenness, "... and at least this within-segment entropy as a "
                                                      "share of uniform.", minimum=0)

        def thresholds(self) -> PatternThresholds:
            return PatternThresholds(**dataclasses.asdict(self))

    def prepare(self, inputs: dict[str, Any], options: Any, ctx: Context) -> Prepared:
        path = inputs.get("patterns")
        if path is None:
            raise AttnscopeError("the patterns family needs an input (--patterns)")
        check_options(options)  # the thresholds are at least 0
        source = read_source(path, self.inputs[0].kinds, model=ctx.model, max_seq_len=ctx.max_seq_len,
                             seed=ctx.seed, require_model=True, attention=ctx.attention)
        if source.is_store and source.data.level != "token":
            raise InputError(path, "the store holds word-level maps; Vig's patterns need token level "
                                   "(extract without --word-level)")
        what = "stored examples" if source.is_store else f"{source.kind} examples"
        return Prepared({"source": source}, weight=len(source), counts={what: len(source)})

    def run(self, prepared: Prepared, options: Any, ctx: Context) -> FamilyResult:
        seed_everything(ctx.seed)
        source = prepared.data["source"]
        model = ctx.model
        notes: list[str] = [source.note] if source.note else []
        model_desc, causal = ctx.made_by(source.data)
        classer, note = TokenClasser.for_model(model)
        notes += [note] if note else []
        analyses = [VigPatterns(classer, causal=causal), SpecialTokens(classer), RelativePosition(),
                    Entropy(causal=causal)]
        if source.is_store:
            notes.append("key concentration needs the model's forward pass; a store holds only the maps")
        elif not supports_hooks(model):
            notes.append(f"key concentration skipped: {model.name} does not route attention through "
                         "transformers' AttentionInterface, so its keys cannot be hooked (the patterns "
                         "come from its attention maps)")
        else:
            analyses.append(KeyConcentration(lm=model, classer=classer))
        out = ctx.passes.run(source.data, analyses, step="maps and patterns", note=source.note)
        notes += ctx.skipped(out.skipped)
        results = {a.name: out.results[a.name] for a in analyses[:4]}
        wanted = sorted({int(i) for k, arr in results["vig-patterns"].arrays.items()
                         if k.startswith("best_example_") for i in arr.ravel() if i >= 0})
        run_info = {"examples": out.analysed, "skipped": out.skipped, "seconds": out.seconds,
                    "max_seq_len": ctx.max_seq_len, "batch_size": ctx.batch_size, "input": source.kind}
        return ctx.result(write_patterns(results, out.results.get(KeyConcentration.name), Path(ctx.out_dir),
                              model_desc=model_desc, causal=causal, thresholds=options.thresholds(),
                              notes=notes, seed=ctx.seed, run=run_info,
                              get_map=_map_getter(source, model, ctx, wanted)))


def _map_getter(source, model, ctx: Context, wanted: list[int]):
    """A function ``index -> AttentionMap | None`` for the examples the best-heads table names
    (read from the store, or extracted again: only those few)."""
    if source.is_store:
        def get(i: int):
            try:
                return source.data.by_index(i)
            except KeyError:
                return None
        return get
    valid = [i for i in wanted if 0 <= i < len(source)]
    return {m.index: m for m in ctx.passes.maps(source.data, valid)}.get
