"""Plain dicts of what the results views draw, read from an analysis output folder.

Two views read what the families wrote (``results/<family>.json``), with no store:

- *profiles* (:func:`profiles_from_result`): every ``[L, H, B]`` array of a result whose
  ``meta["buckets"]`` labels its last axis, e.g. the long-context family's ``dist_mass`` (mean
  attention mass per log-spaced distance bucket), ``dist_weight`` (mean weight per key at those
  distances) and ``pos_sink`` / ``pos_entropy`` (by query-position bucket); with the ``[L, H]``
  sink mass as a heatmap (:func:`sink_heatmap`).
- *attribution maps* (:func:`attribution_payload`): ``results/attribution.json["example"]``,
  the maps of one example by every method that ran (raw attention averaged over heads, the norm
  of the layer's summed ``alpha f(x)``, value zeroing: ``[L n n]``; rollout and flow: ``[n n]``).

Two more feed the viewer's per-head panels (:mod:`attnscope.serve.head_stats`): a head
*scatter* (:func:`head_scatter`, e.g. the general family's MDS placement of the heads) and
per-head *grids* of a labelled array (:func:`relation_grids`, e.g. the syntax family's accuracy
per relation). Which family fills which panel is declared by the family
(:meth:`attnscope.families.base.Family.view`); :func:`attnscope.views.family_views` asks each
family.

Maps travel as ``f32`` blobs (:mod:`attnscope.viz.encoding`); tokens as strings that the page
puts in with ``textContent``. Anything malformed is named in ``problems`` and left out.
"""

from __future__ import annotations

import math

import numpy as np

from attnscope.analyses.family_result import FamilyResult
from attnscope.models.loaded import display_name
from attnscope.models.pieces import readable, visible
from attnscope.viz.encoding import encode_f32

#: Titles of the arrays the long-context family writes; other bucketed arrays keep their name.
PROFILE_TITLES = {
    "dist_mass": "attention mass per distance bucket (mean over query rows)",
    "dist_weight": "mean weight per key at each distance",
    "pos_sink": "mass on the first token (sink) by query position",
    "pos_entropy": "entropy (nats) by query position",
    "pos_norm_entropy": "normalised entropy by query position",
}
#: The attribution methods of an example, in the order they are drawn: (key, title, per layer).
ATTRIBUTION_METHODS = (
    ("weights", "raw attention (mean over heads)", True),
    ("rollout", "attention rollout (all layers)", False),
    ("flow", "attention flow (all layers)", False),
    ("norms", "norm ||\u03a3_h \u03b1 f(x)|| (Kobayashi et al.)", True),
    ("value_zeroing", "value zeroing (Mohebbi et al.)", True),
)


def _finite_or_none(v) -> float | None:
    return float(v) if v is not None and math.isfinite(v) else None


def _numbers(a: np.ndarray) -> np.ndarray | None:
    """``a`` as floats, or None where it holds something else (a table of strings)."""
    try:
        return np.asarray(a, dtype=float)
    except (TypeError, ValueError):
        return None


def profiles_from_result(r: FamilyResult, source: str, problems: list[str]) -> list[dict]:
    """``[{"name", "title", "axis", "source", "buckets" [B'], "values" [L][H][B']}]`` for each bucketed
    ``[L H B]`` array of ``r``; trailing buckets with no data anywhere are dropped (a
    64-token input has nothing at distance 65 or more)."""
    labels = r.meta.get("buckets")
    if not isinstance(labels, list):
        return []
    out = []
    for name, a in r.arrays.items():
        a = _numbers(a) if a.ndim == 3 and a.shape[2] == len(labels) else None
        if a is None:
            continue
        has = np.isfinite(a) & (a != 0)
        used = np.nonzero(has.any(axis=(0, 1)))[0]
        if not len(used):
            continue
        keep = int(used[-1]) + 1
        values = [[[_finite_or_none(v) for v in row[:keep]] for row in layer] for layer in a.tolist()]
        axis = ("distance bucket" if name.startswith("dist_") else
                "query-position bucket" if name.startswith("pos_") else "bucket")
        out.append({"name": f"{r.analysis}: {name}", "title": PROFILE_TITLES.get(name, name),
                    "axis": f"{axis} (log-spaced)",
                    "source": source, "buckets": [str(x) for x in labels[:keep]], "values": values})
    return out


def sink_heatmap(r: FamilyResult, source: str) -> dict | None:
    """The ``[L H]`` array ``sink`` of ``r`` (mean mass on the first token) as
    ``{"name", "source", "values" [L][H]}``, or None."""
    a = r.arrays.get("sink")
    a = _numbers(a) if a is not None and a.ndim == 2 else None
    if a is None:
        return None
    threshold = r.params.get("sink_threshold")
    return {"name": f"{r.analysis}: sink", "source": source, "threshold": threshold,
            "values": [[_finite_or_none(v) for v in row] for row in a.tolist()]}


def attribution_payload(r: FamilyResult, source: str, problems: list[str]) -> dict | None:
    """The maps of the ``example`` of ``r`` (an ``attribution.json``), or None when it has none.

    ``{"index", "tokens" [n], "num_layers", "source", "model", "notes",
    "methods": [{"key", "title", "per_layer", "shape", "map": f32 blob}]}``.
    """
    ex = r.body.get("example")
    if not isinstance(ex, dict):
        return None
    tokens = ex.get("tokens")
    if not isinstance(tokens, list) or not tokens:
        problems.append(f"{source}: the attribution example has no tokens")
        return None
    tokens = [str(t) for t in tokens]
    n = len(tokens)
    methods, layers = [], None
    for key, title, per_layer in ATTRIBUTION_METHODS:
        raw = ex.get(key)
        if raw is None:
            continue
        try:
            a = np.asarray(raw, dtype=np.float32)
        except (TypeError, ValueError):
            a = None
        want = 3 if per_layer else 2
        if a is None or a.ndim != want or a.shape[-2:] != (n, n) or (layers is not None and per_layer
                                                                     and a.shape[0] != layers):
            problems.append(f"{source}: example map {key!r} has shape "
                            f"{list(a.shape) if a is not None else '?'}, expected "
                            f"{'[layers, ' if per_layer else '['}{n}, {n}] for {n} tokens")
            continue
        if per_layer:
            layers = a.shape[0]
        methods.append({"key": key, "title": title, "per_layer": per_layer, "shape": list(a.shape),
                        "map": encode_f32(np.nan_to_num(a, nan=0.0))})
    if not methods:
        problems.append(f"{source}: the attribution example has no maps")
        return None
    model = r.model
    text = [visible(t) for t in readable(tokens, [False] * n, None, "token")]  # tokens as the views show them
    return {"index": ex.get("index"), "tokens": tokens, "token_text": text, "num_layers": layers or 1,
            "source": source,
            "model": display_name(model) if isinstance(model, dict) else model,
            "notes": [str(x) for x in r.body.get("notes") or []], "methods": methods}


def head_scatter(r: FamilyResult, table: str, x: str, y: str, label: str, source: str) -> dict | None:
    """The heads of table ``table`` of ``r`` placed at columns ``x``, ``y`` and labelled by
    column ``label``: ``{"source", "table", "columns" [x, y], "points": [{"layer", "head", "x",
    "y", "label"}]}``, or None when the table has no such rows (rows without both coordinates
    are left out)."""
    rows = r.tables.get(table)
    if not isinstance(rows, list):
        return None
    points = []
    for row in rows:
        if not isinstance(row, dict):
            continue
        px, py = row.get(x), row.get(y)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                   for v in (px, py, row.get("layer"), row.get("head"))):
            continue
        points.append({"layer": int(row["layer"]), "head": int(row["head"]), "x": float(px),
                       "y": float(py), "label": str(row.get(label, ""))})
    if not points:
        return None
    return {"source": f"{r.analysis}: {table}", "table": table, "columns": [x, y],
            "points": points}


def relation_grids(r: FamilyResult, name: str, source: str, problems: list[str], *,
                   first: str | None = None) -> list[dict]:
    """One ``[L][H]`` grid per relation (and direction) of array ``name`` of ``r``, shaped
    ``[R, L, H]`` or ``[R, L, H, D]`` and labelled by ``meta["relations"]`` (and
    ``meta["directions"]``): ``[{"name": "<analysis>: <name> (<relation>[, <direction>])",
    "source", "values" [L][H]}]``, relation ``first`` first (e.g. the overall one)."""
    a = r.arrays.get(name)
    if a is None:
        return []
    a = _numbers(a)
    rels = r.meta.get("relations")
    dirs = r.meta.get("directions") if a is not None and a.ndim == 4 else [None]
    if a is None or a.ndim not in (3, 4) or not isinstance(rels, list) or len(rels) != a.shape[0] \
            or not isinstance(dirs, list) or len(dirs) != (a.shape[3] if a.ndim == 4 else 1):
        problems.append(f"{source}: array {name!r} is not [relation, layer, head(, direction)] "
                        "labelled by its meta's relations (and directions)")
        return []
    a = a.reshape(*a.shape[:3], len(dirs))
    out = []
    for i in sorted(range(len(rels)), key=lambda i: rels[i] != first):
        for k, direction in enumerate(dirs):
            label = str(rels[i]) if direction is None else f"{rels[i]}, {direction}"
            out.append({"name": f"{r.analysis}: {name} ({label})", "source": source,
                        "values": [[_finite_or_none(v) for v in row] for row in a[i, :, :, k].tolist()]})
    return out
