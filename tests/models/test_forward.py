"""The forward helper: hook points, gates and probabilities against the family's own eager code."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import one_line, says, softmax_bound, sum_bound

from attnscope.errors import AttnscopeError
from attnscope.models.forward import forward, pad_batch, supports_hooks


def _tiny_llama():
    """A tiny random Llama with grouped-query attention (4 query heads, 2 key/value heads)."""
    import transformers

    from attnscope.models.families import family_for
    from attnscope.models.forward import install
    from attnscope.models.loading import LoadedModel

    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaModel(cfg).eval()
    assert install(model)
    tok = type("Tok", (), {"pad_token_id": 0})()
    return LoadedModel(model=model, tokenizer=tok, family=family_for("llama"), name="tiny-llama",
                       source="test", weights_hash="-")


def _inputs(lm, seqs):
    return pad_batch(lm, seqs, [None] * len(seqs))


def hidden_bound(lm, hidden, n) -> float:
    """Two float32 passes that differ only in how attention is summed (sdpa or eager, a cache's
    copies, a gate of 0 or zeroed values): each layer's attention output, a weighted mean over n
    keys, is off by eps n of its size (conftest.sum_bound), which every layer adds to the hidden
    states (their largest ``|h|`` here: a normalised layer output scales errors with it)."""
    return lm.num_layers * sum_bound(n, float(hidden.abs().max()))


def _eager_reference(lm, inputs):
    lm.model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return lm.model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask,
                            output_attentions=True, use_cache=False)  # as forward() runs it
    finally:
        lm.model.set_attn_implementation("attnscope")


@pytest.fixture(scope="module")
def tiny_llama():
    return _tiny_llama()


@pytest.mark.parametrize("name", ["debug_bert", "debug_gpt2", "tiny_llama"])
def test_probabilities_and_output_equal_eager(name, request):
    lm = request.getfixturevalue(name)
    assert supports_hooks(lm)
    inputs = _inputs(lm, [[3, 4, 5, 6, 7, 8], [3, 9, 10]])
    ref = _eager_reference(lm, inputs)
    with_probs = forward(lm, inputs, attentions=True)
    fused = forward(lm, inputs)  # sdpa path: no probabilities asked for
    for a, r in zip(with_probs.attentions, ref.attentions):
        torch.testing.assert_close(a, r, rtol=0, atol=0)
    for b, n in enumerate(inputs.lengths):  # padded positions are free to differ
        want = ref.last_hidden_state[b, :n]
        torch.testing.assert_close(fused.output.last_hidden_state[b, :n], want, rtol=0, atol=hidden_bound(lm, want, n))


def test_hook_points_shapes_and_recomputed_attention(tiny_llama):
    """q/k reach the hook after rotary positions: softmax(q k^T * scaling + mask) with keys
    repeated for grouped-query attention reproduces the model's probabilities."""
    lm = tiny_llama
    inputs = _inputs(lm, [[3, 4, 5, 6, 7]])
    seen = []

    def on_k(site, k):
        q = site.query
        kk = k.repeat_interleave(site.kv_groups, dim=1)
        scores = q @ kk.transpose(-1, -2) * site.scaling + site.mask
        size = float((q.abs() @ kk.abs().transpose(-1, -2)).max()) * site.scaling  # >= any |score|
        seen.append((site.layer, tuple(q.shape), tuple(k.shape), torch.softmax(scores.float(), -1), size))

    out = forward(lm, inputs, attentions=True, hooks={"k": on_k})
    assert [s[0] for s in seen] == [0, 1]
    assert seen[0][1] == (1, 4, 5, 4) and seen[0][2] == (1, 2, 5, 4)
    for (_layer, q_shape, _k, probs, size), attn in zip(seen, out.attentions):
        # float32 softmax rows of 5 keys, of scores summed in another order (d terms of |q k|)
        bound = softmax_bound(5, size) + sum_bound(q_shape[-1], size)
        torch.testing.assert_close(probs, attn, rtol=0, atol=bound)
        assert float(attn[0, 0, 0, 1:].abs().max()) == 0.0  # causal: the first row sees only itself


def test_gates_one_is_identity_zero_removes_the_head(debug_bert):
    lm = debug_bert
    inputs = _inputs(lm, [[2, 5, 6, 7, 3]])
    L, H = lm.num_layers, lm.num_heads
    base = forward(lm, inputs).output.last_hidden_state
    ones = forward(lm, inputs, gates=torch.ones(L, H)).output.last_hidden_state
    torch.testing.assert_close(ones, base, rtol=0, atol=0)

    gates = torch.ones(L, H)
    gates[0, 1] = 0.0
    gated = forward(lm, inputs, gates=gates).output.last_hidden_state
    # Removing head (0, 1) by hand: zero the value rows that feed it; its output is then 0.
    attn_mod = lm.model.encoder.layer[0].attention.self
    d = attn_mod.attention_head_size
    saved_w = attn_mod.value.weight.detach().clone()
    saved_b = attn_mod.value.bias.detach().clone()
    try:
        with torch.no_grad():
            attn_mod.value.weight[d:2 * d] = 0
            attn_mod.value.bias[d:2 * d] = 0
        removed = forward(lm, inputs).output.last_hidden_state
    finally:
        with torch.no_grad():
            attn_mod.value.weight.copy_(saved_w)
            attn_mod.value.bias.copy_(saved_b)
    torch.testing.assert_close(gated, removed, rtol=0, atol=hidden_bound(lm, removed, 5))
    assert float((gated - base).abs().max()) > 1e-4


def test_gate_gradient_equals_finite_difference():
    from attnscope.models.debug import build_debug_model

    lm = build_debug_model("bert")
    lm.model.double()  # float64, so central differences are exact to ~1e-9 (h^2 and eps64 / h: not float32 bounds)
    inputs = _inputs(lm, [[2, 5, 6, 7, 3]])
    L, H = lm.num_layers, lm.num_heads
    weights = torch.randn(5, lm.model.config.hidden_size, generator=torch.Generator().manual_seed(0),
                          dtype=torch.float64)

    def loss(g):
        return (forward(lm, inputs, gates=g, grad=True).output.last_hidden_state[0] * weights).sum()

    gates = torch.ones(L, H, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(loss(gates), gates)
    eps = 1e-5
    for layer in range(L):
        for head in range(H):
            up, down = torch.ones(L, H, dtype=torch.float64), torch.ones(L, H, dtype=torch.float64)
            up[layer, head] += eps
            down[layer, head] -= eps
            with torch.no_grad():
                fd = (loss(up) - loss(down)) / (2 * eps)
            np.testing.assert_allclose(float(grad[layer, head]), float(fd), rtol=1e-6, atol=1e-9)
    assert float(grad.abs().min()) > 1e-6  # every gate matters to this loss


def test_head_out_hook_can_replace(debug_bert):
    lm = debug_bert
    inputs = _inputs(lm, [[2, 5, 6, 7, 3]])

    def zero_layer0_head0(site, out):
        if site.layer == 0:
            out = out.clone()
            out[:, :, 0] = 0
            return out
        return None

    gates = torch.ones(lm.num_layers, lm.num_heads)
    gates[0, 0] = 0
    a = forward(lm, inputs, hooks={"head_out": zero_layer0_head0}).output.last_hidden_state
    b = forward(lm, inputs, gates=gates).output.last_hidden_state
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_unknown_hook_point_and_outside_a_pass(debug_bert):
    lm = debug_bert
    inputs = _inputs(lm, [[2, 5, 3]])
    with pytest.raises(ValueError) as e:
        forward(lm, inputs, hooks={"qq": lambda s, t: None})
    says(one_line(e.value), "unknown", "'qq'", "head_out")  # the name given, and the known ones
    # Outside forward(), the model is exactly eager attention (output_attentions works).
    with torch.no_grad():
        out = lm.model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask,
                       output_attentions=True)
    assert len(out.attentions) == lm.num_layers
    torch.testing.assert_close(out.attentions[0].sum(-1), torch.ones(1, lm.num_heads, 3))


def test_families_without_the_interface_refuse_hooks():
    from dataclasses import replace

    import transformers

    from attnscope.models.debug import build_debug_model

    lm = build_debug_model("bert")
    plain = transformers.MPNetModel(transformers.MPNetConfig(
        vocab_size=40, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=32)).eval()
    lm = replace(lm, model=plain)
    assert not supports_hooks(lm)
    inputs = _inputs(lm, [[3, 4, 5]])
    assert len(forward(lm, inputs, attentions=True).attentions) == 1
    with pytest.raises(AttnscopeError, match="AttentionInterface"):
        forward(lm, inputs, hooks={"q": lambda s, t: None})


@pytest.mark.parametrize("name", ["debug_gpt2", "tiny_llama"])
def test_a_decoder_pass_keeps_no_key_value_cache(name, request):
    # the model alone keeps every layer's keys and values (at 16k tokens SmolLM2's are 755 MB);
    # one analysis pass never reads them again
    lm = request.getfixturevalue(name)
    inputs = _inputs(lm, [[3, 4, 5, 6]])
    with torch.no_grad():
        assert lm.model(input_ids=inputs.input_ids).past_key_values is not None  # what forward() turns off
    out = forward(lm, inputs)
    assert out.output.past_key_values is None
    cached = forward(lm, inputs, use_cache=True).output  # the caller's choice stands
    assert cached.past_key_values is not None
    # the same numbers, up to the rounding of keys read from the cache's own copies
    want = out.output.last_hidden_state
    torch.testing.assert_close(want, cached.last_hidden_state, rtol=0, atol=hidden_bound(lm, want, 4))
