"""One head's whole attention row at any query of a long document, on demand, without maps.

:class:`DocumentRows` holds, per layer, the rotated queries ``Q`` ``[Hq n d]`` and keys ``K``
``[Hkv n d]`` that the forward helper's ``"q"`` hook point sees, with the layer's score scale
``s``, from one pass of the document through the model (torch's fused attention, no ``[n n]``
mask or map: :func:`attnscope.models.capture.document_queries_keys`, which a view asks for; this
module runs no model). A row is then what the streaming engine computes for it, in float32::

    S = s * Q[h, i] K[h // G, :k1]^T       [k1]   (k1 = i + 1 for a decoder, n for an encoder)
    P = exp(S - max S) / z                  z = sum exp(S - max S), log z + max S = the row's LSE

``O(n d)`` work for one row: well under a second at 128k tokens. Memory: ``4 n L (Hq + Hkv) d``
bytes, e.g. 1.5 GB for SmolLM2-135M (30 layers, 9 query and 3 key heads of 64) at 16k tokens,
12 GB at 128k. :func:`row_summary` gives what a page draws of a row: its largest keys, its mass
per distance bucket and over the document's stretches, its entropy, largest weight and mass on
the first token (the sink), the values the streaming engine folds for the same row.

>>> from attnscope.models import load_model
>>> from attnscope.models.capture import document_queries_keys
>>> lm = load_model("debug:llama")
>>> ids = lm.tokenizer("the cat sat on the mat")["input_ids"]
>>> doc = DocumentRows(ids, *document_queries_keys(lm, ids), causal=True)
>>> row = doc.row(1, 0, 4)
>>> round(float(row.sum()), 6), int((row[5:] != 0).sum())
(1.0, 0)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnscope.data.records import HeadId
from attnscope.engines.rows import bucket_ranges
from attnscope.errors import AttnscopeError


class DocumentRows:
    """The queries and keys of every layer of one document (see the module docstring)."""

    def __init__(self, ids: Sequence[int], q: list, k: list, scaling: list[float], causal: bool):
        self.ids, self.q, self.k, self.scaling, self.causal = list(ids), q, k, scaling, causal

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.q), self.q[0].shape[0]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.q + self.k)

    def row(self, layer: int, head: int, query: int) -> np.ndarray:
        """Head ``head`` of ``layer``: the attention of token ``query`` over the document's keys,
        ``[n]`` float32 (0 after ``query`` in a decoder)."""
        if not 0 <= query < self.n:
            raise AttnscopeError(f"query {query}: the document has {self.n} tokens (0 to {self.n - 1})",
                                 params=("query",))
        return self.rows(layer, head, query, query + 1)[0]

    def rows(self, layer: int, head: int, q0: int, q1: int) -> np.ndarray:
        """The rows of queries ``q0 .. q1-1`` of one head, ``[q1-q0 n]`` float32 (one block of
        scores: keep ``q1 - q0`` small at long ``n``)."""
        p = self._probs(layer, head, q0, q1)
        out = np.zeros((q1 - q0, self.n), dtype=np.float32)
        out[:, :p.shape[1]] = p.cpu().numpy()
        return out

    def profiles(self, layer: int, head: int, chunk: int = 512) -> dict[str, np.ndarray]:
        """The head's value at every row ``[n]``: its mass on the first token (``sink``) and on
        the token before (``previous``, 0 at row 0), its entropy (nats), largest weight and mean
        distance ``sum_j P_ij |i - j|`` to what it attends to, ``chunk`` rows at a time (one
        ``[chunk n]`` block of scores at most)."""
        import torch

        n = self.n
        pos = torch.arange(n, device=self.q[layer].device)
        out = {k: torch.zeros(n, dtype=torch.float64, device=pos.device)
               for k in ("sink", "previous", "entropy", "max_weight", "distance")}
        for q0 in range(0, n, chunk):
            q1 = min(n, q0 + chunk)
            p = self._probs(layer, head, q0, q1)  # [c k1]
            k1 = p.shape[1]
            out["sink"][q0:q1] = p[:, 0]
            rows = pos[max(q0, 1):q1]
            out["previous"][rows] = p[rows - q0, rows - 1].double()
            out["entropy"][q0:q1] = torch.special.entr(p).sum(-1)
            out["max_weight"][q0:q1] = p.amax(-1)
            if self.causal:  # every key at or before the row: |i - j| = i - j
                out["distance"][q0:q1] = pos[q0:q1].double() - (p @ pos[:k1].float()).double()
            else:
                out["distance"][q0:q1] = (p * (pos[q0:q1, None] - pos[None, :k1]).abs().float()).sum(-1)
        return {k: v.cpu().numpy() for k, v in out.items()}

    def _probs(self, layer: int, head: int, q0: int, q1: int):
        """``softmax(s Q[q0:q1] K[:k1]^T)`` of one head, ``[q1-q0 k1]`` (``k1 = q1`` for a decoder,
        its later keys masked; ``n`` for an encoder): what the engine computes for those rows."""
        import torch

        L, H = self.shape
        if not (0 <= layer < L and 0 <= head < H):
            raise AttnscopeError(f"head {HeadId(layer, head)}: the model has {L} layers of {H} heads",
                                 params=("head",))
        Q, K = self.q[layer][head], self.k[layer][head // (H // self.k[layer].shape[0])]
        k1 = q1 if self.causal else self.n
        scores = (Q[q0:q1] @ K[:k1].T) * self.scaling[layer]
        if self.causal:
            dev = scores.device
            later = torch.arange(k1, device=dev)[None, :] > torch.arange(q0, q1, device=dev)[:, None]
            scores.masked_fill_(later, float("-inf"))
        return torch.softmax(scores, dim=-1)


def stretches(values: np.ndarray, bins: int) -> tuple[np.ndarray, list[int]]:
    """``values`` ``[n]`` summed over each of ``min(bins, n)`` equal stretches, and the stretches'
    edges (what a page draws along a document).

    >>> sums, edges = stretches(np.array([1.0, 3.0, 5.0, 7.0]), 2)
    >>> sums.tolist(), edges
    ([4.0, 12.0], [0, 2, 4])
    """
    n = len(values)
    edges = np.linspace(0, n, min(bins, n) + 1).astype(int)
    sums = np.add.reduceat(np.asarray(values, np.float64), edges[:-1]) if n else np.zeros(0)
    return sums, edges.tolist()


def row_summary(row: np.ndarray, query: int, *, top: int = 20, bins: int = 1024) -> dict:
    """What a page draws of one row ``[n]`` of query ``query``: ``top`` keys by weight (highest
    first, then by position), mass per distance bucket (:func:`~attnscope.engines.rows.bucket_ranges`, the
    buckets of every page), mass over
    ``bins`` equal stretches of the document (the strip; at most ``n``), the row's entropy
    (nats), largest weight and mass on the first token (the sink).

    >>> s = row_summary(np.array([0.5, 0.25, 0.25, 0.0]), 2, top=2, bins=2)
    >>> s["top"], s["strip"], s["sink"], round(s["entropy"], 4)
    ([[0, 0.5], [1, 0.25]], [0.75, 0.25], 0.5, 1.0397)
    """
    row = np.asarray(row, dtype=np.float64)
    n = len(row)
    order = np.lexsort((np.arange(n), -row))[:top]
    dist = np.abs(np.arange(n) - query)
    buckets = [{"lo": lo, "hi": hi, "mass": float(row[(dist >= lo) & (dist <= hi)].sum())}
               for lo, hi in bucket_ranges(n)]
    strip, edges = stretches(row, bins)
    nz = row[row > 0]
    return {"query": int(query), "top": [[int(j), float(row[j])] for j in order if row[j] > 0],
            "buckets": buckets, "strip": [float(f"{x:.6g}") for x in strip],
            "strip_edges": edges, "entropy": float(-(nz * np.log(nz)).sum()),
            "max_weight": float(row.max()) if n else 0.0, "sink": float(row[0]) if n else 0.0}
