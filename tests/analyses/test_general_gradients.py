"""Gradient importance: autograd against finite differences, BERT-style masking, streaming."""

from __future__ import annotations

import numpy as np
import pytest

from attnscope.analyses.gradients import (
    GRAD_CLASSES,
    FitOptions,
    GradientImportance,
    MlmScorer,
    attention_gradients,
    fit_mlm_head,
    mask_like_bert,
    prepare_masked,
)
from attnscope.errors import ModelError


@pytest.fixture(scope="module")
def mlm():
    from attnscope.models import load_model

    return load_model("debug:bert", mlm_head=True)


def _example(lm, text="the cat sat on the mat.", pair="a dog ran"):
    enc = lm.tokenizer(text, pair)
    tokens = lm.tokenizer.convert_ids_to_tokens(enc["input_ids"])
    special = np.array([i in lm.tokenizer.all_special_ids for i in enc["input_ids"]])
    return tokens, special, np.array(enc["token_type_ids"])


def test_gradients_match_finite_differences():
    """Perturb one attention weight inside the model and compare the loss change with autograd."""
    import torch
    from transformers import AttentionInterface
    from transformers.models.bert.modeling_bert import eager_attention_forward

    from attnscope.models import load_model

    lm = load_model("debug:bert", mlm_head=True)
    lm.model.double()
    tokens, special, segment = _example(lm)
    x = prepare_masked(lm, tokens, special, segment, 0, seed=0, prob=0.3)
    grad = attention_gradients(MlmScorer(lm), [x])[0]  # [L H n n]

    probe = {"where": None, "delta": 0.0}
    layer_of = {id(layer.attention.self): i for i, layer in enumerate(lm.model.bert.encoder.layer)}

    def perturbed(module, query, key, value, attention_mask, **kw):
        out, w = eager_attention_forward(module, query, key, value, attention_mask, **kw)
        if probe["where"] is not None and layer_of[id(module)] == probe["where"][0]:
            _, h, i, j = probe["where"]
            w = w.clone()
            w[0, h, i, j] += probe["delta"]
            out = torch.matmul(w, value).transpose(1, 2).contiguous()
        return out, w

    AttentionInterface.register("attnscope_fd_probe", perturbed)
    for module in lm.model.modules():
        if hasattr(module, "config"):
            module.config._attn_implementation = "attnscope_fd_probe"

    def loss() -> float:
        ids = torch.tensor([x.input_ids])
        with torch.no_grad():
            logits = lm.model(input_ids=ids, token_type_ids=torch.tensor([x.token_type_ids]),
                              attention_mask=torch.ones_like(ids)).logits
        logp = torch.log_softmax(logits, -1)[0]
        return float(-logp[torch.as_tensor(x.masked), torch.as_tensor(x.targets)].mean())

    eps = 1e-6
    rng = np.random.default_rng(0)
    L, H, n, _ = grad.shape
    checked = 0
    for where in [(0, 0, 1, 2), (0, 1, 0, 0), (1, 0, int(x.masked[0]), 3)] + [
            tuple(int(v) for v in (rng.integers(L), rng.integers(H), rng.integers(n), rng.integers(n)))
            for _ in range(5)]:
        probe.update(where=where, delta=eps)
        up = loss()
        probe.update(delta=-eps)
        down = loss()
        fd = (up - down) / (2 * eps)
        assert grad[where] == pytest.approx(fd, rel=1e-4, abs=1e-9), where
        checked += abs(fd) > 1e-8
    assert checked >= 3  # not only zeros were compared


def test_masking_like_bert():
    special = np.zeros(100, bool)
    special[[0, 50, 99]] = True
    ids = list(range(1000, 1100))
    rng = np.random.default_rng(0)
    new, pos = mask_like_bert(ids, special, rng, mask_id=7, vocab_size=2000, avoid={7}, prob=0.15)
    assert len(pos) == round(0.15 * 97) and not special[pos].any()
    assert len(set(pos.tolist())) == len(pos)
    changed = [p for p in range(100) if new[p] != ids[p]]
    assert set(changed) <= set(pos.tolist())
    assert sum(new[p] == 7 for p in pos) >= len(pos) // 2  # about 80% become the mask token
    # over many draws: 80 / 10 / 10
    kinds = {"mask": 0, "random": 0, "same": 0}
    for s in range(400):
        new, pos = mask_like_bert(ids, special, np.random.default_rng(s), mask_id=7, vocab_size=2000,
                                  avoid={7}, prob=0.15)
        for p in pos:
            kinds["mask" if new[p] == 7 else "same" if new[p] == ids[p] else "random"] += 1
    total = sum(kinds.values())
    assert abs(kinds["mask"] / total - 0.8) < 0.03
    assert abs(kinds["random"] / total - 0.1) < 0.03
    # at least one token even for a tiny example; none when all are special
    _, pos = mask_like_bert([1, 2, 3], np.array([1, 0, 1], bool), rng, mask_id=7, vocab_size=10, avoid=set())
    assert pos.tolist() == [1]
    _, pos = mask_like_bert([1, 2], np.array([1, 1], bool), rng, mask_id=7, vocab_size=10, avoid=set())
    assert pos.size == 0


def test_masking_is_seeded_per_example(mlm):
    tokens, special, segment = _example(mlm)
    a = prepare_masked(mlm, tokens, special, segment, 5, seed=1, prob=0.3)
    b = prepare_masked(mlm, tokens, special, segment, 5, seed=1, prob=0.3)
    assert a.input_ids == b.input_ids and a.masked.tolist() == b.masked.tolist()
    others = [prepare_masked(mlm, tokens, special, segment, i, seed=1, prob=0.3).input_ids for i in range(6)]
    assert len({tuple(o) for o in others}) > 1


def test_streamed_equals_one_shot_and_classes(mlm):
    from attnscope.extract import extract

    texts = [{"text": "the cat sat.", "text_pair": "a dog, ran"}, {"text": "he saw the big red house."},
             {"text": "she said it was old, then new.", "text_pair": "the man ran"}]
    from attnscope.extract.encode import Encoder

    maps = [m for b in extract(texts, mlm, batch_size=1) for m in b]
    encoded = [Encoder(mlm).encode(m.example, m.index) for m in maps]
    scorer = MlmScorer(mlm)
    whole = GradientImportance(scorer, seed=0)
    whole.update(encoded)
    parts = [GradientImportance(scorer, seed=0, batch_size=1) for _ in maps]
    for p, e in zip(parts, encoded):
        p.update([e])
    merged = parts[0].merge(parts[1]).merge(parts[2])
    a, b = whole.finalize(), merged.finalize()
    for key in a.arrays:
        np.testing.assert_allclose(a.arrays[key], b.arrays[key], rtol=1e-4, atol=1e-9)
    assert set(GRAD_CLASSES) <= {k.removeprefix("layer_") for k in a.arrays}
    counts = a.meta["entries_per_head"]
    n_total = sum(m.num_units for m in maps)
    # every (row, key) entry of every head is counted once, in exactly one class
    assert sum(counts.values()) == sum(m.num_units ** 2 for m in maps)
    assert counts["separator"] == sum(m.num_units * int((np.array(m.tokens) == "[SEP]").sum()) for m in maps)
    assert n_total > 0 and a.tables["gradient_importance"][0]["name"] == "1"
    assert np.isfinite(a.arrays["layer_separator"]).all() and (a.arrays["layer_other"] > 0).all()


def test_no_head_is_refused_clearly(debug_bert, debug_gpt2):
    with pytest.raises(ModelError, match="no masked-LM head"):
        MlmScorer(debug_bert)
    with pytest.raises(ModelError, match="causal"):
        MlmScorer(debug_gpt2)


def test_fit_head_is_seeded_and_reports_accuracy(debug_bert):
    from attnscope.extract import extract

    texts = [{"text": "the cat sat on the mat and the dog ran to the house."}] * 6
    maps = [m for b in extract(texts, debug_bert) for m in b]
    enc = [(m.tokens, m.special, m.segment, m.index) for m in maps]
    opts = FitOptions(steps=10, seed=3)
    h1 = fit_mlm_head(debug_bert, enc, opts)
    h2 = fit_mlm_head(debug_bert, enc, opts)
    assert h1.report == h2.report
    assert 0.0 <= h1.report["heldout_accuracy"] <= 1.0 and h1.report["masked_tokens"] > 0
    scorer = MlmScorer(debug_bert, h1)
    g = GradientImportance(scorer, seed=0)
    from attnscope.extract.encode import Encoder

    g.update([Encoder(debug_bert).encode(m.example, m.index) for m in maps[:2]])
    r = g.finalize()
    assert r.params["scorer"]["head"] == "fitted" and any("fitted" in s for s in r.summary)
    assert np.isfinite(r.arrays["layer_other"]).all()
