"""The general analyses of the paper (sections 3 and 6) as one job (:mod:`attnscope.families.general` runs it).

One streamed pass over the maps (from a store, or straight from the model) feeds relative
position, special tokens, entropy and head distances (and, when the model has a masked-LM
head, gradient importance); then heads are labelled and placed in 2-D, and the tables
(CSV/JSON/Markdown/LaTeX), the figures (PNG/SVG: Figures 1, 2, 3, 4 and 6 of the paper) and
``results/general.json`` are written. The returned :class:`Section` is what the HTML report
shows. Only one map (the example drawn in Figure 1) is kept in memory.
"""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.analyses.clustering import LABELS, label_inputs
from attnscope.analyses.findings import NEARLY_ALL, GeneralFindings, general_findings
from attnscope.analyses.stat import of_results, records
from attnscope.data.records import HeadId, layer_number
from attnscope.maps import AttentionMap
from attnscope.models.pieces import readable, visible
from attnscope.report.figures import new_figure, save_figure
from attnscope.report.html import model_display_name
from attnscope.report.section import FigureArtifact, Section, TableArtifact
from attnscope.report.tables import write_table
from attnscope.store.results import HEADS_DIR, family_results, write_json, write_results

LABEL_COLOURS = {"[SEP]": "#d62728", "[CLS]": "#9467bd", "punctuation": "#8c564b",
                 "previous": "#1f77b4", "next": "#17becf", "broad": "#2ca02c", "other": "#7f7f7f"}


# -- outputs --------------------------------------------------------------------------------
def _tex_safe(s: str) -> str:
    return s.replace("\\", "\\\\").replace("$", r"\$")


def plot_token_lines(m: AttentionMap, heads: list[tuple[int, int, str]]):
    """Figure 1 style: for each head, tokens on two columns, a line from each token (left) to
    each token it attends to (right), darker for more attention."""
    from matplotlib.collections import LineCollection
    from matplotlib.textpath import TextPath

    k = max(len(heads), 1)
    n = m.num_units
    texts = [_tex_safe(visible(t if len(t) <= LABEL_CHARS else t[:LABEL_CHARS - 1] + "\u2026"))
             for t in readable(m.tokens, m.special, m.token_text, m.level)]
    # each panel is as wide as its two columns of labels (measured, in inches) and the lines
    # between them, with a margin either side, so the labels of neighbouring panels never meet
    label_in = max([TextPath((0, 0), t, size=LABEL_PT).get_extents().width / 72 for t in texts] + [0.3])
    width_in = 2 * (label_in + PANEL_MARGIN_IN) + LINES_IN
    # at most PER_ROW heads side by side, and no wider than the report shows a figure at full
    # size, so its token labels stay readable there
    per_row = max(1, min(PER_ROW, int(REPORT_WIDTH_IN // width_in)))
    rows = -(-k // per_row)
    cols = -(-k // rows)  # rows as even as they go: 5 heads are 3 + 2, not 4 + 1
    row_in = max(3.0, 0.24 * n + 1.2)  # a panel and its two-line title
    # the panels fill the figure edge to edge, so an axis unit is an inch and the measured
    # labels fit where they are put
    fig, axes = new_figure(rows, cols, figsize=(width_in * cols, rows * row_in), squeeze=False,
                           gridspec_kw={"left": 0, "right": 1, "wspace": 0, "bottom": 0,
                                        "top": 1 - TITLE_IN / (rows * row_in),
                                        "hspace": TITLE_IN / (row_in - TITLE_IN)})
    for ax in axes.ravel()[k:]:
        ax.axis("off")
    left, right = PANEL_MARGIN_IN + label_in, PANEL_MARGIN_IN + label_in + LINES_IN  # inches
    for ax, (layer, head, label) in zip(axes.ravel(), heads):
        a = m.attn[layer, head]  # [q k]
        ys = -np.arange(n)
        qi, kj = np.nonzero(a > 0.02)
        segs = [[(left + 0.04, ys[i]), (right - 0.04, ys[j])] for i, j in zip(qi, kj)]
        colours = [(0.12, 0.31, 0.62, float(min(1.0, a[i, j]))) for i, j in zip(qi, kj)]
        ax.add_collection(LineCollection(segs, colors=colours, linewidths=1.5))
        for i, text in enumerate(texts):
            ax.text(left, ys[i], text, ha="right", va="center", fontsize=LABEL_PT)
            ax.text(right, ys[i], text, ha="left", va="center", fontsize=LABEL_PT)
        ax.set_xlim(0, width_in)
        ax.set_ylim(-n, 1)
        ax.axis("off")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"head {HeadId(layer, head)}\n" + textwrap.fill(label, max(16, int(width_in * 11))),
                     fontsize=10)
    return fig


#: Figure 1's token labels: their size (points), the longest shown (longer ones end in an
#: ellipsis), the width of the lines between the two columns and the margin either side, the
#: room for a panel's title (inches).
LABEL_PT, LABEL_CHARS, LINES_IN, PANEL_MARGIN_IN, TITLE_IN = 9, 16, 1.1, 0.15, 0.55
#: The width (inches) a figure is shown at full size in the report (its 1,036 px column at the
#: 150 dpi the figures are saved at is 6.9 in; wider ones are scaled down, to 2/3 at this width).
REPORT_WIDTH_IN = 10.5


#: Figure 1: heads side by side in one row.
PER_ROW = 4


def _layer_scatter(ax, arr: np.ndarray, label: str, colour: str, offset: float = 0.0) -> None:
    L, H = arr.shape
    x = np.repeat(np.arange(1, L + 1), H) + offset
    ax.scatter(x, arr.ravel(), s=10, color=colour, alpha=0.5)
    ax.plot(np.arange(1, L + 1) + offset, np.nanmean(arr, axis=1), color=colour, label=label, marker="o")


def plot_figure2(stats: dict[str, np.ndarray]):
    """Figure 2: per layer, each head's mean attention to token classes (dots) and the layer
    mean (line). Panels: to first special / separators / periods or commas; from separators
    vs from other tokens to separators; to the previous / next / current token."""
    fig, axes = new_figure(1, 3, figsize=(11, 3.8))
    for key, label, colour in (("first", "first special ([CLS])", "#9467bd"),
                               ("separator", "separators ([SEP])", "#d62728"),
                               ("punct", ". or ,", "#8c564b")):
        if key in stats:
            _layer_scatter(axes[0], stats[key], label, colour)
    axes[0].set_title("attention to token classes")
    for key, label, colour in (("sep_to_sep", "separator -> separators", "#d62728"),
                               ("other_to_sep", "other -> separators", "#7f7f7f")):
        if key in stats:
            _layer_scatter(axes[1], stats[key], label, colour)
    axes[1].set_title("attention to separators, by source")
    for key, label, colour, off in (("previous", "previous token", "#1f77b4", -0.1),
                                    ("next", "next token", "#17becf", 0.1),
                                    ("current", "current token", "#ff7f0e", 0.0)):
        if key in stats:
            _layer_scatter(axes[2], stats[key], label, colour, off)
    axes[2].set_title("attention by relative position")
    for ax in axes:
        ax.set_xlabel("layer")
        ax.set_ylabel("mean attention")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=9)
    return fig


def plot_figure3(grad: "Any"):
    """Figure 3: mean |dL/d attention| per layer, to separators, periods/commas and others."""
    fig, ax = new_figure(figsize=(5, 3.6))
    for key, label, colour in (("separator", "separators ([SEP])", "#d62728"),
                               ("punct", ". or ,", "#8c564b"), ("other", "other", "#7f7f7f")):
        y = grad.arrays[f"layer_{key}"]
        ax.plot(np.arange(1, len(y) + 1), y, marker="o", label=label, color=colour)
    ax.set_xlabel("layer")
    ax.set_ylabel("mean |gradient of MLM loss|")
    ax.set_title("gradient-based importance of attention")
    ax.legend(fontsize=9)
    return fig


def plot_figure4(stats: dict[str, np.ndarray], uniform: float):
    """Figure 4: each head's mean attention entropy per layer, overall and from the first token,
    with the entropy of uniform attention as a dashed line."""
    fig, axes = new_figure(1, 2, figsize=(9, 3.6))
    for ax, key, title in ((axes[0], "entropy", "entropy of attention"),
                           (axes[1], "entropy_first", "entropy of attention from the first token")):
        _layer_scatter(ax, stats[key], "heads (dots), layer mean (line)", "#2ca02c")
        ax.axhline(uniform, ls="--", color="k", label=f"uniform attention ({uniform:.2f})")
        ax.set_xlabel("layer")
        ax.set_ylabel("entropy (nats)")
        ax.set_title(title)
        ax.legend(fontsize=9)
    return fig


def plot_figure6(coords: np.ndarray, labels: np.ndarray):
    """Figure 6: heads placed by MDS of their distances, coloured by behaviour and by layer."""
    L, H = labels.shape
    fig, axes = new_figure(1, 2, figsize=(11, 4.6))
    flat = labels.ravel()
    for lab in LABELS:
        sel = flat == lab
        if sel.any():
            axes[0].scatter(coords[sel, 0], coords[sel, 1], s=22, color=LABEL_COLOURS[lab], label=lab)
    axes[0].set_title("heads by behaviour")
    axes[0].legend(fontsize=9)
    layers = np.repeat(np.arange(1, L + 1), H)
    sc = axes[1].scatter(coords[:, 0], coords[:, 1], s=22, c=layers, cmap="viridis")
    fig.colorbar(sc, ax=axes[1], label="layer")
    axes[1].set_title("heads by layer")
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    return fig


#: Fewer examples than this, and the report says the averages are only an illustration.
FEW_EXAMPLES = 100


def _heads(n: int) -> str:
    return f"{n} head" if n == 1 else f"{n} heads"


def _names(heads) -> list[str]:
    return [str(HeadId(layer, head)) for layer, head in heads]


def findings(f: GeneralFindings, uniform: float, model_name: str, examples: int, grad=None) -> list[str]:
    """The paper's findings, stated for this model (plain sentences) from what
    :func:`attnscope.analyses.findings.general_findings` found."""
    out = [f"{model_name} over {examples} examples:"]
    if examples < FEW_EXAMPLES:
        out.append(f"Caution: only {examples} examples (the paper used 1000): per-head averages over "
                   "so few examples change from sample to sample; read them as an illustration.")
    for key in ("previous", "next"):
        heads = _names(f.mostly[key])
        out.append(f"{_heads(len(heads))} put more than half their attention on the {key} token"
                   + (f" ({', '.join(heads)})" if heads else "") + ".")
    if f.separator_peak is not None:
        layer, share = f.separator_peak
        out.append("Layers where over half of the attention goes to separator tokens: "
                   + (", ".join(str(layer_number(i)) for i in f.separator_layers) or "none")
                   + f" (the most: layer {layer_number(layer)}, {share:.0%}).")
        if f.separators_to_separators is not None:
            out.append(f"{_heads(len(f.separators_to_separators))} put over {NEARLY_ALL:.0%} of a "
                       "separator's attention on separators.")
    else:
        out.append("The inputs have no separator tokens.")
    if f.first_peak is not None:
        layer, share = f.first_peak
        out.append(f"Attention to the first special token peaks at layer {layer_number(layer)} "
                   f"({share:.0%} on average over its heads).")
    layer, share = f.punct_peak
    out.append(f"Attention to periods and commas peaks at layer {layer_number(layer)} ({share:.0%}).")
    low, high = f.entropy_range
    out.append(f"Mean attention entropy per layer ranges from {low:.2f} to {high:.2f} nats (uniform "
               f"attention: {uniform:.2f}); the last layer's attention from the first token has "
               f"{f.last_first_entropy:.2f} nats.")
    out.append("Head behaviours (paper thresholds): "
               + ", ".join(f"{lab} {c}" for lab, c in f.behaviours.items() if c) + ".")
    if grad is not None and "layer_separator" in grad.arrays:
        s, o = grad.arrays["layer_separator"], grad.arrays["layer_other"]
        lower = [str(layer_number(i)) for i in np.nonzero(s < o)[0]]
        out.append("Gradient importance: attention to separators matters less to the masked-LM "
                   "loss than attention to other tokens in layers " + (", ".join(lower) or "none") + ".")
    return out


METHODS = [
    "Relative position (section 3.1): previous = sum_{i>=1} a[i,i-1] / (n-1), next = "
    "sum_{i<=n-2} a[i,i+1] / (n-1), current = sum_i a[i,i] / n, per example, then averaged over "
    "examples. The paper's code divides previous/next by n.",
    "Special tokens (section 3.2, Figure 2): to class C = sum_i sum_{j in C} a[i,j] / n; separator "
    "-> separators averaged over separator rows, other -> separators over the other rows (the paper's "
    "code divides by 2 and n-2, assuming exactly two [SEP]). Token classes come from the tokenizer's "
    "named special tokens and the unit text, not from BERT literals.",
    "Entropy (section 3.3, Figure 4): H(a[i]) = -sum_j a[i,j] ln a[i,j] in nats, averaged over rows; "
    "from the first token: H(a[0]); uniform reference mean_i ln k_i.",
    "Gradient importance (section 3.2, Figure 3): mean |dL/d alpha[l,h,i,j]| per layer over heads, "
    "rows and key columns of each class, for the masked-LM loss with BERT-style seeded masking.",
    "Head distances (section 6): d(i,j) = (1/T) sum_tokens JS(P_i, P_j), rows smoothed as "
    "0.001/n + 0.999 p (the paper's script); the script sums instead of averaging.",
    "Clustering (Figure 6): metric MDS to 2-D (n_init 4, max_iter 300, eps 1e-6, random_state 0); "
    "labels [SEP]/[CLS]/punctuation > 0.6, previous/next > 0.5, broad: entropy > uniform - "
    "(ln 128 - 3.8) nats (3.8 at 128 tokens).",
]


def write_general(results: dict, out_dir: Path, *, model_desc: dict, example_map: AttentionMap | None,
                  notes: list[str], seed: int, run: dict, clusters: dict) -> Section:
    """Tables, figures, results JSON and the Section, from finalized results and Figure 6's
    ``clusters`` (:func:`attnscope.analyses.clustering.general_clusters`)."""
    with warnings.catch_warnings():  # all-NaN layers (no separators, GPT-2) are expected
        warnings.simplefilter("ignore", category=RuntimeWarning)
        return _write_general(results, out_dir, model_desc=model_desc, example_map=example_map,
                              notes=notes, seed=seed, run=run, clusters=clusters)


def _write_general(results: dict, out_dir: Path, *, model_desc: dict, example_map: AttentionMap | None,
                   notes: list[str], seed: int, run: dict, clusters: dict) -> Section:
    tables_dir, figures_dir, results_dir = out_dir / "tables", out_dir / "figures", out_dir / "results"
    for d in (tables_dir, figures_dir, results_dir):
        d.mkdir(parents=True, exist_ok=True)
    stats = label_inputs(results)
    uniform = float(results["entropy"].meta["uniform_entropy"])
    labels = clusters["labels"]
    L, H = labels.shape
    sec = Section(key="general", title="What do the heads attend to? (paper sections 3 and 6)")

    # per-head table: every declared statistic of the family that the analyses made
    declared = of_results(results)
    names = [s.name for s in declared]
    cols = ["layer", "head", "name", *names, "behaviour", "mds_x", "mds_y"]
    rows = []
    for r in clusters["rows"]:
        row = {"layer": r["layer"], "head": r["head"], "name": r["name"]}
        for k in names:
            v = stats[k][r["layer"], r["head"]]
            row[k] = float(v) if np.isfinite(v) else None
        row.update(behaviour=r["behaviour"], mds_x=r["x"], mds_y=r["y"])
        rows.append(row)
    cap = ("Per head (layer and head 0-indexed; name is the paper's 1-indexed layer-head): "
           + "; ".join(f"{s.name}: {s.what}" for s in declared) + "; and the behaviour label of Figure 6.")
    sec.tables.append(TableArtifact("general_heads", cap, rows, cols,
                                    write_table(rows, tables_dir / "general_heads", columns=cols, caption=cap)))
    lcols = ["layer", "name", *(s.name for s in declared if s.per_layer)]
    lrows = [{"layer": i, "name": str(layer_number(i)),
              **{k: float(np.nanmean(stats[k][i])) for k in lcols[2:]}} for i in range(L)]
    lcap = "Per layer (0-indexed layer; name 1-indexed): the mean over its heads."
    sec.tables.append(TableArtifact("general_layers", lcap, lrows, lcols,
                                    write_table(lrows, tables_dir / "general_layers", columns=lcols, caption=lcap)))
    drows = results["head-distances"].tables["head_distances"]
    dcols = ["head_a", "head_b", "layer_a", "head_a_index", "layer_b", "head_b_index", "js"]
    dcap = "Jensen-Shannon distance (nats per token) between every pair of heads (1-indexed names)."
    sec.tables.append(TableArtifact("head_distances", dcap, [], dcols,
                                    write_table(drows, tables_dir / "head_distances", columns=dcols,
                                                caption=dcap, formats=("csv", "json"))))
    grad = results.get("gradient-importance")
    if grad is not None and grad.tables:
        gcols = ["layer", "name", "separator", "punct", "first", "other"]
        gcap = "Mean |d loss / d attention| per layer (0-indexed; name 1-indexed) by key class."
        grows = grad.tables["gradient_importance"]
        sec.tables.append(TableArtifact("gradient_importance", gcap, grows, gcols,
                                        write_table(grows, tables_dir / "gradient_importance",
                                                    columns=gcols, caption=gcap)))

    # figures
    found = general_findings(stats, labels)
    picks = found.figure1
    if example_map is not None and picks:
        fig = plot_token_lines(example_map, picks)
        sec.figures.append(FigureArtifact("figure1_examples", "Figure 1 style: example heads on "
                                          f"example {example_map.index}; line darkness = attention weight.",
                                          save_figure(fig, figures_dir / "figure1_examples")))
        for layer, head, label in picks:
            sec.best_heads.append((layer, head, example_map.index, label))
        sec.maps[example_map.index] = example_map
    sec.figures.append(FigureArtifact("figure2_special_tokens", "Figure 2: mean attention of every "
                                      "head (dots) and layer means (lines) to token classes, to "
                                      "separators by source, and by relative position.",
                                      save_figure(plot_figure2(stats), figures_dir / "figure2_special_tokens")))
    if grad is not None and "layer_separator" in grad.arrays:
        sec.figures.append(FigureArtifact("figure3_gradients", "Figure 3: gradient-based importance "
                                          "of attention to separators, periods/commas and other tokens.",
                                          save_figure(plot_figure3(grad), figures_dir / "figure3_gradients")))
    sec.figures.append(FigureArtifact("figure4_entropy", "Figure 4: entropy of each head's attention "
                                      "(dots), layer means (line), uniform attention (dashed).",
                                      save_figure(plot_figure4(stats, uniform), figures_dir / "figure4_entropy")))
    sec.figures.append(FigureArtifact("figure6_clusters", "Figure 6: heads placed by MDS of their "
                                      "Jensen-Shannon distances, coloured by behaviour and by layer.",
                                      save_figure(plot_figure6(clusters["coords"], labels),
                                                  figures_dir / "figure6_clusters")))

    # words

    model_name = model_display_name(model_desc)
    sec.findings = findings(found, uniform, model_name, run["examples"], grad) + notes
    if "text" in run:  # how the pairs were built from sentence-per-line text
        sec.findings.append(f"Pairs from the text: {run['text']['summary']}.")
    sec.methods = list(METHODS)
    prev_heads, next_heads = _names(found.mostly["previous"]), _names(found.mostly["next"])
    sep_mostly = [str(layer_number(i)) for i in found.separator_layers]
    sec.paper = [
        {"what": "heads with >50% attention on the previous token", "paper": "4 (layers 2, 4, 7, 8)",
         "ours": f"{len(prev_heads)}" + (f" ({', '.join(prev_heads)})" if prev_heads else "")},
        {"what": "heads with >50% attention on the next token", "paper": "5 (layers 1, 2, 2, 3, 6)",
         "ours": f"{len(next_heads)}" + (f" ({', '.join(next_heads)})" if next_heads else "")},
        {"what": "layers where over half the attention goes to [SEP]", "paper": "6-10",
         "ours": ", ".join(sep_mostly) or "none"},
        {"what": "entropy of the last layer's attention from [CLS] (nats)", "paper": 3.89,
         "ours": round(found.last_first_entropy, 2)},
    ]
    payload = family_results("general", sec, {"seed": seed, **{k: run[k] for k in (
                                 "max_seq_len", "batch_size", "gradients") if k in run}},
                             family="general", model=model_desc, seed=seed, run=run, notes=notes,
                             findings=sec.findings, paper=sec.paper,
                             clustering={"params": clusters["params"], "rows": clusters["rows"]},
                             analyses={k: r.to_json() for k, r in results.items()},
                             stats=records(declared))
    write_results(out_dir, "general", payload)
    write_head_examples(out_dir / HEADS_DIR, results, model=model_desc)
    return sec


def write_head_examples(heads_dir: Path, results: dict, *, model: dict) -> None:
    """``heads/general.json``: the top and typical examples every head's statistics kept
    (:class:`~attnscope.analyses.top_examples.TopExamples`; the maps engine only), for the head
    pages. Nothing is written when no analysis kept any (the streaming engine)."""
    kept = [(name, r.examples) for name, r in results.items() if r.examples]
    path = heads_dir / "general.json"
    if not kept:
        path.unlink(missing_ok=True)
        return
    heads_dir.mkdir(parents=True, exist_ok=True)
    write_json(path, {"attnscope_head_examples": 1, "family": "general", "model": model,
                      "params": kept[0][1]["params"],
                      "analysis": {stat: name for name, ex in kept for stat in ex["heads"]},
                      "heads": {stat: v for _, ex in kept for stat, v in ex["heads"].items()},
                      "examples": dict(sorted({k: v for _, ex in kept for k, v in ex["examples"].items()}.items(),
                                              key=lambda kv: int(kv[0])))}, compact=True)
