"""The long-context report section: tables, figures and plain-words findings from a
:class:`~attnscope.analyses.longctx.LongContextStats` result.

Pure: reads a :class:`~attnscope.analyses.base.Result` (``arrays`` of means) and writes under
``tables/`` and ``figures/``. Heads are named 1-indexed ``layer-head`` in every output, as in
the paper; the JSON tables also carry 0-indexed ``layer`` and ``head``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.analyses.base import Result
from attnscope.analyses.longctx import INDUCTION_THRESHOLD, PREVIOUS_THRESHOLD
from attnscope.data.records import HeadId, layer_number
from attnscope.report.figures import new_figure, save_figure
from attnscope.report.section import FigureArtifact, Section, TableArtifact
from attnscope.report.tables import write_table

HEAD_COLUMNS = ["name", "layer", "head", "sink", "sink_head", "sink_gu", "sink_rate", "special", "punct",
                "previous", "current", "entropy", "norm_entropy", "max", "induction", "duplicate"]


def counted(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless ``n`` is 1: ``counted(1, "document")`` is "1 document"."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _names(mask: np.ndarray, values: np.ndarray, limit: int = 12) -> str:
    idx = np.argwhere(mask)
    order = sorted(idx.tolist(), key=lambda lh: -values[lh[0], lh[1]])
    shown = [f"{HeadId(lh[0], lh[1])} ({values[lh[0], lh[1]]:.2f})" for lh in order[:limit]]
    more = f" and {len(order) - limit} more" if len(order) > limit else ""
    return ", ".join(shown) + more


GU_METRIC = ("each document's mean attention on the first token over all its rows, row 0 included, "
             "above {thr:.0%}, counted per document and averaged over documents")


def sink_findings(res: Result) -> list[str]:
    """The sink-head sentences: the chosen metric's first (``params.sink_metric``), then the other."""
    a = res.arrays
    L, H = a["sink"].shape
    thr = res.params.get("sink_threshold", 0.3)
    pooled = a["sink"] > thr
    n = int(pooled.sum())
    pooled_line = (f"{n} of {L * H} heads {'is an attention sink' if n == 1 else 'are attention sinks'}: "
                   f"over the documents' rows after the first, pooled, they put more than {thr:.0%} of their "
                   "attention on the first token (Gu et al. 2024's threshold)"
                   + (f": {_names(pooled, a['sink'])}." if pooled.any() else "."))
    if "sink_rate" not in a:
        return [pooled_line]
    x = float(a["sink_rate"].sum())
    gu_line = (f"By Gu et al. 2024's metric ({GU_METRIC.format(thr=thr)}), {x:g} of {L * H} heads are sinks "
               f"(sink ratio {x / (L * H):.1%})")
    if res.params.get("sink_metric") != "gu2024":
        return [pooled_line, gu_line + "."]
    label = a["sink_rate"] > 0.5
    return [gu_line + (f"; sinks in more than half of the documents: {_names(label, a['sink_gu'])}."
                       if label.any() else "."), pooled_line]


def findings(res: Result) -> list[str]:
    """Plain sentences about the sink, previous-token and induction heads."""
    a = res.arrays
    if "sink" not in a:
        return ["No statistics: no document had two or more tokens."]
    L, H = a["sink"].shape
    out = sink_findings(res)
    per_layer = a["sink"].mean(1)
    out.append(f"Mean attention on the first token per layer ranges from {per_layer.min():.2f} "
               f"(layer {int(per_layer.argmin()) + 1}) to {per_layer.max():.2f} (layer {int(per_layer.argmax()) + 1}).")
    prev = a["previous"] > PREVIOUS_THRESHOLD
    out.append(f"{counted(int(prev.sum()), 'head')} put{'s' if prev.sum() == 1 else ''} more than half of "
               "their attention on the previous token"
               + (f": {_names(prev, a['previous'])}." if prev.any() else "."))
    if "target_induction" in a and np.isfinite(a["target_induction"]).all():
        ind = a["target_induction"] > INDUCTION_THRESHOLD
        best = np.unravel_index(np.argmax(a["target_induction"]), (L, H))
        out.append(f"On repeated random tokens, {counted(int(ind.sum()), 'head')} put{'s' if ind.sum() == 1 else ''} "
                   f"more than {INDUCTION_THRESHOLD:.0%} "
                   "of their attention on the token that followed the previous copy of the current token "
                   f"(induction heads); the strongest is {HeadId(*map(int, best))} "
                   f"({a['target_induction'][best]:.2f}).")
    if "pos_sink" in a:
        rows = res.meta.get("buckets", [])
        ps = a["pos_sink"].mean(axis=(0, 1))
        seen = [i for i in range(len(ps)) if math.isfinite(ps[i])]
        if len(seen) >= 2 and rows:
            lo, hi = seen[1] if len(seen) > 2 else seen[0], seen[-1]
            out.append(f"Averaged over all heads, attention on the first token is {ps[lo]:.2f} for query "
                       f"positions {rows[lo]} and {ps[hi]:.2f} for positions {rows[hi]}.")
    return out


def head_rows(res: Result) -> list[dict[str, Any]]:
    rows = []
    for r in res.tables.get("heads", []):
        row = {c: r.get(c) for c in HEAD_COLUMNS}
        row["name"] = r["name"]
        rows.append(row)
    return rows


def _heatmap(values: np.ndarray, title: str, stem: Path) -> list[Path]:
    L, H = values.shape
    fig, ax = new_figure(figsize=(max(4.0, 0.45 * H + 2), max(3.0, 0.25 * L + 1.5)))
    im = ax.imshow(values, aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0, origin="lower")
    ax.set_xticks(range(H), [str(h + 1) for h in range(H)])
    step = max(1, L // 15)
    ax.set_yticks(range(0, L, step), [str(layer + 1) for layer in range(0, L, step)])
    ax.set_xlabel("head (1-indexed)")
    ax.set_ylabel("layer (1-indexed)")
    ax.set_title(title)
    fig.colorbar(im, ax=ax)
    return save_figure(fig, stem)


def _distance_figure(res: Result, stem: Path) -> list[Path]:
    w = res.arrays["dist_weight"].mean(1)  # [L B], mean over heads
    labels = res.meta["buckets"]
    # x = the largest distance of each bucket (bucket 0 is distance 0, drawn at 0.5 on log axes)
    xs = np.array([0.5, 1.0] + [2.0 ** (k - 1) for k in range(2, len(labels))])
    fig, ax = new_figure(figsize=(6, 4))
    import matplotlib

    cmap = matplotlib.colormaps["viridis"]
    L = w.shape[0]
    for layer in range(L):
        ok = np.isfinite(w[layer]) & (w[layer] > 0)
        ax.plot(xs[ok], w[layer][ok], color=cmap(layer / max(1, L - 1)), lw=1,
                label=f"layer {layer_number(layer)}" if layer in (0, L - 1) else None)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("distance from the query (tokens; bucket's upper end; 0 drawn at 0.5)")
    ax.set_ylabel("mean attention weight per key")
    ax.set_title("Attention against distance (mean over heads), one line per layer")
    ax.legend()
    return save_figure(fig, stem)


def _position_figure(res: Result, stem: Path) -> list[Path]:
    labels = res.meta["buckets"]
    sink = res.arrays["pos_sink"].mean(axis=1)  # [L B]
    ent = res.arrays["pos_norm_entropy"].mean(axis=1)
    ok = np.isfinite(sink).all(0)
    ok[0] = False  # row 0 is not counted
    xs = np.arange(len(labels))[ok]
    fig, axes = new_figure(1, 2, figsize=(10, 4))
    import matplotlib

    cmap = matplotlib.colormaps["viridis"]
    L = sink.shape[0]
    for layer in range(L):
        c = cmap(layer / max(1, L - 1))
        lab = f"layer {layer_number(layer)}" if layer in (0, L - 1) else None
        axes[0].plot(xs, sink[layer, ok], color=c, lw=1, label=lab)
        axes[1].plot(xs, ent[layer, ok], color=c, lw=1, label=lab)
    for ax, what in ((axes[0], "mean attention on the first token"),
                     (axes[1], "entropy / ln(row length)")):
        ax.set_xticks(xs, [labels[i] for i in xs], rotation=60, fontsize=8)
        ax.set_xlabel("query position (log buckets)")
        ax.set_ylabel(what)
        ax.set_ylim(0, 1.02)
        ax.legend()
    axes[0].set_title("Sink mass against position")
    axes[1].set_title("Normalised entropy against position")
    return save_figure(fig, stem)


def _cluster_figure(clusters: dict, stem: Path, tables_dir: Path, sec: Section) -> None:
    labels = clusters["labels"]
    L, H = labels.shape
    fig, ax = new_figure(figsize=(6, 5))
    for lab in sorted(set(labels.reshape(-1).tolist())):
        idx = [i for i in range(L * H) if labels.reshape(-1)[i] == lab]
        ax.scatter(clusters["coords"][idx, 0], clusters["coords"][idx, 1], s=14, label=lab)
    ax.set_title("Heads by Jensen-Shannon distance (MDS)")
    ax.legend(fontsize=9)
    sec.figures.append(FigureArtifact(stem.name, "Heads placed by multidimensional scaling of the "
                                      "Jensen-Shannon distances of their attention over sampled rows; "
                                      "colour: behaviour (first-token / previous / punctuation / broad).",
                                      save_figure(fig, stem)))
    cols = ["name", "layer", "head", "x", "y", "behaviour"]
    sec.tables.append(TableArtifact("longctx_clusters", "MDS coordinates and behaviour of each head.",
                                    clusters["rows"], cols,
                                    write_table(clusters["rows"], tables_dir / "longctx_clusters", columns=cols)))


def run_findings(res: Result, options: Any, *, engine: str, ray_workers: int, model: Any,
                 documents: int, doc_longest: int, probes: list, batch: tuple[int, int, str],
                 maps_gb: float, max_seq_len: int, generated: list[dict], attention_dtype: str) -> list[str]:
    """Record how the long-context statistics were computed in ``res.meta`` and say it in
    findings: the engine (chosen or forced, and why: the maps of ``batch`` = ``(size, longest,
    kind)`` would take ``maps_gb`` GB), the forward precision, the documents and induction sequences, and whether
    documents ran past the positions ``model`` was configured for."""
    size, longest, kind = batch
    res.meta.update({"engine": engine, "ray_workers": ray_workers,
                     "dtype": options.dtype, "attention_dtype": attention_dtype,
                     "backend": options.backend, "longest": doc_longest, "max_seq_len": max_seq_len,
                     "induction_sequences": len(probes),
                     "model": model.describe(), "generate": options.generate,
                     "level": "word" if options.word_level else "token",
                     # per document: its tokens from generated_from on are the model's own
                     # greedy continuation (statistics cover prompt + continuation)
                     "generated": generated})
    why = (f"the maps of a batch of {counted(size, kind)} of up to {longest} tokens would take "
           f"{maps_gb:.1f} GB"
           + (" (more than --longctx-maps-budget-gb)" if options.engine == "auto" and engine == "streaming" else ""))
    out = [f"Engine: {engine} ({'chosen: ' if options.engine == 'auto' else 'forced: '}{why}); "
           f"forward pass in {options.dtype}"
           + ("" if attention_dtype == "float32" else
              ", attention of bfloat16 queries, keys and values (as the bare bfloat16 flash forward)")
           + ("" if options.backend == "auto" else f", backend {options.backend} asked for")
           + f"; {counted(documents, 'document')}, longest "
           f"{doc_longest} tokens"
           + (f"; {counted(len(probes), 'induction sequence')} of {len(probes[0])} tokens, "
              "run apart (they give the induction and duplicate scores only)." if probes else ".")]
    limit = getattr(model.model.config, "max_position_embeddings", None)
    if limit and doc_longest > limit:
        out.append(f"Documents run to {doc_longest} tokens, past the {limit} positions the model was "
                   "configured for; statistics beyond that length describe extrapolation.")
    return out


def write_section(res: Result, out_dir: Path, *, title: str = "Long-context attention",
                  key: str = "longctx", extra_findings: list[str] | None = None,
                  clusters: dict | None = None) -> Section:
    """Write the tables and figures of ``res`` under ``out_dir`` and describe them; ``clusters``:
    the heads placed by their distances (:func:`attnscope.analyses.longctx.head_clusters`)."""
    out_dir = Path(out_dir)
    tables_dir, fig_dir = out_dir / "tables", out_dir / "figures"
    tables_dir.mkdir(parents=True, exist_ok=True)
    fig_dir.mkdir(parents=True, exist_ok=True)
    sec = Section(key=key, title=title, findings=findings(res) + list(extra_findings or []))
    thr = res.params.get("sink_threshold", 0.3)
    gu = res.params.get("sink_metric") == "gu2024"
    sec.methods = [
        "Statistics are means over query rows at positions 1 and later (row 0 can attend only to "
        "itself), per query head; grouped-query heads are reported as their query heads.",
        "Sink mass: attention on the first token; sink head: " + (
            "a sink in more than half of the documents by Gu et al. 2024's metric ('When Attention Sink "
            f"Emerges': {GU_METRIC.format(thr=thr)})" if gu else
            f"mean sink mass over the pooled rows > {thr} (the threshold of Gu et al. 2024, 'When "
            "Attention Sink Emerges', who average each document's rows, row 0 included, and count "
            "per document: --longctx-sink-metric gu2024)") + ".",
        "Entropy in nats; normalised entropy divides each row's entropy by ln of the number of keys "
        "the row can see (1 = uniform).",
        "Distance buckets: 0, 1, 2, 3-4, 5-8, ...; 'mean weight per key' divides a bucket's mass by "
        "the number of (row, key) pairs at those distances.",
        "Induction / duplicate-token scores: mean weight, on sequences of random tokens repeated "
        "once, on the token after the previous copy of the current token / on that copy.",
        "Head-to-head distances: Jensen-Shannon divergence (paper section 6) over a seeded sample "
        "of query rows per document, each row smoothed as in the paper's script.",
    ]
    if "sink" not in res.arrays:
        return sec
    rows = head_rows(res)
    cols = [c for c in HEAD_COLUMNS  # an encoder has no per-document (Gu et al.) score
            if c not in ("sink_gu", "sink_rate") or c in res.tables["heads"][0]]
    cap = ("Per-head long-context statistics (heads 1-indexed layer-head; layer/head columns 0-indexed); "
           f"sink_head by {'Gu et al. 2024' if gu else 'the pooled'} metric"
           + ("; sink_gu, sink_rate: Gu et al. 2024's per-document score, averaged, and the share of "
              "documents in which it is above the threshold." if "sink_gu" in cols else "."))
    sec.tables.append(TableArtifact("longctx_heads", cap, rows, cols,
                                    write_table(rows, tables_dir / "longctx_heads", columns=cols,
                                                caption=cap)))
    sink_rows = [r for r in rows if r["sink_head"]]
    scols = ["name", "layer", "head", "sink", *(["sink_gu", "sink_rate"] if gu else []), "entropy",
             "norm_entropy"]
    scap = ("Sink heads by Gu et al. 2024's metric: a sink (each document's mean attention on the first token "
            f"over all its rows > {thr}) in more than half of the documents (sink_gu: that mean, averaged; "
            "sink_rate: share of documents)." if gu else
            f"Sink heads (pooled metric): mean attention on the first token over the rows after the first > {thr}.")
    sec.tables.append(TableArtifact("longctx_sink_heads", scap, sink_rows, scols,
                                    write_table(sink_rows, tables_dir / "longctx_sink_heads", columns=scols,
                                                caption=scap)))
    heat = ("Gu et al. 2024's score: each document's mean attention on the first token over all its rows, "
            "averaged over documents" if gu else "Mean attention on the first token over the rows after the first")
    sec.figures.append(FigureArtifact("longctx_sink_heatmap", heat + ", per layer and head.",
                                      _heatmap(res.arrays["sink_gu" if gu else "sink"],
                                               "Attention on the first token" + (" (Gu et al.)" if gu else ""),
                                               fig_dir / "longctx_sink_heatmap")))
    sec.figures.append(FigureArtifact("longctx_distance", "Mean attention weight per key against distance "
                                      "(log axes), averaged over each layer's heads.",
                                      _distance_figure(res, fig_dir / "longctx_distance")))
    sec.figures.append(FigureArtifact("longctx_position", "Sink mass and normalised entropy against query "
                                      "position, averaged over each layer's heads.",
                                      _position_figure(res, fig_dir / "longctx_position")))
    if clusters is not None:
        _cluster_figure(clusters, fig_dir / "longctx_clusters", tables_dir, sec)
    return sec
