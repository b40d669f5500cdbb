"""ALiBi models (Bloom, MPT), whose transformers code computes attention inline, routed through
attnscope's attention function by an adapter (``attnscope.models.adapters``; issue 56, deliver 4):
their maps stay the model's own exactly, the bias is ALiBi by its definition, and the streaming
engine's statistics equal the maps' where before it refused the model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import one_line, says, softmax_bound

from attnscope.analyses.longctx import LongContextStats
from attnscope.engines.plan import plan
from attnscope.engines.streaming import stream_stats
from attnscope.errors import AttnscopeError
from attnscope.models import adapters, load_model
from attnscope.models.forward import forward, pad_batch, supports_hooks
from attnscope.models.loading import borrowed
from tests.engines.test_longctx import TEXTS, _docs, assert_close, reference, stats_bound


@pytest.fixture(scope="module", params=["bloom", "mpt"])
def alibi_lm(request):
    return load_model(f"debug:{request.param}")


def _batch(lm):
    ids = [lm.tokenizer(t)["input_ids"] for t in TEXTS[:2]]
    return pad_batch(lm, [ids[0], ids[1][:7]])  # a padded batch: Bloom's positions come from its mask


def _assert_the_models_own(lm, batch, ours) -> None:
    """``ours`` (a pass of attnscope's, with attentions) gives the maps and last hidden states of
    the model's own attention code run outside a pass on ``batch``, exactly: the same operations on
    the same tensors."""
    import inspect

    cache = {"use_cache": False} if "use_cache" in inspect.signature(lm.model.forward).parameters else {}
    with torch.inference_mode():  # outside a pass: the model's own attention code
        own = lm.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True,
                       **cache)
    assert len(ours.attentions) == len(own.attentions) == lm.num_layers
    for a, b in zip(ours.attentions, own.attentions):
        assert torch.equal(a, b)
    assert torch.equal(ours.output.last_hidden_state, own.last_hidden_state)


def _assert_softmax_of(maps, scores, largest: float) -> None:
    """``maps`` (one sequence's ``[H T K]``, float32) are the softmax of ``scores`` (float64,
    ``-inf`` where a key is masked) within float32 rounding of rows of unshifted scores up to
    ``largest`` in size."""
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(maps.double().numpy(), p, atol=softmax_bound(scores.shape[-1], largest), rtol=0)


def test_the_adapted_maps_and_outputs_are_the_models_own_exactly(alibi_lm):
    lm = alibi_lm
    assert supports_hooks(lm) and lm.facts.adapted and lm.facts.mechanisms == ("alibi",) and lm.facts.causal
    batch = _batch(lm)
    _assert_the_models_own(lm, batch, forward(lm, batch, attentions=True))


def test_the_bias_is_alibi_by_its_definition(alibi_lm):
    # softmax(q.k / sqrt(d) + m_h (j - i)) over the keys j <= i, in float64 from the hooks' q and k,
    # with the slopes of Press et al. for 2^k heads, m_h = 2^(-8 (h + 1) / H) (both models' code
    # computes them its own way, and shifts each row by its own constant)
    lm = alibi_lm
    ids = lm.tokenizer(TEXTS[0])["input_ids"]
    got = {}
    out = forward(lm, pad_batch(lm, [ids]), attentions=True,
                  hooks={"k": lambda site, k: got.setdefault(site.layer, [site.query, k])})
    H, n = lm.num_heads, len(ids)
    assert H & (H - 1) == 0  # (the slopes' closed form holds for a power of two)
    slopes = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)
    distance = np.arange(n)[None, :] - np.arange(n)[:, None]  # j - i
    for layer, (q, k) in got.items():
        q, k = q[0].double().numpy(), k[0].double().numpy()
        qk = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
        s = np.where(distance <= 0, qk + slopes[:, None, None] * distance, -np.inf)
        # (unshifted scores up to max|q.k| / sqrt(d) + m_0 (n - 1): Bloom adds m_h j)
        _assert_softmax_of(out.attentions[layer][0], s, float(np.abs(qk).max()) + slopes[0] * (n - 1))


@pytest.mark.parametrize("backend", ["tiles", "maps", "flex"])
def test_the_streaming_statistics_equal_the_maps(alibi_lm, backend):
    # before the adapter the streaming engine refused these models (outside AttentionInterface)
    lm = alibi_lm
    seqs, targets = _docs(lm)
    st = LongContextStats(js_rows=3)
    stream_stats(lm, seqs, st, chunk=4, batch_size=2, targets=targets, backend=backend)
    assert_close(st.means(), reference(lm, seqs, targets, js_rows=3), stats_bound(seqs))


def test_auto_passes_over_the_backends_without_alibi_and_a_named_one_is_refused(alibi_lm):
    lm = alibi_lm
    p = plan(lm, longest=64, engine="streaming")
    assert p.backend == "tiles" and "alibi" in p.needs
    reasons = {name: reason for name, verdict, reason in p.verdicts if verdict == "declined"}
    says(reasons["compiled"], "alibi")
    with pytest.raises(AttnscopeError) as err:
        plan(lm, longest=64, engine="streaming", backend="compiled")
    says(one_line(err.value), "backend compiled", "alibi", "maps, flex, tiles")


def test_a_callers_bloom_is_adapted_inside_the_block_and_handed_back_as_it_was():
    import transformers

    lm = load_model("debug:bloom")
    model = transformers.BloomModel(lm.model.config)  # the caller's own, never adapted
    attention = model.h[0].self_attention
    assert "forward" not in vars(attention)
    with borrowed(model, lm.tokenizer) as inside:
        assert supports_hooks(inside) and "forward" in vars(attention)
    assert "forward" not in vars(attention) and not adapters.adapted(model)


def test_a_run_of_some_layers_from_a_cached_input_is_the_whole_models(alibi_lm):
    # Bloom's and MPT's layers return tuples: the layers skipped must too (value zeroing and
    # ablation run one layer from its cached input); the same operations on the same input
    lm = alibi_lm
    batch = pad_batch(lm, [lm.tokenizer(TEXTS[0])["input_ids"]])
    whole = forward(lm, batch, output_hidden_states=True).output.hidden_states
    for first in range(lm.num_layers):
        part = forward(lm, batch, output_hidden_states=True, layers=(first, first + 1),
                       hidden=whole[first]).output.hidden_states
        assert torch.equal(part[first + 1], whole[first + 1])
        # a skipped layer passes its input through whole, batch axis and all
        assert all(h.shape == whole[0].shape for h in part), [h.shape for h in part]


# -- GPT-Neo (and the TinyStories models): unscaled scores, alternating global and local layers --

@pytest.fixture(scope="module")
def neo_lm():
    """A tiny GPT-Neo whose local layers read 3 keys (the packaged one reads 256, more than any
    test text), adapted inside ``borrowed``."""
    from attnscope.models.tiny import build_tiny

    tokenizer = load_model("debug:gpt_neo").tokenizer
    model = build_tiny("gpt_neo", tokenizer)
    config = model.config
    config.window_size = 3
    model = type(model)(config).eval()  # (the local layers build their band from the config)
    with borrowed(model, tokenizer, name="debug:gpt_neo") as lm:
        yield lm


def test_gpt_neos_adapted_maps_and_outputs_are_its_own_and_its_local_layers_read_three_keys(neo_lm):
    lm = neo_lm
    assert supports_hooks(lm) and lm.facts.adapted and lm.facts.window == 3
    assert set(lm.facts.mechanisms) == {"window", "scale"} and lm.facts.scale == 1.0
    batch = _batch(lm)
    ours = forward(lm, batch, attentions=True)
    _assert_the_models_own(lm, batch, ours)
    n = int(batch.lengths[0])
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    for layer, kind in enumerate(lm.model.config.attention_layers[:lm.num_layers]):
        far = (j > i) | ((i - j >= 3) if kind == "local" else False)
        assert float(ours.attentions[layer][0, :, :n, :n][:, torch.as_tensor(far)].abs().max()) == 0.0


def test_gpt_neos_maps_are_the_unscaled_softmax_of_its_band(neo_lm):
    lm = neo_lm
    ids = lm.tokenizer(TEXTS[0])["input_ids"]
    got = {}
    out = forward(lm, pad_batch(lm, [ids]), attentions=True,
                  hooks={"k": lambda site, k: got.setdefault(site.layer, [site.query, k])})
    n = len(ids)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    for layer, (q, k) in got.items():
        local = lm.model.config.attention_layers[layer] == "local"
        qk = q[0].double().numpy() @ k[0].double().numpy().transpose(0, 2, 1)  # no 1/sqrt(d)
        s = np.where((j <= i) & ((i - j < 3) | (not local)), qk, -np.inf)
        _assert_softmax_of(out.attentions[layer][0], s, float(np.abs(qk).max()))


@pytest.mark.parametrize("backend", ["tiles", "maps", "flex", "compiled"])
def test_gpt_neos_streaming_statistics_equal_the_maps(neo_lm, backend):
    lm = neo_lm
    seqs, targets = _docs(lm)
    st = LongContextStats(js_rows=3)
    stream_stats(lm, seqs, st, chunk=4, batch_size=2, targets=targets, backend=backend)
    assert_close(st.means(), reference(lm, seqs, targets, js_rows=3), stats_bound(seqs))


# -- Falcon (rotary): three ways of making its keys and values from one fused projection --------

FALCONS = {"multi-query": {"multi_query": True},  # one key/value head (the tiny default)
           "grouped": {"new_decoder_architecture": True, "num_kv_heads": 2},  # Falcon-40B's layout
           "multi-head": {"multi_query": False, "num_kv_heads": 4}}  # (as many as the query heads)


@pytest.fixture(scope="module", params=sorted(FALCONS))
def falcon_lm(request):
    from attnscope.models.tiny import build_tiny

    tokenizer = load_model("debug:falcon").tokenizer
    config = build_tiny("falcon", tokenizer).config
    for key, value in FALCONS[request.param].items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = type(build_tiny("falcon", tokenizer))(config).eval()
    with borrowed(model, tokenizer, name=f"debug:falcon ({request.param})") as lm:
        yield lm


def test_falcons_adapted_maps_and_outputs_are_its_own(falcon_lm):
    lm = falcon_lm
    assert supports_hooks(lm) and lm.facts.adapted and lm.facts.mechanisms == ()
    batch = _batch(lm)
    _assert_the_models_own(lm, batch, forward(lm, batch, attentions=True))


@pytest.mark.parametrize("backend", ["tiles", "maps"])
def test_falcons_streaming_statistics_equal_the_maps(falcon_lm, backend):
    lm = falcon_lm
    seqs, targets = _docs(lm)
    st = LongContextStats(js_rows=3)
    stream_stats(lm, seqs, st, chunk=4, batch_size=2, targets=targets, backend=backend)
    assert_close(st.means(), reference(lm, seqs, targets, js_rows=3), stats_bound(seqs))


def test_falcon_with_alibi_keeps_its_own_attention_and_gets_the_maps_only():
    from attnscope.models.tiny import build_tiny

    tokenizer = load_model("debug:falcon").tokenizer
    config = build_tiny("falcon", tokenizer).config
    config.alibi = True
    model = type(build_tiny("falcon", tokenizer))(config).eval()
    with borrowed(model, tokenizer) as lm:
        assert not supports_hooks(lm) and not adapters.adapted(model)


# -- a bias on the scores per query and key: MPNet's relative positions, DeBERTa-v2's c2p / p2c --

def _deberta_v3_like():
    """A tiny DeBERTa-v2 set as DeBERTa-v3 is (relative attention with both position terms, shared
    position keys, bucketed positions), adapted inside ``borrowed``."""
    from attnscope.models.tiny import build_tiny

    tokenizer = load_model("debug:deberta-v2").tokenizer
    config = build_tiny("deberta-v2", tokenizer).config
    config.update({"relative_attention": True, "pos_att_type": ["p2c", "c2p"], "share_att_key": True,
                   "position_buckets": 8, "max_relative_positions": -1, "norm_rel_ebd": "layer_norm"})
    torch.manual_seed(0)
    return type(build_tiny("deberta-v2", tokenizer))(config).eval(), tokenizer


@pytest.fixture(scope="module", params=["mpnet", "deberta", "deberta-v2"])
def biased_lm(request):
    if request.param in ("mpnet", "deberta"):  # (DeBERTa v1 with c2p and p2c terms)
        yield load_model(f"debug:{request.param}")
    else:
        model, tokenizer = _deberta_v3_like()
        with borrowed(model, tokenizer, name="debug:deberta-v2 (v3-like)") as lm:
            yield lm


def test_a_position_biased_models_maps_and_outputs_are_its_own(biased_lm):
    lm = biased_lm
    assert supports_hooks(lm) and lm.facts.adapted and "position-bias" in lm.facts.mechanisms
    batch = _batch(lm)
    seen = []
    ours = forward(lm, batch, attentions=True, hooks={"q": lambda site, q: seen.append(tuple(site.bias.shape))})
    B, T = batch.input_ids.shape
    assert seen == [(B, lm.num_heads, T, T)] * lm.num_layers  # the bias the hooks and backends read
    _assert_the_models_own(lm, batch, ours)


def test_a_position_biased_models_maps_are_the_softmax_of_its_scaled_scores_and_bias(biased_lm):
    # softmax(scale q.k + b_ij) in float64 from the hooks' q, k, scale and bias
    lm = biased_lm
    ids = lm.tokenizer(TEXTS[0])["input_ids"]
    got = {}
    out = forward(lm, pad_batch(lm, [ids]), attentions=True,
                  hooks={"k": lambda site, k: got.setdefault(site.layer, (site.query, k, site.scaling, site.bias))})
    for layer, (q, k, scale, bias) in got.items():
        s = scale * (q[0].double().numpy() @ k[0].double().numpy().transpose(0, 2, 1)) + bias[0].double().numpy()
        _assert_softmax_of(out.attentions[layer][0], s, float(np.abs(s).max()))


def test_a_position_biased_models_streaming_statistics_equal_the_maps_and_the_rest_are_refused(biased_lm):
    from attnscope.engines.streaming import maps_update

    lm = biased_lm
    ids = [lm.tokenizer(t)["input_ids"] for t in TEXTS]
    want = LongContextStats(js_rows=2, causal=False)
    maps_update(lm, ids, want, batch_size=3)
    for backend in ("tiles", "maps"):
        got = LongContextStats(js_rows=2, causal=False)
        stream_stats(lm, ids, got, batch_size=2, backend=backend)
        assert_close(got.means(), want.means(), stats_bound(ids))
    for backend in ("flex", "compiled"):
        with pytest.raises(AttnscopeError) as err:
            plan(lm, longest=64, engine="streaming", backend=backend)
        says(one_line(err.value), f"backend {backend}", "position-bias", "maps, tiles")


# -- the first BERT's attention kept inline (MegatronBERT, RemBERT, RoFormer, TAPAS, VisualBERT),
# -- XLM's and FlauBERT's, the first GPT's and XGLM's -------------------------------------------

#: model type -> the config changes of the variant (None: the tiny model as built)
INLINE = {"megatron-bert": None, "rembert": None, "roformer": None, "roformer (rotary values)": {"rotary_value": True},
          "tapas": None, "visual_bert": None, "xlm": None, "xlm (causal)": {"causal": True}, "flaubert": None,
          "openai-gpt": None, "xglm": None}


@pytest.fixture(scope="module", params=sorted(INLINE))
def inline_lm(request):
    from attnscope.models.tiny import build_tiny

    family = request.param.split(" ")[0]
    if INLINE[request.param] is None:
        yield load_model(f"debug:{family}")
        return
    tokenizer = load_model(f"debug:{family}").tokenizer
    config = build_tiny(family, tokenizer).config
    config.update(INLINE[request.param])
    torch.manual_seed(0)
    model = type(build_tiny(family, tokenizer))(config).eval()
    with borrowed(model, tokenizer, name=f"debug:{request.param}") as lm:
        yield lm


def test_an_inline_attentions_adapted_maps_and_outputs_are_the_models_own(inline_lm):
    # before the adapters these models got the maps only (their own attention code)
    lm = inline_lm
    assert supports_hooks(lm) and lm.facts.adapted and lm.facts.mechanisms == ()
    assert lm.facts.causal == (lm.name in ("debug:openai-gpt", "debug:xglm", "debug:xlm (causal)"))
    batch = _batch(lm)
    _assert_the_models_own(lm, batch, forward(lm, batch, attentions=True))


def test_an_inline_attentions_maps_are_the_softmax_of_its_scaled_scores(inline_lm):
    # softmax(scale q.k) over the keys j (j <= i for a causal model), in float64 from the hooks'
    # q, k and scale; RoFormer's rotary positions are in the hooks' q and k
    lm = inline_lm
    ids = lm.tokenizer(TEXTS[0])["input_ids"]
    got = {}
    out = forward(lm, pad_batch(lm, [ids]), attentions=True,
                  hooks={"k": lambda site, k: got.setdefault(site.layer, (site.query, k, site.scaling))})
    n = len(ids)
    future = np.arange(n)[None, :] > np.arange(n)[:, None]
    assert sorted(got) == list(range(lm.num_layers))
    for layer, (q, k, scale) in got.items():
        s = scale * (q[0].double().numpy() @ k[0].double().numpy().transpose(0, 2, 1))
        largest = float(np.abs(s).max())
        _assert_softmax_of(out.attentions[layer][0], np.where(future, -np.inf, s) if lm.facts.causal else s, largest)


@pytest.mark.parametrize("backend", ["tiles", "maps", "flex", "compiled"])
def test_an_inline_attentions_streaming_statistics_equal_the_maps(inline_lm, backend):
    from attnscope.engines.streaming import maps_update

    lm = inline_lm
    ids = [lm.tokenizer(t)["input_ids"] for t in TEXTS]
    want = LongContextStats(js_rows=2, causal=lm.facts.causal)
    maps_update(lm, ids, want, batch_size=3)
    got = LongContextStats(js_rows=2, causal=lm.facts.causal)
    stream_stats(lm, ids, got, batch_size=2, backend=backend)
    assert_close(got.means(), want.means(), stats_bound(ids))


def test_a_bert_with_cross_attention_keeps_its_own_attention_and_gets_the_maps_only():
    # its self- and cross-attention are one class: the adapter would hook both, so neither is adapted
    from attnscope.models.tiny import build_tiny

    tokenizer = load_model("debug:megatron-bert").tokenizer
    config = build_tiny("megatron-bert", tokenizer).config
    config.update({"is_decoder": True, "add_cross_attention": True})
    model = type(build_tiny("megatron-bert", tokenizer))(config).eval()
    with borrowed(model, tokenizer) as lm:
        assert not supports_hooks(lm) and not adapters.adapted(model)


def test_a_deberta_with_talking_heads_keeps_its_own_attention_and_gets_the_maps_only():
    # its heads' scores are mixed across heads before the softmax: no per-head attention to hand over
    import copy

    import transformers

    lm = load_model("debug:deberta")
    config = copy.deepcopy(lm.model.config)  # (not the loaded model's own)
    config.update({"talking_head": True})
    model = transformers.DebertaModel(config).eval()
    with borrowed(model, lm.tokenizer) as inside:
        assert not supports_hooks(inside) and not adapters.adapted(model)


@pytest.mark.parametrize("family", ["openai-gpt", "gpt_neo"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_banded_models_half_precision_maps_are_its_own_and_its_padding_is_masked_for_the_hooks(family, dtype):
    # fp16's lowest mask value (-65504) is a masked key too, and a pass without a mask adds none
    import dataclasses

    lm = load_model(f"debug:{family}")
    lm.model.to(dtype)
    try:
        batch = _batch(lm)
        allowed = []
        ours = forward(lm, batch, attentions=True,
                       hooks={"q": lambda site, q: allowed.append(site.allowed(0, site.query.shape[2]))})
        _assert_the_models_own(lm, batch, ours)
        n = int(batch.attention_mask[1].sum())  # the shorter sequence's tokens
        T = batch.input_ids.shape[1]
        want = torch.tril(torch.ones(T, T, dtype=torch.bool))
        want[:, n:] = False  # (its padded keys)
        if family == "gpt_neo" and lm.model.config.attention_layers[0] == "local":
            want &= torch.triu(torch.ones(T, T, dtype=torch.bool), -(lm.model.config.window_size - 1))
        assert torch.equal(allowed[0][1, 0], want)
        unmasked = dataclasses.replace(batch, attention_mask=None)
        with torch.inference_mode():
            own = lm.model(input_ids=batch.input_ids, output_attentions=True)
        ours = forward(lm, unmasked, attentions=True)
        assert all(torch.equal(a, b) for a, b in zip(ours.attentions, own.attentions))
    finally:
        lm.model.to(torch.float32)


def test_an_encoder_decoder_with_a_bert_line_decoder_is_not_adapted():
    # the decoder's config, not the composite's, has the cross-attention
    import transformers

    from attnscope.models.tiny import build_tiny

    tokenizer = load_model("debug:roformer").tokenizer
    config = build_tiny("roformer", tokenizer).config
    decoder = transformers.RoFormerConfig(**{**config.to_dict(), "is_decoder": True, "add_cross_attention": True})
    model = transformers.EncoderDecoderModel(encoder=transformers.RoFormerModel(config),
                                             decoder=transformers.RoFormerForCausalLM(decoder))
    assert not getattr(model.config, "add_cross_attention", False)
    assert not adapters.install(model, lambda *a, **k: None, lambda: False)
    assert not any("forward" in vars(m) for m in model.modules() if type(m).__name__ == "RoFormerSelfAttention")
