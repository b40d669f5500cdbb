"""The coreference family's outputs: Table 2, the layer x head heatmap and Figure 5 style examples.

:func:`write_coref` turns the result of :class:`~attnscope.analyses.coref.CorefAntecedents`
into everything under ``out_dir`` (``tables/``, ``figures/``, ``results/coref.json``) and
returns the :class:`~attnscope.report.section.Section` that the HTML report assembles
(:mod:`attnscope.families.coref` runs the job).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from attnscope.analyses.base import Result
from attnscope.analyses.coref import BASELINES, PAPER_DEFINITION, WindowStats
from attnscope.data.coref import MENTION_TYPES
from attnscope.data.io import atomic_write_text
from attnscope.data.records import Example, HeadId
from attnscope.report.figures import new_figure, save_figure
from attnscope.report.section import (
    MIN_ITEMS,
    FigureArtifact,
    Section,
    TableArtifact,
    small_sample_caution,
)
from attnscope.report.tables import to_csv, to_latex, to_markdown, write_table
from attnscope.store.results import dumps, write_results

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


def write_coref(result: Result, out_dir: Path, *, wstats: WindowStats, examples: Sequence[Example],
                picks: list) -> Section:
    """Table 2 (with the paper's candidates and held out), the per-head table, the heatmap,
    the examples figure, ``results/coref.json`` and the Section, from the finalized ``result``
    of :class:`~attnscope.analyses.coref.CorefAntecedents` (its params also carry ``window``
    and ``max_seq_len``, its meta the extraction's ``skipped`` windows). ``examples``: the
    windows that were scored, and ``picks`` the best head's examples to draw
    (:func:`~attnscope.analyses.coref.best_head_examples`)."""
    params = result.params
    candidates, window, max_seq_len = params["candidates"], params["window"], params["max_seq_len"]
    note = _window_note(wstats, candidates)
    result.meta["window_note"] = note
    tables_dir, figures_dir = out_dir / "tables", out_dir / "figures"
    section = Section(key="coref", title="Coreference: which heads find antecedents (Table 2)")
    rows = result.tables["table2"]
    caption = (f"Antecedent selection accuracy (%) with 95% bootstrap CIs ({params['n_boot']} resamples, "
               f"seed {params['seed']}) on {wstats.documents} documents; {note}. Heads are 1-indexed "
               f"layer-head; the best heads are chosen on the same mentions they are scored on (as the "
               f"paper; the held-out table below chooses them on other mentions).")
    t2 = write_table2(rows, tables_dir / "table2_coref", caption=caption, window=window,
                      max_seq_len=max_seq_len, candidates=candidates)
    shown, shown_cols = table2_display(rows)
    section.tables.append(TableArtifact("table2_coref", caption, shown, shown_cols, t2))
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
        _best_head_examples(section, result, examples, picks, figures_dir, note)
    best_row = rows[len(BASELINES)] if len(rows) > len(BASELINES) else None
    caution = best_row and small_sample_caution(
        "Table 2", best_row.get("all_n") or 0, *(None if best_row.get(k) is None else 100 * best_row[k]
                                                for k in ("all_lo", "all_hi")))
    paper_rows = result.tables.get("table2_all_words")
    # the comparison with the rule-based system restates the summary's best head under the
    # paper's definition (with its interval): say it once
    summary = [s for s in result.summary if not (paper_rows and s.startswith(PAPER_DEFINITION))]
    section.findings = ([caution] if caution else []) + summary + [
        against_rules(result.tables.get(key) or [], what) for key, what in (
            ("table2", f"with {candidates} as candidates"), ("table2_all_words", PAPER_DEFINITION))
        if result.tables.get(key)] + [
        f"{wstats.scored} of {wstats.anaphoric} mentions that have an antecedent were scored "
        f"({window} windows of {max_seq_len} tokens, {wstats.windows} windows over "
        f"{wstats.documents} documents)"]
    skipped = result.meta["extract"]["skipped"]
    if skipped:
        section.findings.append(f"{len(skipped)} windows were longer than {max_seq_len} tokens "
                                f"and skipped")
    section.methods = _methods(candidates, params["ties"])
    write_results(out_dir, "coref", result)
    return section


def _best_head_examples(section: Section, result: Result, examples: Sequence[Example], picks: list,
                        figures_dir: Path, note: str) -> None:
    """The best head's examples figure, its maps and the paper's Table 2 beside ours, in ``section``."""
    rows = result.tables["table2"]
    best = rows[len(BASELINES)]
    head = HeadId(best["layer"], best["head"])
    panels, maps = _example_panels(examples, picks)
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


def _example_panels(examples: Sequence[Example], picks: list) -> tuple[list[dict], dict]:
    """The figure's panels (a snippet of each picked window around the head's choice) and their
    maps by window index, from :func:`~attnscope.analyses.coref.best_head_examples`."""
    panels, maps = [], {}
    for i, amap, pick in picks:
        info = examples[i].fields["coref"]
        snip = _snippet(examples[i].words, pick)
        snip.update({"doc": info["doc"], "example_index": i, "window": info["window"]})
        panels.append(snip)
        maps[i] = amap
    return panels, maps


def against_rules(rows: list[dict], what: str) -> str:
    """How the best head compares with the rule-based system, saying no more than the two
    rows' 95% intervals allow: it "beats" the system only when its interval lies wholly above
    the system's, "falls short of" it only when wholly below; otherwise it "comes close to" it
    (its accuracy within the system's interval or above it) or is "below" it with overlapping
    intervals. Never from fewer than :data:`~attnscope.report.section.MIN_ITEMS` mentions."""
    by_kind = dict(zip(BASELINES, rows))
    rb, best = by_kind["rule-based"], rows[len(BASELINES)]
    what = f"{what[:1].upper()}{what[1:]}"
    if best["all"] is None or rb["all"] is None:
        return f"{what}: too few mentions to compare the best head with the rule-based system"
    head = (f"the best head ({best['name']}, {100 * best['all']:.1f}% [{100 * best['all_lo']:.1f}, "
            f"{100 * best['all_hi']:.1f}])")
    rules = (f"the rule-based system ({100 * rb['all']:.1f}% [{100 * rb['all_lo']:.1f}, "
             f"{100 * rb['all_hi']:.1f}])")
    n = best.get("all_n")
    if n is not None and n < MIN_ITEMS:
        return f"{what}, {head} is not compared with {rules}: {n} mentions are fewer than {MIN_ITEMS}."
    if best["all_lo"] > rb["all_hi"]:
        return f"{what}, {head} beats {rules}: the intervals do not overlap."
    if best["all_hi"] < rb["all_lo"]:
        return f"{what}, {head} falls short of {rules}: the intervals do not overlap."
    if best["all"] >= rb["all_lo"]:
        return f"{what}, {head} comes close to {rules}."
    return f"{what}, {head} is below {rules}, but the intervals overlap."
