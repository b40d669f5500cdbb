"""Results on stdout, progress and warnings on stderr; what extract and info count; an output
folder that cannot be used is refused before the model loads."""

from __future__ import annotations

import json

import pytest

from attnscope.cli.main import main

WORDS = [["the", "unbelievably", "cat"], ["dogs", "ran", "quickly", "away"], ["hi"]]


def run(capsys, *args):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def words_file(tmp_path):
    p = tmp_path / "in.json"
    p.write_text(json.dumps([{"words": w} for w in WORDS]))
    return p


def test_extract_and_info_say_what_they_count(tmp_path, capsys, words_file, debug_bert):
    store = tmp_path / "s"
    code, out, err = run(capsys, "extract", words_file, "--model", "debug", "--out", store,
                         "--word-level", "--quiet")
    assert code == 0 and err == ""
    # worked out independently: the model reads the tokenizer's pieces (special tokens
    # included); the word-level store keeps one position per word plus [CLS] and [SEP]
    tok = debug_bert.tokenizer
    pieces = sum(len(tok(w, is_split_into_words=True)["input_ids"]) for w in WORDS)
    positions = sum(len(w) + 2 for w in WORDS)
    assert pieces != positions  # the debug tokenizer splits some of these words
    code, out, err = run(capsys, "info", store, "--json")
    info = json.loads(out)
    assert code == 0 and err == ""
    assert info["model_tokens"] == pieces and info["stored_positions"] == positions
    assert "tokens" not in info  # the ambiguous name is gone
    code, out, err = run(capsys, "info", store)
    assert code == 0 and err == "" and "model tokens" in out and "words + special tokens" in out
    # stored positions 5, 6 and 3 (words + [CLS] and [SEP]): mean 14 / 3, shown to 2 decimals
    assert "mean_length: 4.67\n" in out and info["mean_length"] == pytest.approx(14 / 3)


def test_extract_summary_on_stdout_names_both_counts(tmp_path, capsys, words_file, debug_bert):
    code, out, err = run(capsys, "extract", words_file, "--model", "debug", "--out", tmp_path / "s",
                         "--word-level")
    tok = debug_bert.tokenizer
    pieces = sum(len(tok(w, is_split_into_words=True)["input_ids"]) for w in WORDS)
    positions = sum(len(w) + 2 for w in WORDS)
    assert code == 0
    assert f"the model read {pieces:,} tokens" in out
    assert f"the store holds {positions:,} word-level positions" in out
    assert "the model read" not in err  # progress (if any) only on stderr


@pytest.mark.parametrize("setup,flags,message", [
    ("store", [], "already holds a store (use --resume"),
    ("other", [], "already holds other files"),
    ("other", ["--overwrite"], "already holds other files"),
    ("file", [], "is a file, not a store folder"),
])
def test_unusable_output_refused_before_the_model_loads(tmp_path, capsys, words_file, monkeypatch,
                                                         setup, flags, message):
    out = tmp_path / "s"
    if setup == "store":
        assert run(capsys, "extract", words_file, "--model", "debug", "--out", out, "-q")[0] == 0
    elif setup == "other":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    else:
        out.write_text("a file")
    before = sorted(p.name for p in tmp_path.rglob("*"))

    import attnscope.models.loading

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the output folder was checked")

    monkeypatch.setattr(attnscope.models.loading, "_load", no_model)
    code, stdout, err = run(capsys, "extract", words_file, "--model", "debug", "--out", out, *flags)
    assert code == 2 and stdout == ""
    assert err.splitlines() == [err.strip()] and message in err and str(out) in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_export_and_import_print_results_on_stdout(tmp_path, capsys, words_file):
    store = tmp_path / "s"
    assert run(capsys, "extract", words_file, "--model", "debug", "--out", store, "-q")[0] == 0
    code, out, err = run(capsys, "export", store, "--out", tmp_path / "x_attn.pkl")
    assert code == 0 and err == "" and "3 examples" in out
    code, out, err = run(capsys, "import", tmp_path / "x_attn.pkl", "--out", tmp_path / "t",
                         "--allow-pickle")
    assert code == 0 and err == "" and "3 examples imported" in out
