"""Tests that guard the headline claims: each would fail if the fix behind a claim broke.

Values are worked out independently of the code under test: by an explicit loop over the
paper's formula, by a direct call of the Hugging Face model, or by hand.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import make_map, softmax_bound, sum_bound  # noqa: E402

from attnscope.analyses.probes.features import ProbeBatch, SentenceSource  # noqa: E402
from attnscope.analyses.probes.models import (  # noqa: E402
    AttentionGloveProbe,
    AttentionProbe,
    DistanceGloveMLP,
)
from attnscope.analyses.probes.training import evaluate  # noqa: E402
from attnscope.data.records import Example  # noqa: E402
from attnscope.extract import extract  # noqa: E402
from attnscope.maps import AttentionBatch  # noqa: E402


# -- corrected segment ids ----------------------------------------------------------------------
def test_pairs_get_segment_ids_0_and_1_in_the_model(debug_bert):
    """``[CLS] A [SEP] B [SEP]`` must reach the model with token type ids 0...0 1...1, as BERT
    was trained (the paper's code sets all to 0)."""
    tok, model = debug_bert.tokenizer, debug_bert.model
    ex = {"text": "the cat sat", "text_pair": "a dog ran"}
    m = next(iter(extract([ex], debug_bert))).items[0]
    ids = tok("the cat sat", "a dog ran")["input_ids"]
    # [CLS] the cat sat [SEP] | a dog ran [SEP]: 5 tokens of segment 0, 4 of segment 1
    types = [0] * 5 + [1] * 4
    assert len(ids) == 9 and m.segment.tolist() == types
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types]),
                    output_attentions=True)
        zeros = model(input_ids=torch.tensor([ids]), token_type_ids=torch.zeros(1, 9, dtype=torch.long),
                      output_attentions=True)
    want = torch.stack(out.attentions)[:, 0].numpy()  # [L H n n]
    other = torch.stack(zeros.attentions)[:, 0].numpy()
    assert not np.allclose(want, other, atol=1e-4)  # the debug model does tell the segments apart
    np.testing.assert_allclose(m.attn, want, atol=softmax_bound(9), rtol=0)  # float32 rows of 9 keys, two passes


# -- the probes' formulas, by explicit loops --------------------------------------------------
def _random_batch(B=2, K=3, M=5, V=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    attn = torch.rand(B, K, M, M, generator=g)
    glove = torch.randint(0, V, (B, M), generator=g)
    glove[:, 0] = -1  # ROOT
    return ProbeBatch(attn, glove, None, None, None, None)


def _randomise(module, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g))


def test_attention_glove_probe_is_the_paper_formula_with_each_words_own_vector():
    """s(i, j) = sum_k W_k (v_i ; v_j) a_k[i, j] + U_k (v_i ; v_j) a_k[j, i] (+ per-head bias),
    i the candidate, j the dependent, each with its OWN vector."""
    B, K, M, d = 2, 3, 5, 4
    vectors = np.random.default_rng(0).normal(size=(7, d)).astype(np.float32)
    probe = AttentionGloveProbe(K, vectors)
    _randomise(probe)
    b = _random_batch(B, K, M)
    got = probe(b).detach().numpy()  # [B j i]
    table = probe.vectors.table.numpy()
    root = probe.vectors.root.detach().numpy()
    Wc, bc = probe.cand.weight.detach().numpy(), probe.cand.bias.detach().numpy()  # [2K d], [2K]
    Wd = probe.dep.weight.detach().numpy()
    a = b.attn.numpy()
    for bi in range(B):
        vec = [root if int(b.glove[bi, u]) < 0 else table[int(b.glove[bi, u])] for u in range(M)]
        for j in range(M):
            for i in range(M):
                z = Wc @ vec[i] + bc + Wd @ vec[j]  # the pair's 2K head weights
                want = sum(z[k] * a[bi, k, i, j] + z[K + k] * a[bi, k, j, i] for k in range(K))
                # float32 sums in another order: 2d + 1 terms of z, then 2K, of these sizes
                za = np.abs(Wc) @ np.abs(vec[i]) + np.abs(bc) + np.abs(Wd) @ np.abs(vec[j])
                size = sum(za[k] * a[bi, k, i, j] + za[K + k] * a[bi, k, j, i] for k in range(K))
                assert got[bi, j, i] == pytest.approx(want, rel=0, abs=sum_bound(2 * d + 1 + 2 * K, float(size)))


def test_attention_probe_formula():
    K, M = 3, 4
    probe = AttentionProbe(K)
    _randomise(probe)
    b = _random_batch(1, K, M)
    got = probe(b).detach().numpy()
    w, u, a = probe.w.detach().numpy(), probe.u.detach().numpy(), b.attn.numpy()
    for j in range(M):
        for i in range(M):
            want = sum(w[k] * a[0, k, i, j] + u[k] * a[0, k, j, i] for k in range(K))
            size = sum(abs(w[k]) * a[0, k, i, j] + abs(u[k]) * a[0, k, j, i] for k in range(K))
            assert got[0, j, i] == pytest.approx(want, rel=0, abs=sum_bound(2 * K, float(size)))  # 2K float32 terms


def test_distance_glove_mlp_uses_the_distance_features():
    """s(i, j) = w2 . relu(W1 (v_i ; v_j ; dist(i, j)) + b1), distance features by hand."""
    M, d, hidden = 8, 3, 6
    vectors = np.random.default_rng(1).normal(size=(7, d)).astype(np.float32)
    mlp = DistanceGloveMLP(vectors, hidden)
    _randomise(mlp)
    b = _random_batch(1, 1, M)
    got = mlp(b).detach().numpy()[0]
    table, root = mlp.vectors.table.numpy(), mlp.vectors.root.detach().numpy()
    vec = [root if int(b.glove[0, u]) < 0 else table[int(b.glove[0, u])] for u in range(M)]
    Wc, bc = mlp.cand.weight.detach().numpy(), mlp.cand.bias.detach().numpy()
    Wd, Wf = mlp.dep.weight.detach().numpy(), mlp.dist.weight.detach().numpy()
    w2 = mlp.out.weight.detach().numpy()[0]

    def feats(j, i):  # 5 "ahead" indicators, 5 "behind", |delta|/10 ahead and behind, ROOT
        f = np.zeros(13)
        if i == 0:
            f[12] = 1.0
            return f
        delta = i - j
        if 1 <= delta <= 5:
            f[delta - 1] = 1.0
        if -5 <= delta <= -1:
            f[5 + (-delta) - 1] = 1.0
        f[10], f[11] = max(delta, 0) / 10, max(-delta, 0) / 10
        return f

    for j in range(1, M):
        for i in range(M):
            h = Wc @ vec[i] + bc + Wd @ vec[j] + Wf @ feats(j, i)
            # float32 sums in another order: the layer's 2d + 13 + 1 terms, then the output's
            ha = np.abs(Wc) @ np.abs(vec[i]) + np.abs(bc) + np.abs(Wd) @ np.abs(vec[j]) + np.abs(Wf) @ feats(j, i)
            bound = sum_bound(2 * d + 14 + hidden, float(np.abs(w2) @ ha))
            assert got[j, i] == pytest.approx(float(w2 @ np.maximum(h, 0)), rel=0, abs=bound)


# -- punctuation is not scored ------------------------------------------------------------------
def test_probe_uas_leaves_out_punct_dependents():
    # "a b ." with heads b, ROOT, b; "." is punct. Head 0 of the map points every word to its
    # gold head except "." (to "a"); a probe with w = 0, u = [1] follows that head exactly.
    toks = ["[CLS]", "a", "b", ".", "[SEP]"]
    a = np.full((5, 5), 0.01)
    a[1, 2] = a[2, 0] = a[3, 1] = 1.0  # a -> b, b -> [CLS] (ROOT), . -> a (wrong)
    a /= a.sum(-1, keepdims=True)
    ex = Example(words=["a", "b", "."], heads=[2, 0, 2], relns=["dep", "root", "punct"],
                 upos=["X", "X", "X"])  # UPOS says nothing: the relation decides
    m = make_map(a, toks, example=ex)
    src = SentenceSource(lambda: [AttentionBatch([m])])
    probe = AttentionProbe(1)
    with torch.no_grad():
        probe.u.fill_(1.0)
    assert evaluate(probe, src) == (2, 2)  # 2 of 2 scored; "." would make it 2 of 3


def test_an_untrained_probe_predicts_nothing():
    # all scores 0: every candidate ties, so no dependent is credited (np.argmax would give
    # ROOT to every word, right for the root word)
    toks = ["[CLS]", "a", "b", "[SEP]"]
    ex = Example(words=["a", "b"], heads=[2, 0], relns=["dep", "root"])
    m = make_map(np.full((4, 4), 0.25), toks, example=ex)
    assert evaluate(AttentionProbe(1), SentenceSource(lambda: [AttentionBatch([m])])) == (0, 2)
