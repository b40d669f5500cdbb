"""Vig's patterns: hand-worked masses and chance levels, key concentration, labels, merge and
batching invariance, and the ``patterns`` family end to end on tiny models."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import line_saying, make_map, one_line, says, softmax_bound
from hypothesis import given, settings
from hypothesis import strategies as st

from attnscope.analyses import ANALYSES
from attnscope.analyses.patterns import (
    STATS,
    KeyConcentration,
    PatternThresholds,
    VigPatterns,
    pattern_labels,
)
from attnscope.analyses.token_classes import TokenClasser
from attnscope.errors import AttnscopeError, InputError
from attnscope.extract import AttentionBatch

BERT = TokenClasser(first=frozenset({"[CLS]"}), separators=frozenset({"[SEP]"}))

# [CLS] a b a [SEP] | a c ##d [SEP]: "a" repeated in its own segment (1, 3) and in the other (5);
# "c ##d" is one word in two pieces (6, 7).
TOKENS = ["[CLS]", "a", "b", "a", "[SEP]", "a", "c", "##d", "[SEP]"]
SPECIAL = [True, False, False, False, True, False, False, False, True]
SEGMENT = [0, 0, 0, 0, 0, 1, 1, 1, 1]
WORDS = [-1, 0, 1, 2, -1, 3, 4, 4, -1]


def _pair_attention() -> np.ndarray:
    a = np.zeros((9, 9))
    a[0] = 1 / 9
    a[1, [3, 5, 0]] = [0.5, 0.25, 0.25]
    a[2, [1, 3]] = [0.5, 0.5]
    a[3, [1, 5, 4]] = [0.2, 0.6, 0.2]
    a[4, 8] = 1.0
    a[5, [1, 3, 6]] = [0.3, 0.3, 0.4]
    a[6, [7, 8]] = [0.8, 0.2]
    a[7, [6, 5]] = [0.5, 0.5]
    a[8, 4] = 1.0
    return a


def _pair_map(index=0, attn=None):
    return make_map(_pair_attention() if attn is None else attn, TOKENS, special=SPECIAL, segment=SEGMENT,
                    word_ids=WORDS, level="token", index=index)


def _finalize(maps, **kw):
    a = VigPatterns(BERT, **kw)
    a.update(AttentionBatch(list(maps)))
    return a.finalize()


# -- hand-worked values ----------------------------------------------------------------------
def test_pair_example_by_hand():
    r = _finalize([_pair_map()])
    v = {k: float(r.arrays[k][0, 0]) for k in STATS}
    c = r.meta["chance"]
    # pattern 3: rows 1 and 3 ("a" in segment A) -> 0.5 and 0.2; row 5 has no "a" in segment B
    assert v["repeat_same"] == pytest.approx(0.35)
    assert c["repeat_same"] == pytest.approx(1 / 9)
    # pattern 4: rows 1, 3 -> col 5 (0.25, 0.6); row 5 -> cols 1, 3 (0.6); chance 1/9, 1/9, 2/9
    assert v["repeat_other"] == pytest.approx(1.45 / 3)
    assert c["repeat_other"] == pytest.approx(4 / 27)
    # pattern 5: row 6 -> its later piece 0.8, row 7 -> its earlier piece 0.5
    assert v["pieces"] == pytest.approx(0.65)
    assert v["pieces_earlier"] == pytest.approx(0.5)
    assert v["pieces_later"] == pytest.approx(0.8)
    for k in ("pieces", "pieces_earlier", "pieces_later"):
        assert c[k] == pytest.approx(1 / 9)
    # within / across, over the six non-special rows, 3 non-special columns on each side
    assert v["within"] == pytest.approx((0.5 + 1.0 + 0.2 + 0.4 + 0.8 + 1.0) / 6)
    assert v["across"] == pytest.approx((0.25 + 0 + 0.6 + 0.6 + 0 + 0) / 6)
    assert c["within"] == pytest.approx(1 / 3) and c["across"] == pytest.approx(1 / 3)
    # entropy of the renormalised within part: rows 2 and 7 split evenly over two (ln 2), others 0
    assert v["within_entropy"] == pytest.approx(2 * math.log(2) / 6)
    assert c["within_entropy"] == pytest.approx(math.log(3))
    assert r.meta["rows"] == {"repeat_same": 2, "repeat_other": 3, "pieces": 2, "pieces_earlier": 1,
                              "pieces_later": 1, "within": 6, "across": 6, "within_entropy": 6}
    # section 3 chance levels: 3 delimiters of 9; previous and next 1/9 per row
    assert r.meta["delimiter_chance"] == pytest.approx(3 / 9)
    assert r.meta["previous_chance"] == pytest.approx(1 / 9)
    assert r.meta["next_chance"] == pytest.approx(1 / 9)


def test_rows_are_pooled_not_averaged_per_example():
    # second example: [CLS] x x x [SEP] with uniform attention: 3 rows, each 2/5 on its repeats
    other = make_map(np.full((5, 5), 0.2), ["[CLS]", "x", "x", "x", "[SEP]"], level="token", index=1)
    r = _finalize([_pair_map(), other])
    assert float(r.arrays["repeat_same"][0, 0]) == pytest.approx((0.5 + 0.2 + 3 * 0.4) / 5)  # not 0.375
    assert r.meta["chance"]["repeat_same"] == pytest.approx((2 / 9 + 3 * 0.4) / 5)
    assert r.meta["rows"]["repeat_same"] == 5


def test_causal_by_hand():
    n = 5
    attn = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]  # uniform over visible keys
    m = make_map(attn, ["a", "b", "a", "c", "##d"], special=[False] * n, segment=[0, 0, 0, 1, 1],
                 word_ids=[0, 1, 2, 3, 3], level="token")
    r = _finalize([m], causal=True)
    v = {k: float(r.arrays[k][0, 0]) for k in STATS}
    c = r.meta["chance"]
    # only row 2 sees an earlier "a"; the segment ids are ignored for a causal model
    assert v["repeat_same"] == pytest.approx(1 / 3) and c["repeat_same"] == pytest.approx(1 / 3)
    assert v["pieces_earlier"] == pytest.approx(1 / 5) and v["pieces"] == pytest.approx(1 / 5)
    for k in ("repeat_other", "across", "pieces_later"):
        assert math.isnan(v[k]) and c[k] is None
    assert v["within"] == pytest.approx(1.0) and c["within"] == pytest.approx(1.0)
    expected_h = np.mean([math.log(k) for k in (2, 3, 4, 5)])
    assert v["within_entropy"] == pytest.approx(expected_h) and c["within_entropy"] == pytest.approx(expected_h)
    assert set(r.meta["not_applicable"]) == {"repeat_other", "across", "pieces_later"}
    assert r.meta["previous_chance"] == pytest.approx(np.mean([1 / 2, 1 / 3, 1 / 4, 1 / 5]))
    assert r.meta["next_chance"] == 0.0


def test_punctuation_and_special_tokens_are_not_repeats():
    tokens = ["[CLS]", ".", "a", ".", ",", ",", "[SEP]", "[SEP]"]
    m = make_map(np.full((8, 8), 1 / 8), tokens, special=[1, 0, 0, 0, 0, 0, 1, 1], level="token")
    r = _finalize([m])
    assert r.meta["rows"]["repeat_same"] == 0 and math.isnan(r.arrays["repeat_same"][0, 0])


def test_best_example_per_head():
    weak = _pair_attention()
    weak[1, [3, 5, 0]] = [0.1, 0.25, 0.65]  # row 1 puts less on its repeat
    r = _finalize([_pair_map(index=7, attn=weak), _pair_map(index=3)])
    assert int(r.arrays["best_example_repeat_same"][0, 0]) == 3
    # a tie goes to the lower index
    r = _finalize([_pair_map(index=9), _pair_map(index=4)])
    assert int(r.arrays["best_example_pieces"][0, 0]) == 4


# -- labels ----------------------------------------------------------------------------------
def test_pattern_labels_thresholds():
    def arr(*xs):
        return np.array([xs], dtype=float)  # [1 H]

    stats = {
        "delimiter": arr(0.7, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1),
        "previous": arr(0.0, 0.6, 0.0, 0.0, 0.0, 0.0, 0.0),
        "next": arr(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
        "pieces_earlier": arr(0.0, 0.9, 0.1, 0.2, 0.0, 0.0, 0.0),
        "pieces_later": arr(0.0, 0.0, 0.4, 0.1, 0.0, 0.0, 0.0),
        "repeat_other": arr(0.0, 0.0, 0.0, 0.0, 0.35, 0.0, 0.0),
        "repeat_same": arr(0.0, 0.0, 0.0, 0.0, 0.0, 0.35, 0.0),
        "within": arr(0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.9),
        "within_entropy": arr(0, 0, 0, 0, 0, 0, 1.9),
    }
    chance = {"pieces_earlier": 0.05, "pieces_later": 0.05, "repeat_other": 0.1, "repeat_same": 0.1,
              "within_entropy": 2.0}
    labels = pattern_labels(stats, chance, causal=False)
    assert labels.tolist() == [["delimiter", "previous", "word pieces", "other", "repeat, other segment",
                                "repeat, same segment", "bag of words"]]
    # head 5: 0.35 on repeats is under 3 x chance when the chance level is 0.2
    chance["repeat_same"] = 0.2
    assert pattern_labels(stats, chance, causal=False)[0, 5] == "other"
    # one direction is enough (head 2: later pieces), but a previous-token head stays "previous"
    # (head 1); 0.4 on later pieces is not over 3 x chance when the chance level is 0.15
    assert pattern_labels(stats, dict(chance, pieces_later=0.15), causal=False)[0, 2] == "other"
    # causal: no later pieces (no chance level), earlier pieces alone make the label
    causal_chance = dict(chance, pieces_later=None)
    stats["pieces_earlier"][0, 3] = 0.4
    assert pattern_labels(stats, causal_chance, causal=True)[0, 2:4].tolist() == ["other", "word pieces"]
    stricter = PatternThresholds(bag_evenness=0.99)
    assert pattern_labels(stats, chance, causal=False, thresholds=stricter)[0, 6] == "other"


# -- key concentration -----------------------------------------------------------------------
def test_key_concentration_by_hand():
    d = 20  # top 5% of 20 dimensions = 1 dimension
    spike = np.zeros(d)
    spike[3] = 2.0
    ones = np.ones(d)  # constant: kurtosis undefined, not counted; top share 1/20
    alt = np.array([1.0, -1.0] * (d // 2))  # kurtosis -2, top share 1/20
    pad = np.arange(d, dtype=float) ** 3
    keys = np.stack([spike, ones, alt, pad])[None, None]  # [B=1 H=1 T=4 d]
    classes = np.array([[0, 3, 3, -1]])
    k = KeyConcentration()
    k.add_keys(0, keys, classes)
    r = k.finalize()
    assert r.meta["top_dims"] == 1
    assert r.arrays["top_share"][0, 0] == pytest.approx(1.0)
    # excess kurtosis of one spike in d dimensions: (d^2 - 3d + 3) / (d - 1) - 3
    assert r.arrays["kurtosis"][0, 0] == pytest.approx((d * d - 3 * d + 3) / (d - 1) - 3)
    assert r.arrays["top_share"][0, 3] == pytest.approx(0.05)
    assert r.arrays["kurtosis"][0, 3] == pytest.approx(-2.0)
    assert math.isnan(r.arrays["top_share"][0, 1])  # no separator tokens
    assert r.arrays["count"][0].tolist() == [1, 0, 0, 2]


def test_key_concentration_merge_equals_one_pass():
    rng = np.random.default_rng(0)
    keys = rng.standard_normal((3, 2, 5, 16))
    classes = rng.integers(-1, 4, size=(3, 5))
    whole = KeyConcentration()
    for layer in range(2):
        whole.add_keys(layer, keys, classes)
    parts = [KeyConcentration(), KeyConcentration()]
    for layer in range(2):
        parts[0].add_keys(layer, keys[:1], classes[:1])
        parts[1].add_keys(layer, keys[1:], classes[1:])
    got = parts[0].merge(parts[1]).finalize()
    want = whole.finalize()
    for key in want.arrays:
        np.testing.assert_allclose(got.arrays[key], want.arrays[key], rtol=1e-12, equal_nan=True)
    with pytest.raises(ValueError):
        KeyConcentration().merge(KeyConcentration(top_fraction=0.1))


# -- contract, merge and batching invariance -------------------------------------------------
def test_contract_empty_one_and_json():
    from attnscope.analyses.base import Result

    assert ANALYSES["vig-patterns"] is VigPatterns
    empty = VigPatterns().finalize()
    assert empty.summary == ["no examples"] and not empty.arrays
    a = VigPatterns(BERT)
    batch = AttentionBatch([_pair_map()])
    before = batch.items[0].attn.copy()
    a.update(batch)
    np.testing.assert_array_equal(batch.items[0].attn, before)
    r = a.finalize()
    back = Result.from_json(json.loads(json.dumps(r.to_json())))
    for k in r.arrays:
        np.testing.assert_array_equal(back.arrays[k], r.arrays[k])
    assert a.finalize().to_json() == r.to_json()
    with pytest.raises(ValueError):
        VigPatterns(BERT).merge(VigPatterns(BERT, causal=True))
    word = make_map(np.eye(3), ["[CLS]", "a", "[SEP]"], level="word")
    with pytest.raises(ValueError, match="token-level"):
        VigPatterns().update(AttentionBatch([word]))


@st.composite
def map_lists(draw):
    L, H = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    k = draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    maps = []
    for _ in range(k):
        n = int(rng.integers(3, 9))
        attn = rng.dirichlet(np.full(n, 0.5), size=(L, H, n))
        inner = [str(rng.choice(["a", "b", "##c", ".", "a"])) for _ in range(n - 2)]
        tokens = ["[CLS]"] + inner + ["[SEP]"]
        cut = int(rng.integers(1, n))
        segment = [0] * cut + [1] * (n - cut)
        special = [True] + [False] * (n - 2) + [True]
        words, w = [], -1
        for t, sp in zip(tokens, special):
            if sp:
                words.append(-1)
                continue
            if not t.startswith("##") or w < 0:
                w += 1
            words.append(w)
        maps.append(make_map(attn, tokens, special=special, segment=segment, word_ids=words,
                             level="token", index=int(rng.integers(0, 50))))
    cuts = sorted(draw(st.lists(st.integers(0, k), max_size=3)))
    return maps, cuts, draw(st.booleans())


@settings(max_examples=40, deadline=None)
@given(map_lists())
def test_streamed_and_merged_equals_one_shot(data):
    maps, cuts, causal = data
    whole = VigPatterns(BERT, causal=causal)
    whole.update(AttentionBatch(maps))
    expected = whole.finalize()
    bounds = [0] + cuts + [len(maps)]
    parts = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        a = VigPatterns(BERT, causal=causal)
        for m in maps[lo:hi]:
            a.update(AttentionBatch([m]))
        parts.append(a)
    merged = parts[-1]  # merged in reverse order: the result must not depend on it
    for p in reversed(parts[:-1]):
        merged.merge(p)
    got = merged.finalize()
    assert set(got.arrays) == set(expected.arrays)
    for key in expected.arrays:
        np.testing.assert_allclose(got.arrays[key], expected.arrays[key], rtol=1e-9, atol=1e-12,
                                   equal_nan=True, err_msg=key)
    for key in ("chance", "rows", "delimiter_chance", "previous_chance", "first_index"):
        assert got.meta.get(key) == pytest.approx(expected.meta.get(key), nan_ok=True), key


# -- the family, end to end ------------------------------------------------------------------
EXAMPLES = [
    {"text": "Strawberries are red. Strawberries are sweet.", "text_pair": "I like strawberries a lot."},
    {"text": "The cat sat on the mat.", "text_pair": "The dog sat too."},
    {"text": "One segment only, with the the repeats."},
]


def _family():
    from attnscope.families import FAMILIES, load_families

    load_families()
    return FAMILIES["patterns"]()


def _run(model, path, out, options=None, **ctx_kw):
    from attnscope.families import Context

    fam = _family()
    opts = options or fam.Options()
    ctx = Context(model=model, out_dir=out, **ctx_kw)
    return fam.run(fam.prepare({"patterns": path}, opts, ctx), opts, ctx).section


def _write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["debug_bert", "debug_gpt2"])
def test_family_end_to_end(name, request, tmp_path):
    lm = request.getfixturevalue(name)
    sec = _run(lm, _write_jsonl(tmp_path / "ex.jsonl", EXAMPLES), tmp_path / "out")
    assert sec.key == "patterns" and sec.title == "Vig's patterns"
    payload = json.loads((tmp_path / "out/results/patterns.json").read_text(), parse_constant=pytest.fail)
    heads = {t.name: t for t in sec.tables}["patterns_heads"]
    assert len(heads.rows) == lm.num_layers * lm.num_heads
    best = {r["statistic"]: r for r in payload["best"]}
    assert sec.best_heads
    for layer, head, index, _ in sec.best_heads:
        assert 0 <= layer < lm.num_layers and 0 <= head < lm.num_heads
        assert index in sec.maps and sec.maps[index].index == index
        assert sec.maps[index].example.text == EXAMPLES[index]["text"]
    keys = payload["keys"]["tables"]["key_concentration"]
    assert len(keys) == lm.num_layers
    for p in sec.figures[0].paths + [t.paths[0] for t in sec.tables]:
        assert p.is_file()
    if lm.facts.causal:
        for k in ("repeat_other", "pieces_later", "next"):
            assert best[k]["value"] is None and best[k]["note"].startswith("not applicable")
        assert all(r["repeat_other"] is None and r["across"] is None for r in heads.rows)
        assert keys[0]["separator_count"] == 0
    else:
        assert best["repeat_other"]["head"] is not None
        # every [SEP] key of every example counted once per key head in each layer
        seps = sum(1 + bool(e.get("text_pair")) for e in EXAMPLES)
        assert keys[0]["separator_count"] == seps * lm.num_heads
        assert keys[0]["first_count"] == len(EXAMPLES) * lm.num_heads


def test_family_text_input_and_store_agree(debug_bert, tmp_path):
    from attnscope.data.unlabeled import prepare_unlabeled
    from attnscope.extract.runner import ExtractOptions
    from attnscope.jobs import extract_to_store

    text = tmp_path / "doc.txt"
    text.write_text("The cat sat.\nThe cat ran away.\nIt was late.\n\nA dog barked.\nThe dog slept.\n",
                    encoding="utf-8")
    _run(debug_bert, text, tmp_path / "a")
    from_text = json.loads((tmp_path / "a/results/patterns.json").read_text())
    examples = prepare_unlabeled(text, debug_bert.tokenizer, max_seq_len=128, seed=0)
    extract_to_store(examples, tmp_path / "store", debug_bert, options=ExtractOptions(), dtype="float32")
    sec = _run(None, tmp_path / "store", tmp_path / "b")
    from_store = json.loads((tmp_path / "b/results/patterns.json").read_text())
    assert from_text["run"]["examples"] == from_store["run"]["examples"] == len(examples)
    a = from_text["analyses"]["vig-patterns"]["arrays"]
    b = from_store["analyses"]["vig-patterns"]["arrays"]
    from attnscope.store import open_store

    bound = softmax_bound(max(len(m.tokens) for m in open_store(tmp_path / "store")))  # float32 rows, two passes
    for k in STATS:
        np.testing.assert_allclose(np.array(b[k]["data"], dtype=float), np.array(a[k]["data"], dtype=float),
                                   atol=bound, rtol=0, equal_nan=True)
    assert from_store["keys"] is None
    line_saying(sec.findings, "key concentration", "model")  # skipped: a store has no forward pass
    assert all(i in sec.maps for _, _, i, _ in sec.best_heads)


def test_family_bad_inputs(debug_bert, tmp_path):
    fam = _family()
    from attnscope.families import Context

    ctx = Context(model=debug_bert, out_dir=tmp_path / "out")
    with pytest.raises(InputError) as e:
        fam.prepare({"patterns": tmp_path / "missing.json"}, fam.Options(), ctx)
    says(one_line(e.value), str(tmp_path / "missing.json"), "no such file")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": \n', encoding="utf-8")
    with pytest.raises(InputError) as e:
        fam.prepare({"patterns": bad}, fam.Options(), ctx)
    says(one_line(e.value), f"{bad}:2")
    with pytest.raises(AttnscopeError) as refused:
        fam.prepare({"patterns": _write_jsonl(tmp_path / "ok.jsonl", EXAMPLES)}, fam.Options(lift=-1.0), ctx)
    says(one_line(refused.value), "lift", "at least 0", "-1.0")
    assert refused.value.params == ("lift",)  # the library names the parameter; the CLI its flag
    with pytest.raises(AttnscopeError) as refused:
        fam.prepare({"patterns": tmp_path / "ok.jsonl"}, fam.Options(), Context(model=None, out_dir=tmp_path))
    # the file, what it lacks, and both ways to give it
    says(one_line(refused.value), str(tmp_path / "ok.jsonl"), "tokenizer", "model", "store")
    assert refused.value.params == ("model",)
    assert not (tmp_path / "out").exists()


def test_family_refuses_word_level_store(debug_bert, tmp_path):
    from attnscope.data.records import Example
    from attnscope.extract.runner import ExtractOptions
    from attnscope.families import Context
    from attnscope.jobs import extract_to_store

    extract_to_store([Example(text="The cat sat.")], tmp_path / "store", debug_bert,
                     options=ExtractOptions(word_level=True))
    fam = _family()
    with pytest.raises(InputError, match="word-level"):
        fam.prepare({"patterns": tmp_path / "store"}, fam.Options(), Context(model=None, out_dir=tmp_path))


@pytest.mark.slow
def test_packaged_model_on_wikitext(default_model, shared_data, tmp_path):
    text = shared_data / "wikitext-2" / "valid.sentences.txt"
    if not text.is_file():
        pytest.skip(f"{text} is absent")
    from attnscope.data.io import write_examples
    from attnscope.data.unlabeled import prepare_unlabeled

    examples = prepare_unlabeled(text, default_model.tokenizer, max_seq_len=128, seed=0, num_examples=50)
    write_examples(examples, tmp_path / "wiki.json")
    sec = _run(default_model, tmp_path / "wiki.json", tmp_path / "out")
    payload = json.loads((tmp_path / "out/results/patterns.json").read_text())
    best = {r["statistic"]: r for r in payload["best"]}
    # a previous-token head exists in every BERT-like model; patterns 3-5 beat chance clearly
    assert best["previous"]["value"] > 0.9
    for k in ("repeat_same", "repeat_other", "pieces"):
        assert best[k]["lift"] > 5, k
    assert sec.best_heads and all(i in sec.maps for _, _, i, _ in sec.best_heads)
    keys = payload["keys"]["tables"]["key_concentration"]
    assert all(row["separator_count"] > 0 and row["other_count"] > 0 for row in keys)


def test_key_concentration_gaussian_reference():
    k = KeyConcentration()
    assert k.gaussian_reference() is None  # no keys seen: no dimension known
    k.add_keys(0, np.ones((1, 1, 1, 200)), np.zeros((1, 1), dtype=np.int64))
    ref = k.gaussian_reference()
    assert ref == k.gaussian_reference()  # seeded
    assert abs(ref["kurtosis"]) < 0.1  # normal components: excess kurtosis about 0
    assert 10 / 200 < ref["top_share"] < 0.5  # above equal components, far from one spike
    assert k.finalize().meta["gaussian_reference"] == ref


def test_section_renders_in_the_html_report(debug_bert, tmp_path):
    from attnscope.report.html import (
        network_references,
        view_file_name,
        write_head_views,
        write_report,
    )

    out = tmp_path / "out"
    sec = _run(debug_bert, _write_jsonl(tmp_path / "ex.jsonl", EXAMPLES), out)
    links = write_head_views(sec, out)
    # one page per best head, opening on that head of its example's map
    from attnscope.viz.encoding import decode
    from tests.viz.test_viz_pages import payload_of

    want: dict = {}
    for la, h, i, label in sec.best_heads:
        want.setdefault(view_file_name(sec.key, label, la, h), (la, h, i))
    assert [link["href"] for link in links] == list(want) and len(want) >= 1
    for link in links:
        layer, head, index = want[link["href"]]
        p = payload_of((out / link["href"]).read_text(encoding="utf-8"))
        assert (p["state"]["layer"], p["state"]["heads"], p["index"]) == (layer, [head], index)
        assert p["tokens"] == sec.maps[index].tokens
        np.testing.assert_allclose(decode(p["attn"]), sec.maps[index].attn, atol=0.5 / 255 + 1e-6)
    prov = {"model": debug_bert.describe(), "data": [], "seeds": {"run": 0}, "command": "test",
            "elapsed_s": 1.0, "versions": {"attnscope": "0"}}
    page = write_report([sec], out, provenance=prov, links={"patterns": links}).read_text(encoding="utf-8")
    assert "Vig&#39;s patterns" in page or "Vig's patterns" in page
    assert "patterns_best" in page and not network_references(page)
