"""The ``maps`` backend of the streaming engine: each layer's whole ``[H n n]`` attention map of a
sequence, made by the model family's own eager attention and folded as it is made, so one
layer's map of one sequence is in memory at a time. It is the reference, as the math kernel is
one of torch's ``scaled_dot_product_attention`` backends: the maps other tools read
(``output_attentions``), the same numbers, on any device and any input (word level, probes,
extra key classes).

``auto`` takes it only where the caller says the pass's maps fit its memory budget (the
long-context family's ``maps_budget_gb``); elsewhere by name (``backend="maps"`` from Python,
``--longctx-engine maps`` on the command line, where ``--longctx-backend`` names the others).
"""

from __future__ import annotations

from attnscope.engines.rows import RowStats, Sequence
from attnscope.engines.seam import Backend, LayerInput
from attnscope.extract.wordlevel import to_word_level
from attnscope.models import forward


def fold_maps(stats: RowStats, layer: int, seq: Sequence, probs) -> None:
    """One layer's token-level probabilities ``[H n n]`` of one sequence into ``stats`` (word
    level: converted with :func:`attnscope.extract.wordlevel.to_word_level` first)."""
    import torch

    if seq.units is None:
        stats.layer_probs(layer, seq, probs)
        return
    a = probs[None].float().cpu().numpy()  # [1 H n n]
    w = to_word_level(a, seq.units.cpu().numpy())[0]
    stats.layer_probs(layer, seq, torch.as_tensor(w, device=probs.device))


def run_layer(layer: LayerInput, b: int, seq: Sequence) -> None:
    """Sequence ``b`` of the batch: the family's eager attention on its queries, keys and values
    (the whole padded length, as the batch's eager attention computes it), with the additive mask
    eager attention takes (0 where a key may be seen, the dtype's lowest value elsewhere, as
    transformers' ``eager_mask`` makes it from the forward's lean mask); its output rows into
    ``layer.out``, its map folded into ``layer.stats``."""
    import torch

    site = layer.site
    # the keys and values as the engine hands them (float32), the queries alike: under
    # attention_dtype bfloat16 the rounded values, multiplied in float32 as by every backend
    q, k, v = site.query[b:b + 1].float(), layer.key[b:b + 1], layer.value[b:b + 1]
    T = k.shape[2]
    mask = torch.zeros(1, 1, q.shape[2], T, dtype=q.dtype, device=q.device).masked_fill(
        ~site.allowed(0, q.shape[2], T)[b:b + 1], torch.finfo(q.dtype).min)
    extra = {} if layer.cap is None else {"softcap": layer.cap}  # (learned sinks: the module's own)
    if site.bias is not None:  # ALiBi or a position bias: the adapted family's eager adds it as the model does
        extra["score_bias"] = site.bias[b:b + 1].float()
    out, probs = forward.family_eager(site.module)(site.module, q, k, v, mask, scaling=site.scaling,
                                                   dropout=0.0, **extra)
    layer.out[b] = out[0]
    n = seq.token_n if seq.units is not None else seq.n
    fold_maps(layer.stats, site.layer, seq, probs[0, :, :n, :n])


BACKEND = Backend("maps", devices=(), token_level=False, probes=True, run=run_layer,
                  usable=lambda kind: True, budget=True,
                  handles=frozenset({"sinks", "sink-scale", "value-size", "softcap", "window", "chunk", "scale", "alibi",
                                     "position-bias"}))
