"""Per-head dependency accuracy (Table 1) on hand-built maps with hand-worked answers."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_map, says
from hypothesis import given, settings
from hypothesis import strategies as st

from attnscope.analyses.base import ANALYSES
from attnscope.analyses.syntax import (
    ALL,
    DependencyHeads,
    HeadCounts,
    binary_bootstrap_ci,
    relation_label,
    score_map,
    table1_rows,
)
from attnscope.data.records import Example
from attnscope.maps import AttentionBatch

TOKENS = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]
WORDS = TOKENS[1:-1]
HEADS = [2, 3, 0, 6, 6, 3]
RELNS = ["det", "nsubj", "root", "case", "det", "obl"]


def sentence_map(index: int = 0):
    """Units 0..7 = [CLS] w1..w6 [SEP]. Background 0.001*(col+1) + 0.0001*(row+1) (no ties).

    Head 0 ("gold"): every word puts 1.0 on its gold head ([CLS] for the root word).
    Head 1 ("previous"): every word puts 1.0 on the unit before it.
    """
    n = len(TOKENS)
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    a = np.zeros((1, 2, n, n)) + 0.001 * (j + 1) + 0.0001 * (i + 1)
    for w, h in enumerate(HEADS, start=1):
        a[0, 0, w, h if h else 0] += 1.0
        a[0, 1, w, w - 1] += 1.0
    ex = Example(words=list(WORDS), heads=list(HEADS), relns=list(RELNS))
    return make_map(a, TOKENS, example=ex, index=index)


def test_hand_worked_sentence():
    d = DependencyHeads()
    d.update(AttentionBatch([sentence_map()]))
    c = d.counts()
    assert c.relations == ["case", "det", "nsubj", "obl", ALL]  # sorted: independent of data order
    assert c.total.tolist() == [1, 2, 1, 1, 5]
    # [relation, layer, head, direction]; worked out in sentence_map's docstring terms:
    # gold head, dep->head: all right. gold head, head->dep: the(1) <- mat (largest row) wrong,
    # cat <- the wrong, on <- mat right, the(5) <- mat right, mat <- the(5) wrong.
    # previous head, dep->head: all wrong. previous head, head->dep: the(1) <- cat right,
    # cat <- sat right, on <- the wrong, the(5) <- mat right, mat <- the(5) wrong.
    expect = {  # relation: (gold d->h, gold h->d, prev d->h, prev h->d)
        "det": (2, 1, 0, 2), "nsubj": (1, 0, 0, 1), "case": (1, 1, 0, 0), "obl": (1, 0, 0, 0),
        ALL: (5, 2, 0, 3)}
    for r, rel in enumerate(c.relations):
        got = (c.correct[r, 0, 0, 0], c.correct[r, 0, 0, 1], c.correct[r, 0, 1, 0], c.correct[r, 0, 1, 1])
        assert tuple(int(x) for x in got) == expect[rel], rel
    # offsets -3..3: gold offsets are +1 +1 +2 +1 -3
    offs = dict(zip(c.offsets, c.offset_correct[c.get(ALL)].tolist()))
    assert offs == {-3: 1, -2: 0, -1: 0, 1: 3, 2: 1, 3: 0}
    rows = {r["relation"]: r for r in table1_rows(c, min_count=1)}
    assert rows["det"]["head"] == "1-1" and rows["det"]["direction"] == "dep->head"
    assert rows["det"]["accuracy"] == 100.0 and rows["det"]["offset"] == "+1"
    assert rows["case"]["offset"] == "+2" and rows["obl"]["offset"] == "-3"
    assert rows[ALL]["offset_accuracy"] == pytest.approx(60.0)
    assert list(rows)[-1] == ALL


def test_ties_predict_nothing_and_self_and_specials_are_ignored():
    # uniform attention except a huge weight on [CLS] and on the word itself: both ignored,
    # so every prediction is a tie among the other words.
    n = len(TOKENS)
    a = np.full((n, n), 0.1)
    a[:, 0] = 5.0
    a[np.arange(n), np.arange(n)] = 9.0
    ex = Example(words=list(WORDS), heads=list(HEADS), relns=list(RELNS))
    m = make_map(a, TOKENS, example=ex)
    d = DependencyHeads()
    d.update(AttentionBatch([m]))
    s = d.counts()
    assert int(s.correct[s.get(ALL)].sum()) == 0  # a tie is no prediction: nothing scores
    # the paper code's argmax: the lowest other word. dep->head predicts word 0 ("the") for all
    # but the(1) itself, which predicts word 1 (cat): the(1) -> cat right; cat -> the wrong;
    # on, the(5), mat -> the(1) wrong. 1 of 5.
    d = DependencyHeads(ties="lowest")
    d.update(AttentionBatch([m]))
    s = d.counts()
    assert int(s.correct[s.get(ALL), 0, 0, 0]) == 1


def test_float16_empty_rows_get_no_credit():
    # A head that attends only to [CLS]: in float16 every word weight is exactly 0. With the
    # word itself excluded, np.argmax would "predict" the lowest other word: word 0 for all
    # but word 0, which gets word 1. Gold heads (0-based): the->cat(1), cat->sat(2),
    # on->mat(5), the->mat(5), mat->sat(2): only the(0)->cat(1) would be credited.
    n = len(TOKENS)
    a = np.zeros((n, n), np.float16)
    a[:, 0] = 1.0
    ex = Example(words=list(WORDS), heads=list(HEADS), relns=list(RELNS))
    m = make_map(a, TOKENS, example=ex)
    old = DependencyHeads(ties="lowest")
    old.update(AttentionBatch([m]))
    c = old.counts()
    assert int(c.correct[c.get("det"), 0, 0, 0]) == 1  # the paper code's behaviour: free credit
    new = DependencyHeads()
    new.update(AttentionBatch([m]))
    c = new.counts()
    assert int(c.correct[c.get(ALL)].sum()) == 0 and int(c.total[c.get(ALL)]) == 5
    # one informative weight is enough: word "the"(0) puts 0.001 on "cat"
    a[1, 2] = np.float16(0.001)
    new = DependencyHeads()
    new.update(AttentionBatch([make_map(a, TOKENS, example=ex)]))
    c = new.counts()
    assert int(c.correct[c.get("det"), 0, 0, 0]) == 1 and int(c.correct[c.get(ALL), 0, 0, 0]) == 1


def test_offsets_outside_the_sentence_do_not_score():
    # 2 words: "a b", a's head is b (+1), b is the root. Offset +1 from "a" is right; offset
    # -1 from "a" would be word -1 (outside): wrong, never clipped onto a word.
    toks = ["[CLS]", "a", "b", "[SEP]"]
    ex = Example(words=["a", "b"], heads=[2, 0], relns=["dep", "root"])
    d = DependencyHeads(offsets=(-1, 1, 2))
    d.update(AttentionBatch([make_map(np.full((4, 4), 0.25), toks, example=ex)]))
    c = d.counts()
    assert c.offset_correct[c.get(ALL)].tolist() == [0, 1, 0]


def test_possessive_rule_uses_the_clitic():
    toks = ["[CLS]", "John", "'s", "dog", "[SEP]"]
    ex = Example(words=["John", "'s", "dog"], heads=[3, 1, 0], relns=["nmod:poss", "case", "root"])
    a = np.full((5, 5), 0.01)
    a[1, 2] = 1.0  # John looks at 's (wrong by itself)
    a[2, 3] = 1.0  # 's looks at dog: John's head
    m = make_map(a, toks, example=ex)
    on, off = DependencyHeads(), DependencyHeads(possessive_rule=False)
    on.update(AttentionBatch([m]))
    off.update(AttentionBatch([m]))
    r_on, r_off = on.counts(), off.counts()
    assert int(r_on.correct[r_on.get("nmod:poss"), 0, 0, 0]) == 1
    assert int(r_off.correct[r_off.get("nmod:poss"), 0, 0, 0]) == 0
    # offsets use the same redirection: 's + 1 = dog
    assert int(r_on.offset_correct[r_on.get("nmod:poss"), list(on.offsets).index(1)]) == 1


def test_collapse_subtypes_and_min_count():
    assert relation_label("acl:relcl", True) == "acl"
    ex = Example(words=["a", "b", "c"], heads=[3, 3, 0], relns=["nmod:poss", "nmod", "root"])
    m = make_map(np.full((5, 5), 0.2), ["[CLS]", "a", "b", "c", "[SEP]"], example=ex)
    d = DependencyHeads(collapse_subtypes=True)
    d.update(AttentionBatch([m]))
    c = d.counts()
    assert c.relations == ["nmod", ALL] and c.total.tolist() == [2, 2]
    rows = table1_rows(c, min_count=3)
    assert [r["relation"] for r in rows] == [ALL]


def test_held_out_selection_scores_the_head_chosen_elsewhere():
    L, H = 1, 2
    sel = HeadCounts(["det", ALL], np.zeros((2, L, H, 2), np.int64), np.zeros((2, 6), np.int64),
                     np.array([10, 10]), (-3, -2, -1, 1, 2, 3))
    sel.correct[:, 0, 1, 0] = 9  # head 1-2 is best on the selection data
    sel.offset_correct[:, 4] = 7  # offset +2
    score = HeadCounts(["det", ALL], np.zeros((2, L, H, 2), np.int64), np.zeros((2, 6), np.int64),
                       np.array([100, 100]), sel.offsets)
    score.correct[:, 0, 0, 0] = 90
    score.correct[:, 0, 1, 0] = 40
    score.offset_correct[:, 3] = 50
    score.offset_correct[:, 4] = 20
    paper = {r["relation"]: r for r in table1_rows(score, None, min_count=1)}
    held = {r["relation"]: r for r in table1_rows(score, sel, min_count=1)}
    assert paper["det"]["head"] == "1-1" and paper["det"]["accuracy"] == 90.0
    assert held["det"]["head"] == "1-2" and held["det"]["accuracy"] == 40.0
    assert held["det"]["offset"] == "+2" and held["det"]["offset_accuracy"] == 20.0


def test_fold_counts_split_by_example_parity():
    d = DependencyHeads()
    d.update(AttentionBatch([sentence_map(0), sentence_map(1), sentence_map(3)]))
    assert d.counts((0,)).total[-1] == 5 and d.counts((1,)).total[-1] == 10


def test_binary_bootstrap_matches_resampling():
    from attnscope.analyses.stats import bootstrap_ci

    values = np.array([1] * 30 + [0] * 70)
    lo, hi = binary_bootstrap_ci(30, 100, n_boot=4000, seed=1)
    lo2, hi2 = bootstrap_ci(values, n_boot=4000, seed=1)
    assert abs(lo - lo2) <= 0.02 and abs(hi - hi2) <= 0.02
    assert lo < 0.3 < hi


# -- an independent reference: the obvious loop ------------------------------------------------
def naive_counts(maps):
    """Loop over sentences, heads, directions and words, like the paper's notebook."""
    out = {}
    for m in maps:
        pos = m.word_positions()
        n = len(pos)
        for layer in range(m.attn.shape[0]):
            for head in range(m.attn.shape[1]):
                a = m.attn[layer, head]
                for d in range(n):
                    g = m.example.heads[d] - 1
                    if g < 0:
                        continue
                    best_dh = best_hd = None
                    for c in range(n):
                        if c == d:
                            continue
                        if best_dh is None or a[pos[d], pos[c]] > a[pos[d], pos[best_dh]]:
                            best_dh = c
                        if best_hd is None or a[pos[c], pos[d]] > a[pos[best_hd], pos[d]]:
                            best_hd = c
                    for key in (m.example.relns[d], ALL):
                        acc = out.setdefault(key, np.zeros((m.attn.shape[0], m.attn.shape[1], 2), int))
                        acc[layer, head, 0] += best_dh == g
                        acc[layer, head, 1] += best_hd == g
    return out


@st.composite
def random_maps(draw):
    maps = []
    for index in range(draw(st.integers(1, 6))):
        n = draw(st.integers(2, 7))
        order = draw(st.permutations(list(range(n))))
        heads = [0] * n
        for k, w in enumerate(order[1:], start=1):  # attach to an earlier word of the order
            heads[w] = order[draw(st.integers(0, k - 1))] + 1
        rel = [draw(st.sampled_from(["det", "obj", "nmod:poss"])) if h else "root" for h in heads]
        seed = draw(st.integers(0, 10_000))
        a = np.random.default_rng(seed).random((2, 3, n + 2, n + 2)).astype(np.float32)
        toks = ["[CLS]"] + [f"w{i}" for i in range(n)] + ["[SEP]"]
        ex = Example(words=toks[1:-1], heads=heads, relns=rel)
        maps.append(make_map(a, toks, example=ex, index=index))
    return maps


@settings(max_examples=40, deadline=None)
@given(random_maps(), st.data())
def test_matches_naive_loop_for_any_batching(maps, data):
    ref = naive_counts(maps)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(maps) - 1)), max_size=3)))
    parts = [maps[a:b] for a, b in zip([0] + cuts, cuts + [len(maps)]) if maps[a:b]]
    pieces = []
    for p in parts:
        d = DependencyHeads(possessive_rule=False)
        d.update(AttentionBatch(p))
        pieces.append(d)
    merged = pieces[0]
    for p in pieces[1:]:
        merged.merge(p)
    one = DependencyHeads(possessive_rule=False)
    one.update(AttentionBatch(maps))
    for d in (merged, one):
        c = d.counts()
        assert set(c.relations) == set(ref)
        for rel, expect in ref.items():
            np.testing.assert_array_equal(c.correct[c.get(rel)], expect)
    assert merged.finalize().to_json()["arrays"]["accuracy"] is not None


def test_registered_and_result_roundtrip(tmp_path):
    assert ANALYSES["dependency-heads"] is DependencyHeads
    d = DependencyHeads()
    empty = d.finalize()
    assert empty.arrays["total"].tolist() == [0]
    d.update(AttentionBatch([sentence_map()]))
    res = d.finalize()
    res.save(tmp_path / "r.json")
    import json

    from attnscope.analyses.base import Result

    back = Result.from_json(json.loads((tmp_path / "r.json").read_text()))
    np.testing.assert_array_equal(back.arrays["accuracy"], res.arrays["accuracy"])


def test_rejects_token_level_maps():
    m = sentence_map()
    m.level = "token"
    with pytest.raises(ValueError, match="word-level"):
        DependencyHeads().update(AttentionBatch([m]))


# -- table1_rows by hand (cases found by mutation testing) ----------------------------------
def _counts(rels: dict[str, tuple], offsets=(1, -1)) -> HeadCounts:
    """HeadCounts with L=1, H=2 from ``{relation: (total, [h0 d->h, h0 h->d, h1 d->h, h1 h->d],
    [offset counts])}`` in the given order."""
    names = list(rels)
    total = np.array([rels[r][0] for r in names])
    correct = np.array([rels[r][1] for r in names]).reshape(len(names), 1, 2, 2)
    offc = np.array([rels[r][2] for r in names])
    return HeadCounts(names, correct, offc, total, offsets)


def _ci(k, n, seed):
    return tuple(100.0 * x for x in binary_bootstrap_ci(k, n, n_boot=1000, level=0.95, seed=seed))


def _row(rel, n, head, layer, h, d, k, r, off, ko):
    lo, hi = _ci(k, n, 2 * r)
    olo, ohi = _ci(ko, n, 2 * r + 1)
    return {"relation": rel, "count": n, "head": head, "layer": layer, "head_index": h,
            "direction": d, "accuracy": 100.0 * k / n, "ci_low": lo, "ci_high": hi,
            "offset": off, "offset_accuracy": 100.0 * ko / n, "offset_ci_low": olo,
            "offset_ci_high": ohi}


def test_table1_rows_by_hand_with_defaults():
    # offsets (+1, -1); best head: most correct, ties to the lowest (layer, head, direction);
    # best offset: most correct, ties to the lowest offset (det: 3000 each -> -1).
    c = _counts({
        "amod": (5003, [2000, 300, 3001, 17], [1200, 1500]),  # 1-2 dep->head; -1
        "case": (99, [50, 0, 0, 0], [5, 0]),  # below the default min_count of 100: left out
        "det": (7919, [6000, 1, 12, 6500], [3000, 3000]),  # 1-2 head->dep; tie -> -1
        "nsubj": (100, [40, 41, 0, 0], [60, 10]),  # exactly 100: kept; 1-1 head->dep; +1
        ALL: (13121, [8090, 342, 3013, 6517], [4265, 4510]),  # 1-1 dep->head; -1
    })
    rows = table1_rows(c)  # defaults: min_count 100, 1000 resamples, seed 0 (+2r, +2r+1)
    # frequent relations first, "all" last; seeds follow each relation's index in c.relations
    assert rows == [
        _row("det", 7919, "1-2", 0, 1, "head->dep", 6500, 2, "-1", 3000),
        _row("amod", 5003, "1-2", 0, 1, "dep->head", 3001, 0, "-1", 1500),
        _row("nsubj", 100, "1-1", 0, 0, "head->dep", 41, 3, "+1", 60),
        _row(ALL, 13121, "1-1", 0, 0, "dep->head", 8090, 4, "-1", 4510),
    ]
    # the resample count and the level reach both intervals
    row = table1_rows(c, n_boot=200, level=0.8)[0]
    lo, hi = binary_bootstrap_ci(6500, 7919, n_boot=200, level=0.8, seed=4)
    olo, ohi = binary_bootstrap_ci(3000, 7919, n_boot=200, level=0.8, seed=5)
    assert (row["ci_low"], row["ci_high"]) == (100.0 * lo, 100.0 * hi)
    assert (row["offset_ci_low"], row["offset_ci_high"]) == (100.0 * olo, 100.0 * ohi)
    assert (lo, hi) != binary_bootstrap_ci(6500, 7919, n_boot=1000, level=0.8, seed=4)
    assert (lo, hi) != binary_bootstrap_ci(6500, 7919, n_boot=200, level=0.95, seed=4)
    # a bootstrap interval depends on its seed and resample count (the test above would not
    # notice a changed seed otherwise)
    assert _ci(3001, 5003, 0) != _ci(3001, 5003, 1) and _ci(3001, 5003, 0) != tuple(
        100.0 * x for x in binary_bootstrap_ci(3001, 5003, n_boot=1001, seed=0))


def test_table1_rows_cross_fitted_pools_counts_and_names_each_fold():
    # fold A and fold B; select on B score on A, then select on A score on B.
    a = _counts({
        "amod": (300, [10, 0, 20, 0], [100, 5]),  # A selects 1-2 d->h, +1
        "det": (200, [150, 0, 0, 1], [3, 120]),  # A selects 1-1 d->h, -1
        "obj": (50, [0, 0, 7, 9], [0, 0]),  # A selects 1-2 h->d, +1 (tie)
        ALL: (550, [160, 0, 27, 10], [103, 125]),
    })
    b = _counts({
        "amod": (400, [30, 0, 40, 0], [4, 200]),  # B selects 1-2 d->h, -1
        "det": (100, [1, 0, 0, 90], [60, 2]),  # B selects 1-2 h->d, +1
        "iobj": (10, [5, 0, 0, 0], [0, 3]),  # only in B
        ALL: (510, [36, 0, 40, 90], [64, 205]),
    })
    rows = {r["relation"]: r for r in table1_rows(a, [(b, a), (a, b)], min_count=1, n_boot=10)}
    # det: B's choice (1-2 h->d, +1) scored on A: 1 head, 3 offset; A's choice (1-1 d->h, -1)
    # scored on B: 1 head, 2 offset -> 2 of 300 and 5 of 300; heads and offsets differ
    assert rows["det"]["count"] == 300 and rows["det"]["head"] == "1-2/1-1"
    assert rows["det"]["offset"] == "+1/-1" and rows["det"]["direction"] == "head->dep"
    assert (rows["det"]["layer"], rows["det"]["head_index"]) == (0, 1)
    assert rows["det"]["accuracy"] == pytest.approx(100 * 2 / 300)
    assert rows["det"]["offset_accuracy"] == pytest.approx(100 * 5 / 300)
    # amod: the same head (1-2 d->h) but different offsets: both are listed per fold
    # head: 20 (on A) + 40 (on B) = 60 of 700; offsets: B's -1 on A: 5, A's +1 on B: 4
    assert rows["amod"]["head"] == "1-2/1-2" and rows["amod"]["offset"] == "-1/+1"
    assert rows["amod"]["accuracy"] == pytest.approx(100 * 60 / 700)
    assert rows["amod"]["offset_accuracy"] == pytest.approx(100 * 9 / 700)
    # obj is in A only: B cannot select for it -> no row; iobj in B only: A cannot -> no row
    assert "obj" not in rows and "iobj" not in rows
    assert list(rows)[-1] == ALL  # a relation without a row does not stop the table
    # the same head and offset in every fold: one name
    rows = {r["relation"]: r for r in table1_rows(a, [(a, a), (a, a)], min_count=1, n_boot=10)}
    assert rows["amod"]["head"] == "1-2" and rows["amod"]["offset"] == "+1"
    assert rows["amod"]["count"] == 600 and rows["amod"]["accuracy"] == pytest.approx(100 * 40 / 600)
    # a fold pair whose scored part lacks the relation is skipped, the others pooled
    rows = {r["relation"]: r for r in table1_rows(b, [(b, a), (b, b)], min_count=1, n_boot=10)}
    assert rows["iobj"]["count"] == 10 and rows["iobj"]["head"] == "1-1"
    # a pair whose selecting part lacks the relation drops the row, even when others have it
    assert "obj" not in {r["relation"] for r in table1_rows(a, [(a, a), (b, a)], min_count=1,
                                                              n_boot=10)}


def test_table1_rows_selecting_part_with_zero_dependents_gives_no_row():
    sel = _counts({"det": (0, [0, 0, 0, 0], [0, 0]), ALL: (0, [0, 0, 0, 0], [0, 0])})
    sc = _counts({"det": (200, [5, 0, 0, 0], [1, 2]), ALL: (200, [5, 0, 0, 0], [1, 2])})
    assert table1_rows(sc, sel, min_count=1, n_boot=10) == []
    # and a scored relation with zero dependents is never a row, not even "all"
    assert table1_rows(sel, None, min_count=0, n_boot=10) == []


# -- score_map edge cases (found by mutation testing) ---------------------------------------
def test_one_word_sentence_is_an_example_with_nothing_to_score():
    # [CLS] Hi [SEP]: the only word is the root and has no other word to predict
    ex = Example(words=["Hi"], heads=[0], relns=["root"])
    m = make_map(np.full((3, 3), 1 / 3), ["[CLS]", "Hi", "[SEP]"], example=ex)
    s = score_map(m, ties="lowest")
    assert s is not None and s.dependents.tolist() == [] and s.predictions.tolist() == [[[[-1], [-1]]]]
    d = DependencyHeads()
    d.update(AttentionBatch([m]))
    assert (d.examples, d.skipped_examples) == (1, 0)
    r = d.finalize()
    says(r.summary[0], "0 relations", "0 dependents", "1 sentences")
    # no tree: skipped and counted
    d.update(AttentionBatch([make_map(np.full((3, 3), 1 / 3), ["[CLS]", "Hi", "[SEP]"],
                                      example=Example(words=["Hi"], heads=[0]))]))
    assert (d.examples, d.skipped_examples) == (2, 1)


def test_possessive_at_the_end_of_the_sentence_keeps_its_own_row():
    # "Mary saw John" with John (the last word) marked poss: nothing follows it, so it is
    # scored with its own row. John -> saw (its gold head, word 1) 0.5.
    toks = ["[CLS]", "Mary", "saw", "John", "[SEP]"]
    ex = Example(words=["Mary", "saw", "John"], heads=[2, 0, 2], relns=["nsubj", "root", "poss"])
    a = np.full((5, 5), 0.1)
    a[3, 2] = 0.5
    a[1, 2] = 0.5  # Mary -> saw
    s = score_map(make_map(a, toks, example=ex))
    assert s.relations == ["nsubj", "poss"] and s.correct[0, 0, 0].tolist() == [True, True]
    # "s'" is a clitic too: "the boys s' toys" (odd, but the rule is literal)
    toks = ["[CLS]", "boys", "s'", "toys", "[SEP]"]
    ex = Example(words=["boys", "s'", "toys"], heads=[3, 1, 0], relns=["poss", "case", "root"])
    a = np.full((5, 5), 0.1)
    a[2, 3] = 0.5  # s' -> toys, the possessor's head
    a[1, 2] = 0.5  # boys -> s' (wrong by itself)
    s = score_map(make_map(a, toks, example=ex))
    assert s.correct[0, 0, 0, 0] and not score_map(make_map(a, toks, example=ex),
                                                   possessive_rule=False).correct[0, 0, 0, 0]
    # a nmod:poss subtype keeps its name unless collapsing is asked for
    ex = Example(words=["boys", "s'", "toys"], heads=[3, 1, 0], relns=["nmod:poss", "case", "root"])
    assert score_map(make_map(a, toks, example=ex)).relations == ["nmod:poss", "case"]
    assert score_map(make_map(a, toks, example=ex), collapse_subtypes=True).relations == ["nmod", "case"]


def test_ties_in_the_head_to_dependent_direction():
    # "a b c": a -> b, c -> b, b root. Column of "a" (unit 1): b and c both give it 0.4, a tie.
    # Column of "c" (unit 3): b gives 0.4, a 0.2: b, right.
    toks = ["[CLS]", "a", "b", "c", "[SEP]"]
    ex = Example(words=["a", "b", "c"], heads=[2, 0, 2], relns=["x", "root", "y"])
    a = np.full((5, 5), 0.05)
    a[2, 1] = a[3, 1] = 0.4
    a[2, 3], a[1, 3] = 0.4, 0.2
    m = make_map(a, toks, example=ex)
    none, lowest = score_map(m), score_map(m, ties="lowest")
    assert none.predictions[0, 0, 1].tolist() == [-1, -1, 1]  # b's column: a .05 = c .05, a tie
    assert none.correct[0, 0, 1].tolist() == [False, True]
    # lowest: a's column -> b (the lower of b, c): right; b's column -> a
    assert lowest.predictions[0, 0, 1].tolist() == [1, 0, 1]
    assert lowest.correct[0, 0, 1].tolist() == [True, True]


def test_heads_at_the_first_and_last_word_and_cut_heads():
    # "a b c" with every dependent's head at the first word, then at the last word
    toks = ["[CLS]", "a", "b", "c", "[SEP]"]
    a = np.full((5, 5), 0.05)
    a[2, 1] = a[3, 1] = 0.5  # b, c -> a
    a[1, 3] = 0.5  # a -> c
    first = score_map(make_map(a, toks, example=Example(words=list("abc"), heads=[0, 1, 1],
                                                         relns=["root", "x", "x"])))
    assert first.dependents.tolist() == [1, 2] and first.gold.tolist() == [0, 0]
    assert first.correct[0, 0, 0].tolist() == [True, True]
    a[2, 3] = 0.6  # b -> c
    last = score_map(make_map(a, toks, example=Example(words=list("abc"), heads=[3, 3, 0],
                                                        relns=["x", "x", "root"])))
    assert last.dependents.tolist() == [0, 1] and last.gold.tolist() == [2, 2]
    assert last.correct[0, 0, 0].tolist() == [True, True]
    # c cut off (the map has units for a and b only): a and b have no scorable head
    cut = make_map(np.full((4, 4), 0.25), ["[CLS]", "a", "b", "[SEP]"],
                   example=Example(words=list("abc"), heads=[3, 3, 0], relns=["x", "x", "root"]))
    s = score_map(cut)
    assert s.dependents.tolist() == [] and s.predictions.shape[-1] == 3
    # a head at the first word while the last word is cut: still scored
    s = score_map(make_map(np.full((4, 4), 0.25), ["[CLS]", "a", "b", "[SEP]"],
                           example=Example(words=list("abc"), heads=[0, 1, 1], relns=["r", "x", "x"])))
    assert s.dependents.tolist() == [1]


def test_finalize_result_in_full():
    d = DependencyHeads()
    d.update(AttentionBatch([sentence_map(),
                             make_map(np.full((3, 3), 1 / 3), ["[CLS]", "Hi", "[SEP]"],
                                      example=Example(words=["Hi"]), index=1)]))  # no tree
    r = d.finalize()
    assert r.analysis == "dependency-heads" and r.params == d.params()
    assert len(r.summary) == 1
    says(r.summary[0], "4 relations", "5 dependents", "1 sentences")
    assert r.tables == {"relations": [{"relation": "case", "count": 1}, {"relation": "det", "count": 2},
                                      {"relation": "nsubj", "count": 1}, {"relation": "obl", "count": 1},
                                      {"relation": ALL, "count": 5}]}
    assert r.meta == {
        "relations": ["case", "det", "nsubj", "obl", ALL], "offsets": [-3, -2, -1, 1, 2, 3],
        "directions": ["dep->head", "head->dep"], "examples": 2, "skipped_examples": 1,
        "skipped_words": 0, "empty_words": 0,
        "heads": "arrays are [relation, layer, head, direction], 0-indexed",
        "ties": "a row whose top value is 0 or shared predicts nothing (wrong); best head: lowest "
                "(layer, head, direction); best offset: lowest offset"}
    assert set(r.arrays) == {"accuracy", "correct", "total", "offset_correct", "offset_accuracy"}
    # "all" row, from test_hand_worked_sentence: (gold d->h, gold h->d, prev d->h, prev h->d)
    assert r.arrays["correct"][-1].reshape(-1).tolist() == [5, 2, 0, 3]
    assert r.arrays["accuracy"][-1].reshape(-1).tolist() == [1.0, 0.4, 0.0, 0.6]
    assert r.arrays["total"].tolist() == [1, 2, 1, 1, 5]
    assert r.arrays["offset_correct"][-1].tolist() == [1, 0, 0, 3, 1, 0]
    assert r.arrays["offset_accuracy"][-1].tolist() == [0.2, 0.0, 0.0, 0.6, 0.2, 0.0]
    assert DependencyHeads(ties="lowest").finalize().meta["ties"].startswith(
        "lowest word index (the paper code's argmax); best head")


def test_possessive_clitic_at_the_end_and_after_an_empty_word():
    zw = "\u200b"
    # "Mary <zwsp> John 's": John (poss, head Mary) is followed by the clitic, the last word;
    # the zwsp word (before John) has no unit. Units: [CLS] Mary John 's [SEP].
    toks = ["[CLS]", "Mary", "John", "'s", "[SEP]"]
    ex = Example(words=["Mary", zw, "John", "'s"], heads=[0, 1, 1, 3], relns=["root", "dep", "poss", "case"])
    a = np.full((5, 5), 0.05)
    a[2, 4] = 0.8  # John -> [SEP] (no word)
    a[2, 3] = 0.1  # John -> 's: wrong by itself
    a[3, 1] = 0.8  # 's -> Mary: John's head
    m = make_map(a, toks, example=ex, word_ids=np.array([-1, 0, 2, 3, -1]))
    s = score_map(m)
    assert s.relations == ["poss", "case"] and s.dependents.tolist() == [2, 3]
    assert s.correct[0, 0, 0].tolist() == [True, False]  # John scored with the clitic's row
    assert score_map(m, possessive_rule=False).correct[0, 0, 0].tolist() == [False, False]


def test_a_head_at_an_empty_first_word_is_not_scored():
    # "<zwsp> a b": word 0 has no unit; a -> word 0 and b -> word 0 are not scored, b -> a is.
    zw = "\u200b"
    toks = ["[CLS]", "a", "b", "[SEP]"]
    m = make_map(np.full((4, 4), 0.25), toks, word_ids=np.array([-1, 1, 2, -1]),
                 example=Example(words=[zw, "a", "b"], heads=[0, 1, 2], relns=["root", "x", "y"]))
    s = score_map(m)
    assert s.dependents.tolist() == [2] and s.gold.tolist() == [1]
