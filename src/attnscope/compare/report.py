"""The comparison's outputs: tables (CSV, JSON, Markdown, LaTeX), figures, head views, the
strict-JSON results and the self-contained ``report.html`` (the single-model report's page,
filled with comparison sections).

Heads in tables are shown as the paper does (1-indexed ``layer-head``) beside 0-indexed
``layer``/``head`` columns; differences are always B - A.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from attnscope.compare.stats import JS_ROUNDING, ROUNDING
from attnscope.data.io import atomic_write_text
from attnscope.data.records import HeadId, layer_number
from attnscope.report.figures import new_figure, save_figure
from attnscope.report.html import heatmap_page, view_file_name, write_report
from attnscope.report.section import FigureArtifact, Section, TableArtifact
from attnscope.report.tables import write_table
from attnscope.store.results import write_json
from attnscope.store.writer import versions

#: Rows of the per-head table shown in the page (all rows are in its files).
SHOWN_ROWS = 25
#: Heads whose head views are linked (both models' views for each).
VIEWED_HEADS = 6


def _name(flat: int, heads: int) -> str:
    return str(HeadId(flat // heads, flat % heads))


def head_rows(cmp) -> list[dict]:
    """One row per head and statistic: A, B, B - A, the 95% interval and whether it excludes 0."""
    st = cmp.stats
    if not st:
        return []
    changed = cmp.changed()
    rows = []
    S, L, H = st["diff"].shape
    for s in range(S):
        for layer in range(L):
            for head in range(H):
                rows.append({"head": str(HeadId(layer, head)), "layer": layer, "head_index": head,
                             "statistic": st["statistics"][s], "a": float(st["a"][s, layer, head]),
                             "b": float(st["b"][s, layer, head]),
                             "change": float(st["diff"][s, layer, head]),
                             "ci_low": float(st["low"][s, layer, head]),
                             "ci_high": float(st["high"][s, layer, head]),
                             "outside_interval": bool(changed[s, layer, head]),
                             "examples": int(st["n"][s])})
    return rows


def layer_rows(cmp) -> list[dict]:
    d = cmp.same_head()
    if d is None:
        return []
    return [{"layer": layer_number(layer), "mean_js": float(d[layer].mean()), "min_js": float(d[layer].min()),
             "max_js": float(d[layer].max()),
             "most_changed_head": (str(HeadId(layer, int(d[layer].argmax()))) if d[layer].max() > JS_ROUNDING
                                   else None)}
            for layer in range(d.shape[0])]


def matching_rows(cmp) -> list[dict]:
    ha, hb = cmp.shape_a[1], cmp.shape_b[1]
    same = cmp.same_head()
    rows = []
    for i, j in cmp.matching:
        row = {"head_a": _name(i, ha), "head_b": _name(j, hb), "js": float(cmp.distances[i, j]),
               "moved": _name(i, ha) != _name(j, hb)}
        if same is not None:
            row["js_same_head"] = float(cmp.distances[i, i])
        rows.append(row)
    return rows


def _nats(x: float) -> str:
    """A distance in nats: 4 decimals, two significant digits below 0.001, and no digits of
    float rounding (at most :data:`JS_ROUNDING`)."""
    return f"<{JS_ROUNDING:g}" if x <= JS_ROUNDING else f"{x:.4f}" if x >= 1e-3 else f"{x:.1e}"


def findings(cmp) -> list[str]:
    """The plain-words summary of the largest changes."""
    a, b = cmp.a.name, cmp.b.name
    out = []
    how = ("token by token (both models tokenize the inputs the same way)" if cmp.pairing.level == "token"
           else "at word level (paper section 4.1: attention to a word summed over its pieces, from "
                "a word averaged)" + (", words only, with one column for all special tokens, because "
                                     "the two models add different special tokens"
                                     if cmp.pairing.layout != "same units" else ""))
    out.append(f"A = {a}, B = {b}: {len(cmp.pairing.indices)} examples compared {how}.")
    if cmp.identical():
        out.append(f"A and B are identical within float rounding: no attention weight of any head differs "
                   f"by more than {ROUNDING:g} (largest difference {cmp.max_diff:.2g}), so nothing "
                   "changed; differences below the rounding thresholds are not findings.")
        return out + list(cmp.notes)
    layer = cmp.layer_distance()
    if layer is not None:
        moved_layers = cmp.changed_layers()
        if not moved_layers:
            out.append(f"No layer changed beyond float rounding: every layer's mean Jensen-Shannon distance "
                       f"between each head of A and the same head of B is at most {JS_ROUNDING:g} nats per unit.")
        else:
            top = ", ".join(f"layer {i + 1} ({_nats(layer[i])})"
                            for i in moved_layers[:max(1, min(2, len(layer) - 1))])
            least = int(np.argmin(layer))
            out.append(f"The layers that changed most, by the mean Jensen-Shannon distance between each "
                       f"head of A and the same head of B: {top}; least: layer {least + 1} "
                       f"({_nats(layer[least])} nats per unit).")
    moved = [r for r in matching_rows(cmp) if r["moved"]]
    pa = cmp.shape_a[0] * cmp.shape_a[1]
    if cmp.same_shape:
        shown = "; ".join(f"{r['head_a']} of A is matched with {r['head_b']} of B" for r in
                          sorted(moved, key=lambda r: r["js"] - r["js_same_head"])[:3])
        out.append(f"The optimal one-to-one matching keeps {pa - len(moved)} of {pa} heads in place"
                   + (f"; {shown}." if moved else "."))
    else:
        out.append(f"The optimal one-to-one matching pairs {len(cmp.matching)} heads of A with heads of B "
                   "(the models have different numbers of heads).")
    if cmp.stats:
        changed = cmp.changed()
        total = changed.size
        st = cmp.stats
        diff = np.where(changed, np.abs(st["diff"]), -1.0)
        largest = []
        for f in np.argsort(-diff, axis=None)[:3]:
            s, layer_i, head = np.unravel_index(f, diff.shape)
            if diff[s, layer_i, head] <= 0:
                break
            largest.append(f"head {HeadId(layer_i, head)}'s {st['what'][s]} went from "
                           f"{st['a'][s, layer_i, head]:.3f} to {st['b'][s, layer_i, head]:.3f} "
                           f"(change {st['diff'][s, layer_i, head]:+.3f}, 95% interval "
                           f"{st['low'][s, layer_i, head]:+.3f} to {st['high'][s, layer_i, head]:+.3f})")
        out.append(f"{int(changed.sum())} of {total} head statistics changed outside their 95% paired "
                   f"bootstrap interval (uncorrected: about {0.05 * total:.0f} would by chance alone "
                   "if nothing had changed)" + (f"; the largest change: {largest[0]}." if largest else "."))
        out.extend(f"Next largest: {x}." for x in largest[1:])
    out.extend(cmp.notes)
    return out


def _heatmap_grid(cmp, stem: Path) -> list[Path]:
    st = cmp.stats
    S, L, H = st["diff"].shape
    cols = 5
    rows = (S + cols - 1) // cols
    step = -(-H // 12)  # at most 12 head ticks a panel, so that "10 11 12" never run together
    fig, axes = new_figure(rows, cols, figsize=(3.2 * cols, 0.3 * L * rows + 1.4 * rows), squeeze=False,
                           layout="constrained")
    changed = cmp.changed()
    for s in range(rows * cols):
        ax = axes[s // cols][s % cols]
        if s >= S:
            ax.axis("off")
            continue
        d = np.where(np.abs(st["diff"][s]) <= ROUNDING, 0.0, st["diff"][s])  # rounding is no change
        # a scale of at least +-0.01, so that no change shows as "no change" and not as a
        # colour bar of 1e-6 with its offset text over the panel
        lim = max(float(np.nanmax(np.abs(d), initial=0.0)), 0.01)
        im = ax.imshow(d, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
        ys, xs = np.nonzero(changed[s])
        ax.scatter(xs, ys, s=6, c="black", marker="o")
        ax.set_title(st["statistics"][s], fontsize=9)
        ax.set_xticks(range(0, H, step))
        ax.set_xticklabels([str(h + 1) for h in range(0, H, step)], fontsize=7)
        ax.set_yticks(range(L))
        ax.set_yticklabels([str(layer_number(i)) for i in range(L)], fontsize=7)
        bar = fig.colorbar(im, ax=ax, shrink=0.9, format="%.2g", aspect=15)
        bar.ax.tick_params(labelsize=7)
        bar.ax.locator_params(nbins=3)
    fig.supxlabel("head")
    fig.supylabel("layer")
    return save_figure(fig, stem)


def _layer_figure(cmp, stem: Path) -> list[Path]:
    d = cmp.same_head()
    d = np.where(d <= JS_ROUNDING, 0.0, d)  # float rounding is no change: no bars of 1e-8
    L = d.shape[0]
    fig, ax = new_figure(figsize=(6, 3.5), layout="constrained")
    ax.bar(range(1, L + 1), d.mean(1), color="#3b6ea5", label="mean over heads")
    ax.scatter(np.repeat(np.arange(1, L + 1), d.shape[1]), d.ravel(), s=8, c="black", alpha=0.5,
               label="each head")
    ax.set_xlabel("layer")
    ax.set_ylabel("JS distance, A head vs same B head (nats)")
    ax.set_xticks(range(1, L + 1))
    ax.set_ylim(0, max(float(d.max()) * 1.1, 0.01))
    ax.legend(fontsize=8)
    return save_figure(fig, stem)


def _cross_figure(cmp, stem: Path) -> list[Path]:
    d = cmp.distances
    (la, ha), (lb, hb) = cmp.shape_a, cmp.shape_b
    size = min(12.0, 3.0 + 0.08 * max(d.shape))
    fig, ax = new_figure(figsize=(size, size), layout="constrained")
    im = ax.imshow(d, cmap="viridis_r", aspect="auto")
    ii, jj = zip(*cmp.matching)
    ax.scatter(jj, ii, s=10, facecolors="none", edgecolors="red", linewidths=0.8, label="matching")
    ax.set_xticks([k * hb for k in range(lb)])
    ax.set_xticklabels([f"{k + 1}-1" for k in range(lb)], fontsize=8)
    ax.set_yticks([k * ha for k in range(la)])
    ax.set_yticklabels([f"{k + 1}-1" for k in range(la)], fontsize=8)
    ax.set_xlabel(f"head of B ({cmp.b.name})")
    ax.set_ylabel(f"head of A ({cmp.a.name})")
    ax.legend(fontsize=8, loc="upper right")
    fig.colorbar(im, ax=ax, shrink=0.8, label="JS distance (nats)")
    return save_figure(fig, stem)


def _views(cmp, out_dir: Path) -> list[dict[str, str]]:
    """Head views of both models for the matched heads that changed most."""
    try:
        from attnscope.viz.pages import head_view_html
    except ImportError:  # the views are an optional part of the installation
        head_view_html = None
    index = cmp.pairing.indices[0]
    maps = {"A": cmp.a.store.by_index(index), "B": cmp.b.store.by_index(index)}
    ha, hb = cmp.shape_a[1], cmp.shape_b[1]
    pairs = sorted(cmp.matching, key=lambda p: -(cmp.distances[p[0], p[0]] if cmp.same_shape
                                                 else cmp.distances[p]))
    moved = [p for p in cmp.matching if _name(p[0], ha) != _name(p[1], hb)]
    chosen = list(dict.fromkeys(moved[:VIEWED_HEADS] + pairs))[:VIEWED_HEADS]
    links = []
    for i, j in chosen:
        for label, side, flat, h in (("A", cmp.a, i, ha), ("B", cmp.b, j, hb)):
            layer, head = divmod(flat, h)
            href = view_file_name("compare", label, layer, head)
            if (out_dir / href).exists():
                continue
            title = f"{label} ({side.name}): head {HeadId(layer, head)} (example {index})"
            amap = maps[label]
            page = (head_view_html(amap, layer=layer, heads=[head], title=title) if head_view_html
                    else heatmap_page(amap, layer=layer, head=head, title=title))
            atomic_write_text(out_dir / href, page)
            links.append({"label": f"{label} ({side.name}), matched with "
                                   f"{_name(j, hb) if label == 'A' else _name(i, ha)} of "
                                   f"{'B' if label == 'A' else 'A'}",
                          "head": f"{HeadId(layer, head)}", "href": href, "example": str(index)})
    return links


def sections(cmp, out_dir: Path) -> tuple[list[Section], dict[str, list[dict]]]:
    """Write the tables, figures and head views; return the report's sections and links."""
    tables, figures = out_dir / "tables", out_dir / "figures"
    for d in (tables, figures, out_dir / "views"):
        d.mkdir(parents=True, exist_ok=True)
    secs: list[Section] = []
    summary = Section("compare-summary", "What changed from A to B", findings=findings(cmp), methods=[
        "Differences are B - A. Per-head statistics are means over the examples where both models "
        "define them (paper section 3 maths of the relative-position, special-tokens and entropy "
        f"analyses); intervals: paired percentile bootstrap over examples, {cmp.params['bootstrap']['n_boot']} "
        f"resamples, seed {cmp.params['bootstrap']['seed']}.",
        "Jensen-Shannon distances (paper section 6 maths, attnscope.analyses.distances): each row "
        f"smoothed with {cmp.params['distances']['smoothing']} / n, the divergence in nats averaged "
        "over every unit's row of every example."])
    secs.append(summary)
    if cmp.stats:
        rows = head_rows(cmp)
        cols = ["head", "layer", "head_index", "statistic", "a", "b", "change", "ci_low", "ci_high",
                "outside_interval", "examples"]
        cap = ("Per-head statistics of A and B side by side, their change (B - A) and its 95% paired "
               "bootstrap interval; heads 1-indexed in 'head', 0-indexed in layer/head_index. "
               f"Shown: the {SHOWN_ROWS} largest changes outside their interval; every row is in the files.")
        paths = write_table(rows, tables / "compare_heads", columns=cols, caption=cap)
        shown = sorted((r for r in rows if r["outside_interval"]), key=lambda r: -abs(r["change"]))[:SHOWN_ROWS]
        fig = _heatmap_grid(cmp, figures / "compare_head_changes")
        secs.append(Section("compare-heads", "Per-head statistics, side by side",
                            tables=[TableArtifact("compare_heads", cap, shown, cols, paths)],
                            figures=[FigureArtifact("compare_head_changes",
                                                    "Change (B - A) of each statistic per head (rows: "
                                                    "layers, columns: heads, 1-indexed); dots: the 95% "
                                                    "interval excludes 0.", fig)]))
    lrows = layer_rows(cmp)
    if lrows:
        cap = ("Per layer: Jensen-Shannon distance between each head of A and the same head of B over "
               "the same units (nats per unit): mean, least and most changed head.")
        paths = write_table(lrows, tables / "compare_layers", caption=cap)
        fig = _layer_figure(cmp, figures / "compare_layers")
        secs.append(Section("compare-layers", "Where the models diverge, layer by layer",
                            tables=[TableArtifact("compare_layers", cap, lrows, list(lrows[0]), paths)],
                            figures=[FigureArtifact("compare_layers", "Distance between each head of A "
                                                    "and the same head of B, per layer (as Kovaleva et "
                                                    "al. 2019 show for fine-tuned BERT).", fig)]))
    mrows = matching_rows(cmp)
    cap = ("Optimal one-to-one matching of A's heads to B's heads (Hungarian method on the "
           "Jensen-Shannon distances); 'moved': matched to a head at another position.")
    paths = write_table(mrows, tables / "compare_matching", caption=cap)
    full = [{"head_a": _name(i, cmp.shape_a[1]), "head_b": _name(j, cmp.shape_b[1]),
             "js": float(cmp.distances[i, j])}
            for i in range(cmp.distances.shape[0]) for j in range(cmp.distances.shape[1])]
    dcap = "Jensen-Shannon distance between every head of A and every head of B (nats per unit)."
    dpaths = write_table(full, tables / "compare_distances", caption=dcap, formats=("csv", "json"))
    shown_m = sorted(mrows, key=lambda r: (not r["moved"], -r.get("js_same_head", r["js"])))[:SHOWN_ROWS]
    fig = _cross_figure(cmp, figures / "compare_distances")
    secs.append(Section("compare-matching", "Which head of B does each head of A become?",
                        tables=[TableArtifact("compare_matching", cap + f" Shown: moved heads first, "
                                              f"then the most changed (at most {SHOWN_ROWS}).",
                                              shown_m, list(mrows[0]), paths),
                                TableArtifact("compare_distances", dcap, [], ["head_a", "head_b", "js"],
                                              dpaths)],
                        figures=[FigureArtifact("compare_distances", dcap + " Circles: the matching.", fig)]))
    secs += _tables_sections(cmp, tables)
    return secs, {"compare-matching": _views(cmp, out_dir)}


def _tables_sections(cmp, tables: Path) -> list[Section]:
    """The families' comparison tables of both runs (``cmp.run_tables``), written under ``tables``."""
    ts = []
    for stem, rows in cmp.run_tables.items():
        if not rows:
            continue
        cap = cmp.run_captions.get(stem, stem)
        paths = write_table(rows, tables / f"{stem}_compare", caption=cap)
        ts.append(TableArtifact(f"{stem}_compare", cap, rows, list(rows[0]), paths))
    return [Section("compare-tables", "The families' tables, both models", tables=ts)] if ts else []


def write_tables_compare(cmp, out_dir: str | Path, *, command: str | None = None) -> Path:
    """Write a :class:`~attnscope.compare.core.TablesComparison`: the tables, ``results/compare.json``
    and ``report.html``."""
    out_dir = Path(out_dir)
    tables = out_dir / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    secs = _tables_sections(cmp, tables)
    write_json(out_dir / "results" / "compare.json",
               {"analysis": "compare", "sources": {"A": str(cmp.a), "B": str(cmp.b)},
                "run_tables": cmp.run_tables, "maps": None})
    prov = {"model": {"name": f"{cmp.a.name} vs {cmp.b.name}"}, "versions": versions(), "command": command,
            "data": [{"role": f"results {k}", "path": str(p), "sha256": "", "bytes": sum(
                f.stat().st_size for f in (p / "results").glob("*.json"))} for k, p in (("A", cmp.a), ("B", cmp.b))]}
    return write_report(secs, out_dir, provenance=prov, links={},
                        title=f"{cmp.a.name} vs {cmp.b.name}: the families' tables",
                        intro=("An attnscope comparison of two output folders that kept no maps: each "
                               "table both hold, side by side, with the change (B - A)."))


def results_json(cmp) -> dict[str, Any]:
    """The comparison as plain data (strict JSON through :func:`write_json`)."""
    st = cmp.stats
    return {
        "analysis": "compare", "params": cmp.params,
        "models": {"A": cmp.a.model, "B": cmp.b.model},
        "sources": {"A": str(cmp.a.path), "B": str(cmp.b.path), "maps": cmp.a.which or None},
        "level": cmp.pairing.level, "units": cmp.pairing.layout,
        "examples": cmp.pairing.indices, "only_a": cmp.pairing.only_a, "only_b": cmp.pairing.only_b,
        "statistics": st["statistics"] if st else [],
        "arrays": {**({k: st[k] for k in ("a", "b", "diff", "low", "high")} if st else {}),
                   "distances": cmp.distances,
                   **({"same_head": cmp.same_head(), "layer_distance": cmp.layer_distance()}
                      if cmp.same_shape else {})},
        "matching": [[i, j] for i, j in cmp.matching],
        "identical": cmp.identical(),
        "max_weight_difference": cmp.max_diff if np.isfinite(cmp.max_diff) else None,
        "run_tables": cmp.run_tables, "findings": findings(cmp), "notes": cmp.notes,
        "head_order": "layer-major: flat index = layer * num_heads + head (0-indexed)",
    }


def write_compare(cmp, out_dir: str | Path, *, command: str | None = None,
                  elapsed_s: float | None = None) -> Path:
    """Write every output of the comparison under ``out_dir``; return the report's path."""
    out_dir = Path(out_dir)
    secs, links = sections(cmp, out_dir)
    write_json(out_dir / "results" / "compare.json", results_json(cmp))
    prov = {
        "model": {"name": f"{cmp.a.name} vs {cmp.b.name}"},
        "data": [{"role": f"maps {s.label}", "path": str(s.store.path),
                  "sha256": (s.store.manifest.get("input") or {}).get("sha256", ""),
                  "bytes": sum(f.stat().st_size for f in s.store.shards())} for s in (cmp.a, cmp.b)],
        "seeds": {"bootstrap": cmp.params["bootstrap"]["seed"]},
        "counts": {"examples compared": len(cmp.pairing.indices)},
        "arguments": {"level": cmp.pairing.level, "units": cmp.pairing.layout,
                      "n_boot": cmp.params["bootstrap"]["n_boot"],
                      "smoothing": cmp.params["distances"]["smoothing"]},
        "versions": versions(), "command": command,
    }
    if elapsed_s is not None:
        prov["elapsed_s"] = round(float(elapsed_s), 3)
    for side in (cmp.a, cmp.b):
        for key in ("name", "source", "weights_sha256"):
            prov["arguments"][f"{side.label} {key}"] = side.model.get(key)
    return write_report(secs, out_dir, provenance=prov, links=links,
                        title=f"What changed from {cmp.a.name} to {cmp.b.name}?",
                        intro=(f"An attnscope comparison, head by head: A = {cmp.a.name}, B = "
                               f"{cmp.b.name}, on the same {len(cmp.pairing.indices)} examples "
                               f"({cmp.pairing.level} level). Changes are B - A."
                               + (" A and B are identical within float rounding: nothing changed."
                                  if cmp.identical() else "")))
