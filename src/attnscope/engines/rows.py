"""What the streaming engine folds per sequence, shared by the engine (:mod:`attnscope.engines.streaming`,
its backends) and the accumulator it folds into (:class:`attnscope.analyses.longctx.LongContextStats`):
the log-spaced distance and position buckets, the key classes (special tokens, punctuation), a
sequence's sampled rows, and the per-row sums of a tile (mass on key classes, mass per distance).
"""

from __future__ import annotations

import hashlib
import math
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from attnscope.extract.encode import WORD_MARKERS

#: Number of log-spaced buckets (distance or position): 0, 1, 2, 3-4, ..., up to 2^20.
NUM_BUCKETS = 22


def row_rounding(n: int) -> float:
    """How far float32 rounding moves a statistic of one softmax row of ``n`` keys (a weight, a
    mass, the entropy with its logarithms): ``eps32 n (1 + ln n)``, what ``attnscope check`` holds
    every backend to and what the flex backend's log-sum-exps must resolve
    (:func:`attnscope.engines.flex.resolves`).

    >>> round(row_rounding(1) / float(np.finfo(np.float32).eps), 6)
    1.0
    """
    return float(np.finfo(np.float32).eps) * n * (1.0 + math.log(max(n, 1)))


def bucket_of(d: np.ndarray) -> np.ndarray:
    """Log-spaced bucket of non-negative integers: 0 -> 0, 1 -> 1, 2 -> 2, 3-4 -> 3, 5-8 -> 4.

    >>> bucket_of(np.array([0, 1, 2, 3, 4, 5, 8, 9, 16, 17])).tolist()
    [0, 1, 2, 3, 3, 4, 4, 5, 5, 6]
    """
    d = np.asarray(d, dtype=np.int64)
    out = np.zeros(d.shape, dtype=np.int64)
    pos = d >= 1
    # ceil(log2 d) + 1 == bit_length(d - 1) + 1, exactly, in integers
    dm1 = d[pos] - 1
    bl = np.zeros(dm1.shape, dtype=np.int64)
    x = dm1.copy()
    while (x > 0).any():
        bl += x > 0
        x >>= 1
    out[pos] = bl + 1
    if (out >= NUM_BUCKETS).any():
        raise ValueError(f"distance or position beyond the last bucket (2^{NUM_BUCKETS - 2})")
    return out


def bucket_range(k: int) -> tuple[int, int]:
    """The distances of bucket ``k`` (:func:`bucket_of`), inclusive: 0, 1, 2, then 3-4, 5-8, ..."""
    return (k, k) if k < 2 else (2 ** (k - 2) + 1, 2 ** (k - 1))


def bucket_labels() -> list[str]:
    """``["0", "1", "2", "3-4", "5-8", ...]``."""
    return [str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in map(bucket_range, range(NUM_BUCKETS))]


def bucket_ranges(n: int) -> list[tuple[int, int]]:
    """The buckets that the distances ``0 .. n-1`` of one sequence fall in, inclusive, the last
    one cut at ``n - 1``: every page draws a row's mass by distance in these.

    >>> bucket_ranges(10)
    [(0, 0), (1, 1), (2, 2), (3, 4), (5, 8), (9, 9)]
    """
    ranges = [bucket_range(k) for k in range(NUM_BUCKETS)]
    return [(lo, min(hi, n - 1)) for lo, hi in ranges if lo <= n - 1]


def pairs_per_bucket(n: int, causal: bool) -> np.ndarray:
    """Number of (row, key) pairs per distance bucket over rows ``1 .. n-1`` of one sequence.

    ``causal``: a row ``i`` sees keys ``0 .. i``; otherwise all ``n`` keys.
    """
    counts = np.zeros(NUM_BUCKETS, dtype=np.float64)
    if n < 2:
        return counts
    rows = np.arange(1, n)
    for k in range(NUM_BUCKETS):
        lo = 0 if k == 0 else (1 if k == 1 else 2 ** (k - 2) + 1)
        hi = 0 if k == 0 else (1 if k == 1 else 2 ** (k - 1))
        if lo > n - 1:
            break
        # keys j <= i with lo <= i - j <= hi
        left = np.clip(np.minimum(rows, hi) - lo + 1, 0, None)
        total = left.sum()
        if not causal and hi >= 1:  # keys j > i with lo <= j - i <= hi
            total += np.clip(np.minimum(n - 1 - rows, hi) - lo + 1, 0, None).sum()
        counts[k] = total
    return counts


def is_punct(text: str) -> bool:
    """A token whose text (word markers removed) is only punctuation characters."""
    for marker in WORD_MARKERS:
        text = text.replace(marker, "")
    text = text.strip()
    return bool(text) and all(unicodedata.category(ch).startswith("P") for ch in text)


@dataclass
class Sequence:
    """What the tile code needs to know about one sequence (tensors on the model's device).

    ``special`` / ``punct``: float ``[n]`` key masks; ``targets``: name -> long ``[n]`` key
    index per row (-1: none); ``js_rows``: the sampled rows; ``js_store``: filled per layer.
    """

    n: int
    special: Any
    punct: Any
    targets: dict[str, Any] = field(default_factory=dict)
    js_rows: list[int] = field(default_factory=list)
    js_store: dict[int, Any] = field(default_factory=dict)  # row -> [L H m] (CPU), filled per layer
    #: optional extra key classes ``[n C]`` (float 0/1) named ``class_names``: their mass is
    #: summed as ``to_<name>``; ``from_masks`` (name -> float ``[n]`` row mask) also sums the
    #: mass of those rows alone as ``from_<row>_to_<name>``; ``max_below`` counts the rows whose
    #: largest weight is at most that value (``rows_max_below``). Used by the general family.
    classes: Any = None
    class_names: tuple[str, ...] = ()
    from_masks: dict[str, Any] = field(default_factory=dict)
    max_below: float | None = None
    #: word level: the unit (word, or a special token alone) of each of the ``token_n`` tokens,
    #: long ``[token_n]`` non-decreasing; ``n`` then counts units (see :func:`unit_sequence`)
    units: Any = None
    token_n: int = 0
    unit_start: list[int] = field(default_factory=list)  # first token of each unit
    unit_counts: Any = None  # float [n]: tokens per unit
    sink_sum: Any = None  # float64 [L H]: this sequence's sink mass over rows >= 1 (per-sample metric)
    #: the layer whose tiles are being folded (-1: none yet), its rows' values ``[F H n]``
    #: (entropy, largest weight, then the mass on each column of :meth:`key_classes`) and its
    #: mass per signed distance ``d`` at index ``n - d`` (``[H 2n+1]`` float64), or, from a
    #: producer that sums them itself, per bucket of ``|d|`` and at ``d = +1`` (``[H NB+1]``)
    layer: int = -1
    row_values: Any = None
    dist_sums: Any = None
    dist_buckets: Any = None
    _table: Any = None  # bucket of every distance 0 .. n
    _classes: Any = None  # [n 3+C] float: first token, special, punctuation, then ``classes``

    def key_classes(self, device) -> Any:
        """``[n 3+C]`` float key classes: the first token, special, punctuation, then ``classes``."""
        if self._classes is None or self._classes.device != device:
            import torch

            first = torch.zeros_like(self.special)
            first[:1] = 1.0
            cols = [first, self.special, self.punct]
            if self.classes is not None:
                cols += list(self.classes.to(self.special.device).unbind(1))
            self._classes = torch.stack(cols, 1).float().to(device)
        return self._classes

    def start_layer(self, layer: int, heads: int, device) -> None:
        """Empty per-row and per-distance buffers for ``layer``'s tiles."""
        import torch

        F = 2 + self.key_classes(device).shape[1]
        if self.row_values is None or self.row_values.shape[:2] != (F, heads) or self.row_values.device != device:
            self.row_values = torch.zeros(F, heads, self.n, device=device)
            self.dist_sums = torch.zeros(heads, 2 * self.n + 1, dtype=torch.float64, device=device)
            self.dist_buckets = torch.zeros(heads, NUM_BUCKETS + 1, dtype=torch.float64, device=device)
        else:
            self.row_values.zero_()
            self.dist_sums.zero_()
            self.dist_buckets.zero_()
        self.layer = layer

    def buckets(self, device) -> Any:
        if self._table is None or self._table.device != device:
            import torch

            self._table = torch.as_tensor(bucket_of(np.arange(self.n + 1)), device=device)
        return self._table


def sample_rows(ids: list[int] | np.ndarray, count: int, seed: int) -> list[int]:
    """``count`` distinct rows from ``1 .. n-1``, drawn from ``seed`` and the sequence itself."""
    return sample_by_digest(len(ids), sequence_digest(ids), count, seed)


def sequence_digest(ids: list[int] | np.ndarray) -> bytes:
    """sha256 of a sequence of token ids (as int64): what seeds its sampled rows."""
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).digest()


def sample_by_digest(n: int, digest: bytes, count: int, seed: int) -> list[int]:
    if count <= 0 or n < 2:
        return []
    rng = np.random.default_rng([seed, int.from_bytes(digest[:8], "little")])
    k = min(count, n - 1)
    return sorted(int(r) for r in rng.choice(np.arange(1, n), size=k, replace=False))


def key_mass(p, classes):
    """``[H c C]``: each row's mass on each class of keys, ``p`` ``[H c K]`` times ``classes``
    ``[K C]``; computed as ``classes^T p^T``, one matrix product with the few classes as rows,
    which on a CPU is about 8x faster than ``p @ classes`` with its few columns."""
    import torch

    H, c, K = p.shape
    return torch.mm(classes.T, p.reshape(H * c, K).T).T.reshape(H, c, -1)


def diagonal_sums(p, q0: int):
    """Sum of ``p`` ``[H c K]`` (rows ``q0 .. q0+c-1``, keys ``0 .. K-1``) over rows, per signed
    distance ``d = i - j``: returns ``(d [W], sums [H W])`` with ``W = K + c - 1``.

    No index tensors: column ``x`` holds distance ``q0 + c - 1 - x``, i.e. key ``j = x - c + 1 + r``
    of row ``r``. Where every row has that key (``c - 1 <= x < K``) the column is a sum over a
    view of ``p`` whose row stride is one more than its width (row ``r`` shifted left by ``r``),
    one pass over ``p`` with no copy; the ``c - 1`` columns at each end, whose sums lack some
    rows, come from the first and last ``c - 1`` keys (:func:`_band_sums`).

    >>> import torch
    >>> p = torch.tensor([[[1., 2., 0.], [3., 4., 5.]]])   # rows i = 1, 2; keys j = 0, 1, 2
    >>> d, sums = diagonal_sums(p, 1)
    >>> dict(zip(d.tolist(), sums[0].tolist()))
    {2: 3.0, 1: 5.0, 0: 7.0, -1: 0.0}
    """
    import torch

    H, c, K = p.shape
    W = K + c - 1
    d = q0 + c - 1 - torch.arange(W, device=p.device)
    if c == 1 or K < 2 * c:
        return d, _band_sums(p)
    p = p.contiguous()
    sums = p.new_empty(H, W)
    sums[:, c - 1:K] = p.as_strided((H, c, K - c + 1), (c * K, K + 1, 1), p.storage_offset()).sum(1)
    sums[:, :c - 1] = _band_sums(p[:, :, :c - 1])[:, :c - 1]
    sums[:, K:] = _band_sums(p[:, :, K - c + 1:])[:, c - 1:]
    return d, sums


def _band_sums(p):
    """:func:`diagonal_sums`'s sums through a copy: the rows go into a zeroed buffer whose row
    stride is one less than its width, which shifts row ``r`` left by ``r``."""
    H, c, K = p.shape
    W = K + c - 1
    buf = p.new_zeros(H, c * W)
    if c > 1:
        buf.as_strided((H, c, K), (c * W, W - 1, 1), c - 1).copy_(p)
    else:
        buf[:, :K] = p[:, 0]
    return buf.view(H, c, W).sum(1)


@runtime_checkable
class RowStats(Protocol):
    """What the streaming engine and its backends fold into, per sequence and layer: the seam
    between the engines and the accumulator a layer above them
    (:class:`attnscope.analyses.longctx.LongContextStats` implements it). Defined here, with the
    :class:`Sequence` it is fed, so the engines name no module above them.

    Per sequence: :meth:`begin`, then for each layer either tiles of whole rows (:meth:`tile`,
    the sampled rows inside them), a producer's own per-row buffers (:meth:`row_buffers`, then
    :meth:`sampled_row` and :meth:`target_weights`), or a layer's whole probabilities
    (:meth:`layer_probs`: the eager maps, the reference), each layer closed by :meth:`layer_end`;
    then :meth:`end`."""

    causal: bool  # keys after a row are masked (a decoder)
    js_rows: int  # rows sampled per sequence for the head distances
    seed: int  # ... drawn from this seed and the sequence itself

    def begin(self, L: int, H: int, seq: Sequence) -> None: ...

    def tile(self, layer: int, seq: Sequence, q0: int, p, ent, top=None, masses=None,
             heads: slice = slice(None), per_d=None) -> None: ...

    def sampled_row(self, layer: int, seq: Sequence, r: int, p, heads: slice = slice(None)) -> None: ...

    def target_weights(self, layer: int, seq: Sequence, weights: dict[str, Any]) -> None: ...

    def row_buffers(self, layer: int, seq: Sequence, device) -> tuple[Any, Any]: ...

    def layer_probs(self, layer: int, seq: Sequence, probs, chunk: int = 512) -> None: ...

    def layer_end(self, seq: Sequence) -> None: ...

    def end(self, seq: Sequence) -> None: ...
