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

ALiBi (Press et al. 2022) is a bias on the scores, per head and key: Bloom adds
``slope_h * j`` (``j`` the key's position), MPT ``slope_h * (j - (n - 1))``; each differs from
``slope_h * (j - i)`` by a constant per row, which the softmax does not see. The adapters hand
it to the attention function as the model makes it, ``key_bias`` ``[B H K]``
(:attr:`attnscope.models.forward.Site.bias`), which the backends that compute ALiBi add to
every score row (``alibi`` in :data:`attnscope.models.facts.MECHANISMS`).

========  ===========================  ====================================================
family    module                       what the adapter repeats of it
========  ===========================  ====================================================
bloom     ``BloomAttention``           fused q/k/v, ``alibi.baddbmm(q, k^T, beta, alpha)``, ``dense``
                                       and the residual dropout-add
mpt       ``MptAttention``             ``Wqkv`` (clipped), ``q k^T * scale + position_bias``,
                                       the boolean mask (True: masked), ``out_proj``
========  ===========================  ====================================================

Bloom under tensor-parallel pretraining (``pretraining_tp > 1`` with ``slow_but_exact``) splits
its output projection; it is left unadapted (maps only).
"""

from __future__ import annotations

from collections.abc import Callable
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


def bloom_eager(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                key_bias=None, **_):
    """Bloom's attention, its operations one for one: ``[B H T d]`` queries, ``[B H K d]`` keys and
    values, ``key_bias`` ``[B H K]`` (its ALiBi) -> heads' outputs ``[B T H d]``, weights ``[B H T K]``."""
    import torch

    B, H, T, d = query.shape
    K = key.shape[2]
    scores = key_bias.reshape(B * H, 1, K).to(query.dtype).baddbmm(
        batch1=query.reshape(B * H, T, d), batch2=key.reshape(B * H, K, d).transpose(-1, -2),
        beta=module.beta, alpha=scaling)
    weights = _masked(scores.view(B, H, T, K), attention_mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.bmm(probs.view(B * H, T, K), value.reshape(B * H, K, value.shape[-1]))
    return out.view(B, H, T, -1).transpose(1, 2), probs


def mpt_eager(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
              key_bias=None, **_):
    """MPT's attention, its operations one for one (shapes as :func:`bloom_eager`'s)."""
    import torch

    # (MPT adds its float32 bias to scores of the forward's dtype: torch promotes them to float32)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling + key_bias[:, :, None, :]
    probs = torch.softmax(_masked(scores, attention_mask, torch.finfo(query.dtype).min).float(), dim=-1)
    probs = probs.to(value.dtype)
    return torch.matmul(probs, value).transpose(1, 2), probs


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
                            key_bias=bias)
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
        out, probs = attend(module, query, key, value, mask, scaling=module.softmax_scale, key_bias=bias)
        return module.out_proj(out.reshape(B, T, -1)), probs

    return forward


#: attention module class name -> (its eager attention, the adapter of its forward)
ADAPTERS: dict[str, tuple[Callable, Callable]] = {
    "BloomAttention": (bloom_eager, _bloom),
    "MptAttention": (mpt_eager, _mpt),
}


def _adaptable(module) -> bool:
    name = type(module).__name__
    if name not in ADAPTERS:
        return False
    return not (name == "BloomAttention" and module.pretraining_tp > 1 and module.slow_but_exact)


def install(model, attend: Callable, active: Callable[[], bool]) -> bool:
    """Adapt every attention module of ``model`` that has an adapter (:data:`ADAPTERS`): its
    ``forward`` runs the adapter within a pass (``active()``) and its own code outside one.
    ``attend``: attnscope's attention function. True where the model's attention is now all
    adapted (idempotent); False, touching nothing, where any attention module has none."""
    modules = [m for m in model.modules() if type(m).__name__ in ADAPTERS]
    if not modules or not all(_adaptable(m) for m in modules):
        return False
    for m in modules:
        if getattr(m, EAGER, None) is not None:
            continue
        eager, adapter = ADAPTERS[type(m).__name__]
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
