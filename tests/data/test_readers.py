"""Input readers: JSON/JSONL, the paper's dependency format, CoNLL-U, sentence-per-line text."""

import json

import pytest
from conftest import one_line, says

from attnscope.data.depparse import iter_depparse
from attnscope.data.io import read_examples
from attnscope.data.unlabeled import prepare_unlabeled
from attnscope.errors import InputError


def write(tmp_path, name, text, mode="w"):
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return p


def test_json_list_and_jsonl_carry_extra_fields(tmp_path):
    data = [{"text": "A b.", "id": 7}, {"words": ["x", "y"], "label": {"k": 1}}]
    p1 = write(tmp_path, "a.json", json.dumps(data))
    p2 = write(tmp_path, "a.jsonl", "\n".join(json.dumps(d) for d in data) + "\n")
    for p in (p1, p2):
        exs = read_examples(p)
        assert exs[0].text == "A b." and exs[0].fields == {"id": 7}
        assert exs[1].words == ["x", "y"] and exs[1].fields == {"label": {"k": 1}}


# what is wrong, by the keys, values and ranges involved (the file and line are checked below)
@pytest.mark.parametrize("content, facts, line", [
    ('[{"text": "a"}, {"text": }]', ("invalid JSON",), 1),
    ('{"text": "a"}\n{"text": "b"\n', ("invalid JSON",), 2),
    ('[{"text": "a", "words": ["a"]}]', ("text/words/tokens", "text and words"), None),
    ('[{"label": 1}]', ("text/words/tokens", "none"), None),
    ('[{"text": "  "}]', ("'text'", "empty"), None),
    ('[{"words": []}]', ("'words'", "empty"), None),
    ('[{"words": ["a", 3]}]', ("'words'", "list of strings"), None),
    ('{"words": ["a", "b"], "heads": [0, 3]}\n', ("head 3", "0..2"), 1),
    ('{"words": ["a", "b"], "heads": [2, 1]}\n', ("dependency cycle",), 1),
    ('[]', ("no examples",), None),
])
def test_json_errors_name_file_and_line(tmp_path, content, facts, line):
    # JSON Lines in a .jsonl file: a .json file holding one object is refused as not a list
    p = write(tmp_path, "bad.jsonl" if content.startswith("{") else "bad.json", content)
    with pytest.raises(InputError) as err:
        read_examples(p)
    text = says(one_line(err.value), *facts)
    assert text.startswith(str(p) + (f":{line}:" if line else ":"))


def test_non_utf8_names_the_line(tmp_path):
    p = write(tmp_path, "bad.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(InputError) as e:
        read_examples(p)
    says(one_line(e.value), f"{p}:2: ", "UTF-8", "0xe9")  # the line, the cause, the byte


PAPER = """The 2-det
cat 3-nsubj
sat 0-root

Dogs 2-nsubj
bark 0-root
"""


def test_paper_depparse_format(tmp_path):
    exs = list(iter_depparse(write(tmp_path, "dev.txt", PAPER)))
    assert [e.words for e in exs] == [["The", "cat", "sat"], ["Dogs", "bark"]]
    assert exs[0].heads == [2, 3, 0] and exs[0].relns == ["det", "nsubj", "root"]


@pytest.mark.parametrize("content, facts, line", [
    ("The 2-det\ncat 3 nsubj\n", ("'word head-relation'", "3 columns"), 2),
    ("The x-det\n", ("head 'x'", "not a number"), 1),
    ("The 2-det\ncat 5-root\n", ("head 5", "0..2"), 2),
    ("The 2-det\ncat 1-root\n", ("dependency cycle",), 1),
    ("The 2det\n", ("head-relation", "'2det'"), 1),
])
def test_paper_depparse_errors(tmp_path, content, facts, line):
    p = write(tmp_path, "bad.txt", content)
    with pytest.raises(InputError) as err:
        list(iter_depparse(p))
    assert says(one_line(err.value), *facts).startswith(f"{p}:{line}:")


def test_plain_text_as_dependencies_hints_at_conllu(tmp_path):
    p = write(tmp_path, "wiki.txt", "The cat sat on the mat .\n")
    with pytest.raises(InputError) as err:
        list(iter_depparse(p))
    assert one_line(err.value) == (f"{p}:1: expected 'word head-relation', found 7 columns (CoNLL-U "
                                   "is read too: a .conllu file, or 10 tab-separated columns)")


CONLLU = """# sent_id = s1
# text = I can't go.
1\tI\tI\tPRON\tPRP\tCase=Nom\t3\tnsubj\t_\t_
2-3\tcan't\t_\t_\t_\t_\t_\t_\t_\t_
2\tca\tcan\tAUX\tMD\t_\t3\taux\t_\t_
3\tn't\tnot\tPART\tRB\t_\t4\tadvmod\t_\t_
3.1\tgo\tgo\tVERB\tVB\t_\t_\t_\t_\t_
4\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\t_
5\t.\t.\tPUNCT\t.\t_\t4\tpunct\t_\t_

"""


def test_conllu_skips_multiword_and_empty_nodes(tmp_path):
    (ex,) = list(iter_depparse(write(tmp_path, "a.conllu", CONLLU)))
    assert ex.words == ["I", "ca", "n't", "go", "."]
    assert ex.heads == [3, 3, 4, 0, 4]
    assert ex.pos == ["PRP", "MD", "RB", "VB", "."] and ex.upos[0] == "PRON"
    assert ex.fields["sent_id"] == "s1"


@pytest.mark.parametrize("old, new, facts, line", [
    ("1\tI\tI\tPRON\tPRP\tCase=Nom\t3\tnsubj\t_\t_", "1\tI\tI\tPRON", ("10", "columns", "found 4"), 3),
    ("\t4\tadvmod", "\tfour\tadvmod", ("head 'four'", "not a number"), 6),
    ("\t0\troot", "\t9\troot", ("head 9", "0..5"), 8),
    ("\t0\troot", "\t5\troot", ("dependency cycle",), None),
])
def test_conllu_errors(tmp_path, old, new, facts, line):
    p = write(tmp_path, "bad.conllu", CONLLU.replace(old, new))
    with pytest.raises(InputError) as err:
        list(iter_depparse(p))
    assert says(one_line(err.value), *facts).startswith(f"{p}:{line}:" if line else f"{p}:")


TEXT = """First sentence of doc one.
Second sentence of doc one.
Third one here.

Only sentence of doc two.

Doc three first.
Doc three second."""  # no trailing blank line


def test_unlabeled_pairs(tmp_path, debug_bert):
    exs = prepare_unlabeled(write(tmp_path, "t.txt", TEXT), debug_bert.tokenizer, max_seq_len=128, seed=3)
    assert [e.fields["doc"] for e in exs] == [0, 1, 2]
    assert exs[0].text_pair is not None
    assert exs[0].text + " " + exs[0].text_pair == ("First sentence of doc one. Second sentence of doc one. "
                                                     "Third one here.")
    assert exs[1].text == "Only sentence of doc two." and exs[1].text_pair is None  # kept, single segment
    assert exs[2].text == "Doc three first." and exs[2].text_pair == "Doc three second."  # last doc kept
    again = prepare_unlabeled(write(tmp_path, "t.txt", TEXT), debug_bert.tokenizer, max_seq_len=128, seed=3)
    assert [e.to_dict() for e in again] == [e.to_dict() for e in exs]


def test_unlabeled_respects_max_len_and_limits(tmp_path, debug_bert):
    exs = prepare_unlabeled(write(tmp_path, "t.txt", TEXT), debug_bert.tokenizer, max_seq_len=12, seed=0)
    tok = debug_bert.tokenizer
    for e in exs:
        assert len(tok(e.text, e.text_pair)["input_ids"]) <= 12
    assert len(prepare_unlabeled(tmp_path / "t.txt", tok, num_examples=2)) == 2
    assert {e.fields["doc"] for e in prepare_unlabeled(tmp_path / "t.txt", tok, num_docs=1)} == {0}


def test_atomic_writes_get_the_usual_file_mode(tmp_path):
    import os

    from attnscope.data.io import atomic_write_text

    umask = os.umask(0)
    os.umask(umask)
    atomic_write_text(tmp_path / "f.txt", "x")
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o666 & ~umask
    assert (tmp_path / "f.txt").read_text() == "x"
