"""Extraction with tiny random BERT, RoBERTa and GPT-2 models."""

import numpy as np
import pytest
from conftest import line_saying, one_line, says, softmax_bound, sum_bound

from attnscope.data.records import Example
from attnscope.errors import AttnscopeError, InputError
from attnscope.extract import ExtractOptions, ExtractStats, extract
from attnscope.extract.encode import token_units
from attnscope.extract.wordlevel import to_word_level

EXAMPLES = [
    {"words": ["The", "unbelievable", "cat", "sat", "."]},
    {"text": "The dog ran.", "text_pair": "Then it sat on the old mat."},
    {"words": ["a"]},
    {"words": ["Where", "is", "the", "small", "red", "house", "?"], "id": "x"},
]


def maps(examples, model, **kw):
    return {m.index: m for b in extract(examples, model, **kw) for m in b}


@pytest.mark.parametrize("fixture", ["debug_bert", "debug_roberta", "debug_gpt2"])
def test_rows_sum_to_one_and_shapes(fixture, request):
    lm = request.getfixturevalue(fixture)
    keys = {}  # each example's token count: a word's row sums its pieces' token rows
    for level in (False, True):
        out = maps(EXAMPLES, lm, word_level=level, batch_size=3)
        assert sorted(out) == [0, 1, 2, 3]
        for i, m in out.items():
            n = len(m.tokens)
            assert m.attn.shape == (2, 2, n, n)
            # the weights of a float32 softmax row add up to 1
            np.testing.assert_allclose(m.attn.sum(-1), 1.0, atol=softmax_bound(keys.setdefault(i, n)), rtol=0)
            assert len(m.special) == len(m.segment) == len(m.word_ids) == n
        if fixture == "debug_gpt2":  # causal: nothing attends to the future
            a = out[1].attn
            assert np.allclose(np.triu(a, k=1), 0.0)


def test_special_tokens_and_segments_come_from_the_tokenizer(debug_bert, debug_roberta, debug_gpt2):
    b = maps(EXAMPLES[1:2], debug_bert)[0]
    assert b.tokens[0] == "[CLS]" and b.tokens[-1] == "[SEP]"
    first_sep = b.tokens.index("[SEP]")
    assert b.segment.tolist() == [0] * (first_sep + 1) + [1] * (len(b.tokens) - first_sep - 1)
    r = maps(EXAMPLES[1:2], debug_roberta)[0]
    assert r.tokens[0] == "<s>" and r.tokens[-1] == "</s>" and r.special[0] and r.special[-1]
    g = maps(EXAMPLES[1:2], debug_gpt2)[0]
    assert not g.special.any()  # GPT-2 adds no special tokens
    assert set(g.segment.tolist()) == {0, 1}


def test_padding_never_changes_the_maps(debug_bert):
    together = maps(EXAMPLES, debug_bert, batch_size=4)
    for i, ex in enumerate(EXAMPLES):
        alone = maps([ex], debug_bert)[0]
        # float32 softmax rows summed in another order (the padded batch's kernels)
        np.testing.assert_allclose(together[i].attn, alone.attn, atol=softmax_bound(len(alone.tokens)), rtol=0)


@pytest.mark.parametrize("fixture", ["debug_bert", "debug_roberta", "debug_gpt2"])
def test_word_level_matches_conversion_of_token_level(fixture, request):
    lm = request.getfixturevalue(fixture)
    tok = maps(EXAMPLES[:1], lm)[0]
    word = maps(EXAMPLES[:1], lm, word_level=True)[0]
    units = token_units(tok.word_ids, tok.special)
    # the same float32 weights, a word's pieces summed in another order
    np.testing.assert_allclose(word.attn, to_word_level(tok.attn, units), atol=sum_bound(len(tok.tokens)), rtol=0)
    words = [t for t, s in zip(word.tokens, word.special) if not s]
    assert words == EXAMPLES[0]["words"]  # every word is one unit, in order
    assert word.word_positions().tolist() == [i for i, s in enumerate(word.special) if not s]


def test_alignment_from_the_tokenizer_splits_unknown_words(debug_bert):
    m = maps(EXAMPLES[:1], debug_bert)[0]
    pieces = [t for t, w in zip(m.tokens, m.word_ids) if w == 1]
    assert len(pieces) > 1 and "".join(p.removeprefix("##") for p in pieces) == "unbelievable"


def test_fields_are_carried_through(debug_bert):
    assert maps(EXAMPLES, debug_bert)[3].example.fields == {"id": "x"}


def test_too_long_examples_are_skipped_and_counted(debug_bert):
    stats = ExtractStats()
    out = maps(EXAMPLES, debug_bert, stats=stats, max_seq_len=8)
    tok = debug_bert.tokenizer
    lengths = [len(tok(" ".join(e["words"]))["input_ids"]) if "words" in e
               else len(tok(e["text"], e["text_pair"])["input_ids"]) for e in EXAMPLES]
    too_long = [i for i, n in enumerate(lengths) if n > 8]
    assert too_long and [s["index"] for s in stats.skipped] == too_long
    assert [s["tokens"] for s in stats.skipped] == [lengths[i] for i in too_long]
    assert sorted(out) == [i for i in range(4) if i not in too_long]
    assert stats.examples_out == len(out)
    cut = maps(EXAMPLES, debug_bert, max_seq_len=8, truncate=True)
    assert len(cut) == 4 and all(len(m.tokens) <= 8 for m in cut.values())
    assert cut[1].tokens[-1] == "[SEP]"


def test_max_len_above_position_limit(debug_bert):
    with pytest.raises(AttnscopeError) as e:
        maps(EXAMPLES, debug_bert, max_seq_len=4096)
    says(one_line(e.value), "max_seq_len 4096", "position", "debug:bert", f"({debug_bert.max_positions})")
    assert e.value.params == ("max_seq_len",)


def test_pretokenized_inputs(debug_bert):
    m = maps([{"tokens": ["[CLS]", "the", "cat", "[SEP]", "sat", "[SEP]"]}], debug_bert, word_level=True)[0]
    assert m.segment.tolist() == [0, 0, 0, 0, 1, 1]
    with pytest.raises(InputError) as e:
        maps([{"tokens": ["[CLS]", "zebra", "[SEP]"]}], debug_bert)
    says(one_line(e.value), "example 0", "'zebra'", "vocabulary", "debug:bert")
    with pytest.raises(InputError) as e:
        maps([{"tokens": ["the", "cat", "[SEP]"]}], debug_bert)
    says(one_line(e.value), "example 0", "'tokens'", "start with '[CLS]'", "'[SEP]'")  # the tokens wanted


def test_casing_options_and_warnings(debug_bert):
    stats = ExtractStats()
    m = maps([{"words": ["The", "Cat"]}], debug_bert, casing="cased", stats=stats)[0]
    line_saying(stats.warnings, "--cased", "debug:bert", "uppercase")  # the option, the model, why
    assert "[UNK]" in m.tokens or "T" not in m.tokens  # cased input against an uncased vocabulary
    up = maps([{"words": ["The", "Cat"]}], debug_bert, casing="uncased")[0]
    assert up.tokens[1:3] == ["the", "cat"]


def test_deterministic(debug_bert):
    a = maps(EXAMPLES, debug_bert)
    b = maps(EXAMPLES, debug_bert)
    for i in a:
        assert np.array_equal(a[i].attn, b[i].attn)


def test_options_are_plain_data():
    assert ExtractOptions(word_level=True).as_dict()["word_level"] is True


def test_byte_level_space_pieces_belong_to_the_next_word(debug_gpt2):
    """Byte-level BPE offsets start at the space before a word (and this vocabulary has the space
    as a piece of its own): that piece belongs to the word after it, not the one before.
    Found on SmolLM2, where 'Ġthe' was counted as part of 'From'."""
    from attnscope.extract.encode import Encoder

    e = Encoder(debug_gpt2).encode(Example(words=["From", "the", "AP"]), 0)
    assert e.tokens == ["F", "r", "o", "m", "Ġ", "the", "Ġ", "A", "P"]
    assert e.word_ids == [0, 0, 0, 0, 1, 1, 2, 2, 2]
