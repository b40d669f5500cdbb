"""The report in a real headless Chromium, offline: figures rendered, tables filled, head views open."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]

TEXT = ("Snow fell on the quiet village.\nThe children built a tall snowman.\n\n"
        "A fox crossed the frozen river.\nIt left small tracks behind.\n")
DEPS = ("1\tThe\tthe\tDET\tDT\t_\t2\tdet\t_\t_\n2\tfox\tfox\tNOUN\tNN\t_\t3\tnsubj\t_\t_\n"
        "3\tran\trun\tVERB\tVBD\t_\t0\troot\t_\t_\n4\t.\t.\tPUNCT\t.\t_\t3\tpunct\t_\t_\n\n"
        "1\tBirds\tbird\tNOUN\tNNS\t_\t2\tnsubj\t_\t_\n2\tsang\tsing\tVERB\tVBD\t_\t0\troot\t_\t_\n\n")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from attnscope.pipeline import RunConfig, demo_inputs, run_pipeline

    root = tmp_path_factory.mktemp("browser")
    (root / "text.txt").write_text(TEXT)
    (root / "deps.conllu").write_text(DEPS)
    cfg = RunConfig(model="debug:bert", text=root / "text.txt", deps=root / "deps.conllu",
                    coref=[demo_inputs()["coref"]])
    return run_pipeline(cfg, root / "out").report


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists() and not shutil.which("chromium"):
        pytest.skip("chromium is not installed (/usr/bin/chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


def _offline_page(browser, outside: list[str]):
    context = browser.new_context(viewport={"width": 1200, "height": 900}, offline=True)

    def route(r):
        url = r.request.url
        if url.startswith(("file://", "data:", "blob:", "about:")):
            r.continue_()
        else:
            outside.append(url)
            r.abort()

    context.route("**/*", route)
    return context, context.new_page()


def test_report_renders_offline_and_links_into_a_head_view(browser, report):
    outside: list[str] = []
    context, page = _offline_page(browser, outside)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(report.as_uri())
    page.wait_for_load_state("load")

    # Every figure decoded to a real image.
    images = page.eval_on_selector_all("img", "els => els.map(e => [e.complete, e.naturalWidth, e.naturalHeight])")
    assert len(images) >= 3
    assert all(c and w > 10 and h > 10 for c, w, h in images), images
    # Every table has a filled body.
    tables = page.eval_on_selector_all(
        "table", "ts => ts.map(t => [t.id, t.querySelectorAll('tbody tr').length, "
                 "Array.from(t.querySelectorAll('tbody td')).filter(td => td.textContent.trim() !== '').length])")
    assert tables and all(rows >= 1 and cells >= 1 for _, rows, cells in tables), tables
    assert all("(no rows)" not in page.inner_text(f"#{t}") for t, _, _ in tables if t)
    for anchor in ("summary", "sec-general", "sec-syntax", "sec-coref", "provenance"):
        assert page.locator(f"#{anchor}").count() == 1, anchor

    # Follow the first head-view link.
    link = page.locator("a.head-view").first
    href = link.get_attribute("href")
    assert href.startswith("views/")
    link.click()
    page.wait_for_load_state("load")
    assert page.url.endswith(href)
    root = page.locator("#attnscope-root, #heatmap").first
    if page.locator("#attnscope-root").count():
        page.wait_for_selector("#attnscope-root[data-ready=true]", timeout=10_000)
        assert page.locator("#attnscope-root svg").count() >= 1
    else:
        assert root.evaluate("e => e.naturalWidth") > 10
    assert errors == []
    assert outside == []
    context.close()
