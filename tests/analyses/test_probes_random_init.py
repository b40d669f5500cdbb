"""The random-init baseline: same architecture, new weights, pretrained embeddings kept."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import softmax_bound

torch = pytest.importorskip("torch")

from attnscope.analyses.probes.random_init import random_init_model  # noqa: E402
from attnscope.extract.runner import extract  # noqa: E402


@pytest.mark.parametrize("fixture", ["debug_bert", "debug_gpt2"])
def test_weights_new_embeddings_kept(request, fixture):
    lm = request.getfixturevalue(fixture)
    r = random_init_model(lm, seed=0)
    emb, remb = lm.model.get_input_embeddings().weight, r.model.get_input_embeddings().weight
    assert torch.equal(emb, remb)
    differ = [n for (n, p), (_, q) in zip(lm.model.named_parameters(), r.model.named_parameters())
              if p.shape == q.shape and not torch.equal(p, q)]
    assert differ and all("emb" not in n and "wte" not in n and "wpe" not in n for n in differ)
    again = random_init_model(lm, seed=0)
    assert all(torch.equal(p, q) for p, q in zip(r.model.parameters(), again.model.parameters()))
    assert r.weights_hash != lm.weights_hash


def test_random_twin_extracts_other_attention(debug_bert):
    ex = [{"words": ["the", "cat", "sat"]}]
    a = next(iter(extract(ex, debug_bert, word_level=True))).items[0].attn
    b = next(iter(extract(ex, random_init_model(debug_bert, 0), word_level=True))).items[0].attn
    assert a.shape == b.shape and not np.allclose(a, b)
    n = len(debug_bert.tokenizer(" ".join(ex[0]["words"]))["input_ids"])  # a word row sums a token row
    np.testing.assert_allclose(b.sum(-1), 1.0, atol=softmax_bound(n), rtol=0)
