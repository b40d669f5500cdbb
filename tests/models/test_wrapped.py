"""A wrapper's or a composite's language model whose own code routes attention through
AttentionInterface (DPR's BERT, DeepSeek-VL's Llama, GOT-OCR2's Qwen2, Granite Speech's Granite;
issue 56): it gets hook points and the streaming engine, where before only the wrapper's class
and top-level config were read and the model got maps only."""

from __future__ import annotations

import pytest
import torch

from attnscope.models import load_model
from attnscope.models.forward import forward, model_configs, pad_batch, supports_hooks
from attnscope.models.loading import borrowed
from attnscope.models.tiny import build_tiny


@pytest.mark.parametrize("model_type", ["dpr", "deepseek_vl", "got_ocr2", "granite_speech"])
def test_the_language_model_inside_is_hooked_once_per_layer_and_its_maps_are_eager_exactly(model_type):
    lm = load_model(f"debug:{model_type}")
    assert supports_hooks(lm) and lm.facts.hooks
    ids = lm.tokenizer("the cat sat on the mat")["input_ids"]
    calls = []
    out = forward(lm, pad_batch(lm, [ids]), attentions=True, hooks={"q": lambda site, q: calls.append(site.layer)})
    assert calls == list(range(lm.num_layers))
    configs = model_configs(lm.model)
    names = [c._attn_implementation for c in configs]
    try:  # transformers' own eager attention, attnscope's function out of the way
        for c in configs:
            c._attn_implementation = "eager"
        with torch.inference_mode():
            eager = lm.model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False).attentions
    finally:
        for c, name in zip(configs, names):
            c._attn_implementation = name
    assert len(eager) == len(out.attentions) and all(torch.equal(a, b) for a, b in zip(out.attentions, eager))


def test_a_borrowed_wrapper_gets_every_config_back():
    tokenizer = load_model("debug:deepseek_vl").tokenizer
    model = build_tiny("deepseek_vl", tokenizer)
    before = [c._attn_implementation for c in model_configs(model)]
    with borrowed(model, tokenizer) as lm:
        assert supports_hooks(lm)
    assert [c._attn_implementation for c in model_configs(model)] == before
