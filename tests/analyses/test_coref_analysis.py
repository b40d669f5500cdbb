"""Per-head antecedent selection and the baselines on hand-built windows with planted attention."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_map, says
from hypothesis import given, settings
from hypothesis import strategies as st

from attnscope.analyses.base import Result
from attnscope.analyses.coref import (
    CorefAntecedents,
    _window_bounds,
    baseline_predictions,
    coref_windows,
    head_choices,
)
from attnscope.data.coref import Document, Mention, assign_heads_and_types
from attnscope.data.records import Example
from attnscope.maps import AttentionBatch

WORDS = ["John", "met", "Mary", ".", "He", "liked", "her", ".", "John", "smiled"]
#            head cluster type       text    number gender  person  scored
MENTIONS = [(0, "A", "proper", "john", "sg", "masc", "3", False),
            (2, "B", "proper", "mary", "sg", "fem", "3", False),
            (4, "A", "pronoun", "he", "sg", "masc", "3", True),
            (6, "B", "pronoun", "her", "sg", "fem", "3", True),
            (8, "A", "proper", "john", "sg", None, "3", True)]

# planted attention: head -> query word -> {key word: weight}; the rest goes to [SEP]
PLANTED = {
    (0, 0): {4: {0: 0.8}, 6: {2: 0.8}, 8: {4: 0.8}},  # always a gold antecedent
    (0, 1): {4: {3: 0.5, 2: 0.3}, 6: {5: 0.5, 4: 0.3}, 8: {7: 0.5, 0: 0.3}},
    (1, 0): {4: {1: 0.2, 0: 0.1, 2: 0.05}, 6: {0: 0.35, 2: 0.3}, 8: {7: 0.4, 4: 0.2}},
    (1, 1): {4: {2: 0.4, 0: 0.2}, 6: {0: 0.4}, 8: {6: 0.5}},
}
# worked out by hand from PLANTED (see the comments in each test)
EXPECT_MENTIONS = np.array([[3 / 3, 1 / 3], [2 / 3, 0 / 3]])
EXPECT_WORDS = np.array([[3 / 3, 0 / 3], [0 / 3, 0 / 3]])


def window_info(doc_index=0, words=WORDS, mentions=MENTIONS):
    cols = {k: [] for k in ("id", "head", "cluster", "type", "text", "head_word", "number", "gender",
                            "person", "score")}
    for i, (h, c, t, text, num, gen, per, score) in enumerate(mentions):
        for k, v in zip(cols, (i, h, c, t, text, words[h].casefold(), num, gen, per, score)):
            cols[k].append(v)
    return {"doc": f"d{doc_index}", "doc_index": doc_index, "window": 0, "offset": 0, "mode": "truncate",
            "mentions": cols}


def planted_map(doc_index=0, index=0):
    n = len(WORDS) + 2  # [CLS] words [SEP]
    attn = np.zeros((2, 2, n, n), np.float32)
    attn[:, :, :, :] = 1.0 / n
    for (ly, h), rows in PLANTED.items():
        for q, weights in rows.items():
            row = np.zeros(n, np.float32)
            for w, a in weights.items():
                row[w + 1] = a
            row[-1] = 1.0 - row.sum()
            attn[ly, h, q + 1] = row
    ex = Example(words=list(WORDS), fields={"coref": window_info(doc_index)})
    return make_map(attn, ["[CLS]"] + WORDS + ["[SEP]"], example=ex, index=index)


def test_baselines_by_hand():
    col = window_info()["mentions"]
    # "He" (q=4): candidates John@0, Mary@2. nearest -> Mary (wrong); no "he" before -> none;
    # sieves: no exact/head match; agreement: John (sg masc 3) passes, Mary (fem) fails -> John
    assert baseline_predictions(col, 2) == {"nearest": 2, "head-match": -1, "rule-based": 0}
    # "her" (q=6): nearest He@4; no head match; agreement: only Mary (fem) -> Mary
    assert baseline_predictions(col, 3) == {"nearest": 4, "head-match": -1, "rule-based": 2}
    # "John" (q=8): nearest her@6; head match John@0; exact string "john" -> John@0
    assert baseline_predictions(col, 4) == {"nearest": 6, "head-match": 0, "rule-based": 0}


def test_planted_heads_and_baselines():
    a = CorefAntecedents()
    a.update(AttentionBatch([planted_map()]))
    r = a.finalize()
    np.testing.assert_allclose(r.arrays["accuracy"], EXPECT_MENTIONS)
    # by type: pronouns are He, her; proper is the second John; no nominal is scored
    by_type = r.arrays["accuracy_by_type"]
    np.testing.assert_allclose(by_type[0], [[1, 0], [0.5, 0]])  # (0,1) picks Mary for He, He for her
    np.testing.assert_allclose(by_type[1], [[1, 1], [1, 0]])
    assert np.isnan(by_type[2]).all()
    rows = {row["model"]: row for row in r.tables["table2"]}
    assert rows["Nearest mention"]["all"] == 0.0
    assert rows["Nearest with same head word"]["all"] == pytest.approx(1 / 3)
    assert rows["Rule-based (4 sieves)"]["all"] == 1.0
    assert rows["Rule-based (4 sieves)"]["nominal"] is None and rows["Rule-based (4 sieves)"]["nominal_n"] == 0
    heads = [row["name"] for row in r.tables["table2"] if row["kind"] == "head"]
    assert heads == ["1-1", "2-1", "1-2"]  # best first; the 1-indexed display names
    assert r.meta["best_head"] == [0, 0] and r.meta["mentions"] == 3
    assert r.meta["mentions_by_type"] == {"pronoun": 2, "proper": 1, "nominal": 0}


def test_candidates_all_preceding_words():
    a = CorefAntecedents(candidates="words")
    a.update(AttentionBatch([planted_map()]))
    np.testing.assert_allclose(a.finalize().arrays["accuracy"], EXPECT_WORDS)


def test_head_choices_match_the_analysis():
    amap = planted_map()
    ch = head_choices(amap, amap.example.fields["coref"], 0, 1)
    assert [(c["query"], c["pred"], c["gold"], c["correct"]) for c in ch] == [
        (4, 2, [0], False), (6, 4, [2], False), (8, 0, [0, 4], True)]
    assert ch[0]["weights"][3] == pytest.approx(0.5)


def test_batch_is_not_modified():
    amap = planted_map()
    before = amap.attn.copy()
    CorefAntecedents().update(AttentionBatch([amap]))
    np.testing.assert_array_equal(amap.attn, before)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=5), st.permutations(range(5)))
def test_result_does_not_depend_on_batching_or_order(sizes, perm):
    maps = [planted_map(doc_index=d, index=d) for d in range(5)]
    for k, m in enumerate(maps):  # vary the attention so documents differ
        m.attn = np.roll(m.attn, k, axis=1)
    whole = CorefAntecedents()
    whole.update(AttentionBatch(maps))
    ordered = [maps[i] for i in perm]
    parts, pos = [], 0
    for s in sizes:
        if pos >= len(ordered):
            break
        part = CorefAntecedents()
        part.update(AttentionBatch(ordered[pos:pos + s]))
        parts.append(part)
        pos += s
    rest = CorefAntecedents()
    rest.update(AttentionBatch(ordered[pos:]))
    merged = parts[0]
    for p in parts[1:] + [rest]:
        merged.merge(p)
    import json

    dump = lambda r: json.dumps(r.to_json(), sort_keys=True)  # noqa: E731  (NaN == NaN as text)
    assert dump(merged.finalize()) == dump(whole.finalize())


def test_empty_input_and_serialisation(tmp_path):
    r = CorefAntecedents().finalize()
    assert r.tables["table2"] == [] and r.meta["mentions"] == 0
    a = CorefAntecedents(seed=3)
    a.update(AttentionBatch([planted_map()]))
    r = a.finalize()
    r.save(tmp_path / "r.json")
    import json

    back = Result.from_json(json.loads((tmp_path / "r.json").read_text()))
    np.testing.assert_allclose(back.arrays["accuracy"], r.arrays["accuracy"])
    assert back.params["seed"] == 3 and back.tables["table2"] == r.tables["table2"]
    with pytest.raises(ValueError):
        CorefAntecedents(seed=3).merge(CorefAntecedents(seed=4))


def test_window_bounds_by_hand():
    counts = np.array([1, 2, 1, 1, 3, 1])
    # 2 special tokens, 6 tokens per window -> 4 word-piece tokens per window
    assert _window_bounds(counts, 2, [0, 2, 4], "truncate", 6) == [(0, 3)]
    assert _window_bounds(counts, 2, [0, 2, 4], "sliding", 6) == [(0, 3), (1, 4), (2, 4), (3, 5), (4, 6)]
    # a word longer than the window still makes progress (extraction then skips it, counted)
    assert _window_bounds(np.array([5, 1]), 2, [0], "sliding", 6) == [(0, 1), (1, 2)]


def _toy_document(n_sent=12):
    words, starts, heads, mentions = [], [], [], []
    for s in range(n_sent):
        starts.append(len(words))
        base = len(words)
        words += ["the", "cat", "saw", "it", "."]
        heads += [base + 1, base + 2, -1, base + 2, base + 2]
        mentions += [Mention(base, base + 2, "cat"), Mention(base + 3, base + 4, "it" if s % 2 else "cat")]
    n = len(words)
    doc = Document(id="toy", words=words, sentence_starts=starts, mentions=mentions, heads=heads,
                   upos=["DET", "NOUN", "VERB", "PRON", "PUNCT"] * n_sent,
                   xpos=["DT", "NN", "VBD", "PRP", "."] * n_sent, feats=[{} for _ in range(n)],
                   lemmas=list(words))
    assign_heads_and_types(doc)
    return doc


def test_coref_windows_truncate_and_sliding(debug_bert):
    doc = _toy_document()
    enc_len = {}
    for mode in ("truncate", "sliding"):
        examples, stats = coref_windows([doc], debug_bert, mode=mode, max_seq_len=24)
        enc_len[mode] = examples
        assert stats.mentions == 24
        # anaphoric: every "cat" but the first (12 + 6 - 1) and every "it" but the first (6 - 1)
        assert stats.anaphoric == 22
        from attnscope.extract.encode import Encoder

        enc = Encoder(debug_bert)
        for ex in examples:
            assert len(enc.encode(ex, 0)) <= 24
        scored = [(ex.fields["coref"]["offset"] + h, i) for ex in examples
                  for h, i, s in zip(ex.fields["coref"]["mentions"]["head"],
                                     ex.fields["coref"]["mentions"]["id"],
                                     ex.fields["coref"]["mentions"]["score"]) if s]
        assert len(scored) == len({i for _, i in scored}) == stats.scored  # each mention once
    trunc, slide = enc_len["truncate"], enc_len["sliding"]
    assert len(trunc) == 1 and len(slide) > 1
    covered = trunc[0].fields["coref"]["mentions"]
    # the first window scores the same mentions in both modes
    assert [s for s in slide[0].fields["coref"]["mentions"]["score"]] == covered["score"]
    # sliding: every anaphoric mention has an antecedent within half a window, so all are scored
    _, st_slide = coref_windows([doc], debug_bert, mode="sliding", max_seq_len=24)
    assert st_slide.scored == 22


def _rows_map(rows_by_query: dict[int, dict[int, float]], dtype=np.float32, doc_index=0, index=0):
    """One head (1x1); each scored query's row gets the weights given, the rest on [SEP]."""
    n = len(WORDS) + 2
    attn = np.full((1, 1, n, n), 1.0 / n, dtype)
    for q, weights in rows_by_query.items():
        row = np.zeros(n, np.float64)
        for w, a in weights.items():
            row[w + 1] = a
        row[-1] = 1.0 - row.sum()
        attn[0, 0, q + 1] = row.astype(dtype)
    ex = Example(words=list(WORDS), fields={"coref": window_info(doc_index)})
    return make_map(attn, ["[CLS]"] + WORDS + ["[SEP]"], example=ex, index=index)


def test_the_query_word_itself_is_never_a_candidate():
    # every query puts 0.6 on itself and 0.3 on a gold antecedent: He@4 -> John@0,
    # her@6 -> Mary@2, John@8 -> He@4. Excluding the word itself, all three are right.
    m = _rows_map({4: {4: 0.6, 0: 0.3}, 6: {6: 0.6, 2: 0.3}, 8: {8: 0.6, 4: 0.3}})
    for cands in ("mentions", "words", "all-words"):
        a = CorefAntecedents(candidates=cands)
        a.update(AttentionBatch([m]))
        assert a.finalize().arrays["accuracy"][0, 0] == 1.0, cands
    choices = head_choices(m, m.example.fields["coref"], 0, 0, candidates="all-words")
    assert [c["pred"] for c in choices] == [0, 2, 4]


def test_paper_definition_all_other_words_is_computed_beside_the_default():
    # He@4: "liked"@5 (after the query) 0.5, John@0 0.3 -> mentions/words: John (right);
    #       all other words: liked (wrong).
    # her@6: "."@7 0.5, Mary@2 0.2, He@4 0.25 -> mentions: He (wrong, cluster A);
    #       words: He (wrong); all words: "." (wrong).
    # John@8: "smiled"@9 0.1, He@4 0.2 -> every definition: He (right).
    m = _rows_map({4: {5: 0.5, 0: 0.3}, 6: {7: 0.5, 2: 0.2, 4: 0.25}, 8: {9: 0.1, 4: 0.2}})
    a = CorefAntecedents()
    a.update(AttentionBatch([m]))
    r = a.finalize()
    assert r.arrays["accuracy"][0, 0] == pytest.approx(2 / 3)
    assert r.arrays["accuracy_all_words"][0, 0] == pytest.approx(1 / 3)
    assert r.arrays["accuracy_by_type_all_words"][:, 0, 0][:2].tolist() == [0.0, 1.0]  # pronoun, proper
    assert r.meta["candidates"] == "mentions" and r.meta["paper_candidates"] == "all-words"
    assert [row["name"] for row in r.tables["table2_all_words"]][3:] == ["1-1"]
    assert r.tables["table2_all_words"][3]["all"] == pytest.approx(1 / 3)
    assert r.tables["heads_all_words"][0]["all"] == pytest.approx(1 / 3)
    assert r.meta["best_head_all_words"] == [0, 0]
    assert any("paper's definition" in line for line in r.summary)


def test_empty_float16_rows_get_no_credit():
    # every query's weight is on [SEP]; in float16 the words get exactly 0. np.argmax over
    # the candidates would pick the first preceding mention, John@0, which is right for
    # He@4 and for John@8 (2 of 3 credited for nothing); no prediction -> 0.
    m = _rows_map({4: {}, 6: {}, 8: {}}, dtype=np.float16)
    old = CorefAntecedents(ties="lowest")
    old.update(AttentionBatch([m]))
    assert old.finalize().arrays["accuracy"][0, 0] == pytest.approx(2 / 3)
    new = CorefAntecedents()
    new.update(AttentionBatch([m]))
    r = new.finalize()
    assert r.arrays["accuracy"][0, 0] == 0.0 and r.arrays["accuracy_all_words"][0, 0] == 0.0
    # a tie between John@0 and Mary@2 for He@4 is no prediction either
    m = _rows_map({4: {0: 0.25, 2: 0.25}, 6: {2: 0.5}, 8: {0: 0.5}})
    a = CorefAntecedents()
    a.update(AttentionBatch([m]))
    assert a.finalize().arrays["accuracy"][0, 0] == pytest.approx(2 / 3)
    assert [c["pred"] for c in head_choices(m, m.example.fields["coref"], 0, 0)] == [-1, 2, 0]


def test_heldout_head_selection():
    # doc 0: the planted map (head 1-1 right on 3/3, 1-2 on 1/3); doc 1: the heads swapped.
    m0 = planted_map(doc_index=0, index=0)
    m1 = planted_map(doc_index=1, index=1)
    m1.attn = np.roll(m1.attn, 1, axis=1)  # doc 1: (0,0) <- old (0,1), (0,1) <- old (0,0)
    a = CorefAntecedents(n_boot=10)
    a.update(AttentionBatch([m0, m1]))
    rows = [r for r in a.finalize().tables["table2_heldout"] if r["candidates"] == "mentions"]
    # no split names: two folds by document parity, each chooses on one and scores the other
    assert [(r["selected_on"], r["scored_on"], r["name"]) for r in rows] == [
        ("even documents", "odd documents", "1-1"), ("odd documents", "even documents", "1-2")]
    for r in rows:
        assert r["select_accuracy"] == 1.0 and r["accuracy"] == pytest.approx(1 / 3)
        assert r["same_data_best"] == 1.0 and r["n"] == 3
        assert r["rule-based"] == 1.0 and r["nearest"] == 0.0
    # with split names: chosen on train, scored on dev
    m0.example.fields["coref"]["split"] = "train"
    m1.example.fields["coref"]["split"] = "dev"
    a = CorefAntecedents(n_boot=10)
    a.update(AttentionBatch([m1, m0]))
    rows = a.finalize().tables["table2_heldout"]
    assert [(r["candidates"], r["selected_on"], r["scored_on"], r["name"], r["accuracy"]) for r in rows] == [
        ("mentions", "train", "dev", "1-1", pytest.approx(1 / 3)),
        ("all-words", "train", "dev", "1-1", 0.0)]  # old (0,1) among all words: 0 of 3 (see above)


def test_rule_based_sieves_apply_in_order():
    # (head position, text, head word, number, gender, person); worked out sieve by sieve
    ms = [(0, "the big dog", "dog", "sg", "neut", "3"), (2, "a dog", "dog", "sg", "neut", "3"),
          (4, "it", "it", "sg", "neut", "3"), (6, "they", "they", "pl", None, "3"),
          (8, "the big dog", "dog", "sg", "neut", "3"), (9, "they", "they", "pl", None, "3"),
          (10, "the cat", "cat", "sg", "neut", "3"), (12, "that dog", "dog", "sg", "neut", "3")]
    col = {k: [m[i] for m in ms] for i, k in enumerate(("head", "text", "head_word", "number", "gender",
                                                          "person"))}
    # "the big dog"@8: exact string -> @0 (head match alone would give the nearer "a dog"@2)
    assert baseline_predictions(col, 4)["rule-based"] == 0
    # "the cat"@10: no string or head match; agreement -> @8 (the nearest, "they"@9, is plural)
    assert baseline_predictions(col, 6)["rule-based"] == 8
    # "that dog"@12: head match -> @8 (agreement alone would give the nearer "the cat"@10)
    assert baseline_predictions(col, 7)["rule-based"] == 8
    assert baseline_predictions(col, 7)["nearest"] == 10 and baseline_predictions(col, 7)["head-match"] == 8


def test_score_split_restricts_table2_but_not_the_heldout_rows():
    m0 = planted_map(doc_index=0, index=0)
    m1 = planted_map(doc_index=1, index=1)
    m1.attn = np.roll(m1.attn, 1, axis=1)
    m0.example.fields["coref"]["split"] = "train"
    m1.example.fields["coref"]["split"] = "dev"
    a = CorefAntecedents(n_boot=10, score_split="dev")
    a.update(AttentionBatch([m0, m1]))
    r = a.finalize()
    # dev alone: head (0,0) there is the planted (0,1) (1/3), (0,1) the planted (0,0) (3/3)
    np.testing.assert_allclose(r.arrays["accuracy"][0], [1 / 3, 1.0])
    assert r.meta["mentions"] == 3 and r.meta["best_head"] == [0, 1]
    assert [row["name"] for row in r.tables["table2_heldout"]] == ["1-1", "1-1"]  # chosen on train
    # a split with no mention scores nothing, but the held-out rows are still computed
    a = CorefAntecedents(n_boot=10, score_split="test")
    a.update(AttentionBatch([m0, m1]))
    r = a.finalize()
    assert r.meta["mentions"] == 0 and r.tables["table2"] == []
    assert [row["name"] for row in r.tables["table2_heldout"]] == ["1-1", "1-1"]


def test_finalize_result_in_full():
    # every field of the result, on the planted map (accuracies worked out above)
    a = CorefAntecedents()
    a.update(AttentionBatch([planted_map()]))
    r = a.finalize()
    assert r.analysis == "coref-antecedents" and r.params == a.params()
    assert {k: v for k, v in r.meta.items()} == {
        "mentions": 3, "mentions_by_type": {"pronoun": 2, "proper": 1, "nominal": 0},
        "num_layers": 2, "num_heads": 2,
        "head_convention": "layer and head 0-indexed; name is the paper's 1-indexed layer-head",
        "candidates": "mentions", "paper_candidates": "all-words", "empty_words": 0,
        "ties": "a row whose top candidate weight is 0 or shared predicts nothing (wrong)",
        "best_head": [0, 0], "best_head_all_words": [0, 0]}
    # the best head and its accuracy under each definition, with the baselines beside it
    assert len(r.summary) == 2
    says(r.summary[0], "best head 1-1", "100.0%", "3 mentions", "nearest mention 0.0%",
         "same head word 33.3%", "rule-based 100.0%")
    says(r.summary[1], "paper's definition", "1-1", "100.0%")
    heads = {(row["layer"], row["head"]): row for row in r.tables["heads"]}
    assert heads[(1, 0)] == {"layer": 1, "head": 0, "name": "2-1", "all": pytest.approx(2 / 3),
                             "pronoun": 0.5, "proper": 1.0, "nominal": None}
    assert [row["kind"] for row in r.tables["table2"]] == ["baseline"] * 3 + ["head"] * 3
    assert [row["model"] for row in r.tables["table2"]][3:] == ["Head 1-1", "Head 2-1", "Head 1-2"]
    assert set(r.tables) == {"heads", "table2", "heads_all_words", "table2_all_words", "table2_heldout"}
    assert len(r.tables["table2_heldout"]) == 0  # one document: no held-out part with mentions
    assert CorefAntecedents(ties="lowest").finalize().meta["ties"] == "lowest candidate index"


def test_finalize_with_nothing_scored():
    r = CorefAntecedents().finalize()
    assert r.summary == ["no mention with an antecedent in its window was scored"]
    assert r.meta["num_layers"] == 0 and r.meta["num_heads"] == 0 and r.meta["mentions"] == 0
    assert r.tables == {"heads": [], "table2": [], "heads_all_words": [], "table2_all_words": [],
                        "table2_heldout": []}
    assert r.arrays["accuracy"].shape == (0, 0)


def test_coref_windows_fields_and_counts_by_hand(debug_bert):
    # doc A: "the cat saw it ." x 4 (20 one-token words, sentences at 0, 5, 10, 15); mention
    # ids 0..7: cat@1 it@3 cat@6 it@8 cat@11 it@13 cat@16 it@18, clusters c c c i c c c i.
    # Sliding windows of 12 tokens = 10 words: [0,10), then the last sentence start in the
    # first half, [5,15), then [10,20). Each mention is scored in the earliest window holding
    # its head, if an antecedent is inside that window.
    doc_a = _toy_document(4)
    zw = "\u200b"
    words = ["the", "cat", zw, "saw", "it", "."]
    doc_b = Document(id="zw", words=words, sentence_starts=[0],
                     mentions=[Mention(0, 2, "c"), Mention(2, 3, "z"), Mention(4, 5, "c")],
                     heads=[1, 3, 3, -1, 3, 3], upos=["DET", "NOUN", "X", "VERB", "PRON", "PUNCT"],
                     xpos=["DT", "NN", "_", "VBD", "PRP", "."], feats=[{} for _ in words],
                     lemmas=list(words))
    assign_heads_and_types(doc_b)
    examples, stats = coref_windows([doc_a, doc_b], debug_bert, mode="sliding", max_seq_len=12,
                                    split="dev", first_doc_index=5)
    assert [(e.fields["coref"]["doc"], e.fields["coref"]["offset"], len(e.words)) for e in examples] == [
        ("toy", 0, 10), ("toy", 5, 10), ("toy", 10, 10), ("zw", 0, 6)]
    # anaphoric: cluster c of A 5 (all but cat@1), i 1 (it@18), B's it@4 1; scored: it@3 cat@6
    # (window 0), cat@11 it@13 (window 1), cat@16 (window 2), it@4 of B; it@18's antecedent
    # it@8 is outside window 2. B's zero-token mention head is unmapped.
    assert stats.as_dict() == {
        "mode": "sliding", "max_seq_len": 12, "documents": 2, "windows": 4, "mentions": 11,
        "anaphoric": 7, "scored": 6, "scored_by_type": {"pronoun": 3, "proper": 0, "nominal": 3},
        "unmapped_heads": 1}
    it = mention_attributes_of(doc_b, 2)
    assert it == ("sg", "neut", "3")
    cat = mention_attributes_of(doc_a, 0)
    info = examples[1].fields["coref"]
    assert info == {
        "doc": "toy", "doc_index": 5, "window": 1, "offset": 5, "mode": "sliding", "split": "dev",
        "mentions": {"id": [2, 3, 4, 5], "head": [1, 3, 6, 8], "cluster": ["cat", "it", "cat", "cat"],
                     "type": ["nominal", "pronoun", "nominal", "pronoun"],
                     "text": ["the cat", "it", "the cat", "it"], "head_word": ["cat", "it", "cat", "it"],
                     "number": [cat[0], "sg", cat[0], "sg"], "gender": [cat[1], "neut", cat[1], "neut"],
                     "person": [cat[2], "3", cat[2], "3"], "score": [False, False, True, True]}}
    assert examples[0].fields["coref"]["mentions"]["score"] == [False, True, True, False]
    assert examples[2].fields["coref"]["mentions"]["score"] == [False, False, True, False]
    b = examples[3].fields["coref"]
    assert b["doc_index"] == 6 and b["mentions"]["id"] == [0, 2] and b["mentions"]["head"] == [1, 4]
    assert b["mentions"]["score"] == [False, True]
    # unmapped heads add up over documents; a document without mentions adds none
    plain = Document(id="p", words=["a", "b"], sentence_starts=[0], mentions=[], heads=[1, -1],
                     upos=["X", "X"], xpos=["_", "_"], feats=[{}, {}], lemmas=["a", "b"])
    assert coref_windows([doc_b, plain, doc_b], debug_bert)[1].unmapped_heads == 2
    # a mention headed by a window's first word is inside it, one headed by the first word
    # after the window is not: "it saw it ." in windows of 2 words (4 tokens)
    words = ["it", "saw", "it", "."]
    its = Document(id="its", words=words, sentence_starts=[0], heads=[1, -1, 1, 1],
                   mentions=[Mention(0, 1, "x"), Mention(2, 3, "x")], upos=["PRON", "VERB", "PRON", "PUNCT"],
                   xpos=["PRP", "VBD", "PRP", "."], feats=[{} for _ in words], lemmas=list(words))
    assign_heads_and_types(its)
    ex, st = coref_windows([its], debug_bert, max_seq_len=4)
    assert [e.words for e in ex] == [["it", "saw"]] and ex[0].fields["coref"]["mentions"]["id"] == [0]
    ex, st = coref_windows([its], debug_bert, mode="sliding", max_seq_len=4)
    assert [e.fields["coref"]["offset"] for e in ex] == [0, 1, 2]
    assert ex[2].fields["coref"]["mentions"]["id"] == [1] and st.scored == 0
    ex, st = coref_windows([its], debug_bert, mode="sliding", max_seq_len=5)  # windows of 3 words
    assert ex[0].fields["coref"]["mentions"]["id"] == [0, 1] and st.scored == 1
    # the defaults: the paper's truncation to 128 tokens, documents numbered from 0, no split
    examples, stats = coref_windows([doc_b], debug_bert)
    assert (stats.mode, stats.max_seq_len, stats.windows, stats.documents) == ("truncate", 128, 1, 1)
    assert examples[0].fields["coref"]["doc_index"] == 0 and "split" not in examples[0].fields["coref"]


def mention_attributes_of(doc, i):
    from attnscope.data.coref import mention_attributes

    return mention_attributes(doc, doc.mentions[i])
