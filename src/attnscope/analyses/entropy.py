"""How broad each head's attention is: entropy and maximum weight per row (paper section 3.3).

For one example with ``n`` units and one head's attention ``a`` (``[n n]``):

- entropy (nats): ``mean_i H(a[i])`` with ``H(p) = -sum_j p_j ln p_j`` (``0 ln 0 = 0``)
- entropy from the first unit (``[CLS]`` / ``<s>``): ``H(a[0])`` (Figure 4, right)
- maximum weight: ``mean_i max_j a[i, j]``, and the share of rows whose maximum is at most
  ``max_weight_threshold`` (0.1: the paper's "at most 10% of their attention on any single word")
- uniform reference: ``mean_i ln k_i`` with ``k_i`` the keys row ``i`` may see (``n``; ``i + 1``
  for a causal model), the entropy every head would have if it attended uniformly.

Each value is averaged over examples (mean of per-example means, as the paper's code).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnscope.analyses.base import MapsAnalysis, Result, register
from attnscope.analyses.relative_position import PerExampleMeans, per_head_rows
from attnscope.analyses.stat import Stat, declare
from attnscope.analyses.top_examples import TopExamples, units_of
from attnscope.maps import AttentionBatch, AttentionMap

_SOURCE = "Clark et al. 2019, section 3.3"
HEAD_STATS = declare(
    Stat("entropy", "row entropy (nats; higher is broader)", "mean_i -sum_j a[i,j] ln a[i,j]", _SOURCE,
         "entropy", higher="broader attention", unit="nats", per_layer=True),
    Stat("entropy_first", "entropy of the first token's row (nats)", "-sum_j a[0,j] ln a[0,j]", _SOURCE,
         "entropy", higher="broader attention from the first token", unit="nats", per_layer=True),
    Stat("max_weight", "largest weight of a row", "mean_i max_j a[i,j]", _SOURCE, "entropy",
         higher="sharper attention"),
    Stat("rows_max_below", "share of rows with no weight above 0.1", "mean_i [max_j a[i,j] <= 0.1]",
         _SOURCE, "entropy", higher="more rows spread thin", unit="share of rows", families=("general",)),
)
#: what the accumulator keeps per example: the statistics, then the uniform reference
STATS = HEAD_STATS + ("uniform",)


def row_entropy(attn: np.ndarray) -> np.ndarray:
    """Entropy in nats of every row: ``[..., q, k] -> [..., q]``; zeros contribute nothing.

    >>> row_entropy(np.array([[0.5, 0.5], [1.0, 0.0]])).round(4).tolist()
    [0.6931, 0.0]
    """
    a = np.asarray(attn, dtype=np.float32)
    logs = np.zeros_like(a)
    np.log(a, out=logs, where=a > 0)
    return 0.0 - np.einsum("...k,...k->...", a, logs).astype(np.float64)  # rows summed in float32


@register
class Entropy(MapsAnalysis):
    """Per head: mean row entropy, entropy from the first unit, and maximum weight per row."""

    name = "entropy"
    summed = ("acc", "examples", "units", "top")
    requires = frozenset()

    @classmethod
    def for_model(cls, model, *, seed: int = 0) -> "Entropy":
        return cls(causal=bool(model is not None and model.facts.causal), seed=seed)

    def __init__(self, causal: bool = False, max_weight_threshold: float = 0.1, seed: int = 0):
        self.causal = bool(causal)
        self.max_weight_threshold = float(max_weight_threshold)
        self.acc = PerExampleMeans(STATS)
        self.examples = 0
        self.units = 0
        self.top = TopExamples(("entropy", "max_weight"), seed=seed)  # broadest and sharpest

    def params(self) -> dict[str, Any]:
        return {"causal": self.causal, "max_weight_threshold": self.max_weight_threshold,
                "average": "mean over examples of per-example means", "unit": "nats", "seed": self.top.seed}

    def _add(self, attn: np.ndarray, m: "AttentionMap | None" = None) -> None:
        """One example's ``attn`` ``[L H n n]`` (and its map ``m``, whose top rows are kept)."""
        n = attn.shape[-1]
        ent = row_entropy(attn)  # [L H q]
        mx = attn.max(-1)  # [L H q]
        keys = np.arange(1, n + 1) if self.causal else np.full(n, n)
        values = np.stack([
            ent.mean(-1), ent[..., 0], mx.mean(-1, dtype=np.float64),
            (mx <= self.max_weight_threshold).mean(-1, dtype=np.float64),
            np.full(attn.shape[:2], np.log(keys).mean()),
        ])  # [S L H]
        self.add_means(values, n)
        if m is not None:
            self.top.offer(m.index, units_of(m), values[[0, 2]], np.ones(2, bool),
                           np.stack([ent, mx]), attn)

    def add_means(self, values: np.ndarray, units: int) -> None:
        """One example's per-head means ``[5 L H]`` (:data:`STATS` order) over its ``units``
        rows: what :meth:`update` computes from a map, and what the streaming engine hands over
        from its sums (no map)."""
        self.acc.add(values, np.ones(len(STATS), dtype=bool))
        self.examples += 1
        self.units += int(units)

    def update(self, batch: AttentionBatch) -> None:
        for m in batch:
            if m.num_units:
                self._add(m.attn, m)

    def finalize(self) -> Result:
        means = self.acc.means()
        res = Result(self.name, params=self.params(),
                     meta={"examples": self.examples, "mean_units": self.units / max(self.examples, 1)})
        if not means:
            res.summary.append("no examples")
            return res
        uniform = float(means["uniform"][0, 0])
        res.meta["uniform_entropy"] = uniform
        arrays = {k: v.copy() for k, v in means.items() if k != "uniform"}
        res.arrays = arrays
        res.tables["entropy"] = per_head_rows(arrays)
        res.meta["standard_error"] = self.acc.standard_errors()
        res.examples = self.top.to_json(arrays)
        last = arrays["entropy_first"][-1]
        res.summary.append(f"the last layer's attention from the first token has a mean entropy of "
                           f"{last.mean():.2f} nats (uniform attention: {uniform:.2f})")
        layer_ent = arrays["entropy"].mean(1)
        res.summary.append("mean entropy per layer (nats): "
                           + ", ".join(f"{i + 1}: {v:.2f}" for i, v in enumerate(layer_ent)))
        broad = np.nonzero((arrays["rows_max_below"] > 0.5).ravel())[0]
        res.summary.append(f"{len(broad)} heads put at most {self.max_weight_threshold:.0%} on any "
                           "single unit in most of their rows")
        return res
