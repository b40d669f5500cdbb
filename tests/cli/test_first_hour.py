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
