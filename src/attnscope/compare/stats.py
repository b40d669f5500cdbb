"""What the comparison computes from paired maps: per-head statistics with paired bootstrap
intervals, and Jensen-Shannon distances between every head of A and every head of B.

Both accumulators follow the analyses' contract (``update`` one pair at a time, ``merge``,
``finalize``); the per-head statistics keep one ``[S L H]`` row per example (a few kilobytes
per example, never a map), because a paired bootstrap resamples examples.

Per-head statistics reuse the per-example maths of the registered analyses (section 3 of the
paper): ``relative-position`` (current, previous, next), ``special-tokens`` (first special
token, separators, periods and commas, separator to separator) and ``entropy`` (mean row
entropy, entropy from the first unit, mean maximum weight).

>>> import numpy as np
>>> a = np.array([[0.2, 0.5], [0.4, 0.1]]); b = np.array([[0.1, 0.4], [0.3, 0.0]])
>>> r = paired_bootstrap(a[:, :, None], b[:, :, None], np.ones((2, 2, 1), bool), n_boot=200, seed=0)
>>> r["diff"].ravel().round(3).tolist(), r["low"].ravel().round(3).tolist()
([-0.1, -0.1], [-0.1, -0.1])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnscope.analyses.distances import LN2, smooth
from attnscope.analyses.entropy import Entropy
from attnscope.analyses.relative_position import RelativePosition
from attnscope.analyses.special_tokens import SpecialTokens
from attnscope.analyses.stat import Stat, declared
from attnscope.maps import AttentionBatch, AttentionMap

#: The registered analyses whose per-example maths the comparison reuses; it compares every
#: statistic they declare for ``compare`` (:func:`compared_stats`).
ANALYSES = (RelativePosition, SpecialTokens, Entropy)


def compared_stats() -> list[Stat]:
    """The declared statistics the comparison tests, in its analyses' order."""
    return [s for cls in ANALYSES for s in declared(family="compare", analysis=cls.name)]


#: Differences of attention weights or of per-head statistics at most this large are float
#: rounding, not change (a store compared with itself differs by exactly 0; statistics are
#: means of float32 values of at most ln n).
ROUNDING = 1e-6
#: Same-head Jensen-Shannon distances (nats per unit) at most this large are float rounding: the
#: divergence identity in :func:`js_cross` sums each row's terms in float32, which leaves about
#: 1e-8 per unit where two heads are identical and at most ``eps32 * ln(units)``, about 1e-6,
#: on rows of thousands of units.
JS_ROUNDING = 1e-5
def example_head_stats(m: AttentionMap, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """One example's per-head statistics ``names``: ``values`` ``[S L H]`` and ``defined`` ``[S]``.

    Each registered analysis is fed this one example; with one example its sums are the
    example's own values (the analysis divides only in ``finalize``). Special tokens are
    classed by position (the first special unit is "first", every other one a separator),
    since a store does not carry the tokenizer.
    """
    one = AttentionBatch([m])
    found: dict[str, tuple[np.ndarray, bool]] = {}
    for cls in ANALYSES:
        analysis = cls()
        analysis.update(one)
        acc = analysis.acc
        L, H = m.attn.shape[:2]
        for s, name in enumerate(acc.names):
            if acc.sums is None:
                found[name] = (np.zeros((L, H)), False)
            else:
                found[name] = (acc.sums[s], bool(acc.counts[s] > 0))
    values = np.stack([found[name][0] for name in names])
    defined = np.array([found[name][1] for name in names])
    return values, defined


class PairedHeadStats:
    """Per-example per-head statistics of both models, for side-by-side means and a paired
    bootstrap of their difference."""

    def __init__(self, n_boot: int = 1000, seed: int = 0, level: float = 0.95):
        self.n_boot, self.seed, self.level = int(n_boot), int(seed), float(level)
        self.compared = compared_stats()  # as declared when the comparison began
        self.names = tuple(s.name for s in self.compared)
        self.rows: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # index -> (a, b, defined)

    def params(self) -> dict[str, Any]:
        return {"n_boot": self.n_boot, "seed": self.seed, "level": self.level,
                "resampling": "paired: the same examples for both models",
                "interval": "percentile", "statistics": list(self.names)}

    def add(self, index: int, map_a: AttentionMap, map_b: AttentionMap) -> None:
        va, da = example_head_stats(map_a, self.names)
        vb, db = example_head_stats(map_b, self.names)
        self.rows[int(index)] = (va, vb, da & db)

    def merge(self, other: "PairedHeadStats") -> "PairedHeadStats":
        if other.params() != self.params():
            raise ValueError("cannot merge paired statistics with different parameters")
        self.rows.update(other.rows)
        return self

    def finalize(self) -> dict[str, Any]:
        """``{"a", "b", "diff", "low", "high", "n", "statistics"}``: ``[S La Ha]`` arrays (means
        over the examples where both models define the statistic; ``diff`` = B - A), ``[S]``
        counts, and the ``S`` statistics' names and what each measures."""
        order = sorted(self.rows)  # the result does not depend on the order pairs came in
        a = np.stack([self.rows[i][0] for i in order])  # [N S L H]
        b = np.stack([self.rows[i][1] for i in order])
        if a.shape[2:] != b.shape[2:]:
            raise ValueError("per-head statistics need the same number of layers and heads")
        defined = np.stack([self.rows[i][2] for i in order])  # [N S]
        defined = np.broadcast_to(defined[:, :, None, None], a.shape)
        out = paired_bootstrap(a, b, defined, n_boot=self.n_boot, seed=self.seed, level=self.level)
        out["n"] = defined[:, :, 0, 0].sum(0)
        out["statistics"], out["what"] = list(self.names), [s.what for s in self.compared]
        return out


def paired_bootstrap(a: np.ndarray, b: np.ndarray, defined: np.ndarray, *, n_boot: int = 1000,
                     seed: int = 0, level: float = 0.95) -> dict[str, np.ndarray]:
    """Means of ``a`` and ``b`` over examples, their difference ``b - a`` and its paired
    bootstrap percentile interval.

    ``a``, ``b``, ``defined``: ``[N, ...]`` per example (``defined`` False where an example
    does not count). Each of ``n_boot`` resamples draws ``N`` example indices with replacement
    (``numpy.random.default_rng(seed)``) and takes the same examples from both models, so what
    the examples share cancels out. The interval is the ``(1 - level) / 2`` and
    ``(1 + level) / 2`` quantiles (numpy's default linear interpolation) of the resampled
    differences. Returns arrays shaped like ``a[0]``; NaN where no example counts.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    w = np.asarray(defined, dtype=np.float64)
    n = a.shape[0]
    shape = a.shape[1:]
    flat = lambda x: x.reshape(n, -1)  # noqa: E731
    d, w2 = flat(np.where(w > 0, b - a, 0.0)), flat(w)
    with np.errstate(invalid="ignore", divide="ignore"):
        count = w2.sum(0)
        mean_a = (flat(np.where(w > 0, a, 0.0)).sum(0) / count).reshape(shape)
        mean_b = (flat(np.where(w > 0, b, 0.0)).sum(0) / count).reshape(shape)
        diff = (d.sum(0) / count).reshape(shape)
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, n, size=(n_boot, n))
        # how often each example is drawn in each resample: [n_boot, N]
        times = np.bincount((idx + n * np.arange(n_boot)[:, None]).ravel(),
                            minlength=n_boot * n).reshape(n_boot, n).astype(np.float64)
        boot = (times @ d) / (times @ w2)  # [n_boot, K]
        q = [(1.0 - level) / 2.0, (1.0 + level) / 2.0]
        lo, hi = np.nanquantile(boot, q, axis=0) if n_boot else (np.full(d.shape[1], np.nan),) * 2
    return {"a": mean_a, "b": mean_b, "diff": diff, "low": lo.reshape(shape), "high": hi.reshape(shape)}


def _sum_xlogx(x: np.ndarray, log_buf: np.ndarray) -> np.ndarray:
    """``sum x ln x`` per head: ``x`` ``[P, r, c]`` -> ``[P]`` float64 (``0 ln 0 = 0``); each
    row's terms are summed in float32, the rows in float64 (as :mod:`attnscope.analyses.distances`)."""
    lg = log_buf[: x.shape[0]]
    lg.fill(0.0)
    np.log(x, out=lg, where=x > 0)
    return np.einsum("prk,prk->pr", x, lg).sum(-1, dtype=np.float64)


def js_cross(attn_a: np.ndarray, attn_b: np.ndarray, smoothing: float = 0.001) -> np.ndarray:
    """Sum over rows of JS(head i of A's row, head j of B's row), for every ``i`` and ``j``.

    ``attn_a`` ``[La Ha r c]`` and ``attn_b`` ``[Lb Hb r c]`` over the same units; returns
    ``[La*Ha, Lb*Hb]`` (heads layer-major). Rows are smoothed as in
    :func:`attnscope.analyses.distances.smooth` and the divergence uses that module's identity
    ``JS = 1/2 F_i + 1/2 F_j - (1/2 sum s ln s - 1/2 ln2 sum s)`` with ``s = p_i + p_j``.
    """
    r, c = attn_a.shape[-2:]
    if attn_b.shape[-2:] != (r, c):
        raise ValueError(f"maps over different units: {attn_a.shape[-2:]} vs {attn_b.shape[-2:]}")
    sa = smooth(attn_a.reshape(-1, r, c), smoothing)  # [Pa r c] float32
    sb = smooth(attn_b.reshape(-1, r, c), smoothing)
    pa, pb = sa.shape[0], sb.shape[0]
    log_buf = np.empty((max(pa, pb), r, c), dtype=np.float32)
    fa, fb = _sum_xlogx(sa, log_buf), _sum_xlogx(sb, log_buf)
    ma, mb = sa.sum((1, 2), dtype=np.float64), sb.sum((1, 2), dtype=np.float64)
    out = np.empty((pa, pb), dtype=np.float64)
    buf = np.empty_like(sb)
    for i in range(pa):
        np.add(sb, sa[i], out=buf)
        cross = _sum_xlogx(buf, log_buf)
        out[i] = 0.5 * (fa[i] + fb) - (0.5 * cross - 0.5 * LN2 * (ma[i] + mb))
    return np.maximum(out, 0.0)  # rounding can leave -1e-9 where two heads agree


class CrossDistances:
    """Mean Jensen-Shannon divergence per row between every head of A and every head of B."""

    def __init__(self, smoothing: float = 0.001):
        self.smoothing = float(smoothing)
        self.sums: np.ndarray | None = None  # [Pa Pb]
        self.rows = 0
        self.examples = 0
        self.shapes: tuple[tuple[int, int], tuple[int, int]] | None = None
        self.max_diff = 0.0  # the largest |A - B| of any weight, head by head (maps of one shape)

    def params(self) -> dict[str, Any]:
        return {"smoothing": self.smoothing, "divergence": "Jensen-Shannon, nats, mean per row",
                "head_order": "layer-major: index = layer * num_heads + head"}

    def add(self, attn_a: np.ndarray, attn_b: np.ndarray) -> None:
        shapes = (tuple(attn_a.shape[:2]), tuple(attn_b.shape[:2]))
        if self.shapes is None:
            self.shapes = shapes
        elif shapes != self.shapes:
            raise ValueError("maps with other numbers of layers or heads after the first pair")
        d = js_cross(attn_a, attn_b, self.smoothing)
        self.sums = d if self.sums is None else self.sums + d
        self.rows += attn_a.shape[-2]
        self.examples += 1
        if attn_a.shape == attn_b.shape:
            diff = float(np.abs(np.asarray(attn_a, np.float64) - attn_b).max(initial=0.0))
            self.max_diff = max(self.max_diff, diff)
        else:
            self.max_diff = float("inf")  # other heads or units: never identical

    def merge(self, other: "CrossDistances") -> "CrossDistances":
        if other.smoothing != self.smoothing:
            raise ValueError("cannot merge distances with different smoothing")
        if other.sums is not None:
            if self.sums is None:
                self.sums, self.shapes = other.sums.copy(), other.shapes
            else:
                self.sums = self.sums + other.sums
        self.rows += other.rows
        self.examples += other.examples
        self.max_diff = max(self.max_diff, other.max_diff) if other.examples else self.max_diff
        return self

    def distances(self) -> np.ndarray | None:
        return None if self.sums is None else self.sums / max(self.rows, 1)


def match_heads(distances: np.ndarray) -> list[tuple[int, int]]:
    """The one-to-one matching of A's heads to B's heads with the least total distance.

    The one place that calls :func:`scipy.optimize.linear_sum_assignment` (the Hungarian
    method), with ``maximize=False`` pinned. Returns ``(head of A, head of B)`` pairs as flat
    layer-major indices, sorted by A's head.

    >>> match_heads(np.array([[0.9, 0.1], [0.2, 0.8]]))
    [(0, 1), (1, 0)]
    """
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(np.asarray(distances, dtype=np.float64), maximize=False)
    return sorted((int(r), int(c)) for r, c in zip(rows, cols))
