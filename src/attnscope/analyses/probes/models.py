"""The probing classifiers of paper section 5, as small PyTorch modules.

Each module maps a :class:`~attnscope.analyses.probes.features.ProbeBatch` to scores
``[B, M, M]``: ``scores[b, j, i]`` is the (unnormalised) log-probability that unit ``i`` is
the head of dependent ``j``; the trainer masks impossible candidates and takes a softmax over
``i``, i.e. ``p(i | j)``. With ``alpha[k, i, j]`` head ``k``'s attention from ``i`` to ``j``:

- :class:`AttentionProbe` (attention only):
  ``s(i, j) = sum_k w_k alpha[k, i, j] + u_k alpha[k, j, i]``, both directions, ``2K`` weights.
- :class:`AttentionGloveProbe` (attention + word vectors): the head weights depend on the two
  words, ``s(i, j) = sum_k W_k (v_i ; v_j) alpha[k, i, j] + U_k (v_i ; v_j) alpha[k, j, i]``,
  with ``v`` frozen GloVe vectors; each candidate ``i`` is paired with its OWN vector ``v_i``
  (the paper's code pairs it with the next word's). A per-head bias is added (``bias=True``),
  which makes the attention-only probe a special case; ``bias=False`` is the paper's formula.
- :class:`DistanceGloveMLP` (baseline): one hidden layer over ``(v_i ; v_j ; distance
  features)``; no attention.

ROOT (unit 0) has a learned vector in the probes that use word vectors; OOV words have the
zero vector (see :mod:`attnscope.data.glove`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from attnscope.analyses.probes.features import ProbeBatch

SHORT_DISTANCES = 5  # indicator features for |distance| 1..5, ahead and behind separately


class _Vectors(nn.Module):
    """Frozen GloVe table plus one learned ROOT vector; index -1 means ROOT (or padding)."""

    def __init__(self, vectors: np.ndarray):
        super().__init__()
        self.register_buffer("table", torch.as_tensor(np.asarray(vectors, np.float32)), persistent=False)
        self.root = nn.Parameter(torch.zeros(self.table.shape[1]))

    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [B M] -> [B M d]
        v = self.table[ids.clamp(min=0)]
        return torch.where((ids < 0)[..., None], self.root.expand_as(v), v)


class AttentionProbe(nn.Module):
    """``s(i, j) = sum_k w_k alpha[k, i, j] + u_k alpha[k, j, i]`` (paper section 5)."""

    name = "attn"

    def __init__(self, num_heads: int):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(num_heads))  # candidate -> dependent
        self.u = nn.Parameter(torch.zeros(num_heads))  # dependent -> candidate

    def forward(self, batch: ProbeBatch) -> torch.Tensor:
        a = batch.attn  # [B K M M] from, to
        from_dep = torch.einsum("bkjc,k->bjc", a, self.u)  # [B j i]: alpha[k, j, i] u_k
        from_cand = torch.einsum("bkij,k->bji", a, self.w)  # [B j i]: alpha[k, i, j] w_k
        return from_dep + from_cand


class AttentionGloveProbe(nn.Module):
    """Head weights from the concatenated word vectors of candidate and dependent."""

    name = "attn+glove"

    def __init__(self, num_heads: int, vectors: np.ndarray, bias: bool = True):
        super().__init__()
        self.vectors = _Vectors(vectors)
        d = self.vectors.dim
        self.K = num_heads
        # W (v_i ; v_j) = W_cand v_i + W_dep v_j: two [2K d] maps instead of one on the pair
        self.cand = nn.Linear(d, 2 * num_heads, bias=bias)
        self.dep = nn.Linear(d, 2 * num_heads, bias=False)
        nn.init.zeros_(self.cand.weight)
        nn.init.zeros_(self.dep.weight)
        if bias:
            nn.init.zeros_(self.cand.bias)

    def forward(self, batch: ProbeBatch) -> torch.Tensor:
        v = self.vectors(batch.glove)  # [B M d]
        a = batch.attn  # [B K M M] from, to
        K = self.K
        dep, cand = self.dep(v), self.cand(v)  # [B M 2K]: W_dep v_j and W_cand v_i (+ bias)
        # s(j, i) = sum_k (dep[j, k] + cand[i, k]) a[k, i, j] + (dep[j, K+k] + cand[i, K+k]) a[k, j, i],
        # as four contractions: the [B j i 2K] pair tensor is never built (same sums, less memory)
        s = torch.einsum("bjk,bkij->bji", dep[..., :K], a)  # candidate -> dependent, by v_j
        s = s + torch.einsum("bik,bkij->bji", cand[..., :K], a)  # ... by v_i
        s = s + torch.einsum("bjk,bkji->bji", dep[..., K:], a)  # dependent -> candidate, by v_j
        return s + torch.einsum("bik,bkji->bji", cand[..., K:], a)  # ... by v_i


def distance_features(M: int) -> torch.Tensor:
    """``[M M F]`` features of the pair (dependent ``j``, candidate ``i``), ``F = 2*5 + 3``.

    Indicators for ``i - j`` = +1..+5 (head ahead) and -1..-5 (head behind), the continuous
    distance ahead and behind (``|i - j| / 10``, separately), and a ROOT indicator (``i = 0``,
    whose other features are 0).
    """
    j = torch.arange(M)[:, None]
    i = torch.arange(M)[None, :]
    delta = (i - j).float()  # [M M]
    feats = [delta == k for k in range(1, SHORT_DISTANCES + 1)]
    feats += [delta == -k for k in range(1, SHORT_DISTANCES + 1)]
    f = torch.stack(feats, -1).float()
    cont = torch.stack([delta.clamp(min=0) / 10, (-delta).clamp(min=0) / 10], -1)
    out = torch.cat([f, cont, torch.zeros(M, M, 1)], -1)
    out[:, 0, :] = 0.0
    out[:, 0, -1] = 1.0
    return out


class DistanceGloveMLP(nn.Module):
    """Baseline: ``s(i, j) = w2 . relu(W1 (v_i ; v_j ; dist(i, j)) + b1)``, no attention."""

    name = "distance+glove"

    def __init__(self, vectors: np.ndarray, hidden: int = 128):
        super().__init__()
        self.vectors = _Vectors(vectors)
        d = self.vectors.dim
        nfeat = 2 * SHORT_DISTANCES + 3
        self.cand = nn.Linear(d, hidden)
        self.dep = nn.Linear(d, hidden, bias=False)
        self.dist = nn.Linear(nfeat, hidden, bias=False)
        self.out = nn.Linear(hidden, 1, bias=False)

    def forward(self, batch: ProbeBatch) -> torch.Tensor:
        v = self.vectors(batch.glove)  # [B M d]
        M = v.shape[1]
        h = self.dep(v)[:, :, None, :] + self.cand(v)[:, None, :, :] + self.dist(distance_features(M))
        return self.out(torch.relu(h)).squeeze(-1)  # [B j i]


def right_branching(num_words: int) -> np.ndarray:
    """Each word's head is the next word; the last word's is ROOT: ``[n]`` 1-based heads.

    >>> right_branching(3).tolist()
    [2, 3, 0]
    """
    heads = np.arange(2, num_words + 2)
    if num_words:
        heads[-1] = 0
    return heads
