"""The coreference family: Table 2 (which heads find antecedents), end to end.

:func:`run_coref` reads coreference files, cuts the documents into model windows, extracts
word-level attention and runs :class:`~attnscope.analyses.coref.CorefAntecedents`;
:mod:`attnscope.report.coref` writes Table 2, the heatmap and the examples figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnscope.analyses.coref import (
    BASELINES,
    CANDIDATE_SETS,
    CorefAntecedents,
    coref_windows,
    head_choices,
)
from attnscope.analyses.units import TIE_RULES
from attnscope.data.coref import MENTION_TYPES, Document, read_coref
from attnscope.data.records import HeadId
from attnscope.errors import InputError
from attnscope.families.base import (
    CompareTable,
    Context,
    Family,
    Input,
    Prepared,
    option,
    register_family,
)
from attnscope.report.coref import (
    PAPER_BEST_HEAD,
    PAPER_TABLE2,
    Progress,
    _methods,
    _snippet,
    _window_note,
    examples_figure,
    heatmap_figure,
    table2_display,
    write_table2,
)
from attnscope.report.results import write_results
from attnscope.report.section import (
    MIN_ITEMS,
    FigureArtifact,
    Section,
    TableArtifact,
    small_sample_caution,
)

WINDOW_MODES = ("truncate", "sliding")


def run_coref(paths: list[Path], model, out_dir: Path, *, window: str = "truncate",
              max_seq_len: int = 128, batch_size: int = 16, seed: int = 0,
              progress: Progress | None = None, candidates: str = "mentions", n_boot: int = 1000,
              top_k: int = 3, n_examples: int = 3,
              documents: Sequence[Document] | None = None, ties: str = "none",
              executor=None) -> Section:
    """Coreference antecedent selection (paper section 4.3, Table 2), end to end.

    ``paths``: CorefUD CoNLL-U or CoNLL-2012 files, read as one corpus (``documents`` may be
    given instead, already read). ``model``: a loaded model. ``window``: ``"truncate"`` (the
    paper: each document's first ``max_seq_len`` tokens) or ``"sliding"``. Writes Table 2,
    the per-head table, the heatmap, the examples figure and ``results/coref.json``.
    ``executor``: where the forward passes run (:mod:`attnscope.executor`; default here).
    """
    from attnscope.errors import AttnscopeError
    from attnscope.executor import run_pass
    from attnscope.extract.runner import ExtractOptions

    out_dir = Path(out_dir)
    docs: list[Document] = list(documents) if documents is not None else []
    if documents is None:
        for i, p in enumerate(paths):
            docs.extend(read_coref(p))
            if progress:
                progress("read", i + 1, len(paths))
    if not docs:
        raise AttnscopeError("no coreference documents to analyse")
    examples, wstats = coref_windows(docs, model, mode=window, max_seq_len=max_seq_len)
    analysis = CorefAntecedents(candidates, seed=seed, n_boot=n_boot, top_k=top_k, ties=ties)
    opts = ExtractOptions(max_seq_len=max_seq_len, batch_size=batch_size, word_level=True, seed=seed)
    out = run_pass(examples, [analysis], model=model, options=opts, executor=executor, step="extract",
                   progress=progress)
    xstats = out.stats
    result = out.results[analysis.name]
    note = _window_note(wstats, candidates)
    result.meta.update({"windows": wstats.as_dict(), "model": model.describe(),
                        "sources": [str(p) for p in paths], "window_note": note,
                        "extract": {"examples_out": xstats.examples_out, "skipped": xstats.skipped}})
    result.params.update({"window": window, "max_seq_len": max_seq_len, "batch_size": batch_size})

    tables_dir, figures_dir = out_dir / "tables", out_dir / "figures"
    section = Section(key="coref", title="Coreference: which heads find antecedents (Table 2)")
    rows = result.tables["table2"]
    caption = (f"Antecedent selection accuracy (%) with 95% bootstrap CIs ({n_boot} resamples, seed "
               f"{seed}) on {wstats.documents} documents; {note}. Heads are 1-indexed layer-head; the "
               f"best heads are chosen on the same mentions they are scored on (as the paper; the "
               f"held-out table below chooses them on other mentions).")
    t2 = write_table2(rows, tables_dir / "table2_coref", caption=caption, window=window,
                      max_seq_len=max_seq_len, candidates=candidates)
    shown, shown_cols = table2_display(rows)
    section.tables.append(TableArtifact("table2_coref", caption, shown, shown_cols, t2))
    from attnscope.report.tables import write_table

    paper_rows = result.tables.get("table2_all_words") or []
    if paper_rows and candidates != "all-words":
        # The paper's definition (section 4.1): a head predicts whichever other word gets the most
        # attention; the baselines still choose among preceding mentions.
        cap_p = (f"Table 2 with the paper's definition of a head's prediction: every other word of the "
                 f"window is a candidate (baselines as above). Accuracy (%) with 95% bootstrap CIs; "
                 f"{note}.")
        tp = write_table2(paper_rows, tables_dir / "table2_coref_all_words", caption=cap_p,
                          window=window, max_seq_len=max_seq_len, candidates="all-words")
        shown_p, cols_p = table2_display(paper_rows)
        section.tables.append(TableArtifact("table2_coref_all_words", cap_p, shown_p, cols_p, tp))
    held = result.tables.get("table2_heldout") or []
    if held:
        cap_h = ("Held-out head selection: the best head chosen on one part of the mentions "
                 "(selected_on) and scored on another (scored_on); same_data_best is the best head's "
                 "accuracy when chosen on the scored part itself, as in the paper. Fractions; "
                 f"accuracy_lo/hi is the 95% bootstrap interval. {note}.")
        cols_h = ["candidates", "selected_on", "scored_on", "name", "select_accuracy", "accuracy",
                  "accuracy_lo", "accuracy_hi", "n", "same_data_best", "nearest", "head-match",
                  "rule-based"]
        hh = write_table(held, tables_dir / "table2_coref_heldout", columns=cols_h, caption=cap_h)
        section.tables.append(TableArtifact("table2_coref_heldout", cap_h, held, cols_h, hh))

    head_cols = ["name", "layer", "head", "all", *MENTION_TYPES]
    head_caption = f"Antecedent accuracy of every head (layer, head 0-indexed; name 1-indexed); {note}."
    hp = write_table(result.tables["heads"], tables_dir / "coref_heads", columns=head_cols,
                     caption=head_caption)
    section.tables.append(TableArtifact("coref_heads", head_caption, result.tables["heads"], head_cols, hp))

    acc = result.arrays["accuracy"]
    if acc.size:
        hm_caption = f"Antecedent selection accuracy per head (red: best). {note}."
        section.figures.append(FigureArtifact("coref_heatmap", hm_caption, heatmap_figure(
            acc, figures_dir / "coref_heatmap", title="coreference: antecedent accuracy per head")))

    if rows:
        best = rows[len(BASELINES)]
        head = HeadId(best["layer"], best["head"])
        panels, maps = _examples(examples, model, head, candidates, n_examples, opts, ties)
        if panels:
            ex_caption = (f"Head {head} on real text: shading is its attention from the head word of a "
                          f"mention (black box); green underlines are gold antecedent head words; the "
                          f"head's choice is boxed (green: correct, orange: wrong). {note}.")
            section.figures.append(FigureArtifact("figure5_coref_examples", ex_caption, examples_figure(
                panels, figures_dir / "figure5_coref_examples", head=head)))
        for p in panels:
            section.best_heads.append((head.layer, head.head, p["example_index"],
                                       f"coref {head}: {p['words'][p['query']]} -> {p['words'][p['pred']]}"))
        section.maps.update(maps)
        result.meta["examples"] = [{k: v for k, v in p.items() if k != "weights"} for p in panels]
        by_kind = dict(zip(BASELINES, rows))
        section.paper = [
            {"what": "Table 2, nearest mention (all)", "paper": PAPER_TABLE2["nearest"],
             "ours": round(100 * by_kind["nearest"]["all"], 1)},
            {"what": "Table 2, same head word (all)", "paper": PAPER_TABLE2["head-match"],
             "ours": round(100 * by_kind["head-match"]["all"], 1)},
            {"what": "Table 2, rule-based (all)", "paper": PAPER_TABLE2["rule-based"],
             "ours": round(100 * by_kind["rule-based"]["all"], 1)},
            {"what": f"Table 2, best head (paper {PAPER_BEST_HEAD}, ours {head})",
             "paper": PAPER_TABLE2["best-head"], "ours": round(100 * best["all"], 1)},
        ]
    best_row = rows[len(BASELINES)] if len(rows) > len(BASELINES) else None
    caution = best_row and small_sample_caution(
        "Table 2", best_row.get("all_n") or 0, *(None if best_row.get(k) is None else 100 * best_row[k]
                                                for k in ("all_lo", "all_hi")))
    section.findings = ([caution] if caution else []) + list(result.summary) + [
        against_rules(result.tables.get(key) or [], what) for key, what in (
            ("table2", f"with {candidates} as candidates"),
            ("table2_all_words", "with the paper's definition (every other word a candidate)"))
        if result.tables.get(key)] + [
        f"{wstats.scored} of {wstats.anaphoric} mentions that have an antecedent were scored "
        f"({window} windows of {max_seq_len} tokens, {wstats.windows} windows over "
        f"{wstats.documents} documents)"]
    if xstats.skipped:
        section.findings.append(f"{len(xstats.skipped)} windows were longer than {max_seq_len} tokens "
                                f"and skipped")
    section.methods = _methods(candidates, ties)
    write_results(out_dir, "coref", result)
    return section


def _examples(examples, model, head: HeadId, candidates: str, n: int, opts, ties: str = "none",
              ) -> tuple[list[dict], dict]:
    """Re-extract a few windows (distinct documents) and describe the best head's choices."""
    from attnscope.extract.runner import extract

    chosen, seen_docs = [], set()
    for i, ex in enumerate(examples):
        info = ex.fields["coref"]
        if info["doc_index"] in seen_docs or not any(info["mentions"]["score"]):
            continue
        chosen.append(i)
        seen_docs.add(info["doc_index"])
        if len(chosen) >= 4 * n:
            break
    panels, maps = [], {}
    sub = [examples[i] for i in chosen]
    amaps = {}
    for batch in extract(sub, model, options=opts):
        for amap in batch:
            amaps[chosen[amap.index]] = amap
    for i in chosen:
        if i not in amaps or len(panels) >= n:
            continue
        amap = amaps[i]
        info = examples[i].fields["coref"]
        choices = head_choices(amap, info, head.layer, head.head, candidates, ties)
        # prefer a correct choice at some distance, as the paper's figure shows
        good = [c for c in choices if c["correct"] and 0 <= c["pred"] and c["query"] - c["pred"] <= 50]
        if not good:
            continue
        pick = max(good, key=lambda c: (c["query"] - c["pred"], -c["query"]))
        snip = _snippet(examples[i].words, pick)
        snip.update({"doc": info["doc"], "example_index": i, "window": info["window"]})
        panels.append(snip)
        amap.index = i
        maps[i] = amap
    return panels, maps


def against_rules(rows: list[dict], what: str) -> str:
    """Whether the best head comes close to the rule-based system: said only when its accuracy
    lies within the rule-based system's 95% interval (or above it), and never from fewer than
    :data:`~attnscope.report.section.MIN_ITEMS` mentions."""
    by_kind = dict(zip(BASELINES, rows))
    rb, best = by_kind["rule-based"], rows[len(BASELINES)]
    what = f"{what[:1].upper()}{what[1:]}"
    if best["all"] is None or rb["all"] is None:
        return f"{what}: too few mentions to compare the best head with the rule-based system"
    head = f"the best head ({best['name']}, {100 * best['all']:.1f}%)"
    rules = (f"the rule-based system ({100 * rb['all']:.1f}% [{100 * rb['all_lo']:.1f}, "
             f"{100 * rb['all_hi']:.1f}])")
    n = best.get("all_n")
    if n is not None and n < MIN_ITEMS:
        return f"{what}, {head} is not compared with {rules}: {n} mentions are fewer than {MIN_ITEMS}."
    verdict = ("comes close to" if best["all"] >= rb["all_lo"] else "falls short of")
    if best["all"] > rb["all_hi"]:
        verdict = "beats"
    return f"{what}, {head} {verdict} {rules}."


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
                    argument="files", sample="coref.conllu"),)
    Options = CorefOptions
    default_model = "default"
    order = 30
    compare_tables = (CompareTable("table2_coref", "table2", "model", ("all", "pronoun", "proper", "nominal"),
                                   "Table 2 of both models: antecedent selection accuracy, with the "
                                   "change."),)

    def prepare(self, inputs, options: CorefOptions, ctx: Context) -> Prepared:
        paths = [Path(p) for p in inputs["coref"]]
        docs: list[Document] = []
        for p in paths:
            found = read_coref(p)
            if not any(d.mentions for d in found):
                raise InputError(p, "holds no coreference annotation (no Entity= brackets in MISC, "
                                    "no coreference column): nothing to score")
            docs.extend(found)
        sentences = sum(len(d.sentence_starts) for d in docs)
        return Prepared({"paths": paths, "documents": docs}, weight=sentences,
                        counts={"coreference sentences": sentences})

    def run(self, prepared: Prepared, options: CorefOptions, ctx: Context) -> Section:
        return run_coref(prepared.data["paths"], ctx.model, ctx.out_dir, window=options.window,
                         max_seq_len=ctx.max_seq_len, batch_size=ctx.batch_size, seed=ctx.seed,
                         progress=ctx.progress, candidates=options.candidates, n_boot=options.n_boot,
                         documents=prepared.data["documents"], ties=options.coref_ties,
                         executor=ctx.executor)
