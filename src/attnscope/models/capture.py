"""What a view reads from one forward pass: the attention of one token sequence, whole or layer
by layer (:mod:`attnscope.viz.generate`), one layer's query and key vectors (the neuron
view, :mod:`attnscope.viz.neuron`), and a long document's queries and keys in every layer (the
long-document view's rows, :class:`~attnscope.engines.document.DocumentRows`).

``q`` and ``k`` come from the forward helper's ``"q"`` hook point (after position encoding,
with the layer's score scale) where the family routes attention through transformers'
AttentionInterface, else from the projections named in the family table
(:mod:`attnscope.models.families`: ``ModelFamily.query`` and ``ModelFamily.key``), hooked for
the pass. A fused projection (GPT-2's ``c_attn``, output ``[q | k | v]``) is split. A path
without ``{layer}`` (ALBERT shares one layer's modules) is hooked once and its ``layer``-th
call is taken.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from attnscope.errors import AttnscopeError
from attnscope.models.families import module_at
from attnscope.models.forward import forward, pad_batch, supports_hooks
from attnscope.models.local_maps import token_maps


def attention(lm, ids: Sequence[int], *, each_layer: Callable[[np.ndarray], None] | None = None,
              token_type_ids: Sequence[int] | None = None):
    """The ``[L H n n]`` float32 attention of one pass over token ``ids`` (with their segment
    ids, for a sentence pair), or, with ``each_layer``, None after handing it each layer's
    ``[H n n]`` as the pass makes it (never the whole map)."""
    inputs = pad_batch(lm, [list(ids)], [token_type_ids])
    if each_layer is not None:
        forward(lm, inputs, hooks={"attn": lambda site, probs: each_layer(probs[0].float().cpu().numpy())})
        return None
    out = forward(lm, inputs, attentions=True)
    return np.stack([a[0].float().cpu().numpy() for a in out.attentions])


def document_queries_keys(lm, ids: Sequence[int]) -> tuple[list, list, list[float]]:
    """Every layer's rotated queries ``[Hq n d]`` and keys ``[Hkv n d]`` (float32, on the CPU) and
    score scale, from one pass over a long document's ``ids`` with torch's fused attention (no
    ``[n n]`` mask or map): what :class:`~attnscope.engines.document.DocumentRows` computes any
    row from."""
    q, k, scaling = [], [], []

    def keep(site, query):
        q.append(query[0].float().cpu().contiguous())
        k.append(site.key[0].float().cpu().contiguous())
        scaling.append(float(site.scaling))

    forward(lm, pad_batch(lm, [list(ids)]), hooks={"q": keep}, lean_mask=True)
    if len(q) != lm.num_layers:
        raise AttnscopeError(f"{lm.name}: its layers were not seen by the hook points")
    return q, k, scaling


def query_key(lm, input_ids: Sequence[int], token_type_ids: Sequence[int] | None,
              layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float | None]:
    """One example's layer ``layer``: query and key vectors ``[H n d]`` (grouped key/value heads
    repeated for their query heads), the model's own attention ``[H n n]`` and the layer's score
    scale (None: ``1/sqrt(d)``), from one forward pass."""
    batch = pad_batch(lm, [input_ids], [token_type_ids])
    if supports_hooks(lm):
        return _from_hook_points(lm, batch, layer)
    return (*_from_projections(lm, batch, layer), None)


def _from_hook_points(lm, batch, layer: int):
    got: dict = {}

    def keep(site, _tensor):
        if site.layer == layer:
            got["q"], got["k"], got["scaling"] = site.query, site.key, site.scaling

    run = forward(lm, batch, attentions=True, hooks={"q": keep})
    q = got["q"][0].float().cpu().numpy()  # [Hq n d]
    k = np.repeat(got["k"][0].float().cpu().numpy(), q.shape[0] // got["k"].shape[1], axis=0)  # GQA -> [Hq n d]
    return q, k, run.attentions[layer][0].float().cpu().numpy(), got["scaling"]


def _from_projections(lm, batch, layer: int):
    """For families outside transformers' AttentionInterface without hook points (LUKE, XLNet ...)."""
    fam = lm.family
    if fam.query is None or fam.key is None:
        raise AttnscopeError(f"neuron view: model family {fam.name!r} has no query/key module "
                             "paths in attnscope.models.families")
    captured: dict[str, list] = {"query": [], "key": []}
    hooks = [(_module(lm.model, fam.query.format(layer=layer)), _keep_output(captured["query"]))]
    if fam.key != fam.query:
        hooks.append((_module(lm.model, fam.key.format(layer=layer)), _keep_output(captured["key"])))
    out = forward(lm, batch, attentions=True, module_hooks=hooks)
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


def _module(model, path: str):
    found = module_at(model, path)
    if found is not None:
        return found
    raise AttnscopeError(f"neuron view: the model has no module {path!r} (family table entry "
                         "in attnscope.models.families does not match this model)")


def _keep_output(store: list):
    def hook(_module, _inputs, output):
        out = output[0] if isinstance(output, tuple) else output
        store.append(out.detach().float().cpu().numpy()[0])  # [n out]
    return hook


def seq2seq_attention(lm, source_ids: Sequence[int], decoder_ids: Sequence[int]):
    """An encoder-decoder model's encoder, decoder and cross attention ``[L H q k]`` (float32)
    of one pass over ``source_ids`` with the decoder reading ``decoder_ids`` (its start token
    first): the model's own ``output_attentions``, eager attention."""
    import torch

    src = torch.tensor([list(source_ids)], device=lm.device)
    with torch.inference_mode():
        res = lm.model(input_ids=src, attention_mask=torch.ones_like(src),
                       decoder_input_ids=torch.tensor([list(decoder_ids)], device=lm.device),
                       output_attentions=True, use_cache=False)

    def stack(layers):
        return np.stack([a[0].float().cpu().numpy() for a in layers])

    encoder = token_maps(res.encoder_attentions, lm.facts.local, src.shape[-1])
    return stack(encoder), stack(res.decoder_attentions), stack(res.cross_attentions)


def beside_eager(lm, ids: Sequence[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """attnscope's maps of one pass over ``ids`` (an encoder-decoder's encoder, decoder and cross
    attention, its decoder reading the first two tokens) and transformers' own eager
    ``output_attentions`` of the same model run without attnscope's attention function, each a
    list of ``[H q k]`` float32 arrays in the same order: what ``attnscope check`` compares."""
    import torch

    from attnscope.models.forward import install, supports_hooks

    ids = list(ids)
    if lm.facts.encoder_decoder:
        ours = [layer for kind in seq2seq_attention(lm, ids, ids[:2]) for layer in kind]
    else:  # (layer by layer: a model's maps need not all have one shape, Longformer's are [H n w])
        ours = [a[0].float().cpu().numpy() for a in forward(lm, pad_batch(lm, [ids]), attentions=True).attentions]
    model, hooked = lm.model, supports_hooks(lm)
    kwargs = {"input_ids": torch.tensor([ids], device=lm.device)}
    if lm.facts.encoder_decoder:
        kwargs["decoder_input_ids"] = kwargs["input_ids"][:, :2]
    if hooked:
        model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            out = model(**kwargs, output_attentions=True, use_cache=False)
    finally:
        if hooked:
            install(model)
    own = token_maps(out.encoder_attentions if lm.facts.encoder_decoder else out.attentions, lm.facts.local, len(ids))
    kinds = (own, out.decoder_attentions, out.cross_attentions) if lm.facts.encoder_decoder else (own,)
    theirs = [a[0].float().cpu().numpy() for kind in kinds for a in kind if a is not None]
    if not lm.facts.encoder_decoder and len(theirs) != len(ours):
        # a linear-attention layer's "weights" are no map over the tokens (MiniMax): not attention
        theirs = [a for a in theirs if a.shape[-2:] == (len(ids), len(ids))]
    return ours, theirs
