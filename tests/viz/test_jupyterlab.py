"""examples/tour.ipynb in a real JupyterLab 4, driven by headless Chromium through Playwright.

A ``jupyter lab`` server on 127.0.0.1 with a random token and a temporary root, settings and
data folders; the page runs every cell of the tour, then the test checks from the page that each
view frame draws its tokens, that hovering and clicking change what is drawn, that the frames
fit their pages, that no request leaves 127.0.0.1 and that nothing is logged as an error. Then
the saved notebook is changed on disk (its signature no longer matches, so JupyterLab opens it
untrusted and sanitises its HTML outputs) and reopened: each view must leave its caption line.

The tour itself is run (about half a minute of cells), not a smaller notebook: the point is
that what a reader opens works. Slow (SmolLM2) and browser; skips with a reason when JupyterLab,
ipykernel, SmolLM2 or Chromium are missing. ``ATTNSCOPE_SCREENSHOT=path`` also saves the
screenshot of the first view's cell there (docs/img/notebook.png was made so).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[2]
TOUR = ROOT / "examples" / "tour.ipynb"
VIEWS = 7  # view outputs in the tour: head, model, head (store), heatmap, head page, results, generated
CELL_TIMEOUT_S = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory, smollm2_file):
    """``(url, token, root)`` of a JupyterLab serving a folder that holds a copy of the tour."""
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (the notebook extra)")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (the notebook extra)")
    pytest.importorskip("ipywidgets", reason="ipywidgets is not installed (the notebook extra)")
    base = tmp_path_factory.mktemp("lab")
    root, home = base / "root", base / "home"
    root.mkdir()
    shutil.copy(TOUR, root / "tour.ipynb")
    settings = home / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    # every cell in the page's DOM (no windowing), so the test can look at all the outputs
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"))
    port, token = _free_port(), secrets.token_hex(16)
    log = open(base / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         "--port-retries=0", f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={token}",
         "--LabApp.expose_app_in_browser=True",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--LabApp.extension_manager=readonly",  # no PyPI queries from the server
         *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("jupyter lab did not start: "
                                       + (base / "lab.log").read_text()[-2000:]) from None
                time.sleep(0.5)
        yield url, token, root
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


class LabPage:
    """A page of the lab in a fresh context: requests off the server are refused and listed in
    ``left``; console errors and page errors are collected in ``errors``."""

    def __init__(self, browser, url: str, token: str, path: str, workspace: str):
        self.url, self.left, self.errors = url, [], []
        self.context = browser.new_context(viewport={"width": 1280, "height": 1000})
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("request", self._request)
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(f"{url}/lab/workspaces/{workspace}/tree/{path}?reset&token={token}")
        self.page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                                    " && window.jupyterapp.shell.currentWidget.context", timeout=120000)
        self.page.evaluate("() => window.jupyterapp.shell.currentWidget.context.ready.then(() => null)")
        self.page.wait_for_selector(".jp-NotebookPanel .jp-Cell")

    def _local(self, url: str) -> bool:
        return url.startswith((self.url + "/", "data:", "blob:", "about:"))

    def _request(self, request):
        if not self._local(request.url):
            self.left.append(request.url)

    def _route(self, route):
        if self._local(route.request.url):
            route.continue_()
        else:
            route.abort()

    def command(self, name: str):
        self.page.evaluate(f"() => window.jupyterapp.commands.execute({json.dumps(name)})"
                           ".then(() => null)")

    def close(self):
        self.context.close()


def _views(page):
    return page.locator(".jp-OutputArea-output div.attnscope-view")


def test_tour_in_jupyterlab_then_untrusted(lab, browser, tmp_path):
    import nbformat

    url, token, root = lab
    lp = LabPage(browser, url, token, "tour.ipynb", "run")
    page = lp.page
    page.wait_for_function("() => { const s = window.jupyterapp.shell.currentWidget.sessionContext;"
                           " return s.session && s.session.kernel && s.session.kernel.status === 'idle'; }",
                           timeout=120000)
    start = time.monotonic()
    lp.command("notebook:run-all-cells")
    code_cells = page.locator(".jp-NotebookPanel .jp-CodeCell")
    n = code_cells.count()
    # done when the last code cell has its execution count and the kernel is idle again
    page.wait_for_function(
        """(n) => { const p = document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell .jp-InputPrompt');
                    const s = window.jupyterapp.shell.currentWidget.sessionContext.session;
                    return p.length === n && p[n - 1].textContent.trim() === `[${n}]:`
                           && s.kernel.status === 'idle'; }""", arg=n, timeout=CELL_TIMEOUT_S * 1000)
    seconds = time.monotonic() - start
    assert page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").count() == 0, \
        page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
    assert page.locator(".jp-OutputArea-output .jp-RenderedText[data-mime-type*='error']").count() == 0
    # progress bars are widgets drawn by JupyterLab (ipywidgets), not text
    assert page.locator(".jp-OutputArea-output .widget-hprogress, .jp-OutputArea-output .jupyter-widgets").count() > 0

    views = _views(page)
    assert views.count() == VIEWS
    # a token each view must draw, as text (a byte-level piece's space shown as "·"), and its raw
    # piece on hover
    expected = {0: ("cat", "cat"), 2: ("bread", "bread"), 3: ("bread", "bread"), 6: ("·Paris", "ĠParis")}
    for i in range(VIEWS):
        frame = page.frame_locator(f".jp-OutputArea-output div.attnscope-view >> nth={i} >> iframe")
        frame.locator("#attnscope-root[data-ready=true]").wait_for(timeout=60000)
        if i in expected:
            tokens = frame.locator(".as-token").evaluate_all(
                "els => els.map(e => [e.firstChild.textContent, (e.querySelector('title') || {}).textContent])")
            shown, raw = expected[i]
            assert any(t == shown and (h or "").startswith(raw) for t, h in tokens), (i, tokens[:20])
        if i == 1:  # the model view: a thumbnail per head of MiniLM's 6 x 12
            assert frame.locator(".as-thumb").count() == 72
        if i == 4:  # head 1-3's page: the demo text's examples where it attends to the previous token
            assert frame.locator(".hp-top .hp-strip").count() > 0
            assert "Head 1-3" in frame.locator("h2").text_content()
        if i == 6:  # SmolLM2's continuation: its 8 generated tokens marked, on both sides
            assert frame.locator(".as-token.as-generated").count() == 2 * 8
        caption = views.nth(i).locator("p.attnscope-caption")
        assert caption.inner_text().startswith("attnscope ")  # shown, its hint hidden (trusted)
        assert "run the cell" not in caption.inner_text()
    # each frame fits its page: its inside is the page's height (not the initial 640 px). Chromium
    # pauses the rendering of cross-origin frames out of sight, so each is scrolled into view.
    for i in range(VIEWS):
        views.nth(i).scroll_into_view_if_needed()
        handle = views.nth(i).locator("iframe").element_handle()
        inner = handle.content_frame()
        measure = ("() => { const b = document.body, s = getComputedStyle(b); return Math.max(b.scrollHeight,"
                   " b.getBoundingClientRect().height) + parseFloat(s.marginTop) + parseFloat(s.marginBottom); }")
        deadline = time.monotonic() + 30
        while True:  # the page posts its height when it changes; the frame follows
            outer, content = handle.evaluate("f => f.clientHeight"), inner.evaluate(measure)
            if abs(outer - content) <= 1 or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert abs(outer - content) <= 1 and outer < (4000 if i == 4 else 2000), (i, outer, content)
    # hover keeps one token's lines; a click on a model-view thumbnail opens that head
    head = page.frame_locator(".jp-OutputArea-output div.attnscope-view >> nth=0 >> iframe")
    root_el = head.locator("#attnscope-root")
    views.nth(0).scroll_into_view_if_needed()
    all_lines = int(root_el.get_attribute("data-lines"))
    head.locator('.as-token[data-unit="2"][data-side="q"]').hover()
    focused = int(root_el.get_attribute("data-lines"))
    assert 0 < focused < all_lines
    shot = tmp_path / "notebook.png"
    page.locator(".jp-NotebookPanel .jp-CodeCell").nth(2).screenshot(path=str(shot))
    if os.environ.get("ATTNSCOPE_SCREENSHOT"):
        shutil.copy(shot, os.environ["ATTNSCOPE_SCREENSHOT"])
    model = page.frame_locator(".jp-OutputArea-output div.attnscope-view >> nth=1 >> iframe")
    views.nth(1).scroll_into_view_if_needed()
    model.locator('.as-thumb[data-layer="3"][data-head="4"]').click()
    model.locator("#attnscope-root[data-rendered-view=head]").wait_for()
    assert "Layer 4, heads 4-5" in model.locator("svg.as-head-view .as-caption").first.text_content()

    lp.command("docmanager:save")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty")
    page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown().then(() => null)")
    assert lp.left == [], f"requests left 127.0.0.1: {lp.left}"
    assert lp.errors == [], lp.errors
    lp.close()

    # saved with its outputs, signed; change it on disk so the signature no longer matches
    path = root / "tour.ipynb"
    nb = nbformat.read(path, as_version=4)
    assert sum("text/html" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", [])) >= VIEWS
    nb.metadata["edited_outside"] = True
    nbformat.write(nb, path)

    lp = LabPage(browser, url, token, "tour.ipynb", "untrusted")
    page = lp.page
    page.wait_for_selector(".jp-OutputArea-output p.attnscope-caption")
    assert page.evaluate("() => window.jupyterapp.shell.currentWidget.content.model.cells.get(0)"
                         ".trusted") is False
    views = _views(page)
    assert views.count() == VIEWS
    assert page.locator(".jp-OutputArea-output iframe").count() == 0  # no broken frame left
    captions = [views.nth(i).inner_text().strip() for i in range(VIEWS)]
    assert captions[0] == "attnscope head view · layer 3 · heads 3-2, 3-9, 3-12 of 12 · 14 tokens — run the cell to interact"
    assert all(c.startswith("attnscope ") and c.endswith("— run the cell to interact") for c in captions)
    assert lp.left == [], f"requests left 127.0.0.1: {lp.left}"
    lp.close()
    print(f"JupyterLab: the tour's cells ran in {seconds:.0f} s")
