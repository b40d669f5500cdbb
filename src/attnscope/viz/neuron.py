"""Query and key vectors of one layer, captured with forward hooks, for the neuron view.

The neuron view shows, for one head and one query token, the query vector ``q``, every key
vector ``k_j``, their element-wise product ``q * k_j``, the scaled dot products
``q . k_j / sqrt(d)`` and their softmax. attnscope gets ``q`` and ``k`` by hooking the
projections named in the family table (:mod:`attnscope.models.families`: ``ModelFamily.query`` and
``ModelFamily.key``), so any family in that table works with the model's own code; nothing is
vendored. A fused projection (GPT-2's ``c_attn``, output ``[q | k | v]``) is split. A path
without ``{layer}`` (ALBERT shares one layer's modules) is hooked once and its ``layer``-th
call is taken.

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
from attnscope.models.families import module_at
from attnscope.models.forward import forward, pad_batch, supports_hooks
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


def _module(model, path: str):
    found = module_at(model, path)
    if found is not None:
        return found
    raise AttnscopeError(f"neuron view: the model has no module {path!r} (family table entry "
                         "in attnscope.models.families does not match this model)")


def _hooked_output(store: list):
    def hook(_module, _inputs, output):
        out = output[0] if isinstance(output, tuple) else output
        store.append(out.detach().float().cpu().numpy()[0])  # [n out]
    return hook


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
    if supports_hooks(lm):
        query, key, attn, scaling = _capture_with_hooks(lm, enc, layer)
    else:
        query, key, attn = _capture_with_module_hooks(lm, enc, layer)
        scaling = None
    return QueryKey(layer=layer, tokens=list(enc.tokens), special=[bool(s) for s in enc.special],
                    segment=[int(s) for s in enc.segment], query=np.ascontiguousarray(query),
                    key=np.ascontiguousarray(key), attn=attn, causal=fam.causal, family=fam.name,
                    scaling=scaling, texts=enc.texts)


def _capture_with_hooks(lm: LoadedModel, enc, layer: int):
    """q and k after position encoding, from the forward helper's hook points."""
    got: dict = {}

    def keep(site, _tensor):
        if site.layer == layer:
            got["q"], got["k"], got["scaling"] = site.query, site.key, site.scaling

    run = forward(lm, pad_batch(lm, [enc.input_ids], [enc.token_type_ids]), attentions=True,
                  hooks={"q": keep})
    q = got["q"][0].float().cpu().numpy()  # [Hq n d]
    k = np.repeat(got["k"][0].float().cpu().numpy(), q.shape[0] // got["k"].shape[1], axis=0)  # GQA -> [Hq n d]
    return q, k, run.attentions[layer][0].float().cpu().numpy(), got["scaling"]


def _capture_with_module_hooks(lm: LoadedModel, enc, layer: int):
    """For families outside transformers' AttentionInterface (MPNet): hook the projections
    named in the family table."""
    fam = lm.family
    if fam.query is None or fam.key is None:
        raise AttnscopeError(f"neuron view: model family {fam.name!r} has no query/key module "
                             "paths in attnscope.models.families")
    paths = {"query": fam.query, "key": fam.key}
    captured: dict[str, list] = {}
    handles = []
    for role, path in paths.items():
        if role == "key" and fam.key == fam.query:
            continue
        captured[role] = []
        handles.append(_module(lm.model, path.format(layer=layer)).register_forward_hook(
            _hooked_output(captured[role])))
    try:
        out = forward(lm, pad_batch(lm, [enc.input_ids], [enc.token_type_ids]), attentions=True)
    finally:
        for h in handles:
            h.remove()
    call = 0 if "{layer}" in fam.query else layer  # shared modules: one call per layer
    q_out = captured["query"][call]  # [n out]
    num_heads = lm.num_heads
    if fam.fused_qkv:
        hidden = q_out.shape[-1] // 3
        q_out, k_out = q_out[:, :hidden], q_out[:, hidden:2 * hidden]
    else:
        k_out = captured["key"][call]
    n = q_out.shape[0]
    d = q_out.shape[-1] // num_heads
    query = q_out.reshape(n, num_heads, d).transpose(1, 0, 2)  # [H n d]
    key = k_out.reshape(n, num_heads, d).transpose(1, 0, 2)  # [H n d]
    return query, key, out.attentions[layer][0].float().cpu().numpy()


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
