"""Neuron view: query/key vectors captured with hooks from the family table, checked against
the model's own attention (a different code path) and against the projections recomputed
from the hidden states."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import one_line, says, softmax_bound, sum_bound, weights_tolerance

from attnscope.errors import AttnscopeError
from attnscope.viz.encoding import decode
from attnscope.viz.neuron import capture_qk, neuron_payload

TEXT = "the cat sat on the mat because it was big"


def _tiny(family: str):
    """A tiny random model of a family that has no debug builder (BERT WordPiece vocabulary)."""
    import torch
    import transformers

    from attnscope.models.debug import _wordpiece_tokenizer
    from attnscope.models.families import family_for
    from attnscope.models.loading import LoadedModel

    tok = _wordpiece_tokenizer()
    common = dict(vocab_size=len(tok), max_position_embeddings=160)
    if family == "distilbert":
        cfg = transformers.DistilBertConfig(dim=32, n_layers=2, n_heads=2, hidden_dim=64, **common)
        cls = transformers.DistilBertModel
    elif family == "mpnet":
        cfg = transformers.MPNetConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=64, pad_token_id=0, **common)
        cls = transformers.MPNetModel
    elif family == "albert":
        cfg = transformers.AlbertConfig(embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, intermediate_size=64, **common)
        cls = transformers.AlbertModel
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = cls(cfg).eval()
    return LoadedModel(model=model, tokenizer=tok, family=family_for(cfg.model_type),
                       name=f"tiny:{family}", source="test", weights_hash="test")


@pytest.fixture(scope="module")
def tiny_models():
    return {f: _tiny(f) for f in ("distilbert", "mpnet", "albert")}


def _extracted_attention(lm, layer):
    from attnscope.extract.runner import extract

    return next(iter(extract([{"text": TEXT}], lm))).items[0].attn[layer]  # [H n n]


def _bound(qk) -> float:
    """The float64 softmax of the captured float32 q and k against the model's float32 attention:
    a softmax row of n keys (softmax_bound) of scores that the model sums over d products in
    float32 (sum_bound, of the size of those products)."""
    H, n, d = qk.query.shape
    scale = qk.scaling if qk.scaling is not None else 1.0 / np.sqrt(d)
    size = float((np.abs(qk.query.astype(np.float64)) @ np.abs(qk.key.astype(np.float64)).transpose(0, 2, 1)).max() * scale)
    return softmax_bound(n, size) + sum_bound(d, size)


@pytest.mark.parametrize("name", ["debug_bert", "debug_roberta", "debug_gpt2"])
def test_softmax_of_captured_qk_is_the_models_attention(name, request):
    lm = request.getfixturevalue(name)
    for layer in range(lm.num_layers):
        qk = capture_qk(lm, TEXT, layer)
        H, n, d = qk.query.shape
        assert (H, d) == (lm.num_heads, lm.model.config.hidden_size // lm.num_heads)
        np.testing.assert_allclose(qk.softmax(), _extracted_attention(lm, layer), atol=_bound(qk), rtol=0)


@pytest.mark.parametrize("family", ["distilbert", "albert"])
def test_other_families(family, tiny_models):
    lm = tiny_models[family]
    qk = capture_qk(lm, TEXT, 1)  # ALBERT shares its modules: the 2nd call is layer 1
    np.testing.assert_allclose(qk.softmax(), _extracted_attention(lm, 1), atol=_bound(qk), rtol=0)
    assert neuron_payload(qk)["softmax_matches_model"]


def test_mpnet_vectors_and_its_position_bias(tiny_models):
    import torch

    lm = tiny_models["mpnet"]
    qk = capture_qk(lm, TEXT, 1)
    # q and k recomputed from the layer's input hidden states with the projection weights
    enc = lm.tokenizer(TEXT, return_tensors="pt")
    with torch.inference_mode():
        hs = lm.model(**enc, output_hidden_states=True).hidden_states[1][0]  # [n hidden]
        attn_mod = lm.model.encoder.layer[1].attention.attn
        q = attn_mod.q(hs).numpy().reshape(len(hs), 2, 16).transpose(1, 0, 2)
        k = attn_mod.k(hs).numpy().reshape(len(hs), 2, 16).transpose(1, 0, 2)
        # float32 projections: sums of 32 products (and the bias), summed in another order
        size = max(float((hs.abs() @ m.weight.abs().T).max() + m.bias.abs().max()) for m in (attn_mod.q, attn_mod.k))
    np.testing.assert_allclose(qk.query, q, atol=sum_bound(hs.shape[-1] + 1, size), rtol=0)
    np.testing.assert_allclose(qk.key, k, atol=sum_bound(hs.shape[-1] + 1, size), rtol=0)
    p = neuron_payload(qk)
    # MPNet adds a relative-position bias before the softmax: measured, stated, model's kept
    assert not p["softmax_matches_model"] and "adds terms" in p["note"]
    # the model's float32 rows in two passes (the capture's and the extraction's)
    np.testing.assert_allclose(decode(p["model_attn"]), _extracted_attention(lm, 1), atol=softmax_bound(qk.attn.shape[-1]), rtol=0)


def test_gpt2_is_causal(debug_gpt2):
    qk = capture_qk(debug_gpt2, TEXT, 0)
    soft = qk.softmax()
    n = soft.shape[-1]
    assert np.all(soft[:, np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] == 0)
    p = neuron_payload(qk, head=1, query=2)
    assert p["selected"]["dots"][3:] == [None] * (n - 3)
    assert p["causal"] and p["softmax_matches_model"]


def test_selected_values_are_consistent(debug_bert):
    qk = capture_qk(debug_bert, TEXT, 1)
    p = neuron_payload(qk, head=1, query=3)
    sel = p["selected"]
    d = p["head_dim"]
    prods = np.asarray(sel["products"])  # [n d]
    # a dot product sums d products, in float32 at worst
    np.testing.assert_allclose(prods.sum(-1) / np.sqrt(d), sel["dots"], rtol=0,
                               atol=sum_bound(d, float(np.abs(prods).sum(-1).max())) / np.sqrt(d))
    e = np.exp(np.asarray(sel["dots"]) - max(sel["dots"]))
    np.testing.assert_allclose(sel["softmax"], e / e.sum(), **weights_tolerance(len(e)))  # a softmax row
    np.testing.assert_array_equal(decode(p["query"]), qk.query)
    assert p["tokens"][0] == "[CLS]" and p["special"][0]


def test_errors(debug_bert):
    from dataclasses import replace

    with pytest.raises(AttnscopeError) as e:
        capture_qk(debug_bert, TEXT, 5)
    says(one_line(e.value), "neuron view", "layer 5", "out of range", "2 layers")
    qk = capture_qk(debug_bert, TEXT, 0)
    with pytest.raises(AttnscopeError) as e:
        neuron_payload(qk, head=2)
    says(one_line(e.value), "neuron view", "head 2", "out of range", "2 heads")
    # Families routed through the forward helper need no module paths: q and k come from its
    # hook points, and softmax(q.k * scaling) is still the model's attention.
    bare = replace(debug_bert, family=replace(debug_bert.family, query=None, key=None))
    qk = capture_qk(bare, TEXT, 0)
    np.testing.assert_allclose(qk.softmax(), qk.attn, atol=_bound(qk), rtol=0)
