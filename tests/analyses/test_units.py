"""Words -> units (zero-token words, truncation) and the no-information rule, shared by
syntax, coreference and the probes; checked through real extraction on a tiny model."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import says

from attnscope.analyses.syntax import ALL, DependencyHeads, score_map
from attnscope.analyses.units import WordUnits, predict, word_units
from attnscope.data.records import Example
from attnscope.extract import extract
from attnscope.maps import AttentionBatch

ZWSP = "\u200b"
# "the cat <zwsp> sat on the mat": the zero-width space becomes no token at all
WORDS = ["the", "cat", ZWSP, "sat", "on", "the", "mat"]
HEADS = [2, 4, 4, 0, 7, 7, 4]
RELNS = ["det", "nsubj", "dep", "root", "case", "det", "obl"]


def one_map(lm, example, **kw):
    return next(iter(extract([example], lm, word_level=True, **kw))).items[0]


@pytest.fixture(scope="module")
def zwsp_map(debug_bert):
    return one_map(debug_bert, Example(words=list(WORDS), heads=list(HEADS), relns=list(RELNS)))


def test_a_zero_token_word_has_no_unit_and_later_words_keep_theirs(zwsp_map, debug_bert):
    tok = debug_bert.tokenizer
    assert tok(ZWSP, add_special_tokens=False)["input_ids"] == []
    # units: [CLS] the cat sat on the mat [SEP] -> words 0,1 at 1,2; word 2 none; 3..6 at 3..6
    assert zwsp_map.tokens == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]
    u = word_units(zwsp_map)
    assert u.positions.tolist() == [1, 2, -1, 3, 4, 5, 6]
    assert u.empty.tolist() == [False, False, True, False, False, False, False]
    assert not u.cut.any()


def test_truncated_words_are_cut_not_empty(debug_bert):
    ex = Example(words=["the", "cat", "sat", "on", "the", "mat"])
    m = one_map(debug_bert, ex, max_seq_len=5, truncate=True)  # [CLS] the cat sat [SEP]
    u = word_units(m)
    assert u.positions.tolist() == [1, 2, 3, -1, -1, -1]
    assert u.cut.tolist() == [False, False, False, True, True, True] and not u.empty.any()


def test_syntax_skips_only_the_empty_word(zwsp_map):
    d = DependencyHeads()
    d.update(AttentionBatch([zwsp_map]))
    assert d.skipped_words == 1 and d.empty_words == 1
    r = d.finalize()
    assert r.meta["empty_words"] == 1
    says(r.summary[1], "1 words", "zero tokens", "skipped")
    c = d.counts()
    # scored: the, cat, on, the, mat (sat is the root; the zwsp word has no unit)
    assert int(c.total[c.get(ALL)]) == 5 and c.get("dep") is None
    # each prediction is the argmax over the other real words of the real row, by hand
    s = score_map(zwsp_map)
    a = zwsp_map.attn.astype(np.float64)
    units = {0: 1, 1: 2, 3: 3, 4: 4, 5: 5, 6: 6}
    for layer in range(a.shape[0]):
        for head in range(a.shape[1]):
            for w, unit in units.items():
                others = {v: a[layer, head, unit, p] for v, p in units.items() if v != w}
                best = max(others, key=others.get)
                assert s.predictions[layer, head, 0, w] == best
            assert s.predictions[layer, head, 0, 2] == -1
    # the [SEP] row (last unit) is never read as a word's row: the old code scored word 2 with it
    assert s.dependents.tolist() == [0, 1, 4, 5, 6]


def test_predict_rule():
    v = np.array([[0.1, 0.7, 0.2], [0.0, 0.0, 0.0], [0.4, 0.2, 0.4], [0.3, 0.3, 0.1]])
    assert predict(v).tolist() == [1, -1, -1, -1]
    assert predict(v, np.array([True, False, True])).tolist() == [2, -1, -1, 0]
    assert predict(v, ties="lowest").tolist() == [1, 0, 0, 0]
    assert predict(v, np.zeros(3, bool)).tolist() == [-1] * 4
    assert predict(np.array([[-2.0, -1.0]]), floor=None).tolist() == [1]  # scores may be negative
    assert predict(np.array([[-2.0, -1.0]])).tolist() == [-1]  # attention: nothing above 0
    assert predict(v, axis=0).tolist() == [2, 0, 2]
    assert predict(np.zeros((2, 0))).tolist() == [-1, -1]
    with pytest.raises(ValueError):
        predict(v, ties="random")
    assert WordUnits(np.array([-1, -1])).cut.all()


def test_predict_edge_cases_found_by_mutation_testing():
    # float64 scores are compared in float64: these two differ only below float32 precision
    assert predict(np.array([[0.1, 0.1 + 1e-12]])).tolist() == [1]
    # one row keeps its row axis; an empty candidate axis gives int -1s
    assert predict(np.array([[0.2, 0.5, 0.3]])).shape == (1,)
    assert predict(np.full((2, 1, 3), 0.1) + np.array([0.0, 0.1, 0.0])).tolist() == [[1], [1]]
    assert predict(np.zeros((2, 0))).dtype == np.int64
    assert predict(np.array([[0.2, 0.5]]), ties="lowest").dtype.kind == "i"
    # no candidate at all is -1 under either rule
    assert predict(np.array([[0.2, 0.5]]), np.zeros(2, bool), ties="lowest").tolist() == [-1]
    # a unique top of exactly 0 is still no information
    assert predict(np.array([[0.0, 0.0]]), np.array([True, False])).tolist() == [-1]
    with pytest.raises(ValueError, match="ties must be one of"):
        predict(np.zeros((1, 2)), ties="x")


def test_word_units_positions_are_integers_and_bounded(zwsp_map):
    u = word_units(zwsp_map)
    assert u.positions.dtype == np.int64
    # asking for fewer words than the map has: the extra words' units are ignored
    assert word_units(zwsp_map, 3).positions.tolist() == [1, 2, -1]
