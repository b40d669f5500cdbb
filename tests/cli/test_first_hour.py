"""A newcomer's first hour, round 4 (issue 58): what stood in the way, each with a test."""

from __future__ import annotations

import pytest
from conftest import one_line, says

from attnscope.errors import IndexRangeError
from tests.cli.test_cli import run


def test_a_chromium_path_that_is_no_file_is_one_line_and_exit_2_before_anything_loads(tmp_path, capsys, monkeypatch):
    import attnscope.models.loading

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(attnscope.models.loading, "load_model", no_load)
    code, out, err = run(capsys, "view", tmp_path, "--example", "0", "--out", tmp_path / "v.html",
                         "--chromium", "/nonexistent")
    assert code == 2 and out == "" and not (tmp_path / "v.html").exists()
    says(one_line(err.strip()), "--chromium", "/nonexistent", "no such file")


def test_neuron_view_takes_what_head_view_takes_a_model_object_and_its_tokenizer():
    from attnscope import notebook
    from attnscope.errors import ModelError
    from attnscope.models import load_model

    lm = load_model("debug:bert")
    by_object = notebook.neuron_view(lm.model, "the cat sat", tokenizer=lm.tokenizer, layer=1, head=1)
    by_loaded = notebook.neuron_view(lm, "the cat sat", layer=1, head=1)
    assert by_object.html.count("\"cat\"") == by_loaded.html.count("\"cat\"") > 0
    with pytest.raises(ModelError, match="tokenizer="):
        notebook.neuron_view(lm.model, "the cat sat")


@pytest.mark.parametrize("view, kwargs, what, count", [
    ("head_view", {"layer": 2}, "layer", 2),
    ("heatmap", {"layer": 0, "head": 2}, "head", 2),
    ("neuron_view", {"layer": 5}, "layer", 2),
])
def test_an_out_of_range_layer_or_head_is_one_line_naming_the_range_in_both_numberings(view, kwargs, what, count):
    from attnscope import notebook

    with pytest.raises(IndexRangeError) as info:
        getattr(notebook, view)("debug:bert", "the cat sat", **kwargs)
    says(one_line(str(info.value)), f"{what} {kwargs[what]} out of range", f"0 to {count - 1}",
         f"1 to {count}")


def test_info_of_the_default_model_prints_its_local_folder_and_what_it_is(capsys):
    from pathlib import Path

    code, out, err = run(capsys, "info", "default", "--json")
    assert code == 0, err
    import json

    info = json.loads(out)
    folder = Path(info["files"])
    assert (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))
    assert (info["model"], info["kind"], info["heads"]) == ("sentence-transformers/all-MiniLM-L6-v2",
                                                            "bidirectional", 12)


def test_the_head_palette_tells_sixteen_heads_apart():
    """Point 4: each head's colour in every view. Sixteen heads (and any twelve) in colours at
    least 25 apart in CIELAB (CIE76 Delta E; about 2.3 is the smallest difference people see, 25
    is plainly another colour): the palette before had two of its 16 at 4.6."""
    import itertools
    import re
    from pathlib import Path

    import numpy as np

    js = (Path(__file__).resolve().parents[2] / "src" / "attnscope" / "viz" / "static" / "attnscope.js").read_text()
    palette = re.findall(r"#[0-9a-fA-F]{6}", re.search(r"var PALETTE = \[(.*?)\];", js, re.S).group(1))

    def lab(colour):  # sRGB (D65) -> CIELAB, the textbook formulas
        rgb = np.array([int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
        rgb = np.where(rgb > 0.04045, ((rgb + 0.055) / 1.055) ** 2.4, rgb / 12.92)
        xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ rgb
        t = xyz / np.array([0.95047, 1.0, 1.08883])
        f = np.where(t > (6 / 29) ** 3, np.cbrt(t), t / (3 * (6 / 29) ** 2) + 4 / 29)
        return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])

    assert len(palette) >= 16 and len(set(palette)) == len(palette)
    closest = min(float(np.linalg.norm(lab(a) - lab(b))) for a, b in itertools.combinations(palette[:16], 2))
    assert closest >= 25, closest
