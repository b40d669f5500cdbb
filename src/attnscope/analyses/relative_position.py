"""Attention to the current, previous and next token, per head (paper section 3.1).

For one example with ``n`` units and one head with attention ``a`` (``[n n]``, row = from):

- current:  ``sum_i a[i, i] / n``
- previous: ``sum_{i>=1} a[i, i-1] / (n - 1)`` (only units that have a previous one)
- next:     ``sum_{i<=n-2} a[i, i+1] / (n - 1)``

Each statistic is averaged over examples (the mean of the per-example means, as the paper's
code does). The paper's released code divides previous and next by ``n`` instead of
``n - 1``; ``denominator="paper-code"`` reproduces that.

>>> import numpy as np
>>> a = RelativePosition(); a._add(np.eye(3, k=-1)[None, None] + np.eye(3, k=2)[None, None], 3)
>>> a.finalize().arrays["previous"].tolist()
[[1.0]]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnscope.analyses.base import MapsAnalysis, Result, register
from attnscope.analyses.stat import Stat, declare
from attnscope.analyses.top_examples import TopExamples, units_of
from attnscope.data.records import HeadId
from attnscope.maps import AttentionBatch, AttentionMap

STATS = declare(
    Stat("current", "attention to the token itself", "sum_i a[i,i] / n", "Clark et al. 2019, section 3.1",
         "relative-position"),
    Stat("previous", "attention to the previous token", "sum_{i>=1} a[i,i-1] / (n-1)",
         "Clark et al. 2019, section 3.1", "relative-position", per_layer=True),
    Stat("next", "attention to the next token", "sum_{i<=n-2} a[i,i+1] / (n-1)",
         "Clark et al. 2019, section 3.1", "relative-position", per_layer=True),
)
DENOMINATORS = ("valid", "paper-code")


def per_head_rows(arrays: dict[str, np.ndarray], digits: int | None = None) -> list[dict]:
    """One row per head: ``layer``, ``head`` (0-indexed), ``name`` (paper's 1-indexed) + stats.

    ``arrays`` maps a statistic's name to its ``[L H]`` array.
    """
    first = next(iter(arrays.values()))
    rows = []
    for layer in range(first.shape[0]):
        for head in range(first.shape[1]):
            row: dict[str, Any] = {"layer": layer, "head": head, "name": str(HeadId(layer, head))}
            for k, v in arrays.items():
                x = float(v[layer, head])
                row[k] = round(x, digits) if digits is not None else x
            rows.append(row)
    return rows


class PerExampleMeans:
    """Sums of per-example means ``[S L H]``, of their squares, and how many examples each
    statistic saw ``[S]``.

    The shared accumulator of the per-head statistics of section 3: ``add`` one example's
    ``[S L H]`` values with a ``[S]`` mask of the statistics that example defines.
    """

    def __init__(self, names: tuple[str, ...]):
        self.names = names
        self.sums: np.ndarray | None = None  # [S L H] float64
        self.squares: np.ndarray | None = None  # [S L H] float64: the spread, for intervals
        self.counts = np.zeros(len(names), dtype=np.int64)  # [S]

    def add(self, values: np.ndarray, defined: np.ndarray) -> None:
        if self.sums is None:
            self.sums = np.zeros((len(self.names),) + values.shape[1:], dtype=np.float64)
            self.squares = np.zeros_like(self.sums)
        elif self.sums.shape[1:] != values.shape[1:]:
            raise ValueError(f"maps of shape {values.shape[1:]} after maps of shape {self.sums.shape[1:]} "
                             "(different models mixed in one analysis)")
        self.sums[defined] += values[defined]
        self.squares[defined] += np.square(values[defined], dtype=np.float64)
        self.counts += defined.astype(np.int64)

    def merge(self, other: "PerExampleMeans") -> None:
        if other.sums is None:
            return
        if self.sums is None:
            self.sums, self.squares = other.sums.copy(), other.squares.copy()
        else:
            if self.sums.shape != other.sums.shape:
                raise ValueError("cannot merge accumulators of different models")
            self.sums += other.sums
            self.squares += other.squares
        self.counts += other.counts

    def means(self) -> dict[str, np.ndarray]:
        """``name -> [L H]`` mean over the examples that define it (NaN where none did)."""
        if self.sums is None:
            return {}
        with np.errstate(invalid="ignore", divide="ignore"):
            m = self.sums / np.where(self.counts > 0, self.counts, np.nan)[:, None, None]
        return {k: m[s] for s, k in enumerate(self.names)}

    def standard_errors(self) -> dict[str, list]:
        """``name -> [L H]`` (as lists) standard error of each mean over examples, ``sqrt(s^2 /
        n)`` with the sample variance ``s^2`` of the per-example values (None below 2 examples):
        a head page's 95% interval is the mean +- 1.96 of it."""
        if self.sums is None:
            return {}
        n = self.counts.astype(np.float64)[:, None, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            var = np.maximum(self.squares - self.sums ** 2 / n, 0.0) / (n - 1)
            se = np.where(n > 1, np.sqrt(var / n), np.nan)
        return {k: [[None if not np.isfinite(x) else float(f"{x:.6g}") for x in row] for row in se[s]]
                for s, k in enumerate(self.names)}


@register
class RelativePosition(MapsAnalysis):
    """Per head: mean attention to the current, previous and next unit (paper section 3.1)."""

    name = "relative-position"
    summed = ("acc", "examples", "top")
    requires = frozenset()

    def __init__(self, denominator: str = "valid", seed: int = 0):
        if denominator not in DENOMINATORS:
            raise ValueError(f"denominator must be one of {DENOMINATORS}, not {denominator!r}")
        self.denominator = denominator
        self.acc = PerExampleMeans(STATS)
        self.examples = 0
        self.top = TopExamples(STATS, seed=seed)

    def params(self) -> dict[str, Any]:
        return {"denominator": self.denominator, "average": "mean over examples of per-example means",
                "seed": self.top.seed}

    def _add(self, attn: np.ndarray, n: int, m: "AttentionMap | None" = None) -> None:
        """One example's ``attn`` ``[L H n n]`` (and its map ``m``, whose top rows are kept)."""
        diagonals = [np.diagonal(attn, offset=o, axis1=2, axis2=3) for o in (0, -1, 1)]  # views
        cur, prev, nxt = (d.sum(-1) for d in diagonals)  # [L H]: a[i, i], a[i+1, i], a[i, i+1]
        side = n if self.denominator == "paper-code" else n - 1
        values = np.stack([cur / n, prev / max(side, 1), nxt / max(side, 1)])  # [3 L H]
        defined = np.array([n > 0, n > 1, n > 1])
        self.add_means(values, defined)
        if m is not None:
            rows = np.full((3,) + attn.shape[:3], -np.inf)  # [3 L H q]: each query row's own value
            rows[0], rows[1][..., 1:], rows[2][..., :-1] = diagonals
            self.top.offer(m.index, units_of(m), values, defined, rows, attn)

    def add_means(self, values: np.ndarray, defined: np.ndarray) -> None:
        """One example's per-head means ``[3 L H]`` (current, previous, next; :data:`STATS`
        order) and which of them the example defines ``[3]``: what :meth:`update` computes from
        a map, and what the streaming engine hands over from its sums (no map)."""
        self.acc.add(values, np.asarray(defined, dtype=bool))
        self.examples += 1

    def update(self, batch: AttentionBatch) -> None:
        for m in batch:
            self._add(m.attn, m.num_units, m)

    def finalize(self) -> Result:
        means = self.acc.means()
        res = Result(self.name, params=self.params(), meta={"examples": self.examples})
        if not means:
            res.summary.append("no examples")
            return res
        res.arrays = {k: v.copy() for k, v in means.items()}
        res.tables["relative_position"] = per_head_rows(means)
        res.examples = self.top.to_json(means)
        res.meta["standard_error"] = self.acc.standard_errors()
        for stat in ("previous", "next"):
            heads = [str(HeadId(int(a), int(b))) for a, b in zip(*np.nonzero(means[stat] > 0.5))]
            res.summary.append(f"{len(heads)} heads put more than half their attention on the "
                               f"{stat} token" + (f": {', '.join(heads)}" if heads else ""))
        return res
