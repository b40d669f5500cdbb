"""The syntax family's outputs: Table 1 (every head against every relation), Table 3 (probes).

:func:`write_syntax` turns the scored heads (:class:`~attnscope.analyses.syntax.DependencyHeads`)
and the probes' rows into Table 1 in two selection modes, Table 3, the per-relation heatmaps,
Figure 5 style examples and ``results/syntax.json``, and returns the
:class:`~attnscope.report.section.Section` (:mod:`attnscope.families.syntax` runs
the job).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from attnscope.analyses.base import Result
from attnscope.analyses.syntax import ALL, DIRECTIONS, HeadCounts, SyntaxTables, relation_label
from attnscope.analyses.units import word_units
from attnscope.data.records import HeadId
from attnscope.maps import AttentionMap
from attnscope.report.figures import new_figure, save_figure
from attnscope.report.section import FigureArtifact, Section, TableArtifact, small_sample_caution
from attnscope.report.tables import write_table
from attnscope.store.results import write_results

Progress = Callable[[str, int, "int | None"], None] | None

TABLE1_COLUMNS = ["relation", "count", "head", "direction", "accuracy", "ci_low", "ci_high",
                  "offset", "offset_accuracy", "offset_ci_low", "offset_ci_high"]
TABLE3_COLUMNS = ["model", "uas", "ci_low", "ci_high", "dependents", "best_epoch", "epochs",
                  "seconds_per_epoch", "parameters"]

#: Table 1 of the paper (BERT-base, PTB Stanford Dependencies) and the EWT (UD) relation
#: closest to each; the paper's "pobj" has no UD counterpart (UD attaches the noun, not the
#: preposition).
PAPER_TABLE1 = [("det", "det", 94.3, 51.7), ("dobj", "obj", 86.8, 40.0),
                ("poss", "nmod:poss", 80.5, 47.7), ("all", ALL, 34.5, 26.3)]
PAPER_TABLE3 = {"right-branching": 26, "distance+glove": 58, "random-init attn+glove": 30,
                "attn": 61, "attn+glove": 77}


# -- Table 1 --------------------------------------------------------------------------------
def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", s)


def heatmap_figures(result_counts: HeadCounts, relations: list[str], fig_dir: Path) -> list[FigureArtifact]:
    """One figure per relation: accuracy of every head, layer x head, both directions."""
    acc = result_counts.accuracy()  # [R L H 2]
    figs = []
    for rel in relations:
        r = result_counts.get(rel)
        if r is None:
            continue
        L, H = acc.shape[1:3]
        # the two directions one above the other, cells of at most 0.5 in: the figure keeps
        # the report's width, so its labels stay readable there
        cell = min(0.5, 6.0 / H)
        fig, axes = new_figure(2, 1, figsize=(2.6 + cell * H, 2 * (1.3 + 0.4 * L)), squeeze=False,
                               gridspec_kw={"hspace": 0.35})
        for d, ax in enumerate(axes[:, 0]):
            im = ax.imshow(100 * acc[r, :, :, d], vmin=0, vmax=100, cmap="viridis", aspect="auto")
            ax.set_title(f"{rel}: {DIRECTIONS[d]}", fontsize=10)
            if d == 1:
                ax.set_xlabel("head (1-indexed)")
            ax.set_ylabel("layer (1-indexed)")
            ax.set_xticks(range(H), [str(h + 1) for h in range(H)], fontsize=9)
            ax.set_yticks(range(L), [str(layer + 1) for layer in range(L)], fontsize=9)
        fig.colorbar(im, ax=axes[:, 0].tolist(), label="accuracy (%)")
        stem = f"figure_syntax_heatmap_{_slug(rel)}"
        paths = save_figure(fig, fig_dir / stem)
        figs.append(FigureArtifact(stem, f"Accuracy (%) of every head for '{rel}' "
                                         "(layer x head, 1-indexed; top: dependent -> head, "
                                         "bottom: head -> dependent).", paths))
    return figs


def example_figure(m: AttentionMap, layer: int, head: int, direction: int, relation: str,
                   stem: Path, collapse_subtypes: bool = False) -> list[Path]:
    """Figure 5 style: one head's word-level attention as lines from words (left) to words
    (right); the gold arcs of ``relation`` in the head's direction are drawn in red."""
    units = word_units(m)
    keep = np.nonzero(units.present)[0]  # words with a unit (a zero-token word has none)
    row_of = {int(w): r for r, w in enumerate(keep)}
    pos = units.positions[keep]
    all_words = m.example.all_words or []
    words = [all_words[w] for w in keep]
    n = len(pos)
    a = m.attn[layer, head][pos[:, None], pos[None, :]]  # [n n] words only
    fig, ax = new_figure(figsize=(4.2, 0.3 * n + 1.0))
    for i in range(n):
        ax.text(0, -i, words[i], ha="right", va="center", fontsize=8)
        ax.text(1, -i, words[i], ha="left", va="center", fontsize=8)
        for j in range(n):
            if a[i, j] > 0.05:
                ax.plot([0.02, 0.98], [-i, -j], color="tab:blue", alpha=float(min(1.0, a[i, j])), lw=1.2)
    for w in keep:
        dep, h = row_of[int(w)], row_of.get(m.example.heads[w] - 1)
        if h is None or relation_label(m.example.relns[w], collapse_subtypes) != relation:
            continue
        src, dst = (dep, h) if direction == 0 else (h, dep)
        ax.plot([0.02, 0.98], [-src, -dst], color="tab:red", lw=2.0, ls="--")
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylim(-n + 0.5, 0.8)
    ax.axis("off")
    ax.set_title(f"head {HeadId(layer, head)}, {relation} ({DIRECTIONS[direction]})", fontsize=9)
    return save_figure(fig, stem)


def _example_figures(picks: list, fig_dir: Path, collapse_subtypes: bool):
    """Figure 5: each picked ``(row, direction, map)`` (:func:`~attnscope.analyses.syntax.figure5_picks`)
    drawn, with the best heads and the maps for the report's views."""
    figs, best, maps = [], [], {}
    for row, d, m in picks:
        rel, layer, head = row["relation"], row["layer"], row["head_index"]
        stem = f"figure5_syntax_{_slug(rel)}"
        paths = example_figure(m, layer, head, d, rel, fig_dir / stem, collapse_subtypes)
        figs.append(FigureArtifact(stem, f"Head {row['head']} on a dev sentence: attention "
                                         f"lines (blue) and the gold '{rel}' arcs (red, "
                                         f"{row['direction']}).", paths))
        best.append((layer, head, m.index, f"{rel}: {row['head']} {row['direction']}"))
        maps[m.index] = m
    return figs, best, maps


# -- Table 3 --------------------------------------------------------------------------------
def _write(rows, stem: Path, caption: str, digits: int = 1) -> list[Path]:
    cols = TABLE3_COLUMNS + ["paper_bert_base"] if "uas" in (rows[0] if rows else {}) else TABLE1_COLUMNS
    return write_table(rows, stem, columns=cols, caption=caption, digits=digits)


def _interval_above(r: dict) -> bool:
    """Whether a Table 1 row's head interval lies wholly above its offset's interval."""
    return r["ci_low"] > r["offset_ci_high"]


def _versus(r: dict) -> str:
    return (f"'{r['relation']}': head {r['head']} ({r['direction']}) {r['accuracy']:.1f}% "
            f"[{r['ci_low']:.1f}, {r['ci_high']:.1f}] vs offset {r['offset']} {r['offset_accuracy']:.1f}% "
            f"[{r['offset_ci_low']:.1f}, {r['offset_ci_high']:.1f}] (n={r['count']})")


def _findings(rows_paper: list[dict], rows_held: list[dict], rows3: list[dict]) -> list[str]:
    """Plain sentences that say no more than their rows: the examples of relations whose head
    beats the offset come from the set the first sentence counts (head interval above the
    offset's); where that set is empty, the best point estimates are given as overlapping."""
    out = []
    relations = [r for r in rows_paper if r["relation"] != ALL]
    beat = [r for r in relations if _interval_above(r)]
    if rows_paper:
        has = ("relation" if len(relations) == 1 else "relations") + (" has" if len(beat) == 1 else " have")
        out.append(f"{len(beat)} of {len(relations)} {has} a head whose accuracy interval lies above "
                   "the best offset's" + (":" if len(beat) == 1 else ", the most accurate:" if beat else "."))
    for r in sorted(beat, key=lambda r: -r["accuracy"])[:3]:
        out.append(_versus(r) + ".")
    if not beat:
        # the relations where the head is above the offset by point estimate only (a tie is not)
        ahead = sorted((r for r in relations if r["accuracy"] > r["offset_accuracy"]),
                       key=lambda r: -r["accuracy"])[:3]
        for r in ahead:
            out.append(_versus(r) + ": the head is ahead by point estimate only, the intervals overlap.")
    held = {r["relation"]: r for r in rows_held}
    drops = [(r["accuracy"] - held[r["relation"]]["accuracy"], r["relation"]) for r in rows_paper
             if r["relation"] in held]
    if drops:
        worst = max(drops)
        if worst[0] > 0:
            out.append(f"Choosing heads on held-out data costs at most {worst[0]:.1f} points "
                       f"('{worst[1]}').")
        else:
            out.append("Choosing heads on held-out data costs no relation any accuracy.")
    for r in rows3:
        out.append(f"Probe '{r['model']}': UAS {r['uas']:.1f}% [{r['ci_low']:.1f}, {r['ci_high']:.1f}].")
    return out


def _paper_rows(rows_paper: list[dict], rows3: list[dict]) -> list[dict]:
    by_rel = {r["relation"]: r for r in rows_paper}
    out = []
    for paper_rel, ours_rel, head_acc, off_acc in PAPER_TABLE1:
        r = by_rel.get(ours_rel)
        if r is None:
            continue
        label = paper_rel if paper_rel == ours_rel else f"{paper_rel} (ours: {ours_rel})"
        out.append({"what": f"Table 1 best head, {label}", "paper": head_acc,
                    "ours": round(r["accuracy"], 1)})
        out.append({"what": f"Table 1 best offset, {label}", "paper": off_acc,
                    "ours": round(r["offset_accuracy"], 1)})
    for r in rows3:
        out.append({"what": f"Table 3 UAS, {r['model']}", "paper": PAPER_TABLE3[r["model"]],
                    "ours": round(r["uas"], 1)})
    return out


METHODS = [
    "Per-head probing (paper 4.2): for dependent d with gold head g, head (l, h) predicts "
    "argmax_j A[l,h,d,j] (dependent -> head) or argmax_i A[l,h,i,d] (head -> dependent), over "
    "words only (special tokens and d itself excluded). A row whose top weight is 0 or shared "
    "by several words predicts nothing and counts as wrong (--syntax-ties lowest: the lowest "
    "other word, as the paper's code). "
    "Accuracy = #correct / #dependents per relation; root words (head 0) are left out.",
    "Fixed-offset baseline: predict d + k for k in {-3..3} \\ {0}; the best k per relation.",
    "Word-level maps (paper 4.1): attention to a split word = sum over its pieces, from it = mean.",
    "Selection: 'paper' chooses the best head and offset on the scored data; 'held-out' chooses "
    "them on other data (train, or the other half of dev) and scores on dev.",
    "95% intervals: percentile bootstrap over dependents (1000 resamples, seeded), drawn as "
    "Binomial(n, k/n)/n, which is the bootstrap distribution of a mean of 0/1 values.",
    "Probes (paper 5): p(i|j) = softmax_i s(i,j), attention-only s = sum_k w_k a_k[i,j] + "
    "u_k a_k[j,i]; attention+GloVe: w_k, u_k = linear functions of (v_i ; v_j). ROOT = the "
    "special tokens (to ROOT: sum, from ROOT: mean). Trained with Adam, minibatches of "
    "sentences, early stopping on dev UAS; UAS excludes punctuation.",
]


def write_syntax(out_dir: Path, tables: SyntaxTables, *, picks: list, rows3: list[dict], probe_details: dict,
                 notes: list[str], collapse_subtypes: bool, n_boot: int, seed: int, max_seq_len: int,
                 root: str, ties: str) -> Section:
    """Tables 1 and 3, the heatmaps, Figure 5's examples, ``results/syntax.json`` and the Section,
    laid out from what the family computed: ``tables`` (Table 1 in both selection modes,
    :func:`~attnscope.analyses.syntax.syntax_tables`), ``picks`` (Figure 5's examples,
    :func:`~attnscope.analyses.syntax.figure5_picks`), ``rows3`` / ``probe_details`` (Table 3,
    :func:`~attnscope.analyses.syntax.table3_row`; empty without probes). ``notes`` go among the
    findings and into the results.
    """
    tables_dir, fig_dir, res_dir = out_dir / "tables", out_dir / "figures", out_dir / "results"
    for d in (tables_dir, fig_dir, res_dir):
        d.mkdir(parents=True, exist_ok=True)
    notes = list(notes)
    rows_paper, rows_held, min_count = tables.paper, tables.heldout, tables.min_count
    rows3 = [{**r, "paper_bert_base": PAPER_TABLE3.get(r["model"])} for r in rows3]
    cap1 = ("Table 1: best attention head per dependency relation (1-indexed layer-head) and "
            "the best fixed-offset baseline, accuracy % with 95% bootstrap intervals; relations "
            f"with at least {min_count} scored dependents ({tables.min_how}); ")
    t1 = TableArtifact("table1_syntax", cap1 + "heads chosen on the scored data (as the paper).",
                       rows_paper, TABLE1_COLUMNS)
    t1.paths = _write(rows_paper, tables_dir / t1.name, t1.caption)
    t1h = TableArtifact("table1_syntax_heldout", cap1 + tables.heldout_how + ".", rows_held, TABLE1_COLUMNS)
    t1h.paths = _write(rows_held, tables_dir / t1h.name, t1h.caption)
    section = Section(key="syntax", title="Syntax: heads and dependency relations")
    section.tables = [t1, t1h]
    figures = heatmap_figures(tables.counts, [r["relation"] for r in rows_paper], fig_dir)
    ex_figs, section.best_heads, section.maps = _example_figures(picks, fig_dir, collapse_subtypes)
    section.figures = ex_figs + figures
    if rows3:
        cap3 = ("Table 3: UAS (%, punctuation excluded) of probing classifiers on the dev split "
                "(early stopping on the same split), 95% bootstrap intervals over dependents; "
                "seconds_per_epoch is each probe's own training time per epoch (the probes "
                "share the batches, whose reading is not counted).")
        t3 = TableArtifact("table3_probes", cap3, rows3, TABLE3_COLUMNS + ["paper_bert_base"])
        t3.paths = _write(rows3, tables_dir / t3.name, t3.caption, digits=1)
        section.tables.append(t3)
    res = tables.result
    if tables.empty_words:
        notes.append(f"{tables.empty_words} dev words became zero tokens (e.g. a zero-width space): "
                     "they have no unit, are never a prediction, and neither they nor the "
                     "dependents whose head they are were scored.")
    section.findings = _findings(rows_paper, rows_held, rows3) + notes
    overall = next((r for r in rows_paper if r["relation"] == ALL), None)
    caution = overall and small_sample_caution("Table 1 (all relations)", overall["count"],
                                               overall["ci_low"], overall["ci_high"])
    if caution:
        section.findings.insert(0, caution)
    write_results(out_dir, "syntax", Result(
        analysis="syntax",
        params={"min_count": min_count, "collapse_subtypes": collapse_subtypes, "n_boot": n_boot,
                "seed": seed, "max_seq_len": max_seq_len, "root": root, **res.params},
        tables={"table1": rows_paper, "table1_heldout": rows_held, "table3": rows3},
        arrays={k: res.arrays[k] for k in ("accuracy", "offset_accuracy", "total")},
        summary=list(section.findings),
        meta={**res.meta, "probes": probe_details, "notes": notes, "heldout_selection": tables.heldout_how,
              "heads": "layer-head names are 1-indexed; layer/head_index columns 0-indexed"}))
    section.methods = list(METHODS)
    if ties != "none":
        section.methods.append("This run scored ties and rows without information with "
                               f"--syntax-ties {ties}: the lowest other word (the paper code's argmax).")
    if probe_details.get("glove"):
        section.methods.append(f"Word vectors of the probes: {probe_details['glove']} "
                               f"({probe_details.get('glove_dim')} dimensions).")
    section.paper = _paper_rows(rows_paper, rows3)
    return section
