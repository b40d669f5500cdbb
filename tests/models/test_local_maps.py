"""Longformer, LED and LongT5 report local attention in a layout of their own (a column per offset,
or blocks), not as maps over the tokens (``attnscope.models.local_maps``; issue 56). Laid out as
``[B H n n]`` maps, each weight must sit at the key the model read it for: the heads' outputs
are then those maps times the values, which the model computed with its own layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import EPS32, one_line, says, sum_bound

from attnscope.errors import ModelError
from attnscope.models import load_model
from attnscope.models.families import family_for
from attnscope.models.forward import forward, pad_batch
from attnscope.models.loaded import LoadedModel
from attnscope.models.local_maps import token_maps
from attnscope.models.tiny import model_class, tiny_config
from attnscope.notebook import View, head_view


def _tiny(model_type: str, **settings) -> LoadedModel:
    tokenizer = load_model(f"debug:{model_type}").tokenizer
    tokens = {k: getattr(tokenizer, k, None) for k in ("pad_token_id", "bos_token_id", "eos_token_id")}
    config = tiny_config(model_type, max(len(tokenizer), 64), tokens)
    for key, value in settings.items():
        setattr(config, key, value)
    if config.is_encoder_decoder:
        config.decoder_start_token_id = tokens["pad_token_id"]
    torch.manual_seed(0)
    model = model_class(model_type, True)(config).eval()
    return LoadedModel(model, tokenizer, family_for(model_type), f"debug:{model_type}", "test", "")


def _ids(lm, n: int) -> list[int]:
    return [5 + (7 * i) % 40 for i in range(n)]


def _context_equals_maps_times_values(maps, values, contexts, heads: int, n: int, reach: int):
    """Each head's output ``[n d]`` is its map ``[n n]`` times its values ``[n d]``: checked in
    float64 from the float32 maps and values, within the rounding of the model's float32 sum of
    ``reach`` weighted values (``sum_bound``: the weights of a row add up to 1)."""
    for p, v, ctx in zip(maps, values, contexts):
        p = p[0].double()  # [H n n]
        v = v.double().reshape(n, heads, -1).transpose(0, 1)  # [H n d]
        ctx = ctx.double().reshape(n, heads, -1).transpose(0, 1)
        bound = sum_bound(reach, float(v.abs().max())) + EPS32 * float(ctx.abs().max())
        assert float((p @ v - ctx).abs().max()) <= bound


def test_longformers_offset_columns_become_the_keys_they_were_read_for():
    lm = _tiny("longformer", attention_window=[4, 8])  # one-sided reach 2 and 4 tokens
    assert lm.facts.local == "window" and lm.facts.kind == "bidirectional" and lm.facts.window == 5
    n, heads = 13, lm.model.config.num_attention_heads
    values, contexts = [], []
    hooks = []
    for layer in lm.model.encoder.layer:  # (the test's own hooks: what the model multiplied)
        hooks.append(layer.attention.self.value.register_forward_hook(
            lambda m, i, out: values.append(out.transpose(0, 1)[0, :n].detach())))  # [T B D] -> [n D]
        hooks.append(layer.attention.self.register_forward_hook(
            lambda m, i, out: contexts.append(out[0][0, :n].detach())))
    try:
        maps = forward(lm, pad_batch(lm, [_ids(lm, n)]), attentions=True).attentions
    finally:
        for h in hooks:
            h.remove()
    assert [tuple(m.shape) for m in maps] == [(1, heads, n, n)] * 2
    for m, reach in zip(maps, (2, 4)):
        far = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs() > reach
        assert float(m[0][:, far].abs().max()) == 0.0  # keys outside the window: exactly 0
        assert float((m[0].double().sum(-1) - 1).abs().max()) <= sum_bound(2 * reach + 1)
    _context_equals_maps_times_values(maps, values, contexts, heads, n, 9)


def test_longt5s_blocks_become_the_keys_they_were_read_for():
    lm = _tiny("longt5", local_radius=2)  # blocks of 3 queries, keys within 2 of the query
    assert lm.facts.local == "blocks" and lm.facts.encoder_decoder and lm.facts.window == 5
    n, heads = 10, lm.model.config.num_heads
    assert lm.facts.heads == heads
    values, contexts, hooks = [], [], []
    for block in lm.model.encoder.block:
        attention = block.layer[0].LocalSelfAttention
        hooks.append(attention.v.register_forward_hook(lambda m, i, out: values.append(out[0].detach())))
        hooks.append(attention.o.register_forward_pre_hook(lambda m, i: contexts.append(i[0][0].detach())))
    ids = torch.tensor([_ids(lm, n)])
    try:
        with torch.inference_mode():
            out = lm.model(input_ids=ids, decoder_input_ids=ids[:, :2], output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    maps = token_maps(out.encoder_attentions, lm.facts.local, n)
    for m in maps:
        far = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs() > 2
        assert tuple(m.shape) == (1, heads, n, n) and float(m[0][:, far].abs().max()) == 0.0
        assert float((m[0].double().sum(-1) - 1).abs().max()) <= sum_bound(5)
    _context_equals_maps_times_values(maps, values, contexts, heads, n, 5)


@pytest.mark.parametrize("model_type", ["led", "longt5"])
def test_their_head_views_draw_token_maps(model_type):
    lm = load_model(f"debug:{model_type}")  # (the debug models read no local layout
    # as token maps before this: LED's page failed on [n 513] rows, LongT5's on its blocks)
    payload = View._payload(head_view(lm, "the cat sat on the mat", target="the cat").html)
    n = len(lm.tokenizer("the cat sat on the mat")["input_ids"])
    layers, heads = lm.model.config.num_hidden_layers, lm.facts.heads
    assert payload["kinds"]["encoder"]["attn"]["shape"] == [layers, heads, n, n]


def test_transient_global_attention_is_refused_in_one_line():
    with pytest.raises(ModelError) as err:
        _tiny("longt5", local_radius=2, encoder_attention_type="transient-global").facts
    says(one_line(err.value), "debug:longt5", "transient-global attention", "summarise blocks")


def test_maps_over_the_tokens_pass_through_unchanged():
    maps = [torch.rand(1, 2, 4, 4)]
    assert token_maps(maps, "", 4)[0] is maps[0]
    rows = torch.arange(1.0, 1 + 1 * 1 * 3 * 3).reshape(1, 1, 3, 3)  # window of 3 over 3 tokens
    full = token_maps([rows], "window", 3)[0][0, 0].numpy()
    # column c of query i is key i + c - 1: key -1 and key 3 fall outside and are dropped
    assert np.array_equal(full, [[2, 3, 0], [4, 5, 6], [0, 7, 8]])
