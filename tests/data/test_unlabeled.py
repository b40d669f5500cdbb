"""``prepare unlabeled``: BERT-style packing, truncation, ``<unk>`` mapping and the summary.

The expected examples below are worked out by hand from the debug BERT tokenizer, in which
every word of the text is one token (``[UNK]`` too) and a pair adds 3 special tokens.
"""

from __future__ import annotations

import json
import random

import pytest
from conftest import line_saying, one_line, says

from attnscope.data.unlabeled import UnlabeledStats, prepare_unlabeled

TEXT = """the cat sat on the mat .
the dog ran to the house .
a man saw the <unk> woman .
she said it was big .

one two three .
"""
# sentence lengths in tokens: 7, 7, 7, 6 | 4


@pytest.fixture
def text_file(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text(TEXT)
    return p


def coin_flips(n_splits_before: int, n: int, seed: int = 0) -> list[bool]:
    """The truncation coin flips (True = cut the front) as the module docstring describes them:
    one ``randint`` per multi-sentence chunk, then one ``random()`` per removed token."""
    rng = random.Random(seed)
    for _ in range(n_splits_before):
        rng.randint(1, 1)
    return [rng.random() < 0.5 for _ in range(n)]


def test_bert_packing_fills_to_the_target_and_keeps_short_documents(text_file, debug_bert):
    stats = UnlabeledStats()
    exs = prepare_unlabeled(text_file, debug_bert.tokenizer, max_seq_len=16, seed=0, stats=stats)
    # budget 13: sentences 1+2 reach 14 >= 13 -> one chunk, split after sentence 1 (the only
    # boundary); 14 > 13, so one token goes from A (the longer side on a tie).
    assert coin_flips(1, 1) == [False]  # seed 0: the back of A -> the final "." goes
    assert (exs[0].text, exs[0].text_pair) == ("the cat sat on the mat", "the dog ran to the house .")
    # sentences 3+4: 7 + 6 = 13 tokens, exactly the budget, no cut; <unk> is one [UNK]
    assert (exs[1].text, exs[1].text_pair) == ("a man saw the [UNK] woman .", "she said it was big .")
    assert (exs[2].text, exs[2].text_pair) == ("one two three .", None)  # kept, one segment
    tok = debug_bert.tokenizer
    assert [len(tok(e.text, e.text_pair)["input_ids"]) for e in exs] == [16, 16, 6]
    assert stats.lengths == [16, 16, 6] and stats.short == 1 and stats.single_segment == 1
    d = stats.distribution()
    assert d == {"mean_length": pytest.approx(38 / 3), "share_at_max": pytest.approx(2 / 3),
                 "share_single_segment": pytest.approx(1 / 3)}
    assert stats.unk_replaced == 1
    says(stats.summary(), "1 '<unk>'", "'[UNK]'")
    assert [e.fields for e in exs] == [{"doc": 0, "line": 1}, {"doc": 0, "line": 3}, {"doc": 1, "line": 6}]


def test_bert_packing_truncates_the_longer_side_front_or_back(text_file, debug_bert):
    # budget 9: 7 + 7 = 14 -> 5 tokens go, from A, B, A, B, A (the longer side, A on a tie)
    exs = prepare_unlabeled(text_file, debug_bert.tokenizer, max_seq_len=12, seed=0)
    flips = coin_flips(1, 5)
    a, b = "the cat sat on the mat .".split(), "the dog ran to the house .".split()
    for side, front in zip("ABABA", flips):
        words = a if side == "A" else b
        words.pop(0 if front else -1)
    assert (exs[0].text, exs[0].text_pair) == (" ".join(a), " ".join(b))
    assert (exs[0].text, exs[0].text_pair) == ("sat on the mat", "dog ran to the house")
    # the second chunk (13 tokens) loses 4: A=7 B=6 -> A, then A/B alternate from 6/6
    assert (exs[1].text, exs[1].text_pair) == ("saw the [UNK] woman", "she said it was big")


def test_a_front_cut_never_starts_inside_a_word(tmp_path, debug_bert):
    # "zzzz" is unknown to the debug vocabulary: z ##z ##z ##z (4 pieces)
    p = tmp_path / "t.txt"
    p.write_text("zzzz cat sat .\nthe dog .\n")
    tok = debug_bert.tokenizer
    assert len(tok("zzzz", add_special_tokens=False)["input_ids"]) == 4
    for seed in range(6):
        for e in prepare_unlabeled(p, tok, max_seq_len=8, seed=seed):
            assert len(tok(e.text, e.text_pair)["input_ids"]) <= 8
            assert e.text.split()[0] in ("zzzz", "cat", "sat", ".", "z", "zz", "zzz")
            # a kept piece of zzzz is always its beginning: the text starts with "z" or a whole word
            assert not e.text.startswith("##")


def test_greedy_packing_is_the_old_behaviour(text_file, debug_bert):
    stats = UnlabeledStats()
    exs = prepare_unlabeled(text_file, debug_bert.tokenizer, max_seq_len=16, seed=0, packing="greedy",
                            stats=stats)
    # budget 13: 7 + 7 > 13, so every sentence of doc 0 is its own example
    assert [(e.text, e.text_pair) for e in exs] == [
        ("the cat sat on the mat .", None), ("the dog ran to the house .", None),
        ("a man saw the [UNK] woman .", "she said it was big ."), ("one two three .", None)]
    assert stats.lengths == [9, 9, 16, 6] and stats.single_segment == 3
    with pytest.raises(Exception) as e:
        prepare_unlabeled(text_file, debug_bert.tokenizer, packing="nope")
    says(e.value, "packing", "bert, greedy", "'nope'")
    assert e.value.params == ("packing",)


def test_unk_mapping_can_be_turned_off_and_is_skipped_without_an_own_unknown_token(
        text_file, debug_bert, debug_gpt2, debug_roberta, debug_llama):
    stats = UnlabeledStats()
    exs = prepare_unlabeled(text_file, debug_bert.tokenizer, max_seq_len=40, unk_marker=None, stats=stats)
    assert "<unk>" in exs[0].text_pair and stats.unk_replaced == 0
    assert "left as text" in stats.summary()
    # the literal marker is several pieces; the mapped one is one token
    tok = debug_bert.tokenizer
    assert len(tok("<unk>", add_special_tokens=False)["input_ids"]) == 5
    assert tok("[UNK]", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]
    # GPT-2's unknown token is its end-of-text token: the marker stays text
    stats = UnlabeledStats()
    exs = prepare_unlabeled(text_file, debug_gpt2.tokenizer, max_seq_len=200, stats=stats)
    assert "<unk>" in exs[0].text + (exs[0].text_pair or "") and stats.unk_replaced == 0
    says(stats.unk_note, "'<unk>'", "left as text", "unknown token")
    # byte-level tokenizers never produce their unknown token, even one distinct from the others
    for lm in (debug_roberta, debug_llama):
        assert lm.tokenizer.unk_token not in {lm.tokenizer.eos_token, lm.tokenizer.bos_token}
        stats = UnlabeledStats()
        exs = prepare_unlabeled(text_file, lm.tokenizer, max_seq_len=200, stats=stats)
        assert "<unk>" in exs[0].text + (exs[0].text_pair or "") and stats.unk_replaced == 0


def test_every_unk_marker_becomes_one_unknown_token_inside_words_too(tmp_path, debug_bert):
    """WikiText writes <unk> inside words as well (<unk>-<unk>, <unk>-like, 1,<unk>: 364 of
    the 11,529 markers of its valid split); each is one [UNK], never '<', 'u', '##n', '##k', '>'."""
    from attnscope.extract.encode import Encoder

    p = tmp_path / "w.txt"
    p.write_text("<unk>-<unk> was <unk>-like in 1,<unk> , a<unk> <unk> .\n")
    stats = UnlabeledStats()
    ex = prepare_unlabeled(p, debug_bert.tokenizer, stats=stats)[0]
    assert ex.text == "[UNK]-[UNK] was [UNK]-like in 1,[UNK] , a[UNK] [UNK] ."
    assert stats.unk_replaced == 6
    says(stats.summary(), "6 '<unk>'", "'[UNK]'")
    e = Encoder(debug_bert).encode(ex, 0)
    tok = debug_bert.tokenizer
    # the debug vocabulary has no "like": it is spelled out letter by letter
    assert list(e.tokens) == ["[CLS]", "[UNK]", "-", "[UNK]", "was", "[UNK]", "-", "l", "##i", "##k",
                              "##e", "in", "1", ",", "[UNK]", ",", "a", "[UNK]", "[UNK]", ".", "[SEP]"]
    assert list(e.input_ids).count(tok.unk_token_id) == 6
    assert not {"<", ">", "u", "##n"} & set(e.tokens)


@pytest.mark.slow
def test_unk_markers_inside_words_with_the_packaged_tokenizer(tmp_path, default_model):
    p = tmp_path / "w.txt"
    p.write_text("<unk>-<unk> <unk>-like 1,<unk>\n")
    ex = prepare_unlabeled(p, default_model.tokenizer)[0]
    tok = default_model.tokenizer
    ids = tok(ex.text, add_special_tokens=False)["input_ids"]
    # bert-base-uncased's WordPiece ids: [UNK] 100, '-' 1011, 'like' 2066, '1' 1015, ',' 1010
    assert ids == [100, 1011, 100, 100, 1011, 2066, 1015, 1010, 100]
    assert not {"<", "un", "##k", ">"} & set(tok.convert_ids_to_tokens(ids))


def test_cli_prints_the_length_distribution(tmp_path, capsys, text_file):
    from attnscope.cli.main import main

    out = tmp_path / "u.json"
    code = main(["prepare", "unlabeled", str(text_file), "--model", "debug", "--out", str(out),
                 "--max-seq-len", "16"])
    text = capsys.readouterr().out.replace("\n", " ")  # a result: on stdout
    assert code in (0, None) and len(json.loads(out.read_text())) == 3
    says(text, "12.7", "66.7%", "16", "1 shorter", "33.3%", "'<unk>'", "'[UNK]'")
    code = main(["prepare", "unlabeled", str(text_file), "--model", "debug", "--out", str(tmp_path / "v.json"),
                 "--packing", "nope"])
    assert code == 2 and not (tmp_path / "v.json").exists()


@pytest.mark.heavy
def test_analyze_says_when_the_pairs_were_packed_for_another_tokenizer(tmp_path, capsys, text_file):
    """``prepare unlabeled`` records the tokenizer it packed for; ``analyze general`` with another
    model's tokenizer says so in one line and how to prepare for it (issue 23, item 15)."""
    from attnscope.cli.main import main
    from attnscope.data.unlabeled import tokenizer_fingerprint
    from attnscope.models import load_model

    wiki = tmp_path / "wiki.json"
    assert main(["prepare", "unlabeled", str(text_file), "--model", "debug:bert", "--out", str(wiki),
                 "--max-seq-len", "16"]) in (0, None)
    rows = json.loads(wiki.read_text())
    bert, gpt2 = load_model("debug:bert").tokenizer, load_model("debug:gpt2").tokenizer
    assert tokenizer_fingerprint(bert) != tokenizer_fingerprint(gpt2)
    assert [r["packed_for"] for r in rows] == [
        {"model": "debug:bert", "vocab_sha256": tokenizer_fingerprint(bert), "max_seq_len": 16}] * 3
    # the line names the file, the length and tokenizer it was packed for, this model, and the
    # command that prepares it for this model
    line = (f"{wiki}:", "16 tokens", "'debug:bert'", "'debug:gpt2'",
            "attnscope prepare unlabeled TEXT --model debug:gpt2")
    analyze = ["analyze", "general", "--general-gradients", "off", "--batch-size", "4"]
    capsys.readouterr()
    # none fits in 8 tokens of GPT-2's pieces: the error says why
    assert main([*analyze, str(wiki), "--model", "debug:gpt2", "--max-seq-len", "8", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip()
    one_line(err)
    says(err, "error: ", "no examples", "--max-seq-len 8", *line)
    assert not (tmp_path / "a").exists()
    assert main(["analyze", "patterns", str(wiki), "--model", "debug:gpt2", "--max-seq-len", "8",
                 "--out", str(tmp_path / "p")]) == 2
    says(one_line(capsys.readouterr().err.strip()), "no examples", "--max-seq-len 8", *line)
    # at the length they were packed to, 2 of 3 are too long: the count and the line in the findings
    assert main([*analyze, str(wiki), "--model", "debug:gpt2", "--max-seq-len", "16", "--out", str(tmp_path / "b")]) in (0, None)
    found = capsys.readouterr().out.splitlines()
    line_saying(found, *line)
    line_saying(found, "2 examples", "16 tokens", "skipped")
    line_saying(json.loads((tmp_path / "b" / "results" / "general.json").read_text())["notes"], *line)
    # the model it was packed for: no line; a file without the field (older, or hand-made) reads as before
    old = tmp_path / "old.json"
    old.write_text(json.dumps([{k: v for k, v in r.items() if k != "packed_for"} for r in rows]))
    for path, model in ((wiki, "debug:bert"), (old, "debug:gpt2")):
        out = tmp_path / f"c-{path.stem}"
        assert main([*analyze, str(path), "--model", model, "--max-seq-len", "16", "--out", str(out)]) in (0, None)
        assert "packed to" not in capsys.readouterr().out
