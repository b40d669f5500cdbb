"""The syntax family: Table 1 (every head against every relation) and Table 3 (probes).

:func:`run_syntax` does the whole job for ``attnscope analyze syntax`` and ``attnscope run``:
extracts word-level maps (or reads a word-level store), scores every head, writes Table 1
in two selection modes, per-relation heatmaps and Figure 5 style examples, and, when a train
split is given, trains the probes of section 5 and writes Table 3. It returns a
:class:`~attnscope.report.section.Section`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from attnscope.analyses.syntax import (
    ALL,
    DIRECTIONS,
    HeadCounts,
    binary_bootstrap_ci,
    score_map,
)
from attnscope.data.records import Example
from attnscope.maps import AttentionMap
from attnscope.report.section import FigureArtifact

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
    from attnscope.report.figures import new_figure, save_figure

    acc = result_counts.accuracy()  # [R L H 2]
    figs = []
    for rel in relations:
        r = result_counts.get(rel)
        if r is None:
            continue
        L, H = acc.shape[1:3]
        fig, axes = new_figure(1, 2, figsize=(3 + 0.5 * H * 2, 1.6 + 0.45 * L), squeeze=False)
        for d, ax in enumerate(axes[0]):
            im = ax.imshow(100 * acc[r, :, :, d], vmin=0, vmax=100, cmap="viridis", aspect="auto")
            ax.set_title(f"{rel}: {DIRECTIONS[d]}", fontsize=9)
            ax.set_xlabel("head (1-indexed)")
            ax.set_ylabel("layer (1-indexed)")
            ax.set_xticks(range(H), [str(h + 1) for h in range(H)], fontsize=9)
            ax.set_yticks(range(L), [str(layer + 1) for layer in range(L)], fontsize=9)
        fig.colorbar(im, ax=axes[0].tolist(), label="accuracy (%)")
        stem = f"figure_syntax_heatmap_{_slug(rel)}"
        paths = save_figure(fig, fig_dir / stem)
        figs.append(FigureArtifact(stem, f"Accuracy (%) of every head for '{rel}' "
                                         "(layer x head, 1-indexed; left: dependent -> head, "
                                         "right: head -> dependent).", paths))
    return figs


def example_figure(m: AttentionMap, layer: int, head: int, direction: int, relation: str,
                   stem: Path, collapse_subtypes: bool = False) -> list[Path]:
    """Figure 5 style: one head's word-level attention as lines from words (left) to words
    (right); the gold arcs of ``relation`` in the head's direction are drawn in red."""
    from attnscope.analyses.syntax import relation_label
    from attnscope.analyses.units import word_units
    from attnscope.report.figures import new_figure, save_figure

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
    ax.set_title(f"head {layer + 1}-{head + 1}, {relation} ({DIRECTIONS[direction]})", fontsize=9)
    return save_figure(fig, stem)


def _pick_examples(rows: list[dict], dev_examples: list[tuple[int, Example]], get_maps,
                   fig_dir: Path, collapse_subtypes: bool, max_figures: int = 4, ties: str = "none"):
    """Figure 5 examples: for the relations whose best head beats its offset baseline most,
    the first dev sentence of 6-25 words where that head gets every such arc right."""
    from attnscope.analyses.syntax import relation_label

    figs, best, maps = [], [], {}
    chosen = sorted((r for r in rows if r["relation"] != ALL and "/" not in r["head"]
                     and r["accuracy"] > r["offset_accuracy"]),
                    key=lambda r: -(r["accuracy"] - r["offset_accuracy"]))[:max_figures]
    for row in chosen:
        rel = row["relation"]
        d = DIRECTIONS.index(row["direction"])
        layer, head = row["layer"], row["head_index"]
        cands = [(i, ex) for i, ex in dev_examples
                 if 6 <= len(ex.words) <= 25 and rel in [relation_label(x, collapse_subtypes) for x in ex.relns]][:20]
        for m in get_maps([i for i, _ in cands]):
            s = score_map(m, collapse_subtypes=collapse_subtypes, ties=ties)
            if s is None:
                continue
            mask = np.array([r == rel for r in s.relations])
            if mask.any() and s.correct[layer, head, d][mask].all():
                stem = f"figure5_syntax_{_slug(rel)}"
                paths = example_figure(m, layer, head, d, rel, fig_dir / stem, collapse_subtypes)
                figs.append(FigureArtifact(stem, f"Head {row['head']} on a dev sentence: attention "
                                                 f"lines (blue) and the gold '{rel}' arcs (red, "
                                                 f"{row['direction']}).", paths))
                best.append((layer, head, m.index, f"{rel}: {row['head']} {row['direction']}"))
                maps[m.index] = m
                break
    return figs, best, maps


# -- Table 3 --------------------------------------------------------------------------------
def _table3_row(name: str, run, n_boot: int, seed: int) -> dict:
    lo, hi = binary_bootstrap_ci(run.correct, run.total, n_boot=n_boot, seed=seed)
    return {"model": name, "uas": 100.0 * run.uas, "ci_low": 100.0 * lo, "ci_high": 100.0 * hi,
            "dependents": run.total, "best_epoch": run.best_epoch, "epochs": run.epochs_run,
            "seconds_per_epoch": run.seconds_per_epoch if run.epochs_run else None,
            "parameters": run.parameters, "paper_bert_base": PAPER_TABLE3.get(name)}










def _write(rows, stem: Path, caption: str, digits: int = 1) -> list[Path]:
    from attnscope.report.tables import write_table

    cols = TABLE3_COLUMNS + ["paper_bert_base"] if "uas" in (rows[0] if rows else {}) else TABLE1_COLUMNS
    return write_table(rows, stem, columns=cols, caption=caption, digits=digits)


def _findings(rows_paper: list[dict], rows_held: list[dict], rows3: list[dict]) -> list[str]:
    out = []
    beat = [r for r in rows_paper if r["relation"] != ALL and r["ci_low"] > r["offset_ci_high"]]
    if rows_paper:
        out.append(f"{len(beat)} of {len([r for r in rows_paper if r['relation'] != ALL])} relations "
                   "have a head whose accuracy interval lies above the best offset's.")
    # the relations where the head does best, among those where it is above the offset (a tie is not)
    top = sorted((r for r in rows_paper if r["relation"] != ALL and r["accuracy"] > r["offset_accuracy"]),
                 key=lambda r: -r["accuracy"])[:3]
    for r in top:
        out.append(f"'{r['relation']}': head {r['head']} ({r['direction']}) {r['accuracy']:.1f}% vs "
                   f"offset {r['offset']} {r['offset_accuracy']:.1f}% (n={r['count']}).")
    held = {r["relation"]: r for r in rows_held}
    drops = [(r["accuracy"] - held[r["relation"]]["accuracy"], r["relation"]) for r in rows_paper
             if r["relation"] in held]
    if drops:
        worst = max(drops)
        out.append(f"Choosing heads on held-out data costs at most {worst[0]:.1f} points "
                   f"('{worst[1]}').")
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
