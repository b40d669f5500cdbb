"""The ``patterns`` family: Vig's attention patterns per head, and the [SEP]-key signature.

Input: examples (JSON list or JSON Lines), sentence-per-line text (made into
``[CLS] A [SEP] B [SEP]`` pairs with :func:`attnscope.data.unlabeled.prepare_unlabeled`), or a
store folder written by ``attnscope extract`` (token level). One streamed pass feeds
:class:`~attnscope.analyses.patterns.VigPatterns` together with the section 3 analyses it
refers to (relative position for patterns 1 and 2, special tokens for pattern 6, entropy for
the section 6 labels shown beside). When the model is run, a second pass over each batch
collects the keys through the forward helper's ``"k"`` hook for
:class:`~attnscope.analyses.patterns.KeyConcentration` (a store holds no keys).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from attnscope.analyses.patterns import KeyConcentration, PatternThresholds, VigPatterns
from attnscope.data.unlabeled import packing_mismatch
from attnscope.errors import AttnscopeError, InputError
from attnscope.families.base import (
    Context,
    Family,
    Input,
    Prepared,
    check_options,
    nothing_fits,
    open_input_store,
    option,
    register_family,
)

_D = PatternThresholds()


def _looks_like_json(path: Path) -> bool:
    if path.suffix.lower() in (".json", ".jsonl"):
        return True
    from attnscope.data.io import read_text

    return read_text(path).lstrip()[:1] in ("[", "{")


@register_family
class PatternsFamily(Family):
    key = "patterns"
    title = "Vig's patterns"
    help = "Vig's attention patterns (repeats, word pieces, bag of words, delimiters) and key signatures per head."
    inputs = (Input("patterns", "Examples (JSON / JSON Lines), sentence-per-line text (made into "
                                "A/B pairs), or a token-level store folder.", store=True,
                    sample="text.txt"),)
    order = 40
    default_model = "default"  # for files; a store alone gives everything but the key signature

    @dataclasses.dataclass
    class Options:
        delimiter: float = option(_D.delimiter, "Label 'delimiter' above this attention to [CLS]/[SEP].",
                                  flag="--delimiter-threshold", minimum=0)
        position: float = option(_D.position, "Label 'previous'/'next' above this attention.",
                                 flag="--position-threshold", minimum=0)
        repeat: float = option(_D.repeat, "Label a repeat pattern above this mass on repeated tokens.",
                               flag="--repeat-threshold", minimum=0)
        pieces: float = option(_D.pieces, "Label 'word pieces' above this mass on the word's earlier or "
                                          "later pieces.", flag="--pieces-threshold", minimum=0)
        lift: float = option(_D.lift, "Repeat and pieces labels also need this many times the chance level.",
                             flag="--lift", minimum=0)
        bag_within: float = option(_D.bag_within, "Label 'bag of words' above this mass within the own "
                                                  "segment ...", flag="--bag-within", minimum=0)
        bag_evenness: float = option(_D.bag_evenness, "... and at least this within-segment entropy as a "
                                                      "share of uniform.", flag="--bag-evenness", minimum=0)

        def thresholds(self) -> PatternThresholds:
            return PatternThresholds(**dataclasses.asdict(self))

    def prepare(self, inputs: dict[str, Any], options: Any, ctx: Context) -> Prepared:
        path = inputs.get("patterns")
        if path is None:
            raise AttnscopeError("the patterns family needs an input (--patterns)")
        path = Path(path)
        check_options(options)  # the thresholds are at least 0
        if path.is_dir():
            store = open_input_store(path)
            if store.level != "token":
                raise InputError(path, "the store holds word-level maps; Vig's patterns need token level "
                                       "(extract without --word-level)")
            return Prepared({"source": store, "kind": "store"}, weight=len(store),
                            counts={"stored examples": len(store)})
        if not path.is_file():
            raise InputError(path, "no such file or store folder")
        if _looks_like_json(path):
            from attnscope.data.io import read_examples

            examples = read_examples(path)
            kind = "examples"
        else:
            if ctx.model is None:
                raise AttnscopeError(f"{path}: sentence-per-line text needs a model (its tokenizer cuts the pairs)")
            from attnscope.data.unlabeled import prepare_unlabeled

            examples = prepare_unlabeled(path, ctx.model.tokenizer, max_seq_len=ctx.max_seq_len, seed=ctx.seed)
            kind = "text"
        if ctx.model is None:
            raise AttnscopeError(f"{path}: examples need a model (or give a store folder)")
        note = packing_mismatch(examples, ctx.model, path)
        return Prepared({"source": examples, "kind": kind, "note": note}, weight=len(examples),
                        counts={f"{kind} examples": len(examples)})

    def run(self, prepared: Prepared, options: Any, ctx: Context):
        from attnscope.analyses.entropy import Entropy
        from attnscope.analyses.relative_position import RelativePosition
        from attnscope.analyses.special_tokens import SpecialTokens
        from attnscope.analyses.token_classes import TokenClasser
        from attnscope.models.loading import seed_everything
        from attnscope.report.patterns import write_patterns

        seed_everything(ctx.seed)
        source, kind = prepared.data["source"], prepared.data["kind"]
        model = ctx.model
        notes: list[str] = [prepared.data["note"]] if prepared.data.get("note") else []
        if kind == "store":
            causal = bool(source.manifest["model"].get("causal", False))
            model_desc = source.manifest["model"]
        else:
            causal = bool(model.family.causal)
            model_desc = model.describe()
        classer, note = TokenClasser.for_model(model)
        notes += [note] if note else []
        analyses = [VigPatterns(classer, causal=causal), SpecialTokens(classer), RelativePosition(),
                    Entropy(causal=causal)]
        keys = KeyConcentration() if kind != "store" else None
        if keys is None:
            notes.append("key concentration needs the model's forward pass; a store holds only the maps")
        total = prepared.weight
        done = 0
        t0 = time.perf_counter()
        from attnscope.extract.runner import ExtractStats

        stats = ExtractStats()
        batches = source.batches() if kind == "store" else _model_batches(model, source, ctx, keys, classer, stats)
        for batch in batches:
            for a in analyses:
                a.update(batch)
            done += len(batch)
            ctx.step("patterns", done, total)
        skipped = len(stats.skipped)
        if done == 0:
            raise nothing_fits(ctx.max_seq_len, prepared.data.get("note"))
        if skipped:
            notes.append(f"{skipped} examples longer than {ctx.max_seq_len} tokens were skipped")
        results = {a.name: a.finalize() for a in analyses}
        key_result = keys.finalize() if keys is not None else None
        wanted = sorted({int(i) for k, arr in results["vig-patterns"].arrays.items()
                         if k.startswith("best_example_") for i in arr.ravel() if i >= 0})
        run_info = {"examples": done, "skipped": skipped, "seconds": time.perf_counter() - t0,
                    "max_seq_len": ctx.max_seq_len, "batch_size": ctx.batch_size, "input": kind}
        return write_patterns(results, key_result, Path(ctx.out_dir), model_desc=model_desc, causal=causal,
                              thresholds=options.thresholds(), notes=notes, seed=ctx.seed, run=run_info,
                              get_map=_map_getter(source, kind, model, ctx, wanted))


def _options(ctx: Context):
    from attnscope.extract.runner import ExtractOptions

    return ExtractOptions(max_seq_len=ctx.max_seq_len, batch_size=ctx.batch_size, seed=ctx.seed)


def _model_batches(model, examples, ctx: Context, keys: KeyConcentration, classer, stats):
    """One :class:`AttentionBatch` per planned batch; the same forward pass feeds ``keys``
    through the forward helper's ``"k"`` hook."""
    import numpy as np

    from attnscope.extract.runner import Extractor

    extractor = Extractor(model, _options(ctx), stats)
    for planned in extractor.plan(examples):
        width = max(len(e) for e in planned)
        classes = np.full((len(planned), width), -1, dtype=np.int64)
        for b, e in enumerate(planned):
            classes[b, :len(e)] = KeyConcentration.class_ids(classer, e.tokens, e.special)

        def hook(site, k, classes=classes):
            keys.update(site.layer, k.float().cpu().numpy(), classes)

        yield extractor.run_batch(planned, hooks={"k": hook})


def _map_getter(source, kind: str, model, ctx: Context, wanted: list[int]):
    """A function ``index -> AttentionMap | None`` for the examples the best-heads table names
    (read from the store, or extracted again: only those few)."""
    if kind == "store":
        def get(i: int):
            try:
                return source.by_index(i)
            except KeyError:
                return None
        return get
    from attnscope.extract.runner import Extractor

    extractor = Extractor(model, _options(ctx))
    maps = {}
    valid = [i for i in wanted if 0 <= i < len(source)]
    for planned in extractor.plan([source[i] for i in valid]):
        for m in extractor.run_batch(planned):
            real = valid[m.index]
            maps[real] = dataclasses.replace(m, index=real)
    return maps.get
