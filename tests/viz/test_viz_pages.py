"""Pages, notebook objects and the ``attnscope view`` command (no browser here)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import one_line, says

from attnscope.viz.encoding import decode

EVIL = "<script>window.pwned=1</script>"


def payload_of(html: str) -> dict:
    """The JSON payload embedded in a page."""
    m = re.search(r'<script id="attnscope-data" type="application/json">(.*?)</script>', html, re.S)
    return json.loads(m.group(1))


@pytest.fixture(scope="module")
def store(tmp_path_factory, debug_bert):
    from attnscope.data.io import example_from_dict
    from attnscope.jobs import extract_to_store

    out = tmp_path_factory.mktemp("viz") / "store"
    examples = [{"text": "the cat sat on the mat", "text_pair": "a dog ran"},
                {"words": [EVIL, "the", "cat"]}, {"text": "who saw the red house"}]
    extract_to_store([example_from_dict(d, i) for i, d in enumerate(examples)], out, debug_bert)
    return out


def test_page_is_self_contained_and_escapes_tokens(map_factory):
    from attnscope.viz.pages import head_view_html

    m = map_factory(np.full((3, 3), 1 / 3), ["[CLS]", EVIL, "[SEP]"])
    html = head_view_html(m, title=EVIL)
    assert EVIL not in html  # neither in the title nor in the data
    assert html.count("<script") == 3  # data block, our script, the mount call
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in html  # the escaped <title>
    assert payload_of(html)["tokens"][1] == EVIL
    # nothing is fetched: no src/href attributes and no URLs other than the SVG namespace
    assert not re.search(r"""\s(src|href)\s*=\s*["']?(https?:|//)""", html)
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", html))
    assert urls <= {"http://www.w3.org/2000/svg"}
    assert "default-src 'none'" in html


def test_notebook_view_object(tmp_path, debug_bert):
    import torch

    from attnscope.notebook import head_view, model_view, neuron_view

    att = tuple(torch.softmax(torch.randn(1, 2, 3, 3), -1) for _ in range(2))
    v = head_view(att, ["[CLS]", EVIL, "[SEP]"], layer=1, heads=[1], special=[1, 0, 1])
    frame = v._repr_html_()
    srcdoc = re.search(r'<iframe id="(attnscope-[0-9a-f]+)" srcdoc="([^"]*)"', frame)
    assert srcdoc and "<" not in srcdoc.group(2)  # the page's scripts are all escaped
    assert frame.count("<script") == 1 and f"getElementById('{srcdoc.group(1)}')" in frame
    assert v.caption == "attnscope head view · layer 2 · head 2-2 of 2 · 3 tokens" and v.caption in frame
    p = payload_of(v.html)
    assert p["state"]["layer"] == 1 and p["state"]["heads"] == [1] and p["special"] == [True, False, True]
    np.testing.assert_allclose(decode(p["attn"])[1, 1], att[1][0, 1].numpy(), atol=0.5 / 255 + 1e-6)
    assert v.save(tmp_path / "v.html").read_text(encoding="utf-8") == v.html
    assert payload_of(model_view(att, ["a", "b", "c"]).html)["state"]["view"] == "model"
    nv = neuron_view(debug_bert, "the cat sat", layer=1, head=1)
    assert payload_of(nv.html)["neuron"]["layer"] == 1
    with pytest.raises(ValueError) as e:
        head_view(att, ["a", "b"])
    says(one_line(e.value), "attention", "[layer, head, 2, 2]", "[2, 2, 3, 3]")  # wanted, and given


def test_importing_views_pulls_in_no_ipython_or_flask():
    code = ("import sys, attnscope, attnscope.notebook, attnscope.viz, attnscope.viz.pages; "
            "print('IPython' in sys.modules, 'flask' in sys.modules, 'attnscope.cli' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]


def test_view_command_writes_each_view(store, tmp_path, capsys):
    from attnscope.cli.main import main

    for view, extra in (("head", ["--heads", "2"]), ("model", []),
                        ("heatmap", ["--head", "1", "--hide-special"]),
                        ("neuron", ["--layer", "2", "--head", "2", "--query", "2"])):
        out = tmp_path / f"{view}.html"
        assert main(["view", str(store), "--example", "0", "--view", view, "--out", str(out), *extra]) == 0
        p = payload_of(out.read_text(encoding="utf-8"))
        assert p["state"]["view"] == view and p["index"] == 0
    p = payload_of((tmp_path / "neuron.html").read_text(encoding="utf-8"))
    assert p["neuron"]["selected"]["query"] == 2 and p["neuron"]["softmax_matches_model"]
    assert p["neuron"]["layer"] == 1 and p["state"]["head"] == 1  # layer 2, head 2: 0-indexed 1, 1
    assert payload_of((tmp_path / "head.html").read_text(encoding="utf-8"))["state"]["heads"] == [1]


@pytest.mark.parametrize("view", ["head", "heatmap"])
@pytest.mark.parametrize("layer, head", [(1, 2), (2, 1)])
def test_view_flags_are_the_numbers_the_pages_show(store, tmp_path, view, layer, head):
    """`view --layer 2` drew "Layer 3": the flags now take the 1-indexed numbers that the pages
    (captions, menus, layer-head names) show. The page opens on the map's layer ``layer - 1``
    in code, whose weights it carries."""
    from attnscope.cli.main import main
    from attnscope.store import open_store

    out = tmp_path / "v.html"
    which = ["--heads", str(head)] if view == "head" else ["--head", str(head)]
    assert main(["view", str(store), "--view", view, "--layer", str(layer), *which, "--out", str(out)]) == 0
    p = payload_of(out.read_text(encoding="utf-8"))
    assert (p["state"]["layer"] + 1, p["state"]["head"] + 1) == (layer, head)
    shown = decode(p["attn"])[p["state"]["layer"], p["state"]["head"]]
    stored = open_store(store).by_index(0).attn[layer - 1, head - 1]
    np.testing.assert_allclose(shown, stored, atol=0.5 / 255 + 1e-3)


# the example, the flag and the value given, and what there is (numbered as the pages show it)
@pytest.mark.parametrize("args, facts", [
    (["--example", "7"], ("example 7", "not in the store", "0..2")),
    (["--example", "2", "--pair-filter", "A->B"], ("example 2", "A->B", "sentence pair")),
    (["--layer", "9"], ("example 0", "--layer 9", "out of range", "2 layers", "1 to 2")),
    (["--layer", "3"], ("example 0", "--layer 3", "out of range", "2 layers", "1 to 2")),
    (["--heads", "1,3"], ("example 0", "--heads 3", "out of range", "2 heads per layer", "1 to 2")),
    (["--view", "heatmap", "--head", "3"], ("--head 3", "out of range", "1 to 2")),
    (["--heads", "0"], ("--heads 0", "from 1")),
    (["--layer", "0"], ("--layer", "1")),
    (["--heads", "x"], ("--heads", "comma-separated", "'x'")),
])
def test_view_command_errors(store, tmp_path, capsys, args, facts):
    from attnscope.cli.main import main

    out = tmp_path / "v.html"
    assert main(["view", str(store), "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ")
    says(one_line(err), *facts)
    assert not out.exists()


def test_view_command_missing_store(tmp_path, capsys):
    from attnscope.cli.main import main

    assert main(["view", str(tmp_path / "nope"), "--out", str(tmp_path / "v.html")]) == 2
    says(one_line(capsys.readouterr().err.strip()), "error: ", str(tmp_path / "nope"), "no such store folder")


@pytest.mark.slow
def test_a_view_of_the_default_models_store_names_the_real_model(tmp_path):
    """``--model default`` is a shorthand: the page names the model the loader recorded
    (sentence-transformers/all-MiniLM-L6-v2), not "default"."""
    from attnscope.data.io import example_from_dict
    from attnscope.jobs import extract_to_store
    from attnscope.models import load_model
    from attnscope.views import write_view

    lm = load_model("default")
    assert lm.name == "default" and lm.display_name == "sentence-transformers/all-MiniLM-L6-v2"
    store = tmp_path / "store"
    extract_to_store([example_from_dict({"words": ["the", "cat", "sat", "."]}, 0)], store, lm)
    write_view(store, 0, "head", tmp_path / "head.html")
    page = payload_of((tmp_path / "head.html").read_text())
    assert page["model"] == "sentence-transformers/all-MiniLM-L6-v2"
