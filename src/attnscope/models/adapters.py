"""Adapters: the self-attention of families whose transformers code computes it inline (not
through ``AttentionInterface``), routed through attnscope's attention function, so hook points,
gates and the streaming engine reach their heads.

An adapter is the few lines of the family's attention that make its queries, keys and values
and that use the heads' outputs, written against transformers' own module; what lies between
(the scores, the softmax, ``P V``) is attnscope's attention function, which calls the hooks and
otherwise runs :func:`eager` functions that repeat the family's own operations one for one, so
the maps equal the model's ``output_attentions`` exactly. Outside a pass of
:func:`attnscope.models.forward.forward` (``model(**inputs)`` as the caller runs it) the
module's own ``forward`` runs, untouched.

MPNet and DeBERTa-v2 add a bias per query and key (``position-bias`` in
:data:`attnscope.models.facts.MECHANISMS`): the adapters hand it over as ``score_bias`` ``[B H T
K]``; the tiles and maps backends add it to the scores, the others are struck for it.

GPT-Neo (and the TinyStories models, which are GPT-Neo) computes its own attention for its
alternating global and local layers; the adapter hands attnscope's function its band (a local
layer reads the ``window_size`` keys up to the query) as the mask, with ``sliding_window`` set on
the local layers, and a score scale of 1 (GPT-Neo scales nothing).

ALiBi (Press et al. 2022) is a bias on the scores, per head and key: Bloom adds
``slope_h * j`` (``j`` the key's position), MPT ``slope_h * (j - (n - 1))``; each differs from
``slope_h * (j - i)`` by a constant per row, which the softmax does not see. The adapters hand
it to the attention function as the model makes it, ``score_bias`` ``[B H K]``
(:attr:`attnscope.models.forward.Site.bias`), which the backends that compute ALiBi add to
every score row (``alibi`` in :data:`attnscope.models.facts.MECHANISMS`).

========  ===========================  ====================================================
family    module                       what the adapter repeats of it
========  ===========================  ====================================================
bloom     ``BloomAttention``           fused q/k/v, ``alibi.baddbmm(q, k^T, beta, alpha)``, ``dense``
                                       and the residual dropout-add
mpt       ``MptAttention``             ``Wqkv`` (clipped), ``q k^T * scale + position_bias``,
                                       the boolean mask (True: masked), ``out_proj``
gpt_neo   ``GPTNeoSelfAttention``      ``q_proj`` / ``k_proj`` / ``v_proj``, float32 scores unscaled,
                                       its causal or local band (``bias``) then the model's mask,
                                       ``out_proj`` and the residual dropout
falcon    ``FalconAttention``          fused q/k/v split as the model splits it, rotary, ``q k^T /
                                       sqrt(d)`` plus the mask, ``dense``
mpnet     ``MPNetSelfAttention``       ``q`` / ``k`` / ``v``, ``q k^T / sqrt(d)`` plus its
                                       relative-position bias and the mask, ``o``
megatron  ``<Family>SelfAttention``    the first BERT's: ``query`` / ``key`` / ``value`` (RoFormer's
-bert,                                 rotary on them), the cache, ``q k^T / sqrt(d)`` plus the mask,
rembert,                               the weights returned as the module returns them
roformer,
tapas,
visual_bert
xlm,      ``MultiHeadAttention``       ``q_lin`` / ``k_lin`` / ``v_lin``, ``(q / sqrt(d)) k^T``, the
flaubert                               masked keys filled, a float32 softmax, ``out_lin``
openai    ``Attention``                fused ``c_attn`` split, ``q k^T / sqrt(d)``, its causal band
-gpt                                   at ``-1e4`` then the model's mask, ``c_proj`` and the residual
                                       dropout
xglm      ``XGLMAttention``            ``q_proj`` (times ``scaling``) / ``k_proj`` / ``v_proj``,
                                       ``bmm``, the mask added and floored, ``out_proj``
deberta   ``DisentangledSelfAttention`` (v1) fused ``in_proj`` (or its split weight for other query
                                       states), ``q_bias`` / ``v_bias``, the position terms of the
                                       scaled queries, ``q / sqrt(d s) k^T`` plus them, the mask filled
deberta   ``DisentangledSelfAttention`` ``query_proj`` / ``key_proj`` / ``value_proj``, the module's
-v2       (DeBERTa v2 and v3)          own ``disentangled_attention_bias`` (c2p, p2c),
                                       ``q (k / sqrt(d s))^T`` plus it, the mask filled
========  ===========================  ====================================================

DeBERTa v1 with talking heads (``talking_head``: scores and weights mixed across heads) is left
unadapted (maps only): no head has a softmax of its own.

A model with cross-attention (``config.add_cross_attention``) is left unadapted (maps only):
the BERT line's cross-attention is the same class as its self-attention.

Falcon with ALiBi (``config.alibi``: Falcon-RW) is left unadapted (maps only): its model folds
``alibi / sqrt(d)`` into the mask for sdpa, and its eager attention adds the bias to the scores
again before scaling (transformers 5.24), so its eager and sdpa attention differ and no one bias
is the model's.

Bloom under tensor-parallel pretraining (``pretraining_tp > 1`` with ``slow_but_exact``) splits
its output projection; it is left unadapted (maps only).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

#: the attribute an adapted attention module carries: its family's eager attention (:func:`eager_for`)
EAGER = "_attnscope_eager"


def _masked(scores, mask, low: float):
    """``scores`` with ``mask`` applied: an additive float mask (0 = attend) is added, a boolean
    one (True = attend, :meth:`~attnscope.models.forward.Site.allowed`'s sense) fills the rest
    with ``low``, as the model's own code does."""
    import torch

    if mask is None:
        return scores
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask, low)
    return scores + mask


def _band_mask(band, attention_mask, B: int):
    """The keys each query may read as one additive float32 mask ``[B 1 T K]`` (0: attend), for
    the hooks and the backends: a causal or local ``band`` (``[1 1 T K]``, bool) and the model's
    own mask in any of its forms (an fp16 mask's lowest value included)."""
    import torch

    allowed = band if attention_mask is None else band & _allowed(attention_mask)
    zeros = torch.zeros(allowed.shape, dtype=torch.float32, device=allowed.device)
    return zeros.masked_fill(~allowed, torch.finfo(torch.float32).min).expand(B, 1, *band.shape[-2:])


def _own_or_given(scores, attention_mask, model_mask, own_mask: bool, low: float):
    """``scores`` with the mask of a banded family's attention: in the adapter (``own_mask``) the
    model's own mask ``model_mask`` as the model applies it (none where it had none); from a
    backend, ``attention_mask``, the band and the mask in one (:func:`_band_mask`), filling the
    keys it masks with ``low`` in the scores' dtype."""
    if own_mask:
        return _masked(scores, model_mask, low)
    if attention_mask is None:
        return scores
    return scores.masked_fill(~_allowed(attention_mask), low)


def bloom_eager(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                score_bias=None, **_):
    """Bloom's attention, its operations one for one: ``[B H T d]`` queries, ``[B H K d]`` keys and
    values, ``score_bias`` ``[B H K]`` (its ALiBi) -> heads' outputs ``[B T H d]``, weights ``[B H T K]``."""
    import torch

    B, H, T, d = query.shape
    K = key.shape[2]
    scores = score_bias.reshape(B * H, 1, K).to(query.dtype).baddbmm(
        batch1=query.reshape(B * H, T, d), batch2=key.reshape(B * H, K, d).transpose(-1, -2),
        beta=module.beta, alpha=scaling)
    weights = _masked(scores.view(B, H, T, K), attention_mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.bmm(probs.view(B * H, T, K), value.reshape(B * H, K, value.shape[-1]))
    return out.view(B, H, T, -1).transpose(1, 2), probs


def mpt_eager(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
              score_bias=None, **_):
    """MPT's attention, its operations one for one (shapes as :func:`bloom_eager`'s)."""
    import torch

    # (MPT adds its float32 bias to scores of the forward's dtype: torch promotes them to float32)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling + score_bias[:, :, None, :]
    probs = torch.softmax(_masked(scores, attention_mask, torch.finfo(query.dtype).min).float(), dim=-1)
    probs = probs.to(value.dtype)
    return torch.matmul(probs, value).transpose(1, 2), probs


def gpt_neo_eager(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                  model_mask=None, own_mask: bool = False, **_):
    """GPT-Neo's attention, its operations one for one (shapes as :func:`bloom_eager`'s): float32
    scores, unscaled (GPT-Neo multiplies ``q.k`` by nothing: ``scaling`` is 1), its causal or local
    (sliding-window) mask from the module's ``bias`` buffer, then the model's own additive mask
    ``model_mask`` (``attention_mask`` is the two in one, for the hooks and the backends)."""
    import torch

    scores = torch.matmul(query.to(torch.float32), key.to(torch.float32).transpose(-1, -2))
    T, K = query.shape[-2], key.shape[-2]
    low = torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype, device=scores.device)
    scores = torch.where(module.bias[:, :, K - T:K, :K], scores, low)
    scores = _own_or_given(scores, attention_mask, model_mask, own_mask, float(low))
    probs = module.attn_dropout(torch.softmax(scores, dim=-1).to(value.dtype))
    return torch.matmul(probs, value).transpose(1, 2), probs


def _gpt_neo(module, attend: Callable) -> Callable:

    def forward(hidden_states, attention_mask=None, layer_past=None, use_cache=False, output_attentions=False,
                **kwargs):
        B, T, _ = hidden_states.shape
        query, key, value = (module._split_heads(proj(hidden_states), module.num_heads, module.head_dim)
                             for proj in (module.q_proj, module.k_proj, module.v_proj))
        if layer_past is not None:
            key, value = layer_past.update(key, value, module.layer_id)
        K = key.shape[2]
        local = module.attention_type == "local"
        # (the keys a query may read: its causal or local band and the model's mask, in one
        # additive mask the hooks and the backends read; the eager repeats the model's two steps)
        given = None if attention_mask is None else attention_mask[:, :, :, :K]
        mask = _band_mask(module.bias[:, :, K - T:K, :K], given, B)
        out, probs = attend(module, query, key, value, mask, scaling=1.0, model_mask=attention_mask, own_mask=True,
                            sliding_window=module.config.window_size if local else None)
        return module.resid_dropout(module.out_proj(out.reshape(B, T, -1))), probs

    return forward


def falcon_eager(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **_):
    """Falcon's rotary attention, its operations one for one (shapes as :func:`bloom_eager`'s; one
    key/value head broadcast over the query heads under multi-query attention): ``q k^T``
    divided by ``sqrt(d)``, the mask added, the softmax in the forward's dtype, no dropout."""
    import math

    import torch

    scores = (query @ key.transpose(-1, -2)) / math.sqrt(module.head_dim)
    probs = torch.softmax(_masked(scores, attention_mask, torch.finfo(scores.dtype).min), dim=-1,
                          dtype=query.dtype)
    return (probs @ value).transpose(1, 2), probs


def _falcon(module, attend: Callable) -> Callable:
    from transformers.models.falcon.modeling_falcon import apply_rotary_pos_emb

    def forward(hidden_states, alibi=None, attention_mask=None, position_ids=None, layer_past=None,
                use_cache=False, output_attentions=False, position_embeddings=None, **kwargs):
        query, key, value = module._split_heads(module.query_key_value(hidden_states))
        B, T = query.shape[:2]
        kv = module.num_heads if module.new_decoder_architecture else module.num_kv_heads
        query = query.transpose(1, 2).reshape(B, module.num_heads, T, module.head_dim)
        key, value = (x.transpose(1, 2).reshape(B, kv, T, module.head_dim) for x in (key, value))
        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        if layer_past is not None:
            key, value = layer_past.update(key, value, module.layer_idx)
        out, probs = attend(module, query, key, value, attention_mask, scaling=module.inv_norm_factor)
        return module.dense(out.reshape(B, T, module.num_heads * module.head_dim)), probs

    return forward


def _allowed(mask):
    """Which keys a mask lets each query read (bool, True = attend) from any of its forms."""
    import torch

    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2


def _self_only(cross) -> None:
    """Refuse cross-attention inputs (``install`` adapts no model with cross-attention)."""
    if cross is not None:
        from attnscope.errors import ModelError

        raise ModelError("an adapted self-attention module was handed cross-attention inputs; "
                         "attnscope adapts no model with cross-attention (its maps: attnscope extract)")


def _cache(cache, kwargs: dict | None):
    """The module's cache, given as ``cache`` or by its old name ``past_key_values`` (which the
    class's own ``forward`` renames, and an adapter, replacing that ``forward``, must too)."""
    return cache if cache is not None else (kwargs or {}).get("past_key_values")


def classic_eager(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                  score_bias=None, **_):
    """The first BERT's attention, its operations one for one (shapes as :func:`bloom_eager`'s),
    as MPNet and the BERT descendants that keep it inline compute it: ``q k^T / sqrt(d)``, MPNet's
    relative-position bias (``score_bias`` ``[B H T K]``), the additive mask, the softmax and the
    attention dropout."""
    import math

    import torch

    scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(module.attention_head_size)
    if score_bias is not None:
        scores = scores + score_bias
    probs = module.dropout(torch.softmax(_masked(scores, attention_mask, torch.finfo(scores.dtype).min), dim=-1))
    return torch.matmul(probs, value).transpose(1, 2), probs


def _bert(module, attend: Callable, always: bool = False, cache_out: bool = False) -> Callable:
    """The inline self-attention of the first BERT as its descendants keep it (MegatronBERT,
    RemBERT, TAPAS, VisualBERT, and RoFormer with its rotary positions on the queries and keys,
    and on the values where ``rotary_value``): ``query`` / ``key`` / ``value``, the model's cache
    where it passes one, and the output the module returns (``always``: the weights whether or not
    they were asked for, as MegatronBERT, RemBERT and RoFormer return them; ``cache_out``: the
    cache after them in a decoder, as TAPAS returns it). Cross-attention is not adapted
    (:func:`install`)."""
    import inspect

    signature = inspect.signature(type(module).forward)

    def forward(*args, **kwargs):
        given = signature.bind(module, *args, **kwargs).arguments
        _self_only(given.get("encoder_hidden_states"))
        hidden, cache = given["hidden_states"], _cache(given.get("cache"), given.get("kwargs"))
        B, T = hidden.shape[:2]
        query, key, value = (proj(hidden).view(B, T, -1, module.attention_head_size).transpose(1, 2)
                             for proj in (module.query, module.key, module.value))
        rotary = given.get("sinusoidal_pos")
        if rotary is not None:
            if module.rotary_value:
                query, key, value = module.apply_rotary_position_embeddings(rotary, query, key, value)
            else:
                query, key = module.apply_rotary_position_embeddings(rotary, query, key)
        if cache is not None:
            key, value = getattr(cache, "self_attention_cache", cache).update(key, value, module.layer_idx)
        out, probs = attend(module, query, key, value, given.get("attention_mask"),
                            scaling=module.attention_head_size ** -0.5)
        context = out.reshape(B, T, module.all_head_size)
        outputs = (context, probs) if always or given.get("output_attentions") else (context,)
        return outputs + (cache,) if cache_out and module.is_decoder else outputs

    return forward


def _mpnet(module, attend: Callable) -> Callable:
    def forward(hidden_states, attention_mask=None, position_bias=None, output_attentions=False, **kwargs):
        B, T = hidden_states.shape[:2]
        query, key, value = (proj(hidden_states).view(B, T, -1, module.attention_head_size).transpose(1, 2)
                             for proj in (module.q, module.k, module.v))
        bias = None if position_bias is None else position_bias.expand(B, -1, -1, -1)
        out, probs = attend(module, query, key, value, attention_mask, scaling=module.attention_head_size ** -0.5,
                            score_bias=bias)
        o = module.o(out.reshape(B, T, module.all_head_size))
        return (o, probs) if output_attentions else (o,)

    return forward


def deberta_v2_eager(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                     score_bias=None, **_):
    """DeBERTa-v2's disentangled attention, its operations one for one (shapes as
    :func:`bloom_eager`'s; ``score_bias`` ``[B H T K]``, its content-to-position and
    position-to-content terms): ``q (k / sqrt(d s))^T`` (``s`` 1 + one per position term), the
    terms, the mask filled with the lowest value, the softmax and the attention dropout."""
    import torch
    from transformers.models.deberta_v2.modeling_deberta_v2 import scaled_size_sqrt

    B, H, T, d = query.shape
    K = key.shape[2]
    q = query.reshape(B * H, T, d)
    scale = scaled_size_sqrt(q, _deberta_scale_factor(module))
    scores = torch.bmm(q, key.reshape(B * H, K, d).transpose(-1, -2) / scale.to(dtype=q.dtype))
    if score_bias is not None:
        scores = scores + score_bias.reshape(B * H, T, K)
    scores = scores.view(B, H, T, K)
    if attention_mask is not None:
        scores = scores.masked_fill(~_allowed(attention_mask), torch.finfo(q.dtype).min)
    probs = module.dropout(torch.softmax(scores, dim=-1))
    out = torch.bmm(probs.view(B * H, T, K), value.reshape(B * H, K, value.shape[-1]))
    return out.view(B, H, T, -1).transpose(1, 2), probs


def deberta_eager(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                  score_bias=None, **_):
    """DeBERTa v1's disentangled attention, its operations one for one (shapes as
    :func:`bloom_eager`'s; ``score_bias`` ``[B H T K]``, its c2p and p2c terms made from the
    scaled queries): the queries divided by ``sqrt(d s)`` (``s`` 1 + one per position term),
    ``q k^T`` plus the terms, the mask filled with the lowest value, the softmax and the
    attention dropout."""
    import torch
    from transformers.models.deberta.modeling_deberta import scaled_size_sqrt

    q = query / scaled_size_sqrt(query, 1 + len(module.pos_att_type)).to(dtype=query.dtype)
    scores = torch.matmul(q, key.transpose(-1, -2))
    if score_bias is not None:
        scores = scores + score_bias
    if attention_mask is not None:
        scores = scores.masked_fill(~_allowed(attention_mask), torch.finfo(q.dtype).min)
    probs = module.dropout(torch.softmax(scores, dim=-1))
    return torch.matmul(probs, value).transpose(1, 2), probs


def _deberta(module, attend: Callable) -> Callable:
    import torch
    from transformers.models.deberta.modeling_deberta import scaled_size_sqrt

    def forward(hidden_states, attention_mask, output_attentions=False, query_states=None, relative_pos=None,
                rel_embeddings=None):
        if query_states is None:
            query, key, value = module.transpose_for_scores(module.in_proj(hidden_states)).chunk(3, dim=-1)
        else:  # (the model's own split of its fused weight, for queries of other states)
            H = module.num_attention_heads
            ws = module.in_proj.weight.chunk(H * 3, dim=0)
            w = [torch.cat([ws[i * 3 + k] for i in range(H)], dim=0) for k in range(3)]
            query, key, value = (module.transpose_for_scores(torch.matmul(wk, x.t().to(dtype=wk.dtype)))
                                 for wk, x in zip(w, (query_states, hidden_states, hidden_states)))
        query = query + module.transpose_for_scores(module.q_bias[None, None, :])
        value = value + module.transpose_for_scores(module.v_bias[None, None, :])
        factor = 1 + len(module.pos_att_type)
        scale = scaled_size_sqrt(query, factor)
        bias = None
        if module.relative_attention and rel_embeddings is not None and relative_pos is not None:
            bias = module.disentangled_att_bias(query / scale.to(dtype=query.dtype), key, relative_pos,
                                                module.pos_dropout(rel_embeddings), factor)
            bias = None if isinstance(bias, int) else bias  # (0: no position terms)
        out, probs = attend(module, query, key, value, attention_mask.bool(), scaling=float(scale) ** -1,
                            score_bias=bias)
        context = out.reshape(*out.shape[:2], -1)
        return context, (probs if output_attentions else None)

    return forward


def _deberta_scale_factor(module) -> int:
    return 1 + ("c2p" in module.pos_att_type) + ("p2c" in module.pos_att_type)


def _deberta_v2(module, attend: Callable) -> Callable:
    def forward(hidden_states, attention_mask, output_attentions=False, query_states=None, relative_pos=None,
                rel_embeddings=None):
        H = module.num_attention_heads
        query = module.transpose_for_scores(module.query_proj(
            hidden_states if query_states is None else query_states), H)  # [B*H T d]
        key = module.transpose_for_scores(module.key_proj(hidden_states), H)
        value = module.transpose_for_scores(module.value_proj(hidden_states), H)
        B, T, K = hidden_states.shape[0], query.shape[1], key.shape[1]
        bias = None
        if module.relative_attention:
            bias = module.disentangled_attention_bias(query, key, relative_pos, module.pos_dropout(rel_embeddings),
                                                      _deberta_scale_factor(module))
            bias = None if isinstance(bias, int) else bias.view(B, H, T, K)  # (0: no position terms)
        scale = float(module.attention_head_size * _deberta_scale_factor(module)) ** -0.5
        out, probs = attend(module, *(x.view(B, H, -1, x.shape[-1]) for x in (query, key, value)),
                            attention_mask.bool(), scaling=scale, score_bias=bias)
        return out.reshape(B, T, -1), (probs if output_attentions else None)

    return forward


def xlm_eager(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **_):
    """XLM's (and FlauBERT's) attention, its operations one for one (shapes as
    :func:`bloom_eager`'s): the queries divided by ``sqrt(d)`` before ``q k^T``, the masked keys
    filled with the lowest value, the softmax in float32 and the attention dropout."""
    import math

    import torch

    scores = torch.matmul(query / math.sqrt(module.head_dim), key.transpose(2, 3))
    scores = _masked(scores, attention_mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores.float(), dim=-1).type_as(scores)
    probs = torch.nn.functional.dropout(probs, p=module.dropout, training=module.training)
    return torch.matmul(probs, value).transpose(1, 2), probs


def _xlm(module, attend: Callable) -> Callable:
    def forward(input, mask, kv=None, cache=None, output_attentions=False, **kwargs):
        _self_only(kv)
        cache = _cache(cache, kwargs)
        B, T, _ = input.shape
        query, key, value = (proj(input).view(B, -1, module.n_heads, module.head_dim).transpose(1, 2)
                             for proj in (module.q_lin, module.k_lin, module.v_lin))
        if cache is not None:
            key, value = getattr(cache, "self_attention_cache", cache).update(key, value, module.layer_id)
        allowed = (mask != 0).view((B, 1, T, -1) if mask.dim() == 3 else (B, 1, 1, -1))  # [B T K] causal, [B K]
        out, probs = attend(module, query, key, value, allowed, scaling=module.head_dim ** -0.5)
        outputs = (module.out_lin(out.reshape(B, T, -1)),)
        return outputs + (probs,) if output_attentions else outputs

    return forward


def openai_gpt_eager(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                     model_mask=None, own_mask: bool = False, **_):
    """The first GPT's attention, its operations one for one (shapes as :func:`bloom_eager`'s):
    ``q k^T``, divided by ``sqrt(d)`` where the model scales (``scale``), the keys after the query set to
    ``-1e4`` (``w b - 1e4 (1 - b)``, ``b`` its causal buffer), then the model's own additive mask
    ``model_mask`` (``attention_mask``, the two in one, for the hooks and the backends), the
    softmax and the attention dropout."""
    import math

    import torch

    scores = torch.matmul(query, key.transpose(-1, -2))
    if module.scale:
        scores = scores / math.sqrt(value.size(-1))
    band = module.bias[:, :, :scores.size(-2), :scores.size(-1)]
    scores = scores * band + -1e4 * (1 - band)
    scores = _own_or_given(scores, attention_mask, model_mask, own_mask, torch.finfo(scores.dtype).min)
    probs = module.attn_dropout(torch.softmax(scores, dim=-1))
    return torch.matmul(probs, value).transpose(1, 2), probs


def _openai_gpt(module, attend: Callable) -> Callable:

    def forward(x, attention_mask=None, output_attentions=False):
        B, T, _ = x.shape
        query, key, value = (module.split_heads(part) for part in module.c_attn(x).split(module.split_size, dim=2))
        # (the keys a query may read: its causal band and the model's mask, in one additive mask
        # the hooks and the backends read; the eager repeats the model's two steps)
        mask = _band_mask(module.bias[:, :, :T, :T].bool(), attention_mask, B)
        out, probs = attend(module, query, key, value, mask, scaling=value.size(-1) ** -0.5 if module.scale else 1.0,
                            model_mask=attention_mask, own_mask=True)
        a = module.resid_dropout(module.c_proj(out.reshape(B, T, -1)))
        return [a, probs] if output_attentions else [a]

    return forward


def xglm_eager(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **_):
    """XGLM's attention, its operations one for one (shapes as :func:`bloom_eager`'s): the
    queries multiplied by ``scaling`` before ``q k^T``, the additive mask and a floor at the
    lowest value, the softmax (in float32 for float16 scores) and the attention dropout."""
    import torch

    B, H, T, d = query.shape
    q = (query * scaling).reshape(B * H, T, d)
    scores = torch.bmm(q, key.reshape(B * H, -1, d).transpose(1, 2))
    K = scores.shape[-1]
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:  # (from a backend: which keys each query reads)
            scores = _masked(scores.view(B, H, T, K), attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = torch.max(scores.view(B, H, T, K) + attention_mask,
                               torch.full((), torch.finfo(scores.dtype).min, device=scores.device))
        scores = scores.view(B * H, T, K)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32 if scores.dtype == torch.float16 else None)
    probs = probs.to(scores.dtype).view(B, H, T, K)
    weights = torch.nn.functional.dropout(probs.view(B * H, T, K), p=module.dropout, training=module.training)
    out = torch.bmm(weights, value.reshape(B * H, K, value.shape[-1]))
    return out.view(B, H, T, -1).transpose(1, 2), probs


def _xglm(module, attend: Callable) -> Callable:
    def forward(hidden_states, key_value_states=None, cache=None, attention_mask=None, **kwargs):
        _self_only(key_value_states)
        cache = _cache(cache, kwargs)
        B, T, _ = hidden_states.shape
        query, key, value = (proj(hidden_states).view(B, T, -1, module.head_dim).transpose(1, 2)
                             for proj in (module.q_proj, module.k_proj, module.v_proj))
        if cache is not None:
            key, value = getattr(cache, "self_attention_cache", cache).update(key, value, module.layer_idx)
        out, probs = attend(module, query, key, value, attention_mask, scaling=module.scaling)
        return module.out_proj(out.reshape(B, T, module.embed_dim)), probs

    return forward


def _bloom(module, attend: Callable) -> Callable:
    from transformers.models.bloom.modeling_bloom import dropout_add

    def forward(hidden_states, residual, alibi, attention_mask, layer_past=None, use_cache=False,
                output_attentions=False, **kwargs):
        B, T, _ = hidden_states.shape
        query, key, value = module._reshape(module.query_key_value(hidden_states))
        if layer_past is not None:
            key, value = layer_past.update(key, value, module.layer_idx)
        bias = alibi.view(B, module.num_heads, -1)[:, :, :key.shape[2]]
        out, probs = attend(module, query, key, value, attention_mask, scaling=module.inv_norm_factor,
                            score_bias=bias)
        output = module.dense(out.reshape(B, T, module.hidden_size))
        return dropout_add(output, residual, module.hidden_dropout, module.training), probs

    return forward


def _mpt(module, attend: Callable) -> Callable:
    def forward(hidden_states, position_bias, cache=None, attention_mask=None, **kwargs):
        B, T = hidden_states.shape[:2]
        qkv = module.Wqkv(hidden_states)
        if module.clip_qkv:
            qkv = qkv.clamp(min=-module.clip_qkv, max=module.clip_qkv)
        query, key, value = (x.reshape(B, T, module.n_heads, module.head_dim).transpose(1, 2)
                             for x in qkv.chunk(3, dim=2))
        if cache is not None:
            key, value = cache.update(key, value, module.layer_idx, kwargs=kwargs)
        K = key.shape[2]
        bias = position_bias[:, 0, max(0, position_bias.size(2) - K):].expand(B, -1, -1)  # [B H K]
        mask = None if attention_mask is None else ~attention_mask  # (MPT's True: masked)
        out, probs = attend(module, query, key, value, mask, scaling=module.softmax_scale, score_bias=bias)
        return module.out_proj(out.reshape(B, T, -1)), probs

    return forward


#: (the transformers family whose module defines it, attention class name) -> (its eager
#: attention, the adapter of its forward); keyed by both, as some class names are several
#: families' (DeBERTa v1's and v2's ``DisentangledSelfAttention``, XLM's and CTRL's
#: ``MultiHeadAttention``, the first GPT's and FSMT's ``Attention``)
ADAPTERS: dict[tuple[str, str], tuple[Callable, Callable]] = {
    ("bloom", "BloomAttention"): (bloom_eager, _bloom),
    ("mpt", "MptAttention"): (mpt_eager, _mpt),
    ("gpt_neo", "GPTNeoSelfAttention"): (gpt_neo_eager, _gpt_neo),
    ("falcon", "FalconAttention"): (falcon_eager, _falcon),
    ("mpnet", "MPNetSelfAttention"): (classic_eager, _mpnet),
    ("deberta", "DisentangledSelfAttention"): (deberta_eager, _deberta),
    ("deberta_v2", "DisentangledSelfAttention"): (deberta_v2_eager, _deberta_v2),  # (v2 and v3)
    ("megatron_bert", "MegatronBertSelfAttention"): (classic_eager, partial(_bert, always=True)),
    ("rembert", "RemBertSelfAttention"): (classic_eager, partial(_bert, always=True)),
    ("roformer", "RoFormerSelfAttention"): (classic_eager, partial(_bert, always=True)),
    ("tapas", "TapasSelfAttention"): (classic_eager, partial(_bert, cache_out=True)),
    ("visual_bert", "VisualBertSelfAttention"): (classic_eager, _bert),
    ("xlm", "MultiHeadAttention"): (xlm_eager, _xlm),
    ("flaubert", "MultiHeadAttention"): (xlm_eager, _xlm),
    ("openai", "Attention"): (openai_gpt_eager, _openai_gpt),
    ("xglm", "XGLMAttention"): (xglm_eager, _xglm),
}


def _key(module) -> tuple[str, str]:
    """``module``'s key in :data:`ADAPTERS`: its family (``transformers.models.<family>.modeling_<family>``)
    and class name."""
    cls = type(module)
    return cls.__module__.rpartition(".modeling_")[2], cls.__name__


def _adaptable(module) -> bool:
    family, name = _key(module)
    if family == "deberta":  # (talking heads mix the heads: no per-head softmax)
        return not module.talking_head
    if name == "FalconAttention":  # (its ALiBi: see the module docstring)
        return not module.config.alibi
    return not (name == "BloomAttention" and module.pretraining_tp > 1 and module.slow_but_exact)


def install(model, attend: Callable, active: Callable[[], bool]) -> bool:
    """Adapt every attention module of ``model`` that has an adapter (:data:`ADAPTERS`): its
    ``forward`` runs the adapter within a pass (``active()``) and its own code outside one.
    ``attend``: attnscope's attention function. True where the model's attention is now all
    adapted (idempotent); False, touching nothing, where any attention module has none."""
    modules = [m for m in model.modules() if _key(m) in ADAPTERS]
    # (the BERT line's and XGLM's self- and cross-attention are one class: neither is adapted where
    # any part of the model, an encoder-decoder's decoder too, has cross-attention)
    crossed = any(getattr(getattr(m, "config", None), "add_cross_attention", False) for m in model.modules())
    if not modules or crossed or not all(_adaptable(m) for m in modules):
        return False
    for m in modules:
        if getattr(m, EAGER, None) is not None:
            continue
        eager, adapter = ADAPTERS[_key(m)]
        own = m.forward  # the module's (an instance's own, e.g. accelerate's device hook, or the class's)
        inside = adapter(m, attend)

        def forward(*args, _own=own, _inside=inside, **kwargs):
            return (_inside if active() else _own)(*args, **kwargs)

        m._attnscope_own_forward = vars(m).get("forward")  # restored by uninstall
        m.forward = forward  # an instance attribute shadows the class's forward
        setattr(m, EAGER, eager)
    model._attnscope_adapted = True
    return True


def adapted(model) -> bool:
    """Whether :func:`install` adapted ``model``'s attention."""
    return getattr(model, "_attnscope_adapted", False)


def uninstall(model) -> None:
    """Undo :func:`install` (a caller's model handed back)."""
    if not adapted(model):
        return
    for m in model.modules():
        if getattr(m, EAGER, None) is not None:
            before = m._attnscope_own_forward
            del m.forward, m._attnscope_own_forward
            if before is not None:
                m.forward = before
            delattr(m, EAGER)
    del model._attnscope_adapted


def eager_for(module) -> Any:
    """The eager attention of an adapted ``module`` (None for any other)."""
    return getattr(module, EAGER, None)
