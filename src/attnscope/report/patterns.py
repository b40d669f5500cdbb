"""The report section "Vig's patterns": tables, figures and ``results/patterns.json``.

Pure: finalized results in, files and a :class:`Section` out. The statistics and their
formulas are in :mod:`attnscope.analyses.patterns`; this module ranks the heads, labels them,
and writes what the report, the viewer and ``--resume`` read.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.analyses.clustering import Thresholds, behaviour_labels
from attnscope.analyses.patterns import (
    CAUSAL_NOT_APPLICABLE,
    KEY_CLASSES,
    PATTERN_LABELS,
    STATS,
    PatternThresholds,
    best_heads,
    finite,
    pattern_labels,
    pattern_stats,
)
from attnscope.data.records import HeadId
from attnscope.report.figures import new_figure, save_figure
from attnscope.report.html import model_display_name
from attnscope.report.section import FigureArtifact, Section, TableArtifact
from attnscope.report.tables import write_table
from attnscope.store.results import family_results, write_results

KEY_COLOURS = {"first": "#9467bd", "separator": "#d62728", "punct": "#8c564b", "other": "#7f7f7f"}
KEY_NAMES = {"first": "first special ([CLS]/BOS)", "separator": "separators ([SEP])",
             "punct": "periods/commas", "other": "other tokens"}


def plot_patterns(stats: dict[str, np.ndarray], chance: dict[str, float | None], causal: bool):
    """Per layer, every head's value (dots), the layer mean (line) and the chance level (dashed)."""
    panels = [("repeat_same", "3: same token, same segment"), ("repeat_other", "4: same token, other segment"),
              ("pieces", "5: other pieces of the word"), ("within", "within own segment (bag of words)")]
    fig, axes = new_figure(1, len(panels), figsize=(3.6 * len(panels), 3.4))
    for ax, (key, title) in zip(axes, panels):
        arr = stats[key]
        L, H = arr.shape
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("layer")
        if causal and key in CAUSAL_NOT_APPLICABLE or not np.isfinite(arr).any():
            ax.text(0.5, 0.5, "not applicable", ha="center", va="center", transform=ax.transAxes)
            continue
        x = np.repeat(np.arange(1, L + 1), H)
        ax.scatter(x, arr.ravel(), s=10, alpha=0.5, color="#1f77b4")
        ax.plot(np.arange(1, L + 1), np.nanmean(arr, axis=1), marker="o", color="#1f77b4", label="layer mean")
        c = chance.get(key)
        if c is not None:
            ax.axhline(c, ls="--", color="k", label=f"chance ({c:.3f})")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=9)
    axes[0].set_ylabel("mean attention mass per row")
    return fig


def plot_keys(key_arrays: dict[str, np.ndarray], top_dims: int | None, reference: dict | None = None):
    """Per layer: share of a key's squared norm in its top dimensions, and its kurtosis, by class;
    dashed: the same for keys of independent normal components (``reference``)."""
    fig, axes = new_figure(1, 2, figsize=(9, 3.6))
    share, kurt = key_arrays["top_share"], key_arrays["kurtosis"]
    L = share.shape[0]
    for c, name in enumerate(KEY_CLASSES):
        if not np.isfinite(share[:, c]).any():
            continue
        axes[0].plot(np.arange(1, L + 1), share[:, c], marker="o", color=KEY_COLOURS[name], label=KEY_NAMES[name])
        axes[1].plot(np.arange(1, L + 1), kurt[:, c], marker="o", color=KEY_COLOURS[name], label=KEY_NAMES[name])
    if reference:
        for ax, key in ((axes[0], "top_share"), (axes[1], "kurtosis")):
            ax.axhline(reference[key], ls="--", color="k", label="Gaussian keys")
    axes[0].set_title(f"share of |key|^2 in its top {top_dims} dimensions", fontsize=9)
    axes[1].set_title("excess kurtosis of key components", fontsize=9)
    for ax in axes:
        ax.set_xlabel("layer")
        ax.legend(fontsize=9)
    return fig


def _reference_words(ref: dict | None) -> str:
    if not ref:
        return ""
    return (f" Keys of independent normal components would give {ref['top_share']:.2f} "
            f"(kurtosis {ref['kurtosis']:.1f}).")


def methods(thresholds: PatternThresholds) -> list[str]:
    t = thresholds
    return [
        "Patterns 3, 4, 5 and the bag-of-words split (Vig, 'Deconstructing BERT'): for each row i the "
        "mass a[i, D_i] on a target set D_i: other occurrences of the same token text (word markers "
        "removed; special tokens, periods and commas excluded) in the same segment (3) or the other "
        "segment (4); the other pieces of the same word (5), split into earlier and later pieces; the "
        "non-special tokens of the own segment (within) or the other one (across).",
        "Only rows whose D_i is not empty count. Each statistic is pooled over rows: the sum of the row "
        "masses over all counted rows of all examples divided by their number, so batching does not "
        "change it. Its chance level is the same average of |D_i| / k_i (k_i = keys the row can see), "
        "the mass uniform attention would give.",
        "Bag of words: the entropy (nats) of the within-segment part renormalised to sum to 1, over rows "
        "with |D_i| >= 2; its reference is ln |D_i| (uniform attention over the own segment).",
        "Patterns 1, 2 and 6 are the section 3 statistics (relative position; special tokens: delimiter = "
        "attention to the first special token + separators, per-example means), not recomputed; their "
        "chance levels are the same averages for uniform attention.",
        f"Pattern labels (first that holds wins): delimiter > {t.delimiter}; previous / next > {t.position}; "
        f"word pieces: earlier or later pieces (earlier only for causal models) > {t.pieces} and > "
        f"{t.lift} x chance; repeat other / same segment > {t.repeat} and > {t.lift} x chance; bag of words: "
        f"within > {t.bag_within} and within-segment entropy >= {t.bag_evenness} x uniform; else other. The "
        "section 6 behaviour labels (paper thresholds) are shown beside them.",
        "Key concentration (Vig's second post): for each real token and key head, the key vector after "
        "position encoding from the forward helper's 'k' hook; share of its squared norm in its "
        "ceil(5% of d) largest squared components, and the excess kurtosis m4/m2^2 - 3 of its components; "
        "pooled over (token, head) pairs per layer and token class.",
    ]


def write_patterns(results: dict, keys, out_dir: Path, *, model_desc: dict, causal: bool,
                   thresholds: PatternThresholds = PatternThresholds(), notes: list[str] | None = None,
                   seed: int = 0, run: dict | None = None,
                   get_map: Callable[[int], Any] | None = None) -> Section:
    """Tables, figures, ``results/patterns.json`` and the Section, from finalized results.

    ``results``: the finalized ``vig-patterns``, ``special-tokens``, ``relative-position`` and
    (optionally) ``entropy`` results; ``keys``: the finalized key concentration or None;
    ``get_map``: example index -> AttentionMap (or None) for the head-view links.
    """
    with warnings.catch_warnings():  # all-NaN statistics (no segments, no split words) are expected
        warnings.simplefilter("ignore", category=RuntimeWarning)
        return _write(results, keys, Path(out_dir), model_desc, causal, thresholds, list(notes or []),
                      seed, dict(run or {}), get_map)


def _write(results, keys, out_dir, model_desc, causal, thresholds, notes, seed, run, get_map) -> Section:
    tables_dir, figures_dir, results_dir = out_dir / "tables", out_dir / "figures", out_dir / "results"
    for d in (tables_dir, figures_dir, results_dir):
        d.mkdir(parents=True, exist_ok=True)
    stats, chance = pattern_stats(results)
    labels = pattern_labels(stats, chance, causal=causal, thresholds=thresholds)
    uniform = results["entropy"].meta.get("uniform_entropy") if "entropy" in results else None
    section6 = behaviour_labels({k: stats[k] for k in ("separator", "first", "punct", "previous", "next", "entropy")
                                 if k in stats}, uniform, Thresholds())
    L, H = labels.shape
    sec = Section(key="patterns", title="Vig's patterns")
    na = set(CAUSAL_NOT_APPLICABLE) if causal else set()

    # per-head table
    keys_cols = list(STATS) + ["delimiter", "previous", "next"]
    cols = ["layer", "head", "name"] + keys_cols + ["pattern", "behaviour"]
    rows = []
    for layer in range(L):
        for head in range(H):
            row: dict[str, Any] = {"layer": layer, "head": head, "name": str(HeadId(layer, head))}
            for k in keys_cols:
                row[k] = None if k in na else finite(stats[k][layer, head])
            row.update(pattern=str(labels[layer, head]), behaviour=str(section6[layer, head]))
            rows.append(row)
    cap = ("Per head (layer and head 0-indexed; name is the paper's 1-indexed layer-head): pooled row "
           "averages of the mass on repeated tokens (same / other segment), on the word's other pieces "
           "(all, earlier, later), within / across segments, the within-segment entropy (nats); attention "
           "to delimiters, previous and next token (section 3); Vig pattern label and section 6 label. "
           "Empty: not applicable or no rows.")
    sec.tables.append(TableArtifact("patterns_heads", cap, rows, cols,
                                    write_table(rows, tables_dir / "patterns_heads", columns=cols, caption=cap)))
    vig = results["vig-patterns"]
    crow = [{"statistic": k, "chance": None if k in na else finite(chance.get(k)),
             "rows": vig.meta["rows"].get(k), "applicable": k not in na} for k in keys_cols]
    ccols = ["statistic", "chance", "rows", "applicable"]
    ccap = ("Chance level of each statistic (uniform attention over each counted row; for "
            "within_entropy: ln of the within-segment size, in nats) and the number of counted rows.")
    sec.tables.append(TableArtifact("patterns_chance", ccap, crow, ccols,
                                    write_table(crow, tables_dir / "patterns_chance", columns=ccols, caption=ccap)))
    best = best_heads(stats, chance, results, labels, causal)
    bcols = ["pattern", "head", "value", "chance", "lift", "example", "label", "note"]
    bcap = ("The head that best shows each pattern (1-indexed layer-head), its value, the chance level "
            "for the same rows, their ratio (lift) and the example where the head shows it most.")
    sec.tables.append(TableArtifact("patterns_best", bcap, best, bcols,
                                    write_table(best, tables_dir / "patterns_best", columns=bcols, caption=bcap)))
    if keys is not None and keys.arrays:
        krows = keys.tables["key_concentration"]
        kcols = ["layer", "name"] + [f"{c}_{s}" for c in KEY_CLASSES for s in ("top_share", "kurtosis")]
        kcap = (f"Key concentration per layer (0-indexed; name 1-indexed): share of a key vector's squared "
                f"norm in its top {keys.meta.get('top_dims')} of {keys.meta.get('dim')} dimensions, and "
                "its excess kurtosis, pooled over tokens and key heads of each class." + _reference_words(keys.meta.get("gaussian_reference")))
        sec.tables.append(TableArtifact("patterns_keys", kcap, krows, kcols,
                                        write_table(krows, tables_dir / "patterns_keys", columns=kcols, caption=kcap)))

    # figures
    sec.figures.append(FigureArtifact("patterns_layers", "Vig's patterns 3, 4, 5 and the within-segment "
                                      "mass of every head (dots), layer means (line) and chance (dashed).",
                                      save_figure(plot_patterns(stats, chance, causal), figures_dir / "patterns_layers")))
    if keys is not None and keys.arrays:
        sec.figures.append(FigureArtifact("patterns_keys", "The [SEP]-key signature: concentration of key "
                                          "vectors per layer and token class.",
                                          save_figure(plot_keys(keys.arrays, keys.meta.get("top_dims"),
                                                                keys.meta.get("gaussian_reference")),
                                                      figures_dir / "patterns_keys")))

    # head-view links
    for r in best:
        if r.get("head") is None or r.get("example") is None:
            continue
        m = get_map(r["example"]) if get_map is not None else None
        if m is None:
            continue
        sec.best_heads.append((r["layer"], r["head_index"], r["example"], f"pattern {r['pattern']}"))
        sec.maps[r["example"]] = m

    # words
    name = model_display_name(model_desc)
    findings = [f"{name} over {run.get('examples', vig.meta['examples'])} examples:"]
    for r in best:
        if r.get("head") is None:
            findings.append(f"Pattern {r['pattern']}: {r['note']}.")
        else:
            c = "" if r["chance"] is None else f" (chance {r['chance']:.3f})"
            findings.append(f"Pattern {r['pattern']}: strongest head {r['head']}, {r['value']:.3f}{c}.")
    counts = {lab: int((labels == lab).sum()) for lab in PATTERN_LABELS}
    findings.append("Pattern labels: " + ", ".join(f"{lab} {c}" for lab, c in counts.items() if c) + ".")
    if keys is not None and keys.arrays:
        share = keys.arrays["top_share"]
        s, o = KEY_CLASSES.index("separator"), KEY_CLASSES.index("other")
        if np.isfinite(share[:, s]).any():
            kurt = keys.arrays["kurtosis"]
            per_layer = "; ".join(f"{i + 1}: {share[i, s]:.2f} vs {share[i, o]:.2f} (kurtosis {kurt[i, s]:.1f} "
                                  f"vs {kurt[i, o]:.1f})" for i in range(share.shape[0]))
            findings.append(f"Key concentration, [SEP] vs other tokens, as the share of a key's squared norm "
                            f"in its top {keys.meta.get('top_dims')} of {keys.meta.get('dim')} dimensions, "
                            f"per layer: {per_layer}." + _reference_words(keys.meta.get("gaussian_reference")))
        else:
            findings.append("The inputs have no separator tokens, so there is no [SEP]-key signature to measure.")
    sec.findings = findings + notes
    sec.methods = methods(thresholds)

    payload = family_results(
        "patterns", sec, {"seed": seed, **asdict(thresholds)},
        family="patterns", model=model_desc, seed=seed, run=run, notes=notes, causal=causal,
        thresholds=asdict(thresholds), findings=sec.findings,
        chance={k: (None if k in na else chance.get(k)) for k in keys_cols},
        labels=[[str(x) for x in r] for r in labels],
        section6_labels=[[str(x) for x in r] for r in section6], best=best, heads=rows,
        analyses={k: r.to_json() for k, r in results.items()},
        keys=keys.to_json() if keys is not None else None)
    write_results(out_dir, "patterns", payload)
    return sec
