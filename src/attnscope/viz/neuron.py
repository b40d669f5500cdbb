"""Query and key vectors of one layer, for the neuron view.

The neuron view shows, for one head and one query token, the query vector ``q``, every key
vector ``k_j``, their element-wise product ``q * k_j``, the scaled dot products
``q . k_j / sqrt(d)`` and their softmax. The vectors come from one forward pass through
:func:`attnscope.models.capture.query_key` (the model's own code; nothing is vendored).

Whether softmax(q . k / sqrt(d)) is the model's attention is *measured*, not assumed: some
families add terms before the softmax (MPNet adds a relative-position bias), and the payload
then says so and carries the model's own attention beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnscope.data.io import example_from_dict
from attnscope.data.records import Example
from attnscope.errors import AttnscopeError, IndexRangeError
from attnscope.extract.encode import Encoder
from attnscope.models.capture import query_key
from attnscope.models.loading import LoadedModel
from attnscope.models.pieces import readable, visible
from attnscope.viz.encoding import encode_f32

#: Largest |softmax(q.k/sqrt d) - model attention| still called "the same" (float32 noise).
MATCH_TOLERANCE = 1e-4


@dataclass
class QueryKey:
    """One layer's projections for one example: ``query``/``key`` are ``[H n d]``,
    ``attn`` the model's own attention of that layer ``[H n n]``."""

    layer: int
    tokens: list[str]
    special: list[bool]
    segment: list[int]
    query: np.ndarray  # [H n d]
    key: np.ndarray  # [H n d]
    attn: np.ndarray  # [H n n]
    causal: bool
    family: str
    scaling: float | None = None  # the layer's score scale; None: 1/sqrt(d)
    texts: list[str] | None = None  # each token as the tokenizer's text (None: the pieces are)

    def scores(self) -> np.ndarray:
        """``q . k * scaling`` (``1/sqrt(d)`` unless the model says otherwise) with future keys
        at -inf for causal models, ``[H n n]``."""
        d = self.query.shape[-1]
        scale = self.scaling if self.scaling is not None else 1.0 / np.sqrt(d)
        s = np.einsum("hqd,hkd->hqk", self.query.astype(np.float64),
                      self.key.astype(np.float64)) * scale  # [H q k]
        if self.causal:
            n = s.shape[-1]
            s = np.where(np.triu(np.ones((n, n), bool), 1), -np.inf, s)
        return s

    def softmax(self) -> np.ndarray:
        """softmax over keys of :meth:`scores`, ``[H n n]``."""
        s = self.scores()
        e = np.exp(s - s.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


def capture_qk(lm: LoadedModel, example: Example | dict | str, layer: int = 0, *,
               index: int = 0, casing: str | None = None) -> QueryKey:
    """Run ``lm`` on one example and capture layer ``layer``'s query and key vectors.

    ``example`` is an :class:`Example`, an input dict, or a plain text string.

    >>> qk = capture_qk(load_model("debug:bert"), "the cat sat", 0)   # doctest: +SKIP
    >>> qk.query.shape                                                # [H n d]  # doctest: +SKIP
    """

    fam = lm.family
    if not 0 <= layer < lm.num_layers:
        raise IndexRangeError("neuron view", "layer", layer, lm.num_layers)
    if isinstance(example, str):
        example = Example(text=example)
    elif isinstance(example, dict):
        example = example_from_dict(example, index)
    enc = Encoder(lm, casing).encode(example, index)
    query, key, attn, scaling = query_key(lm, enc.input_ids, enc.token_type_ids, layer)
    return QueryKey(layer=layer, tokens=list(enc.tokens), special=[bool(s) for s in enc.special],
                    segment=[int(s) for s in enc.segment], query=np.ascontiguousarray(query),
                    key=np.ascontiguousarray(key), attn=attn, causal=lm.facts.causal, family=fam.name,
                    scaling=scaling, texts=enc.texts)


def neuron_payload(qk: QueryKey, *, head: int = 0, query: int = 0) -> dict:
    """The neuron view's dict for one layer; ``selected`` spells out one head and query token.

    ``query``/``key`` are ``f32`` blobs ``[H n d]`` (the page computes any head and query from
    them); ``model_attn`` is an ``f32`` blob of the model's own attention ``[H n n]``;
    ``selected`` has ``dots`` (q . k_j / sqrt d, ``None`` where masked), ``softmax`` and
    ``products`` (``[n][d]``, q * k_j) for ``head`` and ``query``.
    """
    num_heads, n, d = qk.query.shape
    if not 0 <= head < num_heads:
        raise IndexRangeError("neuron view", "head", head, num_heads)
    if not 0 <= query < n:
        raise AttnscopeError(f"neuron view: query position {query} out of range ({n} tokens)")
    soft = qk.softmax()  # [H n n]
    gap = float(np.abs(soft - qk.attn).max())
    matches = gap <= MATCH_TOLERANCE
    dots = qk.scores()[head, query]
    q = qk.query[head, query]  # [d]
    note = "" if matches else (
        f"this model adds terms to q.k/sqrt(d) before the softmax (largest difference from its "
        f"attention: {gap:.3g}); the 'model' column shows its real attention")
    return {
        "view": "neuron", "layer": qk.layer, "family": qk.family, "causal": qk.causal,
        "num_heads": num_heads, "head_dim": d, "tokens": qk.tokens, "special": qk.special,
        "token_text": [visible(t) for t in readable(qk.tokens, qk.special, qk.texts, "token")],
        "segment": qk.segment, "query": encode_f32(qk.query), "key": encode_f32(qk.key),
        "model_attn": encode_f32(qk.attn), "softmax_matches_model": bool(matches),
        "max_difference": gap, "note": note,
        "selected": {"head": head, "query": query,
                     "dots": [None if not np.isfinite(x) else float(x) for x in dots],
                     "softmax": soft[head, query].tolist(),
                     "products": (q[None, :] * qk.key[head]).tolist()},
    }
