"""The general family's statistics from the streaming engine, without ``[n n]`` maps.

For each encoded example, :func:`~attnscope.engines.streaming.stream_stats` gives per-head sums
over rows 1 .. n-1 (row 0 of a causal model attends to itself with weight 1, which is added
exactly); they are turned into the per-example means the maps path computes (relative
position, special tokens and punctuation, entropy, maximum weight) and handed to the same
analyses through their public ``add_means`` / ``add_sums``, so :meth:`StreamedGeneral.parts`
gives ``{name: Result}`` in the maps path's shape. Head distances: Jensen-Shannon over
``js_rows`` seeded rows per example, each smoothed over the example's ``n`` keys as the maps
path does; scaled by ``(n - 1) / rows`` per example (exact when every row is sampled, as for
examples of at most ``js_rows + 1`` tokens). Causal models only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnscope.analyses.base import EncodedAnalysis, Result, register
from attnscope.analyses.distances import HeadDistances
from attnscope.analyses.entropy import Entropy
from attnscope.analyses.longctx import LongContextStats
from attnscope.analyses.relative_position import RelativePosition
from attnscope.analyses.special_tokens import SpecialTokens
from attnscope.analyses.token_classes import TokenClasser
from attnscope.engines.streaming import stream_stats
from attnscope.errors import AttnscopeError

#: Query rows sampled per example (seeded) for the head distances when no maps are made.
STREAM_JS_ROWS = 16


@register
class StreamedGeneral(EncodedAnalysis):
    """Relative position, special tokens, entropy and head distances of a causal model from the
    streaming engine; ``update`` takes encoded examples (it runs the model)."""

    name = "streamed-general"
    requires = frozenset({"model", "causal"})

    @classmethod
    def for_model(cls, model, *, seed: int = 0) -> "StreamedGeneral":
        return cls(model, TokenClasser.for_model(model)[0], seed=seed)

    def __init__(self, model, classer: TokenClasser, *, seed: int = 0, js_rows: int = STREAM_JS_ROWS):
        if not model.facts.causal:
            raise AttnscopeError(f"{model.name} is not causal: the streaming engine of the general family "
                                 "handles decoders only (use the maps engine)")
        self.model = model
        self.classer = classer
        self.seed = int(seed)
        self.js_rows = int(js_rows)
        self.rel, self.spec, self.ent = RelativePosition(), SpecialTokens(classer), Entropy(causal=True)
        self.dist = HeadDistances()
        self.longest = 0  # tokens of the longest example added
        self.finalized_parts: dict[str, Result] | None = None  # parts() as of the last finalize

    def params(self) -> dict[str, Any]:
        return {"model": self.model.name, "seed": self.seed, "js_rows": self.js_rows}

    def update(self, batch: list) -> None:
        for e in batch:
            self._add(e)

    def _add(self, e) -> None:
        L, H = self.model.num_layers, self.model.num_heads
        n = len(e)
        self.longest = max(self.longest, n)
        k = self.classer.classify(list(e.tokens), np.asarray(e.special, dtype=bool), self.spec.key_stats)
        names = self.spec.to_names  # the paper's classes, then the declared key classes
        cls = {name: k.mask(name).astype(np.float32) for name in names}
        sep = k.separator
        doc = LongContextStats(js_rows=self.js_rows, seed=self.seed, causal=True, js_width="sequence")
        stream_stats(self.model, [e.input_ids], doc, extras=[{
            "classes": cls, "from": {"separator": sep}, "max_below": self.ent.max_weight_threshold}])

        def get(key):
            return doc.sums.get(key, np.zeros((L, H)))

        # row 0 sees only key 0, with weight 1: it adds 1 to current, max and key 0's classes
        cur, prev = (get("current") + 1.0) / n, get("previous") / max(n - 1, 1)
        self.rel.add_means(np.stack([cur, prev, np.zeros((L, H))]), np.array([n > 0, n > 1, n > 1]))
        to = {name: get(f"to_{name}") + float(cls[name][0]) for name in names}
        n_sep = int(sep.sum())
        sep_sep = get("from_separator_to_separator") + float(sep[0])
        values = self.spec.example_values(to, sep_sep, to["separator"] - sep_sep, n, n_sep)
        self.spec.add_means(values, self.spec.defined(n, n_sep), k)
        uniform = np.full((L, H), np.log(np.arange(1, n + 1)).mean())
        self.ent.add_means(np.stack([get("entropy") / n, np.zeros((L, H)), (get("max") + 1.0) / n,
                                     get("rows_max_below") / n, uniform]), n)
        js = (doc.js_sums * ((n - 1) / doc.js_count) if doc.js_sums is not None and doc.js_count
              else np.zeros((L * H, L * H)))
        self.dist.add_sums(js, (L, H), n)

    def merge(self, other: "StreamedGeneral") -> "StreamedGeneral":
        self._check_mergeable(other)
        for mine, theirs in zip(self._analyses(), other._analyses()):
            mine.merge(theirs)
        self.longest = max(self.longest, other.longest)
        return self

    def _analyses(self) -> tuple:
        return self.rel, self.spec, self.ent, self.dist

    def parts(self) -> dict[str, Result]:
        """``{name: Result}`` of relative position, special tokens, entropy and head distances,
        as the maps path gives them (what the general family's report reads)."""
        return {a.name: a.finalize() for a in self._analyses()}

    def finalize(self) -> Result:
        """The parts in one result: each part's tables and arrays under ``<part>/<name>``."""
        res = Result(self.name, params=self.params(), meta={"longest": self.longest})
        self.finalized_parts = parts = self.parts()  # kept: the general family's report reads them
        for name, part in parts.items():
            res.tables.update({f"{name}/{k}": v for k, v in part.tables.items()})
            res.arrays.update({f"{name}/{k}": v for k, v in part.arrays.items()})
            res.summary.extend(part.summary)
            res.meta[name] = part.meta
        return res
