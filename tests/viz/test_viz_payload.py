"""Unit tests on the view payloads (dicts, not markup): shapes, pair filters, hiding special
tokens, word level, thumbnails, blobs and safe JSON embedding."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import EPS32, make_map, one_line, says, softmax_bound
from hypothesis import given, settings
from hypothesis import strategies as st

from attnscope.errors import AttnscopeError
from attnscope.viz.encoding import decode, encode_f32, encode_u8
from attnscope.viz.payload import (
    head_payload,
    heatmap_payload,
    model_payload,
    page_payload,
    pool,
    visible_units,
)
from attnscope.viz.render import embed_json


def _random_attn(rng, L, H, n):
    a = rng.random((L, H, n, n)) + 0.01
    return a / a.sum(-1, keepdims=True)


PAIR_TOKENS = ["[CLS]", "a", "b", "[SEP]", "c", "[SEP]"]
PAIR_SPECIAL = [True, False, False, True, False, True]
PAIR_SEGMENT = [0, 0, 0, 0, 1, 1]


def test_head_payload_shapes_and_values(map_factory):
    rng = np.random.default_rng(0)
    attn = _random_attn(rng, 2, 3, 5)
    m = map_factory(attn, ["[CLS]", "x", "y", "z", "[SEP]"])
    p = head_payload(m, layer=1, heads=[0, 2])
    assert np.asarray(p["attn"]).shape == (2, 5, 5)
    np.testing.assert_allclose(p["attn"][1], m.attn[1, 2], rtol=EPS32)  # the float32 map's values, copied
    assert p["rows"] == p["cols"] == [0, 1, 2, 3, 4]
    assert p["heads"] == [0, 2] and p["layer"] == 1 and not p["renormalised"]
    assert len(head_payload(m, layer=0)["heads"]) == 3  # all heads by default


def test_pair_filters_select_without_renormalising(map_factory):
    attn = np.arange(36, dtype=float).reshape(6, 6) + 1
    attn /= attn.sum(-1, keepdims=True)
    m = map_factory(attn, PAIR_TOKENS, special=PAIR_SPECIAL, segment=PAIR_SEGMENT)
    p = head_payload(m, pair_filter="A->B")
    assert p["rows"] == [0, 1, 2, 3] and p["cols"] == [4, 5]
    # row 1 of attn is 7..12 over 57: A->B keeps 11/57 and 12/57 as they are
    np.testing.assert_allclose(p["attn"][0][1], [11 / 57, 12 / 57], rtol=EPS32)  # held in float32: one rounding
    assert visible_units(m, "B->A")[0].tolist() == [4, 5]
    assert visible_units(m, "B->B")[1].tolist() == [4, 5]
    assert visible_units(m, "A->A")[1].tolist() == [0, 1, 2, 3]
    with pytest.raises(AttnscopeError, match="unknown pair filter"):
        head_payload(m, pair_filter="A-B")


def test_pair_filter_needs_a_pair(map_factory):
    m = map_factory(np.full((3, 3), 1 / 3), ["[CLS]", "x", "[SEP]"])
    with pytest.raises(AttnscopeError) as e:
        head_payload(m, pair_filter="A->B")
    says(one_line(e.value), "example 0", "A->B", "pair")


def test_hide_special_renormalises_by_hand(map_factory):
    attn = np.array([[0.25, 0.25, 0.25, 0.25],
                     [0.4, 0.3, 0.1, 0.2],
                     [0.9, 0.0, 0.0, 0.1],  # no mass on real tokens: stays 0
                     [0.1, 0.6, 0.2, 0.1]])
    m = map_factory(attn, ["[CLS]", "x", "y", "[SEP]"])
    p = head_payload(m, hide_special=True)
    assert p["rows"] == [1, 2] and p["cols"] == [1, 2]
    np.testing.assert_allclose(p["attn"][0], [[0.75, 0.25], [0.0, 0.0]], atol=1e-12)
    assert p["renormalised"] and "non-special" in p["note"]


def test_hide_special_and_pair_filter_together(map_factory):
    attn = np.full((6, 6), 1 / 6)
    attn[1] = [0.5, 0.1, 0.1, 0.1, 0.1, 0.1]  # "a": 0.3 on real tokens, 0.1 of it on "c"
    m = map_factory(attn, PAIR_TOKENS, special=PAIR_SPECIAL, segment=PAIR_SEGMENT)
    p = head_payload(m, pair_filter="A->B", hide_special=True)
    assert p["rows"] == [1, 2] and p["cols"] == [4]
    np.testing.assert_allclose(p["attn"][0][0], [0.1 / 0.3])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(3, 9), seed=st.integers(0, 10_000))
def test_hidden_special_rows_sum_to_one_and_keep_ratios(n, seed):
    from conftest import make_map

    rng = np.random.default_rng(seed)
    attn = _random_attn(rng, 1, 2, n)
    special = rng.random(n) < 0.3
    special[0] = special[-1] = True
    m = make_map(attn, [f"t{i}" for i in range(n)], special=special)
    p = head_payload(m, hide_special=True)
    a = np.asarray(p["attn"])  # [h r c]
    if a.size:
        np.testing.assert_allclose(a.sum(-1), 1.0, rtol=1e-9)
        keep = np.nonzero(~special)[0]
        full = m.attn[0].astype(np.float64)[:, keep][:, :, keep]
        # ratios between shown weights are those of the original row
        np.testing.assert_allclose(a * full[..., :1], full * a[..., :1], rtol=1e-9, atol=1e-12)


def test_heatmap_payload_labels(map_factory):
    m = map_factory(np.eye(4) * 0.5 + 0.125, ["[CLS]", "<b>", "y", "[SEP]"])
    p = heatmap_payload(m, layer=0, head=0, hide_special=True)
    assert p["row_labels"] == p["col_labels"] == ["<b>", "y"]
    np.testing.assert_allclose(p["attn"], [[0.625 / 0.75, 0.125 / 0.75], [0.125 / 0.75, 0.625 / 0.75]])


def test_pool_by_hand():
    a = np.array([[0.5, 0.5, 0.0, 0.0],
                  [0.0, 0.0, 1.0, 0.0],
                  [0.25, 0.25, 0.25, 0.25],
                  [0.0, 0.0, 0.0, 1.0]])
    # bins {0,1} {2,3}: cell = mean over query bin of summed weight on key bin
    np.testing.assert_allclose(pool(a, 2), [[0.5, 0.5], [0.25, 0.75]])
    np.testing.assert_allclose(pool(a, 8), a)  # never more bins than positions


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 70), size=st.integers(1, 40), seed=st.integers(0, 1000))
def test_pooled_rows_sum_to_one(n, size, seed):
    a = _random_attn(np.random.default_rng(seed), 1, 1, n)
    t = pool(a, size)
    assert t.shape == (1, 1, min(n, size), min(n, size))
    np.testing.assert_allclose(t.sum(-1), 1.0, rtol=1e-9)


def test_model_payload_shapes(map_factory):
    attn = _random_attn(np.random.default_rng(1), 3, 4, 10)
    m = map_factory(attn, [f"t{i}" for i in range(10)])
    p = model_payload(m, thumb_size=4)
    assert np.asarray(p["thumbnails"]).shape == (3, 4, 4, 4)
    assert p["bins"] == [0, 2, 5, 8, 10]  # rint of 0, 2.5, 5, 7.5, 10 (to even)
    assert p["num_layers"] == 3 and p["num_heads"] == 4


def test_word_level_payload(debug_bert):
    from attnscope.extract.runner import extract

    ex = {"words": ["the", "catdog", "sat"], "words_pair": ["a", "mat"]}
    m = next(iter(extract([ex], debug_bert, word_level=True))).items[0]
    assert m.level == "word"
    p = head_payload(m, layer=1, pair_filter="B->A")
    assert p["level"] == "word" and p["is_pair"]
    assert p["tokens"] == ["[CLS]", "the", "catdog", "sat", "[SEP]", "a", "mat", "[SEP]"]
    assert [p["tokens"][i] for i in p["rows"]] == ["a", "mat", "[SEP]"]
    full = head_payload(m, layer=1, hide_special=True)
    n = len(debug_bert.tokenizer(" ".join(ex["words"]), " ".join(ex["words_pair"]))["input_ids"])
    np.testing.assert_allclose(np.asarray(full["attn"]).sum(-1), 1.0, rtol=0, atol=softmax_bound(n))  # word rows of n-token rows
    assert [full["tokens"][i] for i in full["cols"]] == ["the", "catdog", "sat", "a", "mat"]


def test_page_payload_round_trip(map_factory):
    attn = _random_attn(np.random.default_rng(2), 2, 2, 6)
    m = map_factory(attn, PAIR_TOKENS, special=PAIR_SPECIAL, segment=PAIR_SEGMENT)
    p = page_payload(m, "heatmap", layer=1, head=1, pair_filter="A->B", hide_special=True)
    json.dumps(p)  # plain JSON
    assert p["state"] == {"view": "heatmap", "layer": 1, "heads": [0, 1], "head": 1,
                          "pair_filter": "A->B", "hide_special": True}
    np.testing.assert_allclose(decode(p["attn"]), attn, atol=0.5 / 255 + 1e-7)
    assert p["is_pair"] and p["tokens"] == PAIR_TOKENS
    assert decode(p["thumbnails"]).shape == (2, 2, 6, 6)
    with pytest.raises(AttnscopeError, match="layer 2 out of range"):
        page_payload(m, layer=2)
    with pytest.raises(AttnscopeError, match="head 5 out of range"):
        page_payload(m, heads=[5])
    with pytest.raises(AttnscopeError, match="unknown view"):
        page_payload(m, "graph")
    with pytest.raises(AttnscopeError, match="neuron view needs"):
        page_payload(m, "neuron")


def test_blob_round_trips():
    a = np.random.default_rng(3).random((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(decode(encode_f32(a)), a)
    q = decode(encode_u8(a))
    assert np.abs(q - a).max() <= 0.5 / 255 + 1e-7
    assert decode(encode_u8(np.array([-1.0, 2.0]))).tolist() == [0.0, 1.0]


def test_embedded_json_cannot_close_the_script():
    obj = {"tokens": ["</script><script>alert(1)</script>", "<!--", "a&b", "\u2028"]}
    text = embed_json(obj)
    for bad in ("<", ">", "&", "\u2028"):
        assert bad not in text
    assert json.loads(text) == obj


def test_a_page_first_shows_the_three_heads_that_point_at_words_most_sharply():
    """Twelve heads drawn at once were a hairball (issue 49): a layer of more than four heads opens
    with the three whose rows of words put the largest weight on one word, in head order; a
    smaller layer opens whole; ``heads`` given are kept."""
    from attnscope.viz.payload import pointing_heads

    toks = ["[CLS]", "a", "b", "c", "[SEP]"]
    a = np.full((1, 6, 5, 5), 0.2)
    a[0, 0, :, 0] = 1.0  # head 1: every row on [CLS] (sharp, but not at a word)
    a[0, 0, :, 1:] = 0.0
    for h, weight in ((1, 0.9), (3, 0.6), (4, 0.8)):  # heads 2, 5, 4: word to next word, this sharply
        a[0, h] = (1 - weight) / 4
        for q in range(5):
            a[0, h, q, (q % 3) + 1] = weight
    m = make_map(a, toks)
    assert pointing_heads(m, 0) == [1, 3, 4]
    assert page_payload(m)["state"]["heads"] == [1, 3, 4]
    assert page_payload(m, heads=[0, 5])["state"]["heads"] == [0, 5]
    assert pointing_heads(make_map(a[:, :4], toks), 0) == [0, 1, 2, 3]
