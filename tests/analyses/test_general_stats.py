"""Hand-computed values for token classes, relative position, special tokens and entropy, and
streamed == one-shot for any batching and merge (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import softmax_bound
from hypothesis import given, settings
from hypothesis import strategies as st

from attnscope.analyses import ANALYSES
from attnscope.analyses.entropy import Entropy, row_entropy
from attnscope.analyses.relative_position import RelativePosition
from attnscope.analyses.special_tokens import SpecialTokens
from attnscope.analyses.token_classes import TokenClasser
from attnscope.maps import AttentionBatch

# One head over [CLS] a . [SEP]; rows sum to 1.
A4 = np.array([[0.1, 0.2, 0.3, 0.4],
               [0.5, 0.0, 0.5, 0.0],
               [0.0, 1.0, 0.0, 0.0],
               [0.25, 0.25, 0.25, 0.25]])
T4 = ["[CLS]", "a", ".", "[SEP]"]
BERT = TokenClasser(first=frozenset({"[CLS]"}), separators=frozenset({"[SEP]"}))


def _one(analysis, make_map, attn=A4, tokens=T4, **kw):
    analysis.update(AttentionBatch([make_map(attn, tokens, **kw)]))
    return analysis.finalize()


# -- token classes ----------------------------------------------------------------------------
def test_classes_bert_names():
    k = BERT.classify(["[CLS]", "a", ".", ",", "[SEP]", "b", "[SEP]"],
                      np.array([1, 0, 0, 0, 1, 0, 1], bool))
    assert k.first.tolist() == [1, 0, 0, 0, 0, 0, 0]
    assert k.separator.tolist() == [0, 0, 0, 0, 1, 0, 1]
    assert k.period.tolist() == [0, 0, 1, 0, 0, 0, 0]
    assert k.comma.tolist() == [0, 0, 0, 1, 0, 0, 0]
    assert k.other.tolist() == [0, 1, 0, 0, 0, 1, 0]


def test_classes_positional_and_not_special_text():
    # a non-special "[SEP]" string (typed by a user) is not a separator; position decides specials
    k = TokenClasser.positional().classify(["<x>", "[SEP]", "Ġ.", "▁,", "<y>"],
                                           np.array([1, 0, 0, 0, 1], bool))
    assert k.first.tolist() == [1, 0, 0, 0, 0]
    assert k.separator.tolist() == [0, 0, 0, 0, 1]
    assert k.period.tolist() == [0, 0, 1, 0, 0]
    assert k.comma.tolist() == [0, 0, 0, 1, 0]


def test_classes_from_real_tokenizers(debug_bert, debug_roberta, debug_gpt2):
    from attnscope.extract import extract

    for lm, first, sep in ((debug_bert, "[CLS]", "[SEP]"), (debug_roberta, "<s>", "</s>")):
        classer = TokenClasser.from_tokenizer(lm.tokenizer)
        batch = next(extract([{"text": "the cat sat.", "text_pair": "a dog, ran"}], lm))
        m = batch.items[0]
        k = classer.classify_map(m)
        assert [m.tokens[i] for i in np.nonzero(k.first)[0]] == [first]
        seps = [m.tokens[i] for i in np.nonzero(k.separator)[0]]
        assert seps and set(seps) == {sep}
        assert seps.count(sep) == (2 if lm is debug_bert else 3)  # RoBERTa: <s> A </s></s> B </s>
        assert [TokenClasser.bare(m.tokens[i]) for i in np.nonzero(k.period)[0]] == ["."]
        assert [TokenClasser.bare(m.tokens[i]) for i in np.nonzero(k.comma)[0]] == [","]
    m = next(extract([{"text": "the cat sat, then ran."}], debug_gpt2)).items[0]
    k = TokenClasser.from_tokenizer(debug_gpt2.tokenizer).classify_map(m)
    assert not k.first.any() and not k.separator.any()  # GPT-2 adds no special tokens
    assert k.period.sum() == 1 and k.comma.sum() == 1


# -- relative position --------------------------------------------------------------------------
def test_relative_position_by_hand(map_factory):
    r = _one(RelativePosition(), map_factory)
    assert r.arrays["current"][0, 0] == pytest.approx((0.1 + 0.0 + 0.0 + 0.25) / 4)
    assert r.arrays["previous"][0, 0] == pytest.approx((0.5 + 1.0 + 0.25) / 3)
    assert r.arrays["next"][0, 0] == pytest.approx((0.2 + 0.5 + 0.0) / 3)
    paper = _one(RelativePosition(denominator="paper-code"), map_factory)
    assert paper.arrays["previous"][0, 0] == pytest.approx((0.5 + 1.0 + 0.25) / 4)
    assert paper.arrays["next"][0, 0] == pytest.approx((0.2 + 0.5 + 0.0) / 4)
    assert r.tables["relative_position"][0]["name"] == "1-1"


def test_relative_position_mean_of_example_means(map_factory):
    a = RelativePosition()
    eye3 = np.eye(3, k=-1)
    eye3[0, 0] = 1.0  # previous token everywhere it exists
    a.update(AttentionBatch([map_factory(eye3, ["x", "y", "z"]), map_factory(A4, T4)]))
    prev = a.finalize().arrays["previous"][0, 0]
    assert prev == pytest.approx((1.0 + 1.75 / 3) / 2)


def test_relative_position_summary_names_heads(map_factory):
    attn = np.zeros((2, 3, 3, 3))
    attn[:, :] = np.eye(3)  # current token
    attn[1, 2] = np.eye(3, k=-1)
    attn[1, 2, 0, 0] = 1.0
    r = _one(RelativePosition(), map_factory, attn=attn, tokens=["a", "b", "c"])
    assert "1 heads" in r.summary[0] and "2-3" in r.summary[0]


# -- special tokens --------------------------------------------------------------------------
def test_special_tokens_by_hand(map_factory):
    r = _one(SpecialTokens(BERT), map_factory)
    v = {k: r.arrays[k][0, 0] for k in r.arrays}
    assert v["first"] == pytest.approx((0.1 + 0.5 + 0.0 + 0.25) / 4)
    assert v["separator"] == pytest.approx((0.4 + 0.0 + 0.0 + 0.25) / 4)
    assert v["period"] == pytest.approx((0.3 + 0.5 + 0.0 + 0.25) / 4)
    assert v["comma"] == 0.0
    assert v["punct"] == pytest.approx(v["period"])
    assert v["sep_to_sep"] == pytest.approx(0.25 / 1)  # one separator row
    assert v["other_to_sep"] == pytest.approx((0.4 + 0.0 + 0.0) / 3)
    paper = _one(SpecialTokens(BERT, denominator="paper-code"), map_factory)
    assert paper.arrays["sep_to_sep"][0, 0] == pytest.approx(0.25 / 2)
    assert paper.arrays["other_to_sep"][0, 0] == pytest.approx(0.4 / 2)


def test_special_tokens_without_separators(map_factory):
    attn = np.full((3, 3), 1 / 3)
    r = _one(SpecialTokens(TokenClasser()), map_factory, attn=attn, tokens=["a", "b", "c"],
             special=np.zeros(3, bool))
    assert np.isnan(r.arrays["sep_to_sep"][0, 0])  # no example defines it
    assert r.arrays["separator"][0, 0] == 0.0
    assert r.meta["examples_with_separators"] == 0
    assert any("no separator" in s for s in r.summary)


# -- entropy ----------------------------------------------------------------------------------
def test_entropy_by_hand(map_factory):
    r = _one(Entropy(), map_factory)
    h0 = -(0.1 * math.log(0.1) + 0.2 * math.log(0.2) + 0.3 * math.log(0.3) + 0.4 * math.log(0.4))
    rows = [h0, math.log(2), 0.0, math.log(4)]
    # the map holds float32 rows of 4 keys: their entropy against float64 (rows <= 4 keys)
    assert r.arrays["entropy"][0, 0] == pytest.approx(sum(rows) / 4, abs=softmax_bound(4))
    assert r.arrays["entropy_first"][0, 0] == pytest.approx(h0, abs=softmax_bound(4))
    assert r.arrays["max_weight"][0, 0] == pytest.approx((0.4 + 0.5 + 1.0 + 0.25) / 4)
    assert r.arrays["rows_max_below"][0, 0] == 0.0
    assert r.meta["uniform_entropy"] == pytest.approx(math.log(4))


def test_entropy_causal_uniform_reference(map_factory):
    tril = np.tril(np.ones((3, 3)))
    attn = tril / tril.sum(1, keepdims=True)  # uniform over the visible keys
    r = _one(Entropy(causal=True), map_factory, attn=attn, tokens=["a", "b", "c"])
    expected = (math.log(1) + math.log(2) + math.log(3)) / 3
    assert r.meta["uniform_entropy"] == pytest.approx(expected)
    assert r.arrays["entropy"][0, 0] == pytest.approx(expected, abs=softmax_bound(3))  # float32 rows of 3 keys


def test_row_entropy_broad_rows():
    flat = np.full((1, 20), 1 / 20)
    assert row_entropy(flat)[0] == pytest.approx(math.log(20), abs=softmax_bound(20))  # float32 at worst
    r = Entropy(max_weight_threshold=0.1)
    r._add(flat[None, None].repeat(20, axis=2))
    assert r.finalize().arrays["rows_max_below"][0, 0] == 1.0


# -- streaming == one-shot --------------------------------------------------------------------
@st.composite
def map_lists(draw):
    from conftest import make_map

    L, H = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    k = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    maps = []
    for i in range(k):
        n = int(rng.integers(2, 7))
        attn = rng.dirichlet(np.full(n, 0.5), size=(L, H, n))
        tokens = ["[CLS]"] + [str(rng.choice(["a", ".", ",", "b"])) for _ in range(n - 2)] + ["[SEP]"]
        maps.append(make_map(attn, tokens, index=i))
    cuts = sorted(draw(st.lists(st.integers(0, k), max_size=3)))
    return maps, cuts


def _factories():
    from attnscope.analyses.distances import HeadDistances

    return [lambda: RelativePosition(), lambda: SpecialTokens(BERT), lambda: Entropy(),
            lambda: HeadDistances()]


@settings(max_examples=40, deadline=None)
@given(map_lists())
def test_streamed_equals_one_shot(data):
    maps, cuts = data
    for factory in _factories():
        whole = factory()
        whole.update(AttentionBatch(maps))
        expected = whole.finalize()
        bounds = [0] + cuts + [len(maps)]
        parts = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            a = factory()
            for m in maps[lo:hi]:  # one batch per map inside a part
                a.update(AttentionBatch([m]))
            parts.append(a)
        merged = parts[0]
        for p in parts[1:]:
            merged.merge(p)
        got = merged.finalize()
        assert set(got.arrays) == set(expected.arrays)
        for key in expected.arrays:
            np.testing.assert_allclose(got.arrays[key], expected.arrays[key], rtol=1e-9, atol=1e-12,
                                       equal_nan=True, err_msg=f"{factory().name}:{key}")


def test_merge_is_associative(map_factory):
    rng = np.random.default_rng(3)
    maps = [map_factory(rng.dirichlet(np.ones(4), size=(1, 2, 4)), T4, index=i) for i in range(3)]
    def part(i):
        a = SpecialTokens(BERT)
        a.update(AttentionBatch([maps[i]]))
        return a
    left = part(0).merge(part(1)).merge(part(2)).finalize()
    right = part(0).merge(part(1).merge(part(2))).finalize()
    for k in left.arrays:
        np.testing.assert_allclose(left.arrays[k], right.arrays[k], rtol=1e-12, equal_nan=True)


def test_merge_refuses_other_parameters():
    with pytest.raises(ValueError):
        RelativePosition().merge(RelativePosition(denominator="paper-code"))


@pytest.mark.parametrize("name", ["relative-position", "special-tokens", "entropy", "head-distances"])
def test_contract_empty_one_and_json(name, map_factory):
    from attnscope.analyses.base import Result

    cls = ANALYSES[name]
    empty = cls().finalize()
    assert empty.summary == ["no examples"] and not empty.arrays
    a = cls()
    batch = AttentionBatch([map_factory(A4, T4)])
    before = batch.items[0].attn.copy()
    a.update(batch)
    np.testing.assert_array_equal(batch.items[0].attn, before)  # never mutates the batch
    r = a.finalize()
    back = Result.from_json(r.to_json())
    for k in r.arrays:
        np.testing.assert_array_equal(back.arrays[k], r.arrays[k])
    assert a.finalize().to_json() == r.to_json()  # finalize does not change the state
