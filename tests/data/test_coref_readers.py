"""Coreference readers on small hand-written files of both formats."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import one_line, says

from attnscope.data.coref import (
    constituency_heads,
    detect_format,
    iter_conll2012,
    mention_attributes,
    parse_entity_misc,
    read_coref,
)
from attnscope.errors import InputError


def conllu_line(i, form, upos, xpos, head, deprel, misc="_", feats="_"):
    return "\t".join([str(i), form, form.lower(), upos, xpos, feats, str(head), deprel, "_", misc])


def write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


# "John saw his old friend ." / "It was fun ." (a mention from "friend" to "It" spans the break)
DOC1 = [
    "# newdoc id = d1",
    "# sent_id = 1",
    conllu_line(1, "John", "PROPN", "NNP", 2, "nsubj", "Entity=(1)", "Number=Sing"),
    conllu_line(2, "saw", "VERB", "VBD", 0, "root"),
    conllu_line(3, "his", "PRON", "PRP$", 5, "nmod:poss", "Entity=(2(1)",
                "Gender=Masc|Number=Sing|Person=3|Poss=Yes"),
    conllu_line(4, "old", "ADJ", "JJ", 5, "amod"),
    conllu_line(5, "friend", "NOUN", "NN", 2, "obj", "Entity=2)(4", "Number=Sing"),
    conllu_line(6, ".", "PUNCT", ".", 2, "punct"),
    "",
    "# sent_id = 2",
    conllu_line(1, "It", "PRON", "PRP", 3, "nsubj", "Entity=4)", "Number=Sing|Person=3"),
    conllu_line(2, "was", "AUX", "VBD", 3, "cop"),
    conllu_line(3, "fun", "ADJ", "JJ", 0, "root"),
    "",
    "# newdoc id = d2",
    "# sent_id = 3",
    "1-2\tShe's\t_\t_\t_\t_\t_\t_\t_\t_",
    conllu_line(1, "She", "PRON", "PRP", 3, "nsubj", "Entity=(1)", "Gender=Fem|Number=Sing|Person=3"),
    conllu_line(2, "'s", "AUX", "VBZ", 3, "cop"),
    conllu_line(3, "here", "ADV", "RB", 0, "root"),
    "",
]


def test_conllu_entity_documents_mentions_heads_types(tmp_path):
    path = write(tmp_path, "a.conllu", DOC1)
    assert detect_format(path) == "conllu"
    d1, d2 = read_coref(path)
    assert d1.id == "d1" and d2.id == "d2"
    assert d1.words == ["John", "saw", "his", "old", "friend", ".", "It", "was", "fun"]
    assert d1.sentence_starts == [0, 6]
    assert d1.heads == [1, -1, 4, 4, 1, 1, 8, 8, -1]
    # sorted by (start, -end): John, "his old friend" (outer first), his, "friend . It"
    spans = [(m.start, m.end, m.cluster) for m in d1.mentions]
    assert spans == [(0, 1, "1"), (2, 5, "2"), (2, 3, "1"), (4, 7, "4")]
    heads = [d1.words[m.head] for m in d1.mentions]
    # the cross-sentence mention: friend and It both have heads outside, same depth -> leftmost
    assert heads == ["John", "friend", "his", "friend"]
    assert [m.type for m in d1.mentions] == ["proper", "nominal", "pronoun", "nominal"]
    assert d1.clusters == {"1": [0, 2], "2": [1], "4": [3]}
    # multiword token line skipped, its words kept; clusters do not cross documents
    assert d2.words == ["She", "'s", "here"] and [m.cluster for m in d2.mentions] == ["1"]
    assert mention_attributes(d1, d1.mentions[2]) == ("sg", "masc", "3")
    assert mention_attributes(d2, d2.mentions[0]) == ("sg", "fem", "3")
    assert mention_attributes(d1, d1.mentions[0]) == ("sg", None, "3")


def test_entity_value_parsing():
    p = Path("x.conllu")
    assert parse_entity_misc("(1(2)", p, 1) == [("open", "1"), ("one", "2")]
    assert parse_entity_misc("1)2)(3)", p, 1) == [("close", "1"), ("close", "2"), ("one", "3")]
    # CorefUD's extra fields and discontinuous parts
    assert parse_entity_misc("(e5-person-1-)", p, 1) == [("one", "e5")]
    assert parse_entity_misc("(e7[1/2]-place", p, 1) == [("open", "e7")]


@pytest.mark.parametrize("misc, message, line", [
    ("Entity=3)", "closes no open mention of entity 3", 3),
    ("Entity=(3", "is never closed", 3),
    ("Entity=3", "malformed Entity value", 3),
])
def test_conllu_bad_brackets_name_file_and_line(tmp_path, misc, message, line):
    lines = ["# newdoc id = d", "# sent_id = 1",
             conllu_line(1, "A", "DET", "DT", 2, "det"),
             conllu_line(2, "dog", "NOUN", "NN", 0, "root", misc), ""]
    lines[2], lines[3] = lines[3], lines[2]  # the bracket sits on line 3
    lines[2] = conllu_line(1, "dog", "NOUN", "NN", 0, "root", misc)
    lines[3] = conllu_line(2, "barks", "VERB", "VBZ", 1, "acl")
    path = write(tmp_path, "bad.conllu", lines)
    with pytest.raises(InputError) as exc:
        read_coref(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}:{line}:") and message in msg and "\n" not in msg


def c12(doc, part, i, word, pos, parse, coref, ncols=13):
    cols = [doc, str(part), str(i), word, pos, parse, "-", "-", "-", "spk", "*"]
    cols += ["*"] * (ncols - 12) + [coref]
    return "   ".join(cols)


CONLL12 = [
    "#begin document (test/doc); part 000",
    c12("test/doc", 0, 0, "John", "NNP", "(TOP(S(NP*)", "(1)"),
    c12("test/doc", 0, 1, "saw", "VBD", "(VP*", "-"),
    c12("test/doc", 0, 2, "his", "PRP$", "(NP*", "(2|(1)"),
    c12("test/doc", 0, 3, "old", "JJ", "*", "-"),
    c12("test/doc", 0, 4, "friend", "NN", "*))", "2)"),
    c12("test/doc", 0, 5, ".", ".", "*))", "-"),
    "",
    c12("test/doc", 0, 0, "He", "PRP", "(TOP(S(NP*)", "(1)"),
    c12("test/doc", 0, 1, "left", "VBD", "(VP*)", "-"),
    c12("test/doc", 0, 2, ".", ".", "*))", "-"),
    "",
    "#end document",
    "#begin document (test/doc); part 001",
    c12("test/doc", 1, 0, "the", "DT", "-", "(7"),
    c12("test/doc", 1, 1, "big", "JJ", "-", "-"),
    c12("test/doc", 1, 2, "dogs", "NNS", "-", "-"),
    c12("test/doc", 1, 3, ",", ",", "-", "7)"),
    "",
    c12("test/doc", 1, 0, "they", "PRP", "-", "(7)"),
    "",
    "#end document",
]


def test_conll2012_parts_nesting_parse_heads_and_fallback(tmp_path):
    path = write(tmp_path, "x_gold_conll", CONLL12)
    assert detect_format(path) == "conll2012"
    d0, d1 = read_coref(path)
    assert (d0.id, d1.id) == ("test/doc/part_000", "test/doc/part_001")
    assert d0.head_source == "parse" and d1.head_source == "fallback"
    # head rules: NP "his old friend" -> friend; VP -> saw; S -> VP
    assert d0.heads[:6] == [1, -1, 4, 4, 1, 1]
    assert d0.sentence_starts == [0, 6]
    got = [(m.start, m.end, m.cluster, d0.words[m.head], m.type) for m in d0.mentions]
    assert got == [(0, 1, "1", "John", "proper"), (2, 5, "2", "friend", "nominal"),
                   (2, 3, "1", "his", "pronoun"), (6, 7, "1", "He", "pronoun")]
    # no parse: the rightmost non-punctuation word; a mention across the sentence break is kept
    assert [(m.start, m.end, d1.words[m.head]) for m in d1.mentions] == [(0, 4, "dogs"), (4, 5, "they")]
    assert mention_attributes(d1, d1.mentions[0]) == ("pl", None, "3")


def test_constituency_heads_by_hand():
    # (TOP (S (NP (NP (NNP Mary) (POS 's)) (NN dog)) (VP (VBD ran) (PP (IN to) (NP (PRP me))))))
    bits = ["(TOP(S(NP(NP*", "*)", "*)", "(VP*", "(PP*", "(NP*)))))"]
    tags = ["NNP", "POS", "NN", "VBD", "IN", "PRP"]
    heads = constituency_heads(bits, tags, Path("t"), 1, list(range(1, 7)))
    # Mary <- 's? no: POS is never a head, so 's attaches to Mary, Mary to dog, dog to ran
    assert heads == [2, 0, 3, -1, 3, 4]


# the cell or bracket given and what is wrong with it, the columns wanted and found
@pytest.mark.parametrize("row, facts", [
    (c12("test/doc", 0, 1, "saw", "VBD", "(VP*", "12"), ("malformed", "coreference bracket", "'12'")),
    (c12("test/doc", 0, 1, "saw", "VBD", "(VP*", "3)"), ("'3)'", "no open mention", "entity 3")),
    (c12("test/doc", 0, 1, "saw", "VBD", "(VP**", "-"), ("malformed", "parse bit", "'(VP**'")),
    ("test/doc 0 1 saw VBD (VP* - - - spk", ("12 columns", "found 10")),
])
def test_conll2012_errors_name_file_and_line(tmp_path, row, facts):
    lines = ["#begin document (test/doc); part 000",
             c12("test/doc", 0, 0, "John", "NNP", "(TOP(S(NP*)", "-"), row,
             c12("test/doc", 0, 2, ".", ".", "*)))", "-"), "", "#end document"]
    path = write(tmp_path, "bad_conll", lines)
    with pytest.raises(InputError) as exc:
        list(iter_conll2012(path))
    assert says(one_line(exc.value), *facts).startswith(f"{path}:3:")


def test_conll2012_unclosed_mention_and_document(tmp_path):
    lines = ["#begin document (d); part 000",
             c12("d", 0, 0, "John", "NNP", "-", "(1"), "", "#end document"]
    with pytest.raises(InputError) as e:
        list(iter_conll2012(write(tmp_path, "a_conll", lines)))
    says(one_line(e.value), f"{tmp_path / 'a_conll'}:2: ", "'(1'", "never closed", "'d/part_000'")
    with pytest.raises(InputError) as e:
        list(iter_conll2012(write(tmp_path, "b_conll", lines[:3])))
    says(one_line(e.value), f"{tmp_path / 'b_conll'}:1: ", "'d/part_000'", "'#end document'")
