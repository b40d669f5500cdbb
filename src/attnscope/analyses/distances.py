"""Distances between heads: Jensen-Shannon divergence of their attention (paper section 6).

For heads ``i`` and ``j`` the distance is the Jensen-Shannon divergence between their
attention distributions from the same unit, averaged over every unit of every example:

    d(i, j) = (1 / T) sum_tokens JS(P_i(token), P_j(token))

with ``T`` the number of units (rows) seen. The paper's released script sums instead of
averaging (``reduce="sum"`` gives that raw sum). Before comparing, each row is smoothed as
in that script: ``p' = smoothing / n + (1 - smoothing) p`` with ``smoothing = 0.001`` and ``n``
the example's length, so no probability is 0.

Vectorised with one identity: with ``m = (p + q) / 2``, summed over the ``n x n`` entries of one
example, ``JS = 1/2 F_i + 1/2 F_j - sum m ln m`` where ``F_i = sum p'_i ln p'_i``; and
``sum m ln m = 1/2 sum s ln s - 1/2 ln 2 sum s`` with ``s = p'_i + p'_j``. So each example
needs one logarithm per entry and pair of heads (not two logs and two divisions, as the
paper's script), over the upper triangle of pairs only, all pairs with a partner at once.

>>> import numpy as np
>>> h = np.array([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 1.0]]])  # [P=2 n=2 n=2]
>>> js_matrix(h, smoothing=0.0).round(4).tolist()  # two rows, ln 2 each
[[0.0, 1.3863], [1.3863, 0.0]]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnscope.analyses.base import MapsAnalysis, Result, register
from attnscope.data.records import HeadId
from attnscope.maps import AttentionBatch

REDUCTIONS = ("mean", "sum")
LN2 = float(np.log(2.0))


def smooth(attn: np.ndarray, smoothing: float) -> np.ndarray:
    """The paper script's smoothing, ``smoothing / n + (1 - smoothing) * attn`` (float32)."""
    n = attn.shape[-1]
    return (np.asarray(attn, dtype=np.float32) * np.float32(1.0 - smoothing)
            + np.float32(smoothing / n))


def js_matrix(heads: np.ndarray, smoothing: float = 0.001) -> np.ndarray:
    """Sum over rows of JS(head i's row, head j's row) for one example.

    ``heads``: ``[P, n, n]`` attention of ``P`` heads (rows sum to 1). Returns ``[P, P]``
    float64, symmetric, zero on the diagonal. Unsmoothed zeros are fine (``0 ln 0 = 0``).
    """
    s = smooth(heads, smoothing) if smoothing else np.asarray(heads, dtype=np.float32)
    return js_pairs(s, zeros=not smoothing)


def js_pairs(s: np.ndarray, zeros: bool) -> np.ndarray:
    """``[P P]`` float64: for every pair of heads, the Jensen-Shannon divergences of their rows
    summed over the rows; ``s`` ``[P R W]`` float32 holds each head's ``R`` rows of ``W``
    (already smoothed) weights. Each row's ``W`` terms are summed in float32, the rows in
    float64, as the paper's script does. ``zeros``: ``s`` may hold zeros (``0 ln 0 = 0``)."""
    P, R, W = s.shape
    s = s.reshape(P, R * W)
    buf = np.empty((P, R * W), dtype=np.float32)
    logbuf = np.empty((P, R * W), dtype=np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        f_self = _xlogx(s, R, logbuf, zeros)  # [P] sum p ln p
        mass = s.sum(-1, dtype=np.float64)  # [P]
        out = np.zeros((P, P), dtype=np.float64)
        for i in range(P - 1):
            k = P - 1 - i
            np.add(s[i + 1:], s[i], out=buf[:k])  # s = p_i + p_j for every j > i
            cross = _xlogx(buf[:k], R, logbuf, zeros)  # [k] sum s ln s
            # sum m ln m = 1/2 sum s ln s - 1/2 ln2 sum s
            mlogm = 0.5 * cross - 0.5 * LN2 * (mass[i] + mass[i + 1:])
            out[i, i + 1:] = 0.5 * (f_self[i] + f_self[i + 1:]) - mlogm
    out = np.maximum(out, 0.0)  # rounding can leave -1e-9 where two heads agree
    return out + out.T


def _xlogx(x: np.ndarray, rows: int, out_log: np.ndarray, zeros: bool) -> np.ndarray:
    """``sum x ln x`` per head, ``x`` ``[P, rows*W]`` -> ``[P]`` float64, summed row by row.

    Each row's ``W`` terms are summed in float32, the rows in float64. ``zeros``: the input may
    hold zeros (unsmoothed), whose ``0 ln 0`` is taken as 0.
    """
    p = x.shape[0]
    lg = out_log[:p]
    np.log(x, out=lg)
    if zeros:
        lg[x <= 0] = 0.0
    per_row = np.einsum("prk,prk->pr", x.reshape(p, rows, -1), lg.reshape(p, rows, -1))
    return per_row.sum(-1, dtype=np.float64)


@register
class HeadDistances(MapsAnalysis):
    """Jensen-Shannon distance between every pair of heads, per token (paper section 6).

    Works for any number of layers and heads: heads are flattened layer-major, ``P = L * H``,
    index ``layer * H + head``.
    """

    name = "head-distances"
    summed = ("sums", "tokens", "examples")
    requires = frozenset()

    def __init__(self, smoothing: float = 0.001, reduce: str = "mean"):
        if reduce not in REDUCTIONS:
            raise ValueError(f"reduce must be one of {REDUCTIONS}, not {reduce!r}")
        if not 0.0 <= smoothing < 1.0:
            raise ValueError("smoothing must be in [0, 1)")
        self.smoothing = float(smoothing)
        self.reduce = reduce
        self.sums: np.ndarray | None = None  # [P P] float64
        self.shape: tuple[int, int] | None = None  # (L, H)
        self.tokens = 0
        self.examples = 0

    def params(self) -> dict[str, Any]:
        return {"smoothing": self.smoothing, "reduce": self.reduce,
                "divergence": "Jensen-Shannon, natural log (nats), per token"}

    def _add(self, attn: np.ndarray) -> None:
        L, H, n, _ = attn.shape
        self.add_sums(js_matrix(attn.reshape(L * H, n, n), self.smoothing), (L, H), n)

    def add_sums(self, sums: np.ndarray, shape: tuple[int, int], tokens: int) -> None:
        """One example's head-to-head divergences summed over its rows ``[L*H L*H]`` (heads
        layer-major), for ``shape`` ``(L, H)`` heads and ``tokens`` rows: what :meth:`update`
        computes from a map, and what the streaming engine hands over from sampled rows."""
        L, H = shape
        if self.sums is None:
            self.sums = np.zeros((L * H, L * H), dtype=np.float64)
            self.shape = (L, H)
        elif self.shape != (L, H):
            raise ValueError(f"maps with {L}x{H} heads after maps with {self.shape[0]}x{self.shape[1]}")
        self.sums += sums
        self.tokens += int(tokens)
        self.examples += 1

    def update(self, batch: AttentionBatch) -> None:
        for m in batch:
            if m.num_units:
                self._add(m.attn)

    def merge(self, other: "HeadDistances") -> "HeadDistances":
        if other.sums is not None and self.sums is not None and self.shape != other.shape:
            raise ValueError("cannot merge distances of models with different heads")
        if self.sums is None:
            self.shape = other.shape
        return super().merge(other)

    def distances(self) -> np.ndarray | None:
        """``[P P]``: the mean per token (or the raw sum with ``reduce="sum"``)."""
        if self.sums is None:
            return None
        return self.sums / self.tokens if self.reduce == "mean" else self.sums.copy()

    def finalize(self) -> Result:
        res = Result(self.name, params=self.params(),
                     meta={"examples": self.examples, "tokens": self.tokens,
                           "head_order": "layer-major: index = layer * num_heads + head"})
        d = self.distances()
        if d is None:
            res.summary.append("no examples")
            return res
        L, H = self.shape
        res.arrays["distances"] = d
        names = [str(HeadId(i // H, i % H)) for i in range(L * H)]
        rows = []
        iu = np.triu_indices(L * H, 1)
        for a, b in zip(*iu):
            rows.append({"head_a": names[a], "head_b": names[b], "layer_a": int(a // H),
                         "head_a_index": int(a % H), "layer_b": int(b // H),
                         "head_b_index": int(b % H), "js": float(d[a, b])})
        res.tables["head_distances"] = rows
        same = np.array([[a // H == b // H for b in range(L * H)] for a in range(L * H)])
        off = ~np.eye(L * H, dtype=bool)
        within, across = d[same & off], d[~same]
        if within.size and across.size:
            res.summary.append(f"mean distance between heads of the same layer {within.mean():.3f}, "
                               f"of different layers {across.mean():.3f} (nats per token)")
        return res
