"""The coreference family: Table 2, the layer x head heatmap and Figure 5 style examples.

:func:`run_coref` reads coreference files, cuts the documents into model windows, extracts
word-level attention, runs :class:`~attnscope.analyses.coref.CorefAntecedents` and writes
everything under ``out_dir`` (``tables/``, ``figures/``, ``results/coref.json``). It returns
the :class:`~attnscope.report.section.Section` that the HTML report assembles.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.analyses.coref import (
    WindowStats,
)
from attnscope.data.io import atomic_write_text
from attnscope.data.records import HeadId
from attnscope.report.results import dumps
from attnscope.report.section import Section

#: Table 2 of the paper (BERT-base, CoNLL-2012, documents truncated to 128 tokens), column "All".
PAPER_TABLE2 = {"nearest": 27, "head-match": 52, "rule-based": 69, "best-head": 65}
PAPER_BEST_HEAD = "5-4"

Progress = Callable[[str, int, "int | None"], None]


def _cell(row: dict, col: str) -> str:
    v = row.get(col)
    if v is None:
        return "-"
    lo, hi = row.get(f"{col}_lo"), row.get(f"{col}_hi")
    return f"{100 * v:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def _window_note(stats: WindowStats, candidates: str) -> str:
    how = ("documents truncated to their first window" if stats.mode == "truncate"
           else "sliding windows overlapping by about half; each mention scored once, in the "
                "earliest window holding its head word")
    cand = "head words of preceding mentions" if candidates == "mentions" else "all preceding words"
    return (f"window={stats.mode} ({how}), {stats.max_seq_len} tokens per window; candidates: {cand}; "
            f"{stats.scored} of {stats.anaphoric} mentions with an antecedent scored")


TABLE2_COLUMNS = ["all", "pronoun", "proper", "nominal"]


def table2_display(rows: Sequence[dict]) -> tuple[list[dict], list[str]]:
    """Table 2 as shown (Markdown, LaTeX, the report): accuracy % with its 95% interval."""
    shown = [{"Model": r["model"], **{c.capitalize(): _cell(r, c) for c in TABLE2_COLUMNS}} for r in rows]
    return shown, ["Model"] + [c.capitalize() for c in TABLE2_COLUMNS]


def write_table2(rows: Sequence[dict], stem: Path, *, caption: str, window: str, max_seq_len: int,
                 candidates: str) -> list[Path]:
    """Table 2 as Markdown and LaTeX (accuracy % with 95% CI) and CSV/JSON (fractions, CI, n)."""
    from attnscope.report.tables import to_csv, to_latex, to_markdown

    cols = TABLE2_COLUMNS
    shown, shown_cols = table2_display(rows)
    numeric_cols = ["model", "kind", "name", "layer", "head"] + [
        f"{c}{s}" for c in cols for s in ("", "_lo", "_hi", "_n")] + ["window", "max_seq_len", "candidates"]
    numeric = [{**r, "window": window, "max_seq_len": max_seq_len, "candidates": candidates} for r in rows]
    paths = []
    for ext, text in [
        ("md", f"{caption}\n\n" + to_markdown(shown, shown_cols)),
        ("tex", to_latex(shown, shown_cols, caption=caption)),
        ("csv", to_csv(numeric, numeric_cols)),
        ("json", dumps(numeric)),
    ]:
        p = stem.with_suffix(f".{ext}")
        atomic_write_text(p, text)
        paths.append(p)
    return paths


def heatmap_figure(acc: np.ndarray, stem: Path, *, title: str) -> list[Path]:
    """Layer x head accuracy heatmap (1-indexed axes, as the paper), best head outlined."""
    from attnscope.report.figures import new_figure, save_figure

    L, H = acc.shape
    fig, ax = new_figure(figsize=(max(4.0, 0.45 * H + 1.5), max(3.0, 0.4 * L + 1.2)))
    im = ax.imshow(100 * acc, cmap="viridis", aspect="auto", origin="upper")
    ax.set_xticks(range(H), [str(h + 1) for h in range(H)])
    ax.set_yticks(range(L), [str(ly + 1) for ly in range(L)])
    ax.set_xlabel("head (1-indexed)")
    ax.set_ylabel("layer (1-indexed)")
    ax.set_title(title, fontsize=9)
    if np.isfinite(acc).any():
        ly, h = np.unravel_index(np.nanargmax(acc), acc.shape)
        ax.add_patch(_rect(h - 0.5, ly - 0.5))
    fig.colorbar(im, ax=ax, label="antecedent accuracy (%)")
    return save_figure(fig, stem)


def _rect(x, y):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), 1, 1, fill=False, edgecolor="red", linewidth=2)


def examples_figure(panels: Sequence[dict], stem: Path, *, head: HeadId) -> list[Path]:
    """Figure 5 style: text snippets shaded by the head's attention from a mention's head word.

    Each panel: ``words`` (the snippet), ``query``, ``pred``, ``gold`` (indices in the snippet),
    ``weights`` ``[len(words)]``. Query word boxed in black, gold antecedent heads underlined
    in green, the head's choice boxed in orange (green when correct).
    """
    from matplotlib import colormaps

    from attnscope.report.figures import new_figure, save_figure

    cmap = colormaps["Blues"]
    line_chars = 92
    layouts = []
    for p in panels:
        rows, x, y = [], 0, 0
        for w in p["words"]:
            if x and x + len(w) > line_chars:
                x, y = 0, y + 1
            rows.append((x, y))
            x += len(w) + 1
        layouts.append((rows, y + 1))
    total_lines = sum(n + 2 for _, n in layouts) or 1
    fig, axes = new_figure(len(panels) or 1, 1, figsize=(11, 0.32 * total_lines + 0.6), squeeze=False,
                           gridspec_kw={"height_ratios": [n + 2 for _, n in layouts] or [1]})
    width_in = fig.get_figwidth() * axes[0, 0].get_position().width
    size = 0.95 * width_in * 72 / line_chars / 0.6  # monospace glyphs are ~0.6 em wide
    for ax, p, (rows, nlines) in zip(axes[:, 0], panels, layouts):
        ax.set_xlim(0, line_chars)
        ax.set_ylim(nlines + 0.5, -1.5)
        ax.axis("off")
        wmax = max(float(np.max(p["weights"])), 1e-9)
        verdict = "correct" if p["pred"] in p["gold"] else "wrong"
        ax.text(0, -1.2, f"head {head}: '{p['words'][p['query']]}' -> '{p['words'][p['pred']]}' "
                         f"({verdict}); {p['doc']}", fontsize=8, family="monospace", va="center")
        for k, (w, (x, y)) in enumerate(zip(p["words"], rows)):
            face = cmap(0.85 * float(p["weights"][k]) / wmax)
            edge, lw = "none", 0
            if k == p["query"]:
                edge, lw = "black", 1.5
            elif k == p["pred"]:
                edge, lw = ("green" if k in p["gold"] else "orange"), 1.5
            ax.text(x + len(w) / 2, y, w, fontsize=size, family="monospace", ha="center", va="center",
                    color="white" if float(p["weights"][k]) / wmax > 0.6 else "black",
                    bbox={"facecolor": face, "edgecolor": edge, "linewidth": lw, "pad": 1.0})
            if k in p["gold"]:
                ax.plot([x, x + len(w)], [y + 0.42, y + 0.42], color="green", linewidth=1.5)
    return save_figure(fig, stem)


def _snippet(words: list[str], choice: dict, max_words: int = 60) -> dict:
    q = choice["query"]
    lo = min([q] + choice["gold"] + ([choice["pred"]] if choice["pred"] >= 0 else []))
    lo = max(0, min(lo - 3, q - 5), min(q - max_words, choice["pred"]))
    hi = min(len(words), q + 4)
    return {"words": words[lo:hi], "query": q - lo, "pred": choice["pred"] - lo,
            "gold": [g - lo for g in choice["gold"] if g >= lo],
            "weights": choice["weights"][lo:hi]}






def _methods(candidates: str, ties: str = "none") -> list[str]:
    cand = {"mentions": "C = head words of the mentions whose head word precedes q in the window",
            "words": "C = all words before q in the window",
            "all-words": "C = every other word of the window (the paper's definition)"}[candidates]
    return [
        "Antecedent selection (paper section 4.3, Table 2): for a mention with head word q and "
        f"{cand}, head (l, h) predicts argmax_{{c in C}} attn[l, h, q, c] on word-level maps (attention "
        "TO a word = sum over its pieces, FROM a word = mean over its pieces); it is correct when a "
        "mention of q's cluster has its head word at the predicted position. Accuracy = correct / "
        "scored mentions, per mention type of q's head (pronoun, proper, nominal). "
        + ("A row whose top candidate weight is 0 or shared predicts nothing and counts as wrong."
           if ties == "none" else "A row whose top candidate weight is 0 or shared predicts the "
           "lowest candidate (--coref-ties lowest, the paper code's argmax)."),
        "Baselines (paper section 4.3): nearest preceding mention; nearest preceding mention with the "
        "same head word (none = wrong); rule-based: sieves in order - exact string match, head-word "
        "match, agreement in number, gender and person (UD features, then a pronoun lexicon), any "
        "mention - choosing the nearest mention passing the earliest sieve any mention passes.",
        "95% intervals: percentile bootstrap over scored mentions, seeded. The best heads are selected "
        "on the scored data itself, as in the paper.",
    ]


def coref_paths_info(section: Section) -> dict[str, Any]:
    """Paths of every artifact of a coref section (for command-line summaries)."""
    return {"tables": [str(p) for t in section.tables for p in t.paths],
            "figures": [str(p) for f in section.figures for p in f.paths]}
