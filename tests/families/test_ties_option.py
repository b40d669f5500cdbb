"""``--syntax-ties`` / ``--coref-ties`` and ``meta["empty_words"]`` through the families, on a
debug BERT whose attention is exactly uniform, so that every row is an exact tie and the
answers can be worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import line_saying

from attnscope.data.coref import Document, Mention, assign_heads_and_types
from attnscope.data.records import Example
from attnscope.pipeline import run_family

ZWSP = "\u200b"


@pytest.fixture(scope="module")
def uniform_bert():
    """debug:bert with every query projection zeroed: all scores are 0, so every row of every
    head is exactly 1/n (in float32 too), and at word level (single-piece words) every word
    of a row gets the same weight: every prediction is a tie."""
    from attnscope.models import load_model

    lm = load_model("debug:bert")  # a fresh model: the session's debug_bert stays untouched
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if ".attention.self.query." in name:
                p.zero_()
    return lm


def _results(out, name):
    return json.loads((out / "results" / f"{name}.json").read_text())


def _array(res, key):
    return np.asarray(res["arrays"][key]["data"], dtype=np.float64)


# -- syntax --------------------------------------------------------------------------------
# "the cat sat on the mat", 0-based gold heads: the->cat(1), cat->sat(2), sat root,
# on->mat(5), the->mat(5), mat->sat(2): 5 scored dependents, offsets +1 +1 +2 +1 -3.
SENT = Example(words=["the", "cat", "sat", "on", "the", "mat"], heads=[2, 3, 0, 6, 6, 3],
               relns=["det", "nsubj", "root", "case", "det", "obl"])


def _run_syntax(lm, tmp_path, examples, **opts):
    out = tmp_path / "out"
    run_family("syntax", {"deps": examples}, out, model=lm, min_count=1, **opts)
    res = _results(out, "syntax")
    return res, {r["relation"]: r for r in res["tables"]["table1"]}


def test_uniform_rows_are_exact_ties(uniform_bert):
    from attnscope.extract import extract

    m = next(iter(extract([SENT], uniform_bert, word_level=True))).items[0]
    assert m.tokens == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]
    assert np.all(m.attn == m.attn[..., :1])  # every row: one value repeated


@pytest.mark.heavy
def test_syntax_ties_none_scores_nothing_and_lowest_the_lowest_other_word(uniform_bert, tmp_path):
    res, rows = _run_syntax(uniform_bert, tmp_path / "none", [SENT])
    assert res["params"]["ties"] == "none"
    # every row is a tie: no prediction anywhere, in either direction
    assert rows["all"]["accuracy"] == 0.0 and rows["all"]["count"] == 5
    # the offset baseline does not read attention: +1 is right for the, cat, on (3 of 5)
    assert rows["all"]["offset"] == "+1" and rows["all"]["offset_accuracy"] == pytest.approx(60.0)
    res, rows = _run_syntax(uniform_bert, tmp_path / "lowest", [SENT], syntax_ties="lowest")
    assert res["params"]["ties"] == "lowest" and "lowest" in res["meta"]["ties"]
    # lowest other word: the(0) -> cat(1) right; every other word -> the(0): wrong. 1 of 5,
    # the same in the head->dep direction (the map is its own transpose)
    assert rows["all"]["accuracy"] == pytest.approx(20.0)
    assert rows["det"]["accuracy"] == pytest.approx(50.0)  # the(0) right, the(4) wrong
    assert rows["all"]["offset_accuracy"] == pytest.approx(60.0)  # unchanged by the option
    assert res["meta"]["empty_words"] == 0
    assert not any("zero tokens" in line for line in res["summary"])


def test_syntax_empty_word_is_counted_and_said(uniform_bert, tmp_path):
    # "the cat <zwsp> sat on the mat": the zwsp word has no unit; 0-based heads the->cat(1),
    # cat->sat(3), zwsp->sat (skipped: no unit), on->mat(6), the->mat(6), mat->sat(3).
    ex = Example(words=["the", "cat", ZWSP, "sat", "on", "the", "mat"], heads=[2, 4, 4, 0, 7, 7, 4],
                 relns=["det", "nsubj", "dep", "root", "case", "det", "obl"])
    res, rows = _run_syntax(uniform_bert, tmp_path, [ex], syntax_ties="lowest")
    assert res["meta"]["empty_words"] == 1 and res["meta"]["skipped_words"] == 1
    assert "dep" not in rows and rows["all"]["count"] == 5
    # lowest other present word: the(0) -> cat(1) right, all others -> the(0): 1 of 5
    assert rows["all"]["accuracy"] == pytest.approx(20.0)
    line_saying(res["summary"], "1 dev words", "zero tokens")  # the count, the split, what happened


# -- coreference ---------------------------------------------------------------------------
def _coref_doc():
    """"the cat <zwsp> saw a dog and it ." with "the cat" and "it" in cluster c, "a dog" in d.

    Query "it"(7). Mention candidates: cat(1), dog(5), a tie under uniform attention.
    All-words candidates: every other present word, the lowest is the(0)."""
    words = ["the", "cat", ZWSP, "saw", "a", "dog", "and", "it", "."]
    heads = [1, 3, 3, -1, 5, 3, 7, 3, 3]
    upos = ["DET", "NOUN", "X", "VERB", "DET", "NOUN", "CCONJ", "PRON", "PUNCT"]
    doc = Document(id="zw", words=words, sentence_starts=[0],
                   mentions=[Mention(0, 2, "c"), Mention(4, 6, "d"), Mention(7, 8, "c")],
                   heads=heads, upos=upos, xpos=["_"] * 9, feats=[{} for _ in words],
                   lemmas=list(words))
    assign_heads_and_types(doc)
    assert [m.head for m in doc.mentions] == [1, 5, 7]
    return doc


def _run_coref(lm, tmp_path, **opts):
    out = tmp_path / "out"
    run_family("coref", {"coref": [_coref_doc()]}, out, model=lm, n_boot=10, **opts)
    return _results(out, "coref")


def test_coref_ties_option_and_empty_words(uniform_bert, tmp_path):
    res = _run_coref(uniform_bert, tmp_path / "none")
    assert res["params"]["ties"] == "none" and res["meta"]["mentions"] == 1
    # cat(1) and dog(5) tie: no prediction; among all words every word ties: none either
    assert np.nanmax(_array(res, "accuracy")) == 0.0
    assert np.nanmax(_array(res, "accuracy_all_words")) == 0.0
    assert res["meta"]["empty_words"] == 1 and res["meta"]["windows"]["windows"] == 1
    line_saying(res["summary"], "1 words", "zero tokens")
    res = _run_coref(uniform_bert, tmp_path / "lowest", coref_ties="lowest")
    assert res["params"]["ties"] == "lowest"
    # the lowest mention candidate is cat(1), an antecedent: every head right
    assert np.nanmin(_array(res, "accuracy")) == 1.0
    # the lowest other word is the(0), not a mention head: every head wrong
    assert np.nanmax(_array(res, "accuracy_all_words")) == 0.0


def test_tie_options_are_generated_and_checked(tmp_path, capsys):
    from attnscope.cli.main import main
    from attnscope.pipeline import RunConfig

    cfg = RunConfig(syntax_ties="lowest", coref_ties="lowest")
    assert cfg.options["syntax"].syntax_ties == "lowest" and cfg.options["coref"].coref_ties == "lowest"
    assert RunConfig().options["syntax"].syntax_ties == "none"
    dev = tmp_path / "dev.conllu"
    dev.write_text("1\tthe\t_\tDET\t_\t_\t2\tdet\t_\t_\n2\tcat\t_\tNOUN\t_\t_\t0\troot\t_\t_\n\n")
    rc = main(["analyze", "syntax", str(dev), "--model", "debug:bert", "--out", str(tmp_path / "o"),
               "--syntax-ties", "random"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--syntax-ties" in err
    assert not (tmp_path / "o").exists()
