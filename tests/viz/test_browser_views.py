"""End-to-end: the view pages in a real headless Chromium with the network cut off.

Skips when /usr/bin/chromium or playwright is missing. One browser for the module.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest

from attnscope.viz.export import is_local, png_size

pytestmark = pytest.mark.browser
EVIL = "<script>window.pwned=1</script>"


class Opened:
    """A page opened offline: ``left`` lists requests that tried to leave the machine."""

    def __init__(self, browser, html: str, tmp_path: Path):
        self.left: list[str] = []
        self.errors: list[str] = []
        self.context = browser.new_context()
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        path = tmp_path / "view.html"
        path.write_text(html, encoding="utf-8")
        self.page.goto(path.as_uri())
        self.page.wait_for_selector("#attnscope-root[data-ready=true]", timeout=30000)

    def _route(self, route):
        if is_local(route.request.url) and not route.request.url.startswith("http"):
            route.continue_()
        else:
            self.left.append(route.request.url)
            route.abort()

    def js(self, expr, arg=None):
        return self.page.evaluate(expr, arg)

    def close(self):
        assert self.left == [], f"requests left the machine: {self.left}"
        assert self.errors == []
        self.context.close()


@pytest.fixture(scope="module")
def pair_map(debug_bert):
    from attnscope.extract.runner import extract

    ex = {"text": "the cat sat on the mat", "text_pair": "a dog ran"}
    return next(iter(extract([ex], debug_bert))).items[0]


@pytest.mark.parametrize("view", ["head", "model", "heatmap", "neuron"])
def test_every_view_renders_offline(browser, tmp_path, pair_map, debug_bert, view):
    from attnscope.viz.pages import neuron_view_html, view_html

    html = (neuron_view_html(pair_map, debug_bert, layer=1, head=1) if view == "neuron"
            else view_html(pair_map, view, layer=1))
    o = Opened(browser, html, tmp_path)
    assert o.page.get_attribute("#attnscope-root", "data-rendered-view") == view
    assert o.page.locator(f"svg.as-{view}-view").count() == 1
    if view == "neuron":  # JS recomputes the softmax from q and k: it matches the model's
        soft = o.js("() => window.attnscope.neuronValues(1, 0).softmax")
        np.testing.assert_allclose(soft, pair_map.attn[1, 1, 0], atol=1e-4)
    o.close()


def test_model_thumbnail_opens_that_head(browser, tmp_path, pair_map):
    from attnscope.viz.pages import model_view_html

    o = Opened(browser, model_view_html(pair_map), tmp_path)
    o.page.click('.as-thumb[data-layer="1"][data-head="0"]')
    o.page.wait_for_selector("#attnscope-root[data-rendered-view=head]")
    st = o.js("() => window.attnscope.state")
    assert (st["view"], st["layer"], st["heads"]) == ("head", 1, [0])
    assert "Layer 2, heads 2-1" in o.page.text_content("svg.as-head-view .as-caption")
    o.close()


def test_png_and_svg_export(browser, tmp_path, pair_map):
    import xml.etree.ElementTree as ET

    from matplotlib.image import imread

    from attnscope.viz.pages import head_view_html

    o = Opened(browser, head_view_html(pair_map, layer=0), tmp_path)
    size = o.js("() => window.attnscope.svgSize()")
    url = o.js("() => window.attnscope.exportPNG(2)")
    data = base64.b64decode(url.split(",", 1)[1])
    assert png_size(data) == (2 * size["width"], 2 * size["height"])
    pixels = imread(io.BytesIO(data))
    assert pixels.std() > 0.01  # something was drawn, not a blank image
    svg = ET.fromstring(o.js("() => window.attnscope.exportSVG()"))
    assert svg.tag.endswith("svg") and int(svg.get("width")) == size["width"]
    with o.page.expect_download() as dl:  # the button downloads, without any request
        o.page.click(".as-export-png")
    assert dl.value.suggested_filename == "attnscope-0-head-L1.png"
    o.close()


def test_script_token_renders_as_text(browser, tmp_path, map_factory):
    from attnscope.viz.pages import heatmap_html

    m = map_factory(np.full((2, 1, 3, 3), 1 / 3), ["[CLS]", EVIL, "[SEP]"])
    o = Opened(browser, heatmap_html(m, title=EVIL), tmp_path)
    assert o.js("() => window.pwned") is None
    assert o.page.title() == EVIL
    labels = o.page.eval_on_selector_all("svg.as-heatmap-view text.as-token",
                                         "ts => ts.map(t => t.firstChild.textContent)")
    assert labels[1] == EVIL[:15] + "\u2026"  # shown (shortened to 16) as text
    assert o.page.text_content('.as-heatmap-view .as-token[data-unit="1"][data-side="q"] title') == EVIL
    o.js("() => window.attnscope.setState({view: 'head'}).then(() => null)")
    assert o.page.text_content('.as-token[data-unit="1"][data-side="q"] title') == EVIL
    assert o.js("() => window.pwned") is None
    o.close()


def test_page_filters_agree_with_the_payload(browser, tmp_path, pair_map):
    from attnscope.viz.pages import head_view_html
    from attnscope.viz.payload import head_payload

    o = Opened(browser, head_view_html(pair_map), tmp_path)
    for filt, hide in (("A->B", True), ("B->A", False), ("all", True)):
        o.js("(s) => window.attnscope.setState(s).then(() => null)", {"layer": 1, "heads": [0, 1], "pair_filter": filt,
                                                     "hide_special": hide})
        got = o.js("() => window.attnscope.currentMatrix()")
        want = head_payload(pair_map, 1, [0, 1], pair_filter=filt, hide_special=hide)
        assert got["rows"] == want["rows"] and got["cols"] == want["cols"]
        np.testing.assert_allclose(got["attn"], want["attn"], atol=0.01)  # 1/255 quantisation
        note = o.page.text_content(".as-note")
        assert ("non-special" in note) == hide  # renormalisation is stated on the page
    o.close()


def test_hover_focuses_one_token(browser, tmp_path, pair_map):
    from attnscope.viz.pages import head_view_html

    o = Opened(browser, head_view_html(pair_map, layer=0), tmp_path)
    o.js("() => window.attnscope.setState({min_weight: 0, heads: [0, 1]}).then(() => null)")
    n = len(pair_map.tokens)
    assert o.page.get_attribute("#attnscope-root", "data-lines") == str(2 * n * n)
    o.page.hover('.as-token[data-unit="2"][data-side="q"]')
    assert o.page.get_attribute("#attnscope-root", "data-lines") == str(2 * n)  # only its lines
    # the weight boxes are drawn behind the key tokens: each token keeps a white halo over them
    assert o.page.locator(".as-boxes rect").count() == 2 * n
    halo = o.js("() => { const s = getComputedStyle(document.querySelector('.as-token[data-side=\"k\"]'));"
                " return [s.paintOrder, s.stroke, s.strokeWidth]; }")
    assert halo[0].startswith("stroke") and halo[1] == "rgb(255, 255, 255)" and float(halo[2][:-2]) >= 3
    o.close()


def test_the_head_view_has_a_legend_of_its_head_colours_in_its_drawing(browser, tmp_path, pair_map):
    """Which colour is which head is drawn in the view's own SVG (so the PNG and SVG exports carry
    it): one swatch per head shown, in that head's colour, named as the pages name heads."""
    from attnscope.viz.pages import head_view_html

    o = Opened(browser, head_view_html(pair_map, layer=1), tmp_path)
    o.js("() => window.attnscope.setState({heads: [0, 1]}).then(() => null)")
    got = o.js("() => Array.from(document.querySelectorAll('.as-head-view .as-legend .as-swatch'))"
               ".map(l => [l.getAttribute('stroke'), l.dataset.name])")
    want = o.js("() => [0, 1].map(h => [AttnScope.headColour(h), '2-' + (h + 1)])")
    assert got == want and want[0][0] != want[1][0]
    assert o.js("() => window.attnscope.exportSVG()").count('class="as-swatch"') == 2
    o.close()


def test_a_hybrids_pages_name_its_layers_as_the_model_does(browser, tmp_path):
    # debug:granitemoehybrid: Mamba in layer 1, attention in layer 2 only; the maps hold that one
    # layer, which every menu, caption and thumbnail used to call layer 1
    from attnscope.data.records import Example
    from attnscope.jobs import extract_to_store
    from attnscope.models import load_model
    from attnscope.notebook import View, head_view, model_view
    from attnscope.store import open_store

    lm = load_model("debug:granitemoehybrid")
    assert lm.facts.attention_layers == (1,)
    view = head_view(lm, "the cat sat on the mat")
    assert View._payload(view.html)["layer_numbers"] == [2]
    assert "layer 2 " in view.caption  # the notebook's one line under the frame
    o = Opened(browser, view.html, tmp_path)
    assert o.page.locator("select.as-layer option").all_text_contents() == ["2"]
    assert "Layer 2, heads 2-1" in o.page.text_content("svg.as-head-view .as-caption")
    o.close()
    o = Opened(browser, model_view(lm, "the cat sat on the mat").html, tmp_path)
    assert o.page.text_content('.as-thumb[data-layer="0"][data-head="2"] title') == "head 2-3"
    o.close()
    # a store keeps the numbering with its model: the maps read back carry it to their pages
    extract_to_store([Example(text="the cat sat on the mat")], tmp_path / "store", lm)
    amap = next(iter(open_store(tmp_path / "store")))
    assert amap.layers == (1,) and amap.layer_numbers == [2]
