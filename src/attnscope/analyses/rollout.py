"""Attention rollout and attention flow (Abnar & Zuidema 2020, "Quantifying Attention Flow").

Both treat the layers as a graph whose edges are each layer's attention averaged over heads,
with the residual connection added as an identity edge:

    A~_l = rownorm(A_l + I),      A_l = mean over heads of layer l's attention  [n n]

Because every row of ``A_l`` sums to 1, ``rownorm(A_l + I) = 0.5 A_l + 0.5 I``: the two forms
the paper and the issue write are the same matrix (they differ only for rows that do not sum
to 1, e.g. a fully masked row; those keep the identity). The paper motivates the 0.5/0.5 split
by the residual adding the layer's input to its attention output with equal weight.

- Rollout: ``R = A~_L A~_{L-1} ... A~_1``; ``R[i, j]`` is how much of output token ``i``
  (after the last layer) traces back to input token ``j`` when attention is followed linearly.
- Flow: the layered graph with nodes ``(l, i)`` for ``l = 0..L`` and an edge from ``(l, i)`` to
  ``(l-1, j)`` of capacity ``A~_l[i, j]``; ``F[i, j]`` is the maximum flow from ``(L, i)`` to
  ``(0, j)`` (networkx's Edmonds-Karp, pinned, one residual network reused). That is ``n^2``
  max-flow problems on a graph of ``(L+1) n`` nodes and ``L n^2`` edges, so inputs above
  :data:`MAX_FLOW_TOKENS` are refused.
  Flow values are not row-normalised (the paper compares them by rank).

Both take ``attn`` as ``[L H n n]`` (``[layer, head, query, key]``) and return ``[n n]``.
"""

from __future__ import annotations

import numpy as np

from attnscope.errors import AttnscopeError

#: Longest input attention flow accepts by default (n^2 max-flow problems).
MAX_FLOW_TOKENS = 32


def residual_attention(attn: np.ndarray) -> np.ndarray:
    """``rownorm(mean_h A + I)`` per layer: ``[L H n n]`` -> ``[L n n]`` float64.

    >>> residual_attention(np.array([[[[0.0, 1.0], [1.0, 0.0]]]])).tolist()
    [[[0.5, 0.5], [0.5, 0.5]]]
    """
    a = np.asarray(attn, dtype=np.float64)
    if a.ndim != 4 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"attention must be [L H n n], got shape {a.shape}")
    mixed = a.mean(1) + np.eye(a.shape[-1])[None]
    return mixed / mixed.sum(-1, keepdims=True)


def attention_rollout(attn: np.ndarray) -> np.ndarray:
    """Rollout ``[n n]`` of ``attn [L H n n]``: the product of the residual-mixed layers, last first.

    >>> attention_rollout(np.array([[[[0.0, 1.0], [0.0, 1.0]]]])).tolist()
    [[0.5, 0.5], [0.0, 1.0]]
    """
    layers = residual_attention(attn)
    out = layers[0]
    for a in layers[1:]:
        out = a @ out
    return out


def attention_flow(attn: np.ndarray, *, max_tokens: int = MAX_FLOW_TOKENS, rows=None) -> np.ndarray:
    """Maximum flow ``[n n]`` from each output token to each input token (see the module docstring).

    ``rows``: only these output tokens (``[k n]``, in that order); each row costs ``n`` max-flows.
    """
    import networkx as nx
    from networkx.algorithms.flow import build_residual_network, edmonds_karp

    layers = residual_attention(attn)
    L, n, _ = layers.shape
    if n > max_tokens:
        raise AttnscopeError(f"attention flow is limited to {max_tokens} tokens (n^2 max-flow problems "
                             f"on {L + 1} x n nodes); this input has {n}; use rollout, or raise the limit")
    g = nx.DiGraph()
    for layer in range(L):
        for i in range(n):
            for j in range(n):
                c = float(layers[layer, i, j])
                if c > 0:
                    g.add_edge((layer + 1, i), (layer, j), capacity=c)
    rows = list(range(n)) if rows is None else [int(i) for i in rows]
    out = np.zeros((len(rows), n), dtype=np.float64)
    residual = build_residual_network(g, "capacity")  # built once; edmonds_karp resets its flows
    for k, i in enumerate(rows):
        src = (L, i)
        for j in range(n):
            dst = (0, j)
            if src in g and dst in g:
                out[k, j] = edmonds_karp(g, src, dst, capacity="capacity", residual=residual,
                                         value_only=True).graph["flow_value"]
    return out
