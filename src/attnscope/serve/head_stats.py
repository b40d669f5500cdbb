"""The per-head statistics the viewer shows from an analysis output folder, when one is given.

Reads the families' results files as :class:`~attnscope.analyses.family_result.FamilyResult`
(through :class:`~attnscope.store.results.ResultsFolder`, the one reader of
``results/<key>.json``) and takes from them:

- per-head statistics: every table with one row per ``(layer, head)`` gives one ``[L][H]``
  grid per numeric column, and every ``[L, H]`` array gives one grid;
- what each family's :meth:`~attnscope.families.base.Family.view` declares for this panel:
  more grids (``grids``, e.g. the syntax family's head accuracy per dependency relation and
  direction) and the heads' ``scatter`` (e.g. the general family's MDS placement and
  behaviour labels, whose columns are then not shown as grids).

Anything unreadable is listed in ``problems`` and skipped; a missing folder or no results give
an empty answer, not an error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnscope.analyses.family_result import FamilyResult
from attnscope.store.results import ResultsFolder
from attnscope.views import family_views


def _num(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if np.isfinite(v) else None


def _per_head(rows: list, L: int, H: int) -> dict[str, list]:
    """Numeric columns of a one-row-per-head table as ``[L][H]`` grids (``None`` = missing);
    none for any other table."""
    seen = set()
    grids: dict[str, list] = {}
    for r in rows:
        try:
            layer, head = int(r["layer"]), int(r["head"])
        except (KeyError, TypeError, ValueError):
            return {}
        if not (0 <= layer < L and 0 <= head < H) or (layer, head) in seen:
            return {}
        seen.add((layer, head))
        for k, v in r.items():
            x = _num(v)
            if k not in ("layer", "head") and x is not None:
                grids.setdefault(k, [[None] * H for _ in range(L)])[layer][head] = x
    return grids


def _fits(values, L: int, H: int) -> bool:
    return len(values) == L and all(len(row) == H for row in values)


def load_results(folder: str | Path | None, num_layers: int, num_heads: int) -> dict:
    """``{"folder": str | None, "stats": [{"name", "source", "values": [L][H]}], "scatter":
    {...} | None, "summaries": [{"analysis", "summary"}], "problems": [str]}``."""
    out: dict = {"folder": None, "stats": [], "scatter": None, "summaries": [], "problems": []}
    if folder is None:
        return out
    out["folder"] = str(folder)
    if not Path(folder).is_dir():
        out["problems"].append(f"{folder}: no such results folder")
        return out
    L, H = num_layers, num_heads
    found = ResultsFolder(folder)
    for r, panels in family_views(found):
        analysis, source = r.analysis, r.source
        if r.summary:
            out["summaries"].append({"analysis": analysis, "summary": list(r.summary)})
        scatter = panels.get("scatter")
        if scatter is not None and out["scatter"] is None:
            out["scatter"] = scatter
        placed = {(scatter["table"], c) for c in scatter["columns"]} if scatter else set()
        for tname, rows in r.tables.items():
            for col, values in (_per_head(rows, L, H) if isinstance(rows, list) else {}).items():
                if (tname, col) not in placed:
                    out["stats"].append({"name": f"{analysis}: {tname}.{col}", "source": source,
                                         "values": values})
        for aname, a in r.arrays.items():
            if a.shape == (L, H) and a.dtype.kind in "fiu":  # (malformed ones were named when read)
                out["stats"].append({"name": f"{analysis}: {aname}", "source": source,
                                     "values": [[_num(v) for v in row] for row in a.tolist()]})
        out["stats"] += [g for g in panels.get("grids", []) if _fits(g["values"], L, H)]
    out["problems"] = found.problems
    return out


def results_shape(folder: str | Path | None) -> tuple[int, int]:
    """``(layers, heads)`` of the model a results folder describes, read from its per-head
    tables (largest 0-indexed ``layer`` / ``head`` + 1) and ``[L, H, B]`` arrays; ``(0, 0)``
    when it names none. Used when the viewer runs on a results folder without a store."""
    L = H = 0
    if folder is None or not Path(folder).is_dir():
        return L, H
    for result in FamilyResult.read_all(ResultsFolder(folder)):
        for rows in result.tables.values():
            for r in rows if isinstance(rows, list) else []:
                layer, head = (r.get("layer"), r.get("head")) if isinstance(r, dict) else (None, None)
                if all(isinstance(x, int) and not isinstance(x, bool) for x in (layer, head)):
                    L, H = max(L, layer + 1), max(H, head + 1)
        for a in result.arrays.values():
            if a.ndim == 3:
                L, H = max(L, a.shape[0]), max(H, a.shape[1])
    return L, H
