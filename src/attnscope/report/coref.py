"""The coreference family: Table 2, the layer x head heatmap and Figure 5 style examples.

:func:`run_coref` reads coreference files, cuts the documents into model windows, extracts
word-level attention, runs :class:`~attnscope.analyses.coref.CorefAntecedents` and writes
everything under ``out_dir`` (``tables/``, ``figures/``, ``results/coref.json``). It returns
the :class:`~attnscope.report.section.Section` that the HTML report assembles.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.analyses.coref import (
    BASELINES,
    CorefAntecedents,
    WindowStats,
    coref_windows,
    head_choices,
)
from attnscope.data.coref import MENTION_TYPES, Document, read_coref
from attnscope.data.io import atomic_write_text
from attnscope.data.records import HeadId
from attnscope.report.section import FigureArtifact, Section, TableArtifact

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


def write_table2(rows: Sequence[dict], stem: Path, *, caption: str, window: str, max_seq_len: int,
                 candidates: str) -> list[Path]:
    """Table 2 as Markdown and LaTeX (accuracy % with 95% CI) and CSV/JSON (fractions, CI, n)."""
    from attnscope.report.tables import to_csv, to_latex, to_markdown

    cols = ["all", "pronoun", "proper", "nominal"]
    shown = [{"Model": r["model"], **{c.capitalize(): _cell(r, c) for c in cols}} for r in rows]
    shown_cols = ["Model"] + [c.capitalize() for c in cols]
    numeric_cols = ["model", "kind", "name", "layer", "head"] + [
        f"{c}{s}" for c in cols for s in ("", "_lo", "_hi", "_n")] + ["window", "max_seq_len", "candidates"]
    numeric = [{**r, "window": window, "max_seq_len": max_seq_len, "candidates": candidates} for r in rows]
    paths = []
    for ext, text in [
        ("md", f"{caption}\n\n" + to_markdown(shown, shown_cols)),
        ("tex", to_latex(shown, shown_cols, caption=caption)),
        ("csv", to_csv(numeric, numeric_cols)),
        ("json", json.dumps(numeric, indent=1, ensure_ascii=False) + "\n"),
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


def run_coref(paths: list[Path], model, out_dir: Path, *, window: str = "truncate",
              max_seq_len: int = 128, batch_size: int = 16, seed: int = 0,
              progress: Progress | None = None, candidates: str = "mentions", n_boot: int = 1000,
              top_k: int = 3, n_examples: int = 3,
              documents: Sequence[Document] | None = None) -> Section:
    """Coreference antecedent selection (paper section 4.3, Table 2), end to end.

    ``paths``: CorefUD CoNLL-U or CoNLL-2012 files, read as one corpus (``documents`` may be
    given instead, already read). ``model``: a loaded model. ``window``: ``"truncate"`` (the
    paper: each document's first ``max_seq_len`` tokens) or ``"sliding"``. Writes Table 2,
    the per-head table, the heatmap, the examples figure and ``results/coref.json``.
    """
    from attnscope.errors import AttnscopeError
    from attnscope.extract.runner import ExtractOptions, ExtractStats, extract

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
    analysis = CorefAntecedents(candidates, seed=seed, n_boot=n_boot, top_k=top_k)
    opts = ExtractOptions(max_seq_len=max_seq_len, batch_size=batch_size, word_level=True, seed=seed)
    xstats = ExtractStats()
    done = 0
    for batch in extract(examples, model, options=opts, stats=xstats):
        analysis.update(batch)
        done += len(batch)
        if progress:
            progress("extract", done, len(examples))
    result = analysis.finalize()
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
               f"best heads are chosen on the same mentions they are scored on.")
    t2 = write_table2(rows, tables_dir / "table2_coref", caption=caption, window=window,
                      max_seq_len=max_seq_len, candidates=candidates)
    section.tables.append(TableArtifact("table2_coref", caption, rows,
                                        ["model", "all", "pronoun", "proper", "nominal"], t2))
    from attnscope.report.tables import write_table

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
        panels, maps = _examples(examples, model, head, candidates, n_examples, opts)
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
    section.findings = list(result.summary) + [
        f"{wstats.scored} of {wstats.anaphoric} mentions that have an antecedent were scored "
        f"({window} windows of {max_seq_len} tokens, {wstats.windows} windows over "
        f"{wstats.documents} documents)"]
    if xstats.skipped:
        section.findings.append(f"{len(xstats.skipped)} windows were longer than {max_seq_len} tokens "
                                f"and skipped")
    section.methods = _methods(candidates)
    result.save(out_dir / "results" / "coref.json")
    return section


def _examples(examples, model, head: HeadId, candidates: str, n: int, opts) -> tuple[list[dict], dict]:
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
        choices = head_choices(amap, info, head.layer, head.head, candidates)
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


def _methods(candidates: str) -> list[str]:
    cand = ("C = head words of the mentions whose head word precedes q in the window"
            if candidates == "mentions" else "C = all words before q in the window")
    return [
        "Antecedent selection (paper section 4.3, Table 2): for a mention with head word q and "
        f"{cand}, head (l, h) predicts argmax_{{c in C}} attn[l, h, q, c] on word-level maps (attention "
        "TO a word = sum over its pieces, FROM a word = mean over its pieces); it is correct when a "
        "mention of q's cluster has its head word at the predicted position. Accuracy = correct / "
        "scored mentions, per mention type of q's head (pronoun, proper, nominal).",
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
