"""attnscope compare: paired bootstrap, cross-model distances and matching, refusals, word level.

Hand-worked cases use numbers derived in the comments, not by running the code under test.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from conftest import js_bound, line_saying, softmax_bound

from attnscope.compare import combine_rows, compare, js_cross, match_heads, paired_bootstrap
from attnscope.compare.pairing import word_rows
from attnscope.compare.stats import CrossDistances
from attnscope.data.records import Example
from attnscope.errors import AttnscopeError
from attnscope.maps import AttentionMap

LN2 = math.log(2.0)
SENTENCES = [
    {"words": ["the", "cats", "sat", "on", "the", "mat", "."]},
    {"words": ["a", "dog", "ran", "because", "it", "saw", "the", "big", "cat", "."],
     "words_pair": ["she", "said", "hello", "."]},
    {"words": ["there", "is", "an", "old", "house", "here", "."]},
    {"words": ["he", "saw", "her", "house", ",", "then", "she", "ran", "."]},
]


def _store(tmp_path, name, model, examples=SENTENCES, word_level=False):
    from attnscope.extract.runner import ExtractOptions
    from attnscope.jobs import extract_to_store

    path = tmp_path / name
    extract_to_store([Example.from_dict(e) if isinstance(e, dict) else e for e in examples], path, model,
                     options=ExtractOptions(word_level=word_level), dtype="float32")
    return path


# -- paired bootstrap: hand-made cases ---------------------------------------------------------

def test_paired_bootstrap_constant_shift_has_zero_width():
    # B = A + 0.1 on every example while A varies a lot between examples: every resample's
    # paired difference is exactly 0.1, so the interval is [0.1, 0.1] (an unpaired interval
    # would be about as wide as the spread of A).
    a = np.array([0.0, 5.0, -3.0, 10.0, 2.0])[:, None]
    r = paired_bootstrap(a, a + 0.1, np.ones_like(a, bool), n_boot=500, seed=3)
    assert r["diff"][0] == pytest.approx(0.1)
    assert r["low"][0] == pytest.approx(0.1) and r["high"][0] == pytest.approx(0.1)


def test_paired_bootstrap_three_examples_by_enumeration():
    # differences (0, 0, 3): a resample's mean is k, the number of times the third example is
    # drawn (k ~ Binomial(3, 1/3)); P(k=0) = 8/27 = 0.296 > 0.025, so the 2.5% quantile is 0;
    # P(k=3) = 1/27 = 0.037 > 0.025, so the 97.5% quantile is 3. The interval [0, 3] touches 0:
    # not a change "outside the interval".
    a = np.zeros((3, 1))
    b = np.array([[0.0], [0.0], [3.0]])
    r = paired_bootstrap(a, b, np.ones_like(a, bool), n_boot=4000, seed=0)
    assert r["diff"][0] == pytest.approx(1.0)
    assert r["low"][0] == 0.0 and r["high"][0] == 3.0


def test_paired_bootstrap_skips_undefined_examples_and_is_seeded():
    a = np.array([[1.0], [2.0], [0.0]])
    b = np.array([[2.0], [4.0], [100.0]])
    defined = np.array([[True], [True], [False]])  # the 100 must not count
    r1 = paired_bootstrap(a, b, defined, n_boot=300, seed=7)
    r2 = paired_bootstrap(a, b, defined, n_boot=300, seed=7)
    assert r1["a"][0] == pytest.approx(1.5) and r1["b"][0] == pytest.approx(3.0)
    assert r1["diff"][0] == pytest.approx(1.5)
    assert 1.0 <= r1["low"][0] <= r1["high"][0] <= 2.0  # every resample is 1, 1.5 or 2
    assert r1["low"][0] == r2["low"][0] and r1["high"][0] == r2["high"][0]


# -- distances and matching --------------------------------------------------------------------

def _longest(store) -> int:
    from attnscope.store import open_store

    return max(len(m.tokens) for m in open_store(store))


def test_js_cross_hand_case_and_self():
    # A's head looks at unit 0 from both rows, B's at unit 1: JS of two disjoint one-hot rows is
    # ln 2 per row, so the mean per row is ln 2; a head against itself is 0.
    ha = np.array([[[[1.0, 0.0], [1.0, 0.0]]]])  # [1 1 2 2]
    hb = np.array([[[[0.0, 1.0], [0.0, 1.0]]]])
    acc = CrossDistances(smoothing=0.0)
    acc.add(ha, hb)
    assert acc.distances()[0, 0] == pytest.approx(LN2, abs=js_bound(2))  # a mean per row
    assert js_cross(ha, ha, 0.0)[0, 0] == pytest.approx(0.0, abs=2 * js_bound(2))  # summed over 2 rows


def test_js_cross_agrees_with_the_paper_section_6_matrix():
    from attnscope.analyses.distances import js_matrix

    rng = np.random.default_rng(0)
    x = rng.random((2, 3, 5, 5))
    x /= x.sum(-1, keepdims=True)
    both = js_matrix(x.reshape(6, 5, 5), 0.001)
    assert np.allclose(js_cross(x, x, 0.001), both, atol=5 * js_bound(5), rtol=0)  # sums of 5 rows of 5


def test_match_heads_finds_a_permutation():
    d = np.array([[5.0, 0.1, 4.0], [0.2, 6.0, 4.0], [3.0, 3.0, 0.3]])
    assert match_heads(d) == [(0, 1), (1, 0), (2, 2)]


def test_word_rows_by_hand():
    # units: [CLS] w0 w1 [SEP]; the words' rows keep their word columns and sum the two special
    # columns into the last one.
    attn = np.array([[[[0.1, 0.2, 0.3, 0.4], [0.5, 0.1, 0.1, 0.3], [0.0, 0.6, 0.2, 0.2],
                       [0.25, 0.25, 0.25, 0.25]]]])
    m = AttentionMap(0, attn, ["[CLS]", "a", "b", "[SEP]"], np.array([1, 0, 0, 1], bool),
                     np.zeros(4, int), np.array([-1, 0, 1, -1]), "word", Example(words=["a", "b"]))
    assert np.allclose(word_rows(m)[0, 0], [[0.1, 0.1, 0.8], [0.6, 0.2, 0.2]])


def test_combine_rows():
    a = [{"relation": "det", "head": "8-11", "accuracy": 90.0, "selection": "paper"},
         {"relation": "det", "head": "1-1", "accuracy": 10.0, "selection": "held-out"}]
    b = [{"relation": "det", "head": "6-2", "accuracy": 80.0, "selection": "paper"},
         {"relation": "nsubj", "head": "2-2", "accuracy": 50.0, "selection": "paper"}]
    rows = combine_rows(a, b, "relation", ["head", "accuracy"], selection="paper")
    assert rows[0] == {"relation": "det", "head_a": "8-11", "head_b": "6-2", "accuracy_a": 90.0,
                       "accuracy_b": 80.0, "accuracy_change": -10.0}
    assert rows[1]["accuracy_a"] is None and "accuracy_change" not in rows[1]


# -- whole comparisons on tiny random models ---------------------------------------------------

def test_a_store_against_itself(tmp_path, debug_bert):
    s = _store(tmp_path, "a", debug_bert)
    s2 = _store(tmp_path, "a2", debug_bert)
    out = tmp_path / "out"
    cmp = compare(s, s2, out, n_boot=200)
    assert cmp.pairing.level == "token"
    assert np.all(cmp.stats["diff"] == 0) and np.all(cmp.stats["low"] == 0) and np.all(cmp.stats["high"] == 0)
    assert not cmp.changed().any()
    assert cmp.matching == [(i, i) for i in range(4)]
    assert np.allclose(cmp.same_head(), 0.0, atol=js_bound(_longest(s)), rtol=0)  # equal rows: rounding only
    off = cmp.distances[~np.eye(4, dtype=bool)]
    assert cmp.same_head().max() < off.min() / 100  # random heads are close to uniform, yet distinct
    res = json.loads((out / "results" / "compare.json").read_text())
    assert res["level"] == "token" and res["matching"] == [[i, i] for i in range(4)]
    assert res["identical"] is True and res["max_weight_difference"] == 0.0
    line_saying(res["findings"], "identical within float rounding")
    assert not any("changed most" in f or "largest change" in f for f in res["findings"]), res["findings"]
    layers = json.loads((out / "tables" / "compare_layers.json").read_text())
    assert [r["most_changed_head"] for r in layers] == [None, None]  # noise names no head
    html = (out / "report.html").read_text()
    assert "identical within float rounding" in html
    assert "What changed from" in html and "Content-Security-Policy" in html
    from attnscope.report.html import network_references

    assert network_references(html) == []
    assert (out / "tables" / "compare_heads.tex").is_file()
    assert (out / "figures" / "compare_layers.png").is_file()
    assert any((out / "views").glob("compare-a-*.html"))


def test_a_store_compared_with_itself_says_identical(tmp_path, debug_bert, capsys):
    """``attnscope compare X X`` (the tour's): float32 rounding of the distances (about 1e-8) is
    not reported as change, in the printed findings, the page or the results."""
    from attnscope.cli.main import main

    s = _store(tmp_path, "a", debug_bert, word_level=True)
    out = tmp_path / "out"
    assert main(["compare", str(s), str(s), "--out", str(out), "--n-boot", "200"]) == 0
    err = capsys.readouterr().err
    assert "identical within float rounding" in err and "changed most" not in err, err
    res = json.loads((out / "results" / "compare.json").read_text())
    assert res["identical"] is True and res["level"] == "word"
    assert not any(res["arrays"]["diff"][s][layer][h] for s in range(10) for layer in range(2) for h in range(2))
    assert len(res["findings"]) == 2  # what was compared, and that nothing changed
    html = (out / "report.html").read_text()
    assert "identical within float rounding" in html and "changed most" not in html


def _swap_heads(lm, layer: int, h1: int, h2: int) -> None:
    """Swap two heads of one BERT layer: their query/key/value rows and the output projection's
    input columns. The layer computes the same function; only the heads' order changes."""
    import torch

    att = lm.model.encoder.layer[layer].attention
    d = lm.model.config.hidden_size // lm.model.config.num_attention_heads
    order = torch.arange(lm.model.config.hidden_size)
    a, b = order[h1 * d:(h1 + 1) * d].clone(), order[h2 * d:(h2 + 1) * d].clone()
    order[h1 * d:(h1 + 1) * d], order[h2 * d:(h2 + 1) * d] = b, a
    with torch.no_grad():
        for lin in (att.self.query, att.self.key, att.self.value):
            lin.weight.copy_(lin.weight[order])
            lin.bias.copy_(lin.bias[order])
        att.output.dense.weight.copy_(att.output.dense.weight[:, order])


def test_swapped_heads_are_matched_back(tmp_path):
    from attnscope.models import load_model

    orig = load_model("debug:bert", seed=0)
    swapped = load_model("debug:bert", seed=0)
    _swap_heads(swapped, 0, 0, 1)
    a, b = _store(tmp_path, "a", orig), _store(tmp_path, "b", swapped)
    cmp = compare(a, b, n_boot=200)
    # flat heads, layer-major with 2 heads per layer: layer 0's heads 0 and 1 trade places,
    # layer 1 is untouched (its input is the same)
    assert cmp.matching == [(0, 1), (1, 0), (2, 2), (3, 3)]
    off = min(cmp.distances[0, 0], cmp.distances[1, 1])
    assert max(cmp.distances[0, 1], cmp.distances[1, 0]) < off / 100
    assert cmp.same_head()[1].max() < off / 100
    # the statistics of head 0 in B are head 1's in A
    # (means of float32 softmax rows' statistics, the swapped heads' scores summed in another order)
    assert np.allclose(cmp.stats["b"][:, 0, 0], cmp.stats["a"][:, 0, 1], atol=softmax_bound(_longest(a)), rtol=0)
    from attnscope.compare.report import findings

    said = findings(cmp)
    assert not cmp.identical() and cmp.max_diff > 1e-3  # random heads are near uniform
    # layer 1 changed; layer 2 differs by float rounding only (the swapped heads' outputs are
    # summed in another order), which is no finding
    assert cmp.changed_layers() == [0] and cmp.layer_distance()[1] <= 1e-5
    line_saying(said, "changed most", "layer 1 (", "least: layer 2 (<1e-05 nats")
    assert not cmp.changed()[:, 1].any()
    line = line_saying(said, "2 of 4 heads")
    # each moved head is named with its match, one pair to a clause
    assert re.search(r"1-1 of A[^;]*1-2 of B", line) and re.search(r"1-2 of A[^;]*1-1 of B", line), line


def test_refuses_different_inputs(tmp_path, debug_bert, capsys):
    from attnscope.cli.main import main

    a = _store(tmp_path, "a", debug_bert)
    b = _store(tmp_path, "b", debug_bert, examples=SENTENCES[:2] + [{"words": ["a", "cat", "."]}])
    out = tmp_path / "out"
    code = main(["compare", str(a), str(b), "--out", str(out), "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "different inputs" in err and "Traceback" not in err
    assert not out.exists()


def test_usage_errors_are_one_line(tmp_path, debug_bert, capsys):
    from attnscope.cli.main import main

    a = _store(tmp_path, "a", debug_bert)
    out = tmp_path / "out"
    for argv in (["compare", str(a), "--out", str(out)],
                 ["compare", str(a), str(a), "--out", str(out), "--model-a", "debug"],
                 ["compare", str(a), str(tmp_path / "nothing"), "--out", str(out)]):
        assert main(argv) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.heavy
def test_the_report_path_goes_to_stdout_as_run_prints_it(tmp_path, debug_bert, capsys):
    """Like ``attnscope run``: the report's path alone on stdout (also with --quiet), the
    summary on stderr."""
    from attnscope.cli.main import main

    a, b = _store(tmp_path, "a", debug_bert), _store(tmp_path, "b", debug_bert)
    for quiet, out in (([], tmp_path / "out"), (["-q"], tmp_path / "out-q")):
        assert main(["compare", str(a), str(b), "--out", str(out), "--n-boot", "200", *quiet]) == 0
        said = capsys.readouterr()
        assert said.out == f"{out / 'report.html'}\n"
        assert ("4 examples" in said.err and "token level" in said.err) == (not quiet)
        assert str(out / "report.html") not in said.err


def test_two_tokenizers_at_word_level_by_hand(tmp_path, debug_bert, debug_roberta):
    ex = [{"words": ["the", "cats", "sat", "."]}]
    a = _store(tmp_path, "a", debug_bert, ex)
    b = _store(tmp_path, "b", debug_roberta, ex)
    from attnscope.store import open_store

    ma, mb = open_store(a)[0], open_store(b)[0]
    assert ma.tokens == ["[CLS]", "the", "cat", "##s", "sat", ".", "[SEP]"]
    assert mb.tokens == ["<s>", "the", "Ġc", "at", "s", "Ġs", "at", "Ġ", ".", "</s>"]
    cmp = compare(a, b, n_boot=200)
    # one sentence: both models put one special token before and one after it, so the word-level
    # units are the same: [CLS]/<s>, the, cats, sat, ., [SEP]/</s>.
    assert cmp.pairing.level == "word" and cmp.pairing.layout == "same units"
    # units by hand. BERT: the=1, cats=2..3, sat=4, .=5; specials 0 and 6. RoBERTa (as its debug
    # vocabulary splits them): the=1, cats=2..4, sat=5..6, .=7..8; specials 0 and 9. A unit's row is
    # the mean of its pieces' rows; its column the sum over its pieces.

    def by_hand(attn, units):
        rows = np.stack([attn[:, :, p, :].mean(2) for p in units], axis=2)  # [L H U n]
        return np.stack([rows[..., p].sum(-1) for p in units], axis=-1)  # [L H U U]

    wa = by_hand(ma.attn, [[0], [1], [2, 3], [4], [5], [6]])
    wb = by_hand(mb.attn, [[0], [1], [2, 3, 4], [5, 6], [7, 8], [9]])
    n = len(mb.tokens)  # the longer: each unit row sums a float32 softmax row of at most n tokens
    assert np.allclose(wa.sum(-1), 1.0, atol=softmax_bound(n), rtol=0)
    assert np.allclose(wb.sum(-1), 1.0, atol=softmax_bound(n), rtol=0)

    def js(p, q):  # Jensen-Shannon divergence of two rows, in nats, after the 0.001 smoothing
        p = 0.001 / p.size + 0.999 * p
        q = 0.001 / q.size + 0.999 * q
        m = (p + q) / 2
        return 0.5 * np.sum(p * np.log(p / m)) + 0.5 * np.sum(q * np.log(q / m))

    expect = np.zeros((4, 4))
    for i in range(4):
        for j in range(4):
            pa, pb = wa[i // 2, i % 2], wb[j // 2, j % 2]
            expect[i, j] = np.mean([js(pa[r], pb[r]) for r in range(6)])
    assert np.allclose(cmp.distances, expect, atol=js_bound(n), rtol=0)  # means per row, against float64
    # the per-head statistics are each model's own: 'current' of A is the mean diagonal
    assert np.allclose(cmp.stats["a"][0], np.diagonal(wa, axis1=2, axis2=3).mean(-1), atol=softmax_bound(n), rtol=0)


def test_pairs_compare_words_with_one_special_column(tmp_path, debug_bert, debug_roberta):
    # a sentence pair: [CLS] A [SEP] B [SEP] against <s> A </s></s> B </s>: the special tokens
    # differ, so only the words' rows are compared, with one column for all special tokens
    ex = [SENTENCES[1]]
    cmp = compare(_store(tmp_path, "a", debug_bert, ex), _store(tmp_path, "b", debug_roberta, ex),
                  n_boot=200)
    assert cmp.pairing.layout == "words + special column"
    assert cmp.rows == 14  # the 14 words' rows
    assert cmp.distances.shape == (4, 4) and np.isfinite(cmp.distances).all()


def test_text_split_differently_is_refused(tmp_path, debug_bert, debug_gpt2):
    # GPT-2's byte-level pre-tokenizer keeps "don't" as "don" + "'t", BERT splits it into three
    # words: the words differ, so there is no common unit to compare.
    ex = [{"text": "They don't sit."}]
    a = _store(tmp_path, "a", debug_bert, ex)
    b = _store(tmp_path, "b", debug_gpt2, ex)
    with pytest.raises(AttnscopeError, match="different words"):
        compare(a, b)


@pytest.mark.heavy
def test_two_run_folders_with_saved_maps(tmp_path, capsys):
    """The seam with ``attnscope run --save-maps``: its maps/syntax/dev store and its Table 1."""
    import shutil

    from attnscope.cli.main import main
    from attnscope.pipeline import RunConfig, demo_inputs, run_pipeline
    from attnscope.store.results import read_json

    run1 = tmp_path / "run1"
    run_pipeline(RunConfig(model="debug:bert", deps=demo_inputs()["deps"], save_maps=True), run1)
    run2 = tmp_path / "run2"
    shutil.copytree(run1, run2)
    out = tmp_path / "out"
    assert main(["compare", str(run1), str(run2), "--out", str(out), "-q", "--n-boot", "200"]) == 0
    res = read_json(out / "results" / "compare.json")
    assert res["sources"]["maps"] == "syntax/dev" and res["level"] == "word"
    table1 = [r for r in read_json(run1 / "tables" / "table1_syntax.json") if r["selection"] == "paper"]
    rows = res["run_tables"]["table1_syntax"]
    assert [r["relation"] for r in rows] == [r["relation"] for r in table1]
    assert all(r["accuracy_change"] == 0 and r["head_a"] == r["head_b"] for r in rows)
    assert "Table 1 of both models" in (out / "report.html").read_text()
    # a second comparison into the same folder needs --overwrite
    assert main(["compare", str(run1), str(run2), "--out", str(out), "-q"]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_accumulators_merge_like_one_pass(tmp_path, debug_bert, debug_roberta):
    from attnscope.compare.pairing import check_pairing, common_units, open_sides, paired_maps
    from attnscope.compare.stats import PairedHeadStats

    a, b = open_sides(_store(tmp_path, "a", debug_bert), _store(tmp_path, "b", debug_roberta))
    pairing = check_pairing(a, b)
    pairs = list(paired_maps(a, b, pairing))
    whole, halves = (PairedHeadStats(n_boot=200), CrossDistances()), [
        (PairedHeadStats(n_boot=200), CrossDistances()) for _ in range(2)]
    for k, (ma, mb) in enumerate(pairs):
        for stats, cross in (whole, halves[k % 2]):
            stats.add(ma.index, ma, mb)
            cross.add(*common_units(ma, mb, pairing.layout)[:2])
    merged_stats = halves[1][0].merge(halves[0][0])  # another order than the one pass
    merged_cross = halves[1][1].merge(halves[0][1])
    one, two = whole[0].finalize(), merged_stats.finalize()
    for key in ("a", "b", "diff", "low", "high"):
        assert np.array_equal(one[key], two[key])
    assert merged_cross.rows == whole[1].rows
    assert np.allclose(merged_cross.distances(), whole[1].distances(), rtol=1e-12)


def test_two_models_of_different_shapes_from_the_command_line(tmp_path, debug_bert, capsys):
    """--model-a/--model-b: a local model folder with 3 layers x 4 heads against debug:bert."""
    import torch
    import transformers

    from attnscope.cli.main import main
    from attnscope.data.io import write_examples
    from attnscope.store.results import read_json

    torch.manual_seed(1)
    config = transformers.BertConfig(vocab_size=len(debug_bert.tokenizer), hidden_size=32,
                                     num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=512, type_vocab_size=2)
    folder = tmp_path / "bert-3x4"
    transformers.BertModel(config).save_pretrained(folder)
    debug_bert.tokenizer.save_pretrained(folder)
    inputs = tmp_path / "inputs.json"
    write_examples(SENTENCES, inputs)
    out = tmp_path / "out"
    argv = ["compare", "--model-a", "debug:bert", "--model-b", str(folder), "--inputs", str(inputs),
            "--out", str(out), "-q", "--n-boot", "200"]
    assert main(argv) == 0, capsys.readouterr().err
    res = read_json(out / "results" / "compare.json")
    assert res["level"] == "word" and res["statistics"] == []
    assert np.array(res["arrays"]["distances"]).shape == (4, 12)
    assert "same_head" not in res["arrays"]
    assert len(res["matching"]) == 4 and len({j for _, j in res["matching"]}) == 4
    assert any("different heads" in n for n in res["notes"])
    assert (out / "stores" / "a" / "manifest.json").is_file() and (out / "report.html").is_file()


def test_two_models_refused_leave_nothing(tmp_path, capsys):
    from attnscope.cli.main import main
    from attnscope.data.io import write_examples

    inputs = tmp_path / "text.json"
    write_examples([{"text": "They don't sit."}], inputs)
    out = tmp_path / "out"
    code = main(["compare", "--model-a", "debug:bert", "--model-b", "debug:gpt2", "--inputs", str(inputs),
                 "--out", str(out), "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "different words" in err
    assert not out.exists()
