"""The one map Figure 1 of the paper draws (token-to-token lines of example heads).

:class:`Figure1Example` keeps a single map out of a whole pass: the lowest-index example of at
most ``max_units`` units with two segments, else the shortest (lowest index among equals). The
choice does not depend on the order the maps come in, so it merges like every analysis (the
smaller key wins) and on Ray each worker keeps its own and only one map per unit of work comes
back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnscope.analyses.base import MapsAnalysis, Result, register
from attnscope.maps import AttentionBatch, AttentionMap

#: Longest example (in units) preferred for the Figure 1 drawing.
FIGURE1_MAX_UNITS = 40


@register
class Figure1Example(MapsAnalysis):
    """Keeps the map Figure 1 draws; ``best`` is it (None before any map)."""

    name = "figure-1-example"

    def __init__(self, max_units: int = FIGURE1_MAX_UNITS):
        self.max_units = int(max_units)
        self.best: AttentionMap | None = None

    def params(self) -> dict[str, Any]:
        return {"max_units": self.max_units,
                "choice": "lowest index with two segments within max_units, else the shortest"}

    def _key(self, m: AttentionMap) -> tuple:
        two_segments = bool((np.asarray(m.segment) == 1).any())
        fits = m.num_units <= self.max_units
        return (not (fits and two_segments), not fits, m.num_units if not fits else 0, m.index)

    def _offer(self, m: AttentionMap | None) -> None:
        if m is not None and (self.best is None or self._key(m) < self._key(self.best)):
            self.best = m

    def update(self, batch: AttentionBatch) -> None:
        for m in batch:
            self._offer(m)

    def merge(self, other: "Figure1Example") -> "Figure1Example":
        self._check_mergeable(other)
        self._offer(other.best)
        return self

    def finalize(self) -> Result:
        res = Result(self.name, params=self.params())
        if self.best is None:
            res.summary.append("no examples")
            return res
        m = self.best
        res.arrays["attn"] = np.asarray(m.attn)
        res.tables["units"] = [{"unit": i, "text": t, "special": bool(s), "segment": int(g)}
                               for i, (t, s, g) in enumerate(zip(m.tokens, m.special, m.segment))]
        res.meta.update({"index": int(m.index), "units": int(m.num_units), "level": m.level})
        return res
