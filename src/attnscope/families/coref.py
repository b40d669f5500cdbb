"""The coreference family: Table 2 (which heads find antecedents), end to end.

The family reads coreference files, cuts the documents into model windows and runs
:class:`~attnscope.analyses.coref.CorefAntecedents` on their word-level maps (folded where the
maps are made: here, or on the Ray workers); :func:`attnscope.report.coref.write_coref` writes
Table 2, the heatmap, the examples figure and ``results/coref.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnscope.analyses.coref import (
    CANDIDATE_SETS,
    CorefAntecedents,
    best_head_examples,
    coref_windows,
)
from attnscope.analyses.family_result import FamilyResult
from attnscope.analyses.units import TIE_RULES
from attnscope.data.coref import Document, read_coref
from attnscope.errors import AttnscopeError, InputError
from attnscope.families.base import (
    CompareTable,
    Context,
    Family,
    Input,
    Prepared,
    option,
    register_family,
)
from attnscope.report.coref import write_coref
from attnscope.report.section import Section

WINDOW_MODES = ("truncate", "sliding")


def _coref(paths: list[Path], docs: list[Document], options: "CorefOptions", ctx: Context) -> Section:
    """Coreference antecedent selection (paper section 4.3, Table 2), end to end: one pass over
    the windows of ``docs`` (read from ``paths``). ``options.window``: ``"truncate"`` (the paper:
    each document's first ``max_seq_len`` tokens) or ``"sliding"``. Writes Table 2, the per-head
    table, the heatmap, the examples figure and ``results/coref.json``."""
    if not docs:
        raise AttnscopeError("no coreference documents to analyse")
    examples, wstats = coref_windows(docs, ctx.model, mode=options.window, max_seq_len=ctx.max_seq_len)
    analysis = CorefAntecedents(options.candidates, seed=ctx.seed, n_boot=options.n_boot, top_k=3,
                                ties=options.coref_ties)
    out = ctx.passes.run(examples, [analysis], step="extract", word_level=True)
    result = out.results[analysis.name]
    result.meta.update({"windows": wstats.as_dict(), "model": ctx.model.describe(),
                        "sources": [str(p) for p in paths],
                        "extract": {"examples_out": out.stats.examples_out, "skipped": out.stats.skipped}})
    result.params.update({"window": options.window, "max_seq_len": ctx.max_seq_len,
                          "batch_size": ctx.batch_size})
    picks = best_head_examples(result, examples, lambda indices: ctx.passes.maps(examples, indices, word_level=True), n=3)
    return write_coref(result, ctx.out_dir, wstats=wstats, examples=examples, picks=picks)


# -- the family ------------------------------------------------------------------------------
@dataclass
class CorefOptions:
    window: str = option("truncate", "Documents longer than --max-seq-len: truncate (the first "
                         "window of each document, as the paper) or sliding (overlapping windows, "
                         "every mention scored once).", choices=WINDOW_MODES)
    candidates: str = option("mentions", "What a head may choose: head words of preceding "
                             "mentions, all preceding words, or every other word (all-words: the paper's definition, "
                             "always reported beside the others).", choices=CANDIDATE_SETS)
    n_boot: int = option(1000, "Bootstrap resamples for the 95% intervals.")
    coref_ties: str = option("none", "A query row whose top candidate weight is 0 or shared: none "
                             "(no prediction, counted wrong) or lowest (the paper code's argmax: "
                             "the lowest candidate).", choices=TIE_RULES)


@register_family
class Coref(Family):
    key = "coref"
    title = "Coreference: which heads find antecedents (Table 2)"
    help = "Antecedent selection accuracy of every head and three baselines (paper section 4.3)."
    inputs = (Input("coref", "Coreference files (repeatable): CoNLL-U with Entity= in MISC (CorefUD, "
                    "OntoGUM) or CoNLL-2012 *_conll; read as one corpus: Table 2.", multiple=True,
                    argument="files", sample="coref.conllu", objects=(Document,)),)
    Options = CorefOptions
    default_model = "default"
    order = 30
    compare_tables = (CompareTable("table2_coref", "table2", "model", ("all", "pronoun", "proper", "nominal"),
                                   "Table 2 of both models: antecedent selection accuracy, with the "
                                   "change."),)

    def prepare(self, inputs, options: CorefOptions, ctx: Context) -> Prepared:
        paths: list[Path] = []
        docs: list[Document] = []
        for item in inputs["coref"]:  # files, or (from Python) documents already read
            if isinstance(item, Document):
                docs.append(item)
                continue
            p = Path(item)
            paths.append(p)
            found = read_coref(p)
            if not any(d.mentions for d in found):
                raise InputError(p, "holds no coreference annotation (no Entity= brackets in MISC, "
                                    "no coreference column): nothing to score")
            docs.extend(found)
        sentences = sum(len(d.sentence_starts) for d in docs)
        return Prepared({"paths": paths, "documents": docs}, weight=sentences,
                        counts={"coreference sentences": sentences})

    def run(self, prepared: Prepared, options: CorefOptions, ctx: Context) -> FamilyResult:
        return ctx.result(_coref(prepared.data["paths"], prepared.data["documents"], options, ctx))
