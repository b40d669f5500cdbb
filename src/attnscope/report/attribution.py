"""The attribution family's tables and figures (pure: results in, files and a Section out).

Tables: per-head importance with zero/mean ablation loss changes and, when the general family
ran in the same job, each head's behaviour label; the pruning curves; weight share vs norm share
per layer; rollout/flow agreement. Figures: the ``[layer, head]`` importance heatmap, the pruning
curves, weight vs norm share of the special tokens per layer, and the maps of one example.
Heads are 1-indexed ``layer-head`` in tables and figures, 0-indexed in the JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from attnscope.models.pieces import readable, visible
from attnscope.report.figures import new_figure, save_figure
from attnscope.report.section import FigureArtifact, Section, TableArtifact
from attnscope.report.tables import write_table
from attnscope.store.results import family_results, write_results

METHODS = [
    "Head importance (Michel et al. 2019): mean over examples of |dL/d gate| at gate 1 (the paper's "
    "equation; or, as the figure caption says when chosen, the authors' released code: |dL/d gate| "
    "per token position, summed and divided by the tokens), each layer divided by its L2 norm; L is "
    "the masked-LM loss (seeded BERT masking) or the next-token loss.",
    "Ablation: loss change when one head's output is zeroed (gate 0) or replaced by its mean output "
    "over the corpus; pruning curves remove heads cumulatively, least important first, vs a seeded "
    "random order (importance is measured on the same examples, as in the paper).",
    "Rollout and flow (Abnar & Zuidema 2020): layers as 0.5 A + 0.5 I (A averaged over heads; equal "
    "to row-normalising A + I); rollout multiplies them, flow is the max-flow of the layered graph.",
    "Norms (Kobayashi et al. 2020): ||alpha_ij f(x_j)|| with f(x) = (x W_V + b_V) W_O; per layer, "
    "the share of weight vs the share of norm that goes to each token class.",
    "Value zeroing (Mohebbi et al. 2023): cosine distance of token i's layer output when token j's "
    "value is zeroed in that layer, rows normalised.",
]


def general_behaviours(general: dict | None) -> dict[tuple[int, int], str]:
    """``(layer, head) -> behaviour`` from the general family's results (its ``clustering``
    rows) when that family ran in the same job (else empty)."""
    rows = ((general or {}).get("clustering") or {}).get("rows") or []
    out = {}
    for r in rows:
        try:
            out[(int(r["layer"]), int(r["head"]))] = str(r["behaviour"])
        except (KeyError, TypeError, ValueError):
            continue
    return out


#: At most this many token labels on a heatmap's axis (every k-th beyond).
MAX_TICKS = 40


def _ticks(labels) -> tuple[list[int], list[str]]:
    """Positions and texts of the token labels an axis shows: all of them up to
    :data:`MAX_TICKS`, else every k-th so that at most that many are drawn."""
    step = -(-len(labels) // MAX_TICKS)
    at = list(range(0, len(labels), step))
    return at, [labels[i] for i in at]


def _heatmap(ax, m, title, xlabels=None, ylabels=None, cmap="viridis"):
    im = ax.imshow(m, cmap=cmap, aspect="auto")
    ax.set_title(title, fontsize=9)
    fontsize = 8 if max(len(xlabels or ()), len(ylabels or ())) <= 24 else 6
    if xlabels is not None:
        at, text = _ticks(xlabels)
        ax.set_xticks(at)
        ax.set_xticklabels(text, rotation=90, fontsize=fontsize)
    if ylabels is not None:
        at, text = _ticks(ylabels)
        ax.set_yticks(at)
        ax.set_yticklabels(text, fontsize=fontsize)
    return im


def write_attribution(results: dict[str, Any], out_dir: Path, *, notes: list[str],
                      example: dict[str, Any] | None, general: dict | None = None,
                      params: dict[str, Any], **extra: Any) -> Section:
    """Write tables, figures and ``results/attribution.json`` under ``out_dir`` and return the
    report Section.

    ``results``: analysis name -> :class:`~attnscope.analyses.base.Result` (any subset of
    ``head-importance``, ``ablation-zero``, ``ablation-mean``, ``pruning-curve``,
    ``norm-shares``, ``attribution-agreement``). ``example``: ``{"tokens", "rollout", "flow",
    "norms" [L n n], "weights" [L n n], "value_zeroing" [L n n]}`` of one example, or None.
    ``general``: the general family's results from the same job (each head's behaviour
    label), or None. ``params`` and ``extra`` (model, seed, methods, examples) go into the
    results file.
    """
    sec = _section(results, Path(out_dir), notes, example, general_behaviours(general))
    write_results(out_dir, "attribution", family_results(
        "attribution", sec, params, family="attribution", **extra, notes=notes,
        findings=sec.findings, analyses={k: r.to_json() for k, r in results.items()},
        example=None if example is None else
        {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in example.items()}))
    return sec


def _section(results: dict[str, Any], out_dir: Path, notes: list[str], example: dict[str, Any] | None,
             labels: dict[tuple[int, int], str]) -> Section:
    out_dir = Path(out_dir)
    tables_dir, figures_dir = out_dir / "tables", out_dir / "figures"
    tables_dir.mkdir(parents=True, exist_ok=True)
    figures_dir.mkdir(parents=True, exist_ok=True)
    sec = Section(key="attribution", title="Beyond attention weights: importance, ablation, "
                  "rollout, norms", methods=list(METHODS))
    sec.findings.extend(notes)
    imp = results.get("head-importance")
    if imp is not None and "importance" in imp.arrays:
        _head_table(sec, results, labels, tables_dir)
        _importance_figure(sec, imp.arrays["importance"], labels, figures_dir,
                           imp.params.get("norm", "paper"))
        sec.findings.extend(_importance_findings(sec.tables[-1].rows, labels))
    pc = results.get("pruning-curve")
    if pc is not None and "loss" in pc.arrays:
        rows = pc.tables["pruning_curve"]
        cols = ["order", "fraction_removed", "heads_removed", "loss", "accuracy"]
        sec.tables.append(TableArtifact("attribution_pruning", "Loss and accuracy of the scored tokens "
                                        "as heads are removed.", rows, cols,
                                        write_table(rows, tables_dir / "attribution_pruning", columns=cols)))
        _pruning_figure(sec, pc, figures_dir)
    ns = results.get("norm-shares")
    if ns is not None and "weight_share" in ns.arrays:
        rows = ns.tables["norm_shares"]
        cols = list(rows[0].keys())
        sec.tables.append(TableArtifact("attribution_norm_shares", "Per layer: share of attention "
                                        "weight vs share of ||alpha f(x)|| by key class.", rows, cols,
                                        write_table(rows, tables_dir / "attribution_norm_shares", columns=cols)))
        _shares_figure(sec, ns, figures_dir)
        w, n = ns.arrays["weight_share"][:, :2].sum(1), ns.arrays["norm_share"][:, :2].sum(1)
        sec.findings.append("share of first/separator tokens, weight vs norm, per layer (1-indexed): "
                            + "; ".join(f"{i + 1}: {w[i]:.2f} vs {n[i]:.2f}" for i in range(len(w))))
    ag = results.get("attribution-agreement")
    if ag is not None:
        rows = ag.tables["agreement"]
        cols = ["pair", "spearman", "rows", "undefined_rows"]
        sec.tables.append(TableArtifact("attribution_agreement", "Mean Spearman correlation per row "
                                        "(Abnar & Zuidema, Table 1).", rows, cols,
                                        write_table(rows, tables_dir / "attribution_agreement", columns=cols)))
    if example is not None:
        _example_figure(sec, example, figures_dir)
    return sec


def _head_table(sec, results, labels, tables_dir):
    imp = results["head-importance"]
    zero = results.get("ablation-zero")
    mean = results.get("ablation-mean")
    rows = []
    for r in imp.tables["head_importance"]:
        row = dict(r)
        key = (r["layer"], r["head"])
        if zero is not None and "loss_change" in zero.arrays:
            row["zero_ablation"] = float(zero.arrays["loss_change"][key])
        if mean is not None and "loss_change" in mean.arrays:
            row["mean_ablation"] = float(mean.arrays["loss_change"][key])
        if labels:
            row["behaviour"] = labels.get(key, "")
        rows.append(row)
    cols = list(rows[0].keys())
    sec.tables.append(TableArtifact("attribution_heads", "Per head (1-indexed layer-head): importance "
                                    "(normalised per layer), its rank, ablation loss changes and the "
                                    "behaviour label of the general family when available.", rows, cols,
                                    write_table(rows, tables_dir / "attribution_heads", columns=cols)))


def _importance_findings(rows, labels) -> list[str]:
    ranked = sorted(rows, key=lambda r: r["rank"])

    def fmt(rs):
        return ", ".join(r["name"] + (f" ({labels.get((r['layer'], r['head']), '?')})" if labels else "")
                         for r in rs)

    k = max(1, min(5, len(ranked) // 2))
    return [f"most important heads: {fmt(ranked[:k])}", f"least important heads: {fmt(ranked[-k:][::-1])}"]


def _importance_figure(sec, imp, labels, figures_dir, norm: str):
    L, H = imp.shape
    fig, ax = new_figure(figsize=(max(4, 0.5 * H + 2), max(3, 0.4 * L + 1.5)))
    im = _heatmap(ax, imp, "head importance (normalised per layer)",
                  [str(h + 1) for h in range(H)], [str(layer + 1) for layer in range(L)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    if labels and L * H <= 400:
        for (layer, head), lab in labels.items():
            if layer < L and head < H:
                ax.text(head, layer, lab[:4], ha="center", va="center", fontsize=7, color="white")
    fig.colorbar(im, ax=ax)
    paths = save_figure(fig, figures_dir / "attribution_importance")
    estimate = ("the paper's estimate, |dL/d gate| per example" if norm == "paper" else
                "the released code's estimate, |dL/d gate| per token divided by the tokens")
    sec.figures.append(FigureArtifact("attribution_importance", f"Head importance [layer, head] ({estimate})"
                                      + (", with behaviour labels" if labels else "") + ".", paths))


def _pruning_figure(sec, pc, figures_dir):
    fr = np.asarray(pc.params["fractions"])
    fig, axes = new_figure(1, 2, figsize=(9, 3.5))
    for o, name in enumerate(pc.params["orders"]):
        axes[0].plot(fr, pc.arrays["loss"][o], marker="o", label=name)
        axes[1].plot(fr, pc.arrays["accuracy"][o], marker="o", label=name)
    axes[0].set_ylabel("loss")
    axes[1].set_ylabel("accuracy of scored tokens")
    for ax in axes:
        ax.set_xlabel("fraction of heads removed")
        ax.legend(fontsize=9)
    paths = save_figure(fig, figures_dir / "attribution_pruning")
    sec.figures.append(FigureArtifact("attribution_pruning", "Pruning curves: heads removed by "
                                      "importance (least first) vs a seeded random order.", paths))


def _shares_figure(sec, ns, figures_dir):
    w, n = ns.arrays["weight_share"], ns.arrays["norm_share"]
    layers = np.arange(1, w.shape[0] + 1)
    fig, ax = new_figure(figsize=(6, 3.5))
    ax.plot(layers, w[:, 0], "o-", label="weight: first")
    ax.plot(layers, n[:, 0], "o--", label="norm: first")
    ax.plot(layers, w[:, 1], "s-", label="weight: separators")
    ax.plot(layers, n[:, 1], "s--", label="norm: separators")
    ax.set_xlabel("layer")
    ax.set_ylabel("share")
    ax.legend(fontsize=9)
    paths = save_figure(fig, figures_dir / "attribution_weight_vs_norm")
    sec.figures.append(FigureArtifact("attribution_weight_vs_norm", "Weight share vs norm share of "
                                      "the first token and separators per layer.", paths))


def _example_figure(sec, ex, figures_dir):
    toks = [visible(t) for t in readable(list(ex["tokens"]), [False] * len(ex["tokens"]), None, "token")]
    panels = [("rollout", ex.get("rollout")), ("flow", ex.get("flow")),
              ("last layer: weights (head mean)", ex["weights"][-1] if ex.get("weights") is not None else None),
              ("last layer: ||sum_h alpha f||", ex["norms"][-1] if ex.get("norms") is not None else None),
              ("last layer: value zeroing", ex["value_zeroing"][-1] if ex.get("value_zeroing") is not None
               else None)]
    panels = [(t, m) for t, m in panels if m is not None]
    fig, axes = new_figure(1, len(panels), figsize=(3.6 * len(panels), 4.2), squeeze=False,
                           layout="constrained")
    for ax, (title, m) in zip(axes[0], panels):
        im = _heatmap(ax, np.asarray(m), title, toks, toks, cmap="Blues")
        ax.set_xlabel("to (key token)", fontsize=8)
        fig.colorbar(im, ax=ax, shrink=0.8).ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("from (query token)", fontsize=8)
    paths = save_figure(fig, figures_dir / "attribution_example")
    sec.figures.append(FigureArtifact("attribution_example", f"Attribution maps of example "
                                      f"{ex.get('index', 0)} (rows: from, columns: to).", paths))
