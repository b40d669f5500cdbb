"""What the viewer shows from an analysis results folder, when one is given.

Looks for ``results/*.json`` (written by :meth:`attnscope.analyses.base.Result.save`; also
``*.json`` directly in the folder) and ``tables/*.csv``. From them it takes:

- per-head statistics: every table with one row per ``(layer, head)`` gives one ``[L][H]``
  grid per numeric column, every ``[L, H]`` array gives one grid, and every array
  ``[relation, L, H]`` or ``[relation, L, H, direction]`` whose result names its relations
  (and directions) in ``meta`` gives one grid per relation (and direction), the ``all``
  relation first: the syntax family's head accuracy per dependency relation;
- the head-clustering scatter: a table with ``layer``, ``head`` and ``x``/``y`` (or, as the
  general family's per-head table has them, ``mds_x``/``mds_y``) per head, with a
  ``behaviour`` label per head.

Anything unreadable is listed in ``problems`` and skipped; a missing folder or no results give
an empty answer, not an error.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from attnscope.analyses.syntax import ALL
from attnscope.report.results import read_json


def _num(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v) if np.isfinite(v) else None
    if isinstance(v, str):
        try:
            x = float(v)
        except ValueError:
            return None
        return x if np.isfinite(x) else None
    return None


def _per_head(rows: list[dict], L: int, H: int) -> tuple[dict[str, list], bool]:
    """Numeric columns of a one-row-per-head table as ``[L][H]`` grids (``None`` = missing)."""
    seen = set()
    grids: dict[str, list] = {}
    for r in rows:
        try:
            layer, head = int(r["layer"]), int(r["head"])
        except (KeyError, TypeError, ValueError):
            return {}, False
        if not (0 <= layer < L and 0 <= head < H) or (layer, head) in seen:
            return {}, False
        seen.add((layer, head))
        for k, v in r.items():
            if k in ("layer", "head"):
                continue
            x = _num(v)
            if x is None:
                continue
            grids.setdefault(k, [[None] * H for _ in range(L)])[layer][head] = x
    return grids, True


def _per_relation(arr: dict, meta: dict, L: int, H: int) -> list[tuple[str, list]]:
    """``(label, [L][H] grid)`` for each relation (and direction) of an array ``[R, L, H]`` or
    ``[R, L, H, D]`` labelled by ``meta["relations"]`` (and ``meta["directions"]``); none for
    any other array."""
    shape = list(arr["shape"])
    if len(shape) not in (3, 4) or shape[1:3] != [L, H]:
        return []
    rels = meta.get("relations")
    dirs = meta.get("directions") if len(shape) == 4 else [None]
    if not isinstance(rels, list) or len(rels) != shape[0] or not isinstance(dirs, list) \
            or len(dirs) != (shape[3] if len(shape) == 4 else 1):
        return []
    a = np.asarray(arr["data"], dtype=float).reshape(shape[0], L, H, len(dirs))
    out = []
    for r in sorted(range(len(rels)), key=lambda r: rels[r] != ALL):  # the overall grid first
        for d, direction in enumerate(dirs):
            label = str(rels[r]) if direction is None else f"{rels[r]}, {direction}"
            out.append((label, [[_num(v) for v in row] for row in a[r, :, :, d].tolist()]))
    return out


#: Column pairs that place a head in the clustering scatter, in order of preference.
SCATTER_COLUMNS = (("x", "y"), ("mds_x", "mds_y"))


def _scatter(rows: list[dict], source: str) -> dict | None:
    if not rows or not all(k in rows[0] for k in ("layer", "head")):
        return None
    cols = next((c for c in SCATTER_COLUMNS if all(k in rows[0] for k in c)), None)
    if cols is None:
        return None
    points = []
    for r in rows:
        x, y = _num(r.get(cols[0])), _num(r.get(cols[1]))
        if x is None or y is None:
            continue
        points.append({"layer": int(r["layer"]), "head": int(r["head"]), "x": x, "y": y,
                       "label": str(r.get("behaviour", r.get("label", "")))})
    return {"source": source, "points": points} if points else None


def load_results(folder: str | Path | None, num_layers: int, num_heads: int) -> dict:
    """``{"folder": str | None, "stats": [{"name", "source", "values": [L][H]}], "scatter":
    {...} | None, "summaries": [{"analysis", "summary"}], "problems": [str]}``."""
    out: dict = {"folder": None, "stats": [], "scatter": None, "summaries": [], "problems": []}
    if folder is None:
        return out
    out["folder"] = str(folder)
    folder = Path(folder)
    if not folder.is_dir():
        out["problems"].append(f"{folder}: no such results folder")
        return out
    L, H = num_layers, num_heads
    jsons = sorted((folder / "results").glob("*.json")) + sorted(folder.glob("*.json"))
    for path in jsons:
        d = read_json(path)
        if isinstance(d, dict) and "attnscope_results" in d:
            continue  # a run's results.json: the same results as results/*.json
        if not isinstance(d, dict) or not isinstance(d.get("analysis"), str):
            out["problems"].append(f"{path}: not an analysis result")
            continue
        analysis = d["analysis"]
        if d.get("summary"):
            out["summaries"].append({"analysis": analysis, "summary": list(d["summary"])})
        for tname, rows in (d.get("tables") or {}).items():
            if not isinstance(rows, list):
                continue
            sc = _scatter(rows, f"{analysis}: {tname}")
            if sc and out["scatter"] is None:
                out["scatter"] = sc
            grids, ok = _per_head(rows, L, H)
            for col, values in grids.items():
                if col in ("x", "y", "mds_x", "mds_y"):
                    continue
                out["stats"].append({"name": f"{analysis}: {tname}.{col}",
                                     "source": str(path), "values": values})
        for aname, arr in (d.get("arrays") or {}).items():
            try:
                if list(arr["shape"]) == [L, H]:
                    a = np.asarray(arr["data"], dtype=float).reshape(L, H)
                    out["stats"].append({"name": f"{analysis}: {aname}", "source": str(path),
                                         "values": [[_num(v) for v in row] for row in a.tolist()]})
                for label, values in _per_relation(arr, d.get("meta") or {}, L, H):
                    out["stats"].append({"name": f"{analysis}: {aname} ({label})", "source": str(path),
                                         "values": values})
            except (KeyError, TypeError, ValueError):
                out["problems"].append(f"{path}: array {aname!r} is malformed")
    json_tables = {name.split(": ", 1)[1].split(".", 1)[0] for name in
                   (st["name"] for st in out["stats"]) if ": " in name}
    for path in sorted((folder / "tables").glob("*.csv")):
        if path.stem in json_tables:
            continue  # the same table as in a result JSON
        try:
            with open(path, newline="", encoding="utf-8") as f:
                rows = list(csv.DictReader(f))
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            out["problems"].append(f"{path}: unreadable CSV ({type(exc).__name__})")
            continue
        if out["scatter"] is None:
            out["scatter"] = _scatter(rows, path.name)
        grids, ok = _per_head(rows, L, H)
        for col, values in grids.items():
            if col not in ("x", "y", "mds_x", "mds_y"):
                out["stats"].append({"name": f"{path.stem}.{col}", "source": str(path),
                                     "values": values})
    return out


def results_shape(folder: str | Path | None) -> tuple[int, int]:
    """``(layers, heads)`` of the model a results folder describes, read from its per-head
    tables (largest 0-indexed ``layer`` / ``head`` + 1) and ``[L, H, B]`` arrays; ``(0, 0)``
    when it names none. Used when the viewer runs on a results folder without a store."""
    L = H = 0
    if folder is None or not Path(folder).is_dir():
        return L, H
    folder = Path(folder)
    for path in sorted((folder / "results").glob("*.json")) + sorted(folder.glob("*.json")):
        d = read_json(path)
        if not isinstance(d, dict) or "attnscope_results" in d:
            continue
        for rows in (d.get("tables") or {}).values():
            for r in rows if isinstance(rows, list) else []:
                if not isinstance(r, dict):
                    continue
                layer, head = r.get("layer"), r.get("head")
                if isinstance(layer, int) and isinstance(head, int) and not isinstance(layer, bool):
                    L, H = max(L, layer + 1), max(H, head + 1)
        for arr in (d.get("arrays") or {}).values():
            shape = arr.get("shape") if isinstance(arr, dict) else None
            if isinstance(shape, list) and len(shape) == 3 and all(isinstance(x, int) for x in shape):
                L, H = max(L, shape[0]), max(H, shape[1])
    return L, H
