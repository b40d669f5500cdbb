"""CoNLL-2012 files that are tab-separated with EMPTY fields instead of ``-`` placeholders."""

from __future__ import annotations

from attnscope.data.coref import read_coref

# "John saw Mary ." / "He left ." -- 13 columns: 11 fixed, one predicate-argument column, coref.
# Empty cells where the space-aligned format has "-": predicate lemma, frameset, sense, named
# entities, coreference. "saw" has a predicate lemma, "John" not: whitespace-splitting gives
# them different column counts, which the reader used to refuse.
TAB_ROWS = [
    "#begin document (tabs/doc); part 000",
    "tabs/doc\t0\t0\tJohn\tNNP\t(TOP(S(NP*)\t\t\t\tspk\t(PERSON)\t(ARG0*)\t(0)",
    "tabs/doc\t0\t1\tsaw\tVBD\t(VP*\tsee\t01\t1\tspk\t\t(V*)\t",
    "tabs/doc\t0\t2\tMary\tNNP\t(NP*))\t\t\t\tspk\t(PERSON)\t(ARG1*)\t(1)",
    "tabs/doc\t0\t3\t.\t.\t*))\t\t\t\tspk\t\t*\t",
    "",
    "tabs/doc\t0\t0\tHe\tPRP\t(TOP(S(NP*)\t\t\t\tspk\t\t(ARG0*)\t(0)",
    "tabs/doc\t0\t1\tleft\tVBD\t(VP*)\tleave\t01\t1\tspk\t\t(V*)\t",
    "tabs/doc\t0\t2\t.\t.\t*))\t\t\t\tspk\t\t*\t",
    "",
    "#end document",
]


def _same_with_dashes(rows):
    """The space-aligned file with '-' placeholders, built from the tab rows."""
    out = []
    for row in rows:
        if "\t" in row:
            row = "   ".join(c if c else "-" for c in row.split("\t"))
        out.append(row)
    return out


def _read(tmp_path, name, rows):
    p = tmp_path / name
    p.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return read_coref(p)


def test_tab_separated_empty_fields_are_read(tmp_path):
    (doc,) = _read(tmp_path, "tabs_gold_conll", TAB_ROWS)
    assert doc.id == "tabs/doc/part_000"
    assert doc.words == ["John", "saw", "Mary", ".", "He", "left", "."]
    assert doc.sentence_starts == [0, 4]
    # worked out by hand from the brackets: John (0), Mary (1), He (0)
    assert [(m.start, m.end, m.cluster) for m in doc.mentions] == [(0, 1, "0"), (2, 3, "1"), (4, 5, "0")]
    assert doc.clusters == {"0": [0, 2], "1": [1]}
    # head rules: S -> VP -> saw; NP John and NP Mary attach to saw; "." to saw
    assert doc.heads == [1, -1, 1, 1, 5, -1, 5]
    assert doc.head_source == "parse"
    assert [m.type for m in doc.mentions] == ["proper", "proper", "pronoun"]


def test_tab_file_reads_like_its_space_aligned_twin(tmp_path):
    (tabs,) = _read(tmp_path, "a_gold_conll", TAB_ROWS)
    (spaces,) = _read(tmp_path, "b_gold_conll", _same_with_dashes(TAB_ROWS))
    assert tabs.words == spaces.words and tabs.heads == spaces.heads
    assert [(m.start, m.end, m.cluster, m.head) for m in tabs.mentions] == \
        [(m.start, m.end, m.cluster, m.head) for m in spaces.mentions]


def test_tab_file_with_a_short_row_names_its_line(tmp_path):
    import pytest
    from conftest import one_line, says

    from attnscope.errors import InputError

    rows = list(TAB_ROWS)
    rows[3] = rows[3].rsplit("\t", 1)[0]  # "Mary" loses its coreference column
    with pytest.raises(InputError) as e:
        _read(tmp_path, "tabs_gold_conll", rows)
    # the line, the columns of the sentence's first line, the columns found
    says(one_line(e.value), f"{tmp_path / 'tabs_gold_conll'}:4: ", "13 columns", "found 12")
