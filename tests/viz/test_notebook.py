"""Views in a notebook: the output of ``View._repr_html_`` in a real Chromium (the frame fits its
page, the caption), export from inside a running event loop (as in a Jupyter kernel), and
``examples/tour.ipynb`` run top to bottom in a real kernel with nbclient (slow: SmolLM2).

The kernel tests skip with a reason when nbclient, nbformat or ipykernel are missing
(``pip install -e ".[notebook]"``); the browser tests when Chromium or Playwright are.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
TOUR = ROOT / "examples" / "tour.ipynb"
TOKENS = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]


def _attentions(seed: int = 0, layers: int = 3, heads: int = 4):
    """BertViz-style inputs: a tuple of per-layer ``[1 H n n]`` arrays whose rows sum to 1."""
    rng = np.random.default_rng(seed)
    n = len(TOKENS)
    out = []
    for _ in range(layers):
        w = rng.random((1, heads, n, n)) ** 4
        out.append(w / w.sum(-1, keepdims=True))
    return tuple(out)


def _frame_heights(page):
    """Per view frame on ``page``: (the frame's height in px, its page's content height in px)."""
    out = []
    for frame in page.locator("div.attnscope-view > iframe").element_handles():
        inner = frame.content_frame()
        inner.wait_for_selector("#attnscope-root[data-ready=true]")
        content = inner.evaluate("""() => { const b = document.body, s = getComputedStyle(b);
            return Math.max(b.scrollHeight, b.getBoundingClientRect().height)
                   + parseFloat(s.marginTop) + parseFloat(s.marginBottom); }""")
        out.append((frame.evaluate("f => f.getBoundingClientRect().height"), content))
    return out


@pytest.mark.browser
def test_frame_fits_its_page_and_follows_it(browser):
    from attnscope.notebook import head_view, model_view

    att = _attentions()
    views = [head_view(att, TOKENS, layer=1, special=[1, 0, 0, 0, 0, 0, 0, 1]),
             model_view(att, TOKENS)]
    assert [v.caption for v in views] == ["attnscope head view · layer 2 · 4 heads · 8 tokens",
                                          "attnscope model view · 3 layers x 4 heads · 8 tokens"]
    context = browser.new_context(viewport={"width": 1000, "height": 800})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_content("<h1>notebook</h1>" + "".join(v._repr_html_() for v in views))

    def fitted():  # the frame's inside is its page's height (rounded up), inside 2 px of border
        return all(abs((f - 2) - c) <= 1 for f, c in _frame_heights(page))

    page.wait_for_function("() => [...document.querySelectorAll('div.attnscope-view > iframe')]"
                           ".every(f => f.style.height !== '640px')")
    heights = _frame_heights(page)
    assert fitted(), heights
    assert all(100 < f < 600 for f, _ in heights), heights  # smaller than the initial 640 px
    # trusted output: the caption is shown and its "run the cell" hint is hidden
    captions = page.locator("p.attnscope-caption").all_inner_texts()
    assert [c.strip() for c in captions] == [v.caption for v in views]

    # the model view grows when a thumbnail opens a head view in it; the frame follows
    before = heights[1][0]
    model = page.frame_locator("div.attnscope-view:nth-of-type(2) > iframe")
    model.locator('.as-thumb[data-layer="2"][data-head="1"]').click()
    model.locator("#attnscope-root[data-rendered-view=head]").wait_for()
    assert "Layer 3, heads 3-2" in model.locator("svg.as-head-view .as-caption").first.text_content()
    page.wait_for_function(f"() => document.querySelectorAll('div.attnscope-view > iframe')[1]"
                           f".getBoundingClientRect().height !== {before}")
    assert fitted(), _frame_heights(page)
    assert errors == []
    context.close()


def test_caption_without_a_page_payload():
    from attnscope.notebook import View

    assert View("<p>no data</p>", "head").caption == "attnscope head view"
    v = View("<p>x</p>", "heatmap", caption="my <b>own</b>")
    html = v._repr_html_()
    assert "my &lt;b&gt;own&lt;/b&gt;" in html and "run the cell to interact" in html


@pytest.mark.browser
def test_save_png_inside_a_running_event_loop(tmp_path, chromium):
    """A Jupyter kernel runs cells inside an asyncio loop, where Playwright's sync API refuses
    to start; View.save_png/save_svg must still export there."""
    from attnscope.notebook import head_view
    from attnscope.viz.export import png_size
    view = head_view(_attentions(), TOKENS, layer=0)

    async def cell():
        return view.save_png(tmp_path / "v.png", scale=1), view.save_svg(tmp_path / "v.svg")

    # a thread of its own: this module's browser fixture keeps Playwright's loop on this one
    done = {}
    worker = threading.Thread(target=lambda: done.update(sizes=asyncio.run(cell())))
    worker.start()
    worker.join(120)
    (pw, ph), (sw, sh) = done["sizes"]
    assert png_size((tmp_path / "v.png").read_bytes()) == (pw, ph) and (pw, ph) == (sw, sh)
    assert f'width="{sw}"' in (tmp_path / "v.svg").read_text(encoding="utf-8")


def _kernel_tools():
    nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (the notebook extra)")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (the notebook extra)")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (the notebook extra)")
    return nbformat, nbclient


def test_tour_is_stored_without_outputs():
    nbformat, _ = _kernel_tools()
    nb = nbformat.read(TOUR, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)


def run_tour(folder: Path, timeout: int = 900):
    """Copy the tour into ``folder`` and run it there in a fresh python3 kernel; returns the
    executed notebook and the seconds it took."""
    import time

    nbformat, nbclient = _kernel_tools()
    shutil.copy(TOUR, folder / "tour.ipynb")
    nb = nbformat.read(folder / "tour.ipynb", as_version=4)
    start = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(folder)}}).execute()
    return nb, time.perf_counter() - start


@pytest.mark.slow
def test_tour_runs_top_to_bottom_in_a_kernel(tmp_path, monkeypatch, smollm2_file, chromium):
    """The tour notebook, every cell in a real kernel (it saves a view as PNG: Chromium)."""
    pytest.importorskip("ipywidgets", reason="ipywidgets is not installed (the notebook extra)")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    nb, seconds = run_tour(tmp_path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [(i, o.ename, o.evalue) for i, c in enumerate(code) for o in c.outputs
              if o.output_type == "error"]
    assert errors == []
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    streams = [o for c in code for o in c.outputs if o.output_type == "stream"]
    stderr = [o.text for o in streams if o.name == "stderr"]
    assert not any("Warning" in t or "IProgress" in t for t in stderr), stderr
    assert not any("\r" in o.text for o in streams)  # no raw progress bars in the output

    # every view is an iframe holding its page, with the caption line under it
    views = [o for c in code for o in c.outputs
             if o.get("data", {}).get("text/plain", "").startswith("<attnscope View")]
    captions = []
    for o in views:
        html = o["data"]["text/html"]
        frame = re.search(r'<iframe id="(attnscope-[0-9a-f]+)" srcdoc="&lt;!doctype html&gt;', html)
        assert frame and 'sandbox="allow-scripts' in html
        assert f"getElementById('{frame.group(1)}')" in html  # the height listener finds it
        captions.append(re.search(r'<p class="attnscope-caption"[^>]*>(.*?)<span', html).group(1))
    assert captions == [
        "attnscope head view · layer 3 · heads 3-2, 3-9, 3-12 of 12 · 14 tokens",  # the 3 pointing at words
        "attnscope model view · 6 layers x 12 heads · 14 tokens",
        "attnscope head view · layer 2 · heads 2-1, 2-6, 2-11 of 12 · 13 words",
        "attnscope heatmap · head 1-4 · 13 words",
        "attnscope head page · head 1-3 · top examples for 10 statistics",
        "attnscope results view · long-context profiles · sink mass",
        "attnscope head view · layer 30 · heads 30-6, 30-7, 30-8 of 9 · 13 tokens · 8 generated",
    ]

    # progress bars are notebook widgets; the general figures and the exported PNG are inline
    widgets = [o for c in code for o in c.outputs
               if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert widgets, "no progress widget: tqdm fell back to text bars"
    by_source = {c.source.split("\n", 1)[0]: c for c in code}
    figures = [o for o in by_source["for fig in general.figures:"].outputs if "image/png" in o.get("data", {})]
    assert len(figures) >= 4  # Figures 1, 2, 4 and 6 (3 needs gradients, which MiniLM lacks)
    saved = tmp_path / "tour-notebook"
    out = "".join(o.text for o in by_source[next(k for k in by_source if k.startswith("view ="))].outputs
                  if o.output_type == "stream")
    from attnscope.viz.export import png_size

    width, height = png_size((saved / "head.png").read_bytes())
    assert f"({width}, {height})" in out and width > 200 and height > 200
    svg = ET.parse(saved / "head.svg").getroot()
    assert svg.tag.endswith("svg") and f"({svg.get('width')}, {svg.get('height')})" in out
    assert (saved / "maps").is_dir() and (saved / "longctx" / "results").is_dir()
    print(f"tour: {len(code)} cells in {seconds:.0f} s")
