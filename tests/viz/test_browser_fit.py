"""Pages that fit at 1280 px: the report, each view and the viewer in a real headless Chromium
with a 1280 x 900 window. Nothing is wider than the page, every column of every table and every
head column of the model view can be seen without scrolling sideways, and no figure of the
report shows letters under 9 px tall.

The model is a tiny random BERT of the packaged default's shape (6 layers x 12 heads), so the
tables, figures and the model view have the columns a user meets; the inputs are the demo's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.browser

WIDTH, HEIGHT = 1280, 900
#: Height of a capital letter as a share of the font size (DejaVu Sans, matplotlib's default).
CAP_HEIGHT = 0.729
MIN_LETTER_PX = 9.0
MIN_VIEW_FONT_PX = 9.0

#: document wider than the window, elements sticking out of it, and every table's box
FITS = """() => {
  const d = document.documentElement, W = d.clientWidth;
  const out = {page: [d.scrollWidth, W], outside: [], tables: []};
  for (const e of document.body.querySelectorAll('*')) {
    const r = e.getBoundingClientRect();
    if (r.width && r.right > W + 0.5) out.outside.push(e.tagName + '#' + e.id + '.' + e.className + ' ' + r.right);
  }
  for (const t of document.querySelectorAll('table')) {
    const box = t.parentElement, last = t.querySelector('tr > :last-child');
    out.tables.push({id: t.id || t.className, table: t.getBoundingClientRect().right,
                     box: box.getBoundingClientRect().right, scroll: [box.scrollWidth, box.clientWidth],
                     last: last ? last.getBoundingClientRect().right : 0});
  }
  return out;
}"""


def assert_fits(page):
    got = page.evaluate(FITS)
    assert got["page"][0] <= got["page"][1], got["page"]
    assert got["outside"] == []
    for t in got["tables"]:  # every column in view: the table fits its box, which fits the page
        assert t["scroll"][0] <= t["scroll"][1] and t["last"] <= t["box"] + 0.5 <= WIDTH, t
    return got


@pytest.fixture(scope="module")
def wide_model():
    """debug:bert at the default model's shape: 6 layers x 12 heads (hidden 48)."""
    from attnscope.models import debug

    saved = dict(debug.TINY)
    debug.TINY.update(hidden=48, layers=6, heads=12)
    try:
        yield debug.build_debug_model("bert")
    finally:
        debug.TINY.clear()
        debug.TINY.update(saved)


@pytest.fixture(scope="module")
def report(tmp_path_factory, wide_model):
    """The demo's job on the wide model; ``fonts``: each figure's smallest text (points) and
    resolution, read from matplotlib's own text objects as the figure is saved."""
    import attnscope.report.figures as figures
    from attnscope.pipeline import demo_config, run_pipeline

    fonts: dict[str, tuple[float, int]] = {}
    original = figures.save_figure

    def spy(fig, stem, formats=("png", "svg"), dpi=150):
        import matplotlib.text

        sizes = [t.get_fontsize() for t in fig.findobj(matplotlib.text.Text)
                 if t.get_visible() and t.get_text().strip()]
        fonts[Path(stem).name] = (min(sizes), dpi)
        return original(fig, stem, formats, dpi)

    mp = pytest.MonkeyPatch()
    import sys

    for mod in [m for name, m in sys.modules.items() if name.startswith("attnscope.")]:
        if getattr(mod, "save_figure", None) is original:
            mp.setattr(mod, "save_figure", spy)
    try:
        out = run_pipeline(demo_config("debug:bert"), tmp_path_factory.mktemp("fit") / "out", model=wide_model)
    finally:
        mp.undo()
    return out.report, fonts


def _page(browser):
    context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    return context, page, errors


def test_report_fits_1280_and_its_figures_are_readable(browser, report):
    path, fonts = report
    context, page, errors = _page(browser)
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    got = assert_fits(page)
    ids = {t["id"] for t in got["tables"]}
    assert {"table-general_heads", "table-table2_coref_heldout", "data-files"} <= ids
    shown = page.eval_on_selector_all(
        "figure img", "is => is.map(i => [i.closest('figure').id.slice(7), i.naturalWidth, "
                      "i.getBoundingClientRect().width])")
    assert len(shown) >= 10 and {"figure1_examples", "figure2_special_tokens"} <= {s[0] for s in shown}
    for name, natural, width in shown:
        points, dpi = fonts[name]
        letter = CAP_HEIGHT * points * dpi / 72 * width / natural  # css px of a capital letter
        assert letter >= MIN_LETTER_PX, (name, round(letter, 1))
    assert errors == []
    context.close()


def _views_page(tmp_path, amap, view, **kwargs):
    from attnscope.viz.pages import view_html

    path = tmp_path / f"{view}.html"
    path.write_text(view_html(amap, view, **kwargs), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def wide_map(wide_model):
    from attnscope.extract.runner import extract

    text = {"text": "The quick brown fox jumps over the lazy dog near the old river bank .",
            "text_pair": "Then it ran back home ."}
    return next(iter(extract([text], wide_model))).items[0]


def _view_text_px(page) -> float:
    """The smallest font of the stage's SVG as drawn (css px, after any scaling to fit)."""
    return page.evaluate("""() => {
      const s = document.querySelector('.as-stage svg'), r = s.getBoundingClientRect();
      const k = r.width / (+s.getAttribute('width'));
      return Math.min(...Array.from(s.querySelectorAll('text')).map(t => parseFloat(getComputedStyle(t).fontSize) * k));
    }""")


@pytest.mark.parametrize("view", ["head", "model", "heatmap", "neuron", "profile"])
def test_each_view_fits_1280(browser, tmp_path, wide_map, wide_model, view):
    from attnscope.viz.neuron import capture_qk, neuron_payload

    neuron = neuron_payload(capture_qk(wide_model, wide_map.example, 2)) if view == "neuron" else None
    path = _views_page(tmp_path, wide_map, view, layer=2, neuron=neuron)
    context, page, errors = _page(browser)
    page.goto(path.as_uri())
    page.wait_for_selector("#attnscope-root[data-ready=true]")
    assert_fits(page)
    stage = page.evaluate("() => { const s = document.querySelector('.as-stage'); "
                          "return [s.scrollWidth, s.clientWidth, s.querySelector('svg').getBoundingClientRect().width]; }")
    assert stage[0] <= stage[1] and stage[2] <= stage[1], stage  # the drawing is not cut at the side
    assert _view_text_px(page) >= MIN_VIEW_FONT_PX
    if view == "model":  # all twelve head columns in the stage
        right = page.evaluate("() => Math.max(...Array.from(document.querySelectorAll('.as-thumb rect'))"
                              ".map(r => r.getBoundingClientRect().right))")
        assert page.locator(".as-thumb").count() == 6 * 12
        assert right <= page.evaluate("() => document.querySelector('.as-stage').getBoundingClientRect().right")
    if view == "head":  # a drawing of a useful size, lines that show their weight
        assert stage[2] >= 600
        line = page.evaluate("""() => { const v = window.attnscope, M = v.currentMatrix(), l = document.querySelector('.as-lines line');
          return [+l.getAttribute('stroke-opacity'), M.attn]; }""")
        weights = np.asarray(line[1][0]).ravel()
        assert any(abs(np.sqrt(w) - line[0]) < 1e-3 for w in weights if w >= 0.01)
    assert errors == []
    context.close()


def test_view_flag_layer_is_the_layer_the_page_draws(browser, tmp_path, capsys):
    """`view --layer 2`: the caption says Layer 2 and the layer menu shows 2."""
    from attnscope.cli.main import main
    from attnscope.data.io import example_from_dict
    from attnscope.jobs import extract_to_store
    from attnscope.models import load_model

    extract_to_store([example_from_dict({"text": "the cat sat on the mat"}, 0)], tmp_path / "s",
                     load_model("debug:gpt2"))
    for layer in (1, 2):
        out = tmp_path / f"v{layer}.html"
        assert main(["view", str(tmp_path / "s"), "--layer", str(layer), "--heads", "2", "--out", str(out)]) == 0
        context, page, errors = _page(browser)
        page.goto(out.as_uri())
        page.wait_for_selector("#attnscope-root[data-ready=true]")
        caption = page.text_content(".as-head-view .as-caption")
        assert caption.startswith(f"Layer {layer}, heads {layer}-2")
        assert page.eval_on_selector(".as-layer", "s => s.options[s.selectedIndex].textContent") == str(layer)
        # tokens as text, the raw piece on hover
        texts = page.eval_on_selector_all(".as-head-view .as-q text",
                                          "ts => ts.map(t => [t.firstChild.textContent, t.querySelector('title').textContent])")
        assert ["\u00b7sat", "Ġsat"] in texts or ["\u00b7s", "Ġs"] in texts
        assert not any("Ġ" in shown for shown, _ in texts)
        assert errors == []
        context.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory, wide_model):
    from attnscope.data.io import example_from_dict
    from attnscope.jobs import extract_to_store
    from attnscope.serve.app import create_app
    from tests.serve.test_browser_serve import start

    store = tmp_path_factory.mktemp("served") / "store"
    extract_to_store([example_from_dict({"text": "The quick brown fox jumps over the lazy dog ."}, 0)],
                     store, wide_model)
    server, url = start(create_app(store, None))
    yield url
    server.shutdown()


@pytest.mark.parametrize("view", ["model", "head", "heatmap"])
def test_the_viewer_fits_1280(browser, served, view):
    """serve's model view cut off the twelfth head column at 1280 px: every column is in view."""
    context, page, errors = _page(browser)
    page.goto(served)
    page.wait_for_function("() => window.attnscopeViewer !== undefined")
    page.evaluate("() => window.attnscopeViewer.ready.then(() => null)")
    # the viewer opened the first example when it became ready; clicking it opens it again,
    # and that second view must be the one drawn before a tab is clicked (under load the stale
    # "ready" of the first view let the click reach a view that was then replaced)
    page.evaluate("() => document.querySelector('#attnscope-root').removeAttribute('data-ready')")
    page.click("#vw-list li:nth-child(1)")
    page.wait_for_selector("#attnscope-root[data-ready=true]")
    page.click(f'.as-tabs button[data-view="{view}"]')
    page.wait_for_selector(f"svg.as-{view}-view")
    assert_fits(page)
    stage = page.evaluate("() => { const s = document.querySelector('.as-stage'); "
                          "return [s.scrollWidth, s.clientWidth, s.getBoundingClientRect().right]; }")
    assert stage[0] <= stage[1], stage
    if view == "model":
        heads = page.evaluate("() => Array.from(document.querySelectorAll('.as-thumb')).map(g => "
                              "[+g.dataset.head, g.getBoundingClientRect().right])")
        assert {h for h, _ in heads} == set(range(12)) and max(r for _, r in heads) <= stage[2]
    assert _view_text_px(page) >= MIN_VIEW_FONT_PX
    assert errors == []
    context.close()

