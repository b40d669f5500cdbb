"""The demo sample that ships in the package: read by attnscope's own readers, trees checked."""

from __future__ import annotations

import pytest

from attnscope.data.conllu import iter_conllu
from attnscope.data.depparse import iter_depparse
from attnscope.data.unlabeled import read_documents
from attnscope.pipeline import demo_inputs

#: UPOS that each relation's dependent may have (UD v2 guidelines as used by EWT).
DEPENDENT_UPOS = {
    "det": {"DET"}, "det:predet": {"DET"}, "case": {"ADP", "PART"}, "amod": {"ADJ"},
    "nummod": {"NUM"}, "cop": {"AUX"}, "aux": {"AUX"}, "aux:pass": {"AUX"}, "cc": {"CCONJ"},
    "mark": {"SCONJ", "PART"}, "punct": {"PUNCT"}, "expl": {"PRON"}, "discourse": {"INTJ"},
    "nmod:poss": {"PRON", "PROPN", "NOUN"}, "advmod": {"ADV", "PART"},
    "nsubj": {"NOUN", "PROPN", "PRON"}, "nsubj:pass": {"NOUN", "PROPN", "PRON"},
    "obj": {"NOUN", "PROPN", "PRON"}, "iobj": {"NOUN", "PROPN", "PRON"},
    "compound": {"NOUN", "PROPN"}, "obl:unmarked": {"NOUN", "PROPN"}, "obl:agent": {"NOUN", "PROPN", "PRON"},
}


def _projective(heads: list[int]) -> bool:
    arcs = [(min(i + 1, h), max(i + 1, h)) for i, h in enumerate(heads) if h > 0]
    return not any(a < c < b < d for a, b in arcs for c, d in arcs)


def _sentences():
    paths = demo_inputs()
    for key in ("deps_train", "deps", "coref"):
        for sent in iter_conllu(paths[key]):
            yield key, sent


def test_every_demo_file_is_a_declared_sample_listed_in_the_readme():
    """The demo's inputs are the samples its families declare, every file of the packaged
    folder is one of them (or the README), and the README's table lists exactly them, with the
    sentence and document counts the readers find."""
    import re

    paths = demo_inputs()
    assert {k: p.name for k, p in paths.items()} == {
        "text": "text.txt", "deps": "deps-dev.conllu", "deps_train": "deps-train.conllu",
        "coref": "coref.conllu"}
    root = paths["text"].parent
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith("__")) == sorted(
        [p.name for p in paths.values()] + ["README.md"])
    readme = (root / "README.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| `([^`]+)` \|", readme, flags=re.M)
    assert sorted(listed) == sorted(p.name for p in paths.values())
    coref = [sent for key, sent in _sentences() if key == "coref"]
    assert "coref.conllu` | two short original documents (14 sentences)" in readme and len(coref) == 14
    assert len(list(read_documents(paths["text"]))) == 4 and "four short original texts (30 sentences)" in readme


def test_text_reads_as_documents():
    docs = list(read_documents(demo_inputs()["text"]))
    assert len(docs) == 4
    assert sum(len(d) for d in docs) == 30


def test_dependency_splits_read_with_depparse():
    train = list(iter_depparse(demo_inputs()["deps_train"]))
    dev = list(iter_depparse(demo_inputs()["deps"]))
    assert (len(train), len(dev)) == (28, 12)
    for ex in train + dev:
        assert ex.heads is not None and len(ex.heads) == len(ex.words) == len(ex.relns)
        assert ex.pos is not None and all(p != "_" for p in ex.pos)
    train_text = {" ".join(e.words) for e in train}
    assert not train_text & {" ".join(e.words) for e in dev}  # the splits do not overlap


@pytest.mark.parametrize("key,sent", list(_sentences()), ids=lambda x: x if isinstance(x, str) else None)
def test_each_tree_is_well_formed(key, sent):
    heads = [t.head for t in sent.tokens]
    roots = [t for t in sent.tokens if t.head == 0]
    assert len(roots) == 1 and roots[0].deprel == "root"
    assert _projective(heads), sent.comment_value("sent_id")
    for t in sent.tokens:
        allowed = DEPENDENT_UPOS.get(t.deprel)
        assert allowed is None or t.upos in allowed, (sent.comment_value("sent_id"), t.form, t.deprel, t.upos)
        assert (t.deprel == "punct") == (t.upos == "PUNCT"), (t.form, t.deprel)
        if t.deprel in ("det", "amod", "nummod", "case", "nmod:poss"):
            head = sent.tokens[t.head - 1]
            assert head.upos in ("NOUN", "PROPN", "NUM", "PRON"), (t.form, head.form)
    # The '# text' comment is the words joined as written (SpaceAfter=No honoured).
    text = "".join(t.form + ("" if "SpaceAfter=No" in t.misc else " ") for t in sent.tokens).strip()
    assert sent.comment_value("text") == text


def test_coreference_clusters_read_with_coref_reader():
    coref = pytest.importorskip("attnscope.data.coref")
    docs = coref.read_coref(demo_inputs()["coref"])
    assert [d.id for d in docs] == ["demo_bicycle", "demo_museum"]
    bike = docs[0]
    clusters = {cid: [bike.mention_text(bike.mentions[i]) for i in idx] for cid, idx in bike.clusters.items()}
    # Worked out by hand from the story.
    assert clusters["1"] == ["Lena", "She", "Her", "Lena", "she", "her"]
    assert clusters["2"] == ["an old bicycle", "it", "it", "the bicycle", "it", "it", "the green bicycle"]
    assert clusters["3"] == ["Her brother Max", "He", "Max", "his", "Max"]
    assert all(len(idx) >= 2 for idx in bike.clusters.values())  # no singletons (OntoNotes scheme)
    museum = docs[1]
    texts = [museum.mention_text(m) for m in museum.mentions]
    assert "the volunteers who had cleaned the halls" in texts
    # Head words come from the UD tree: "the volunteers who had cleaned the halls" -> "volunteers".
    m = next(m for m in museum.mentions if museum.mention_text(m).startswith("the volunteers"))
    assert museum.words[m.head] == "volunteers"
