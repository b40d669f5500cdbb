"""End-to-end: the local viewer in a real headless Chromium, served on 127.0.0.1.

Skips when /usr/bin/chromium or playwright is missing. One browser for the module.
"""

from __future__ import annotations

import shutil
import threading

import pytest

from tests.serve.test_serve_app import TEXTS, build_store

pytestmark = pytest.mark.browser


def start(app):
    """The viewer on the server `attnscope serve` uses (waitress), on a free loopback port."""
    from attnscope.serve.app import make_server

    server = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=server.run, daemon=True).start()
    server.shutdown = server.close  # what the fixtures call to stop it
    return server, f"http://127.0.0.1:{server.effective_port}/"


@pytest.fixture(scope="module")
def viewer(tmp_path_factory, debug_bert):
    from attnscope.serve.app import create_app

    root = tmp_path_factory.mktemp("viewer")
    store = build_store(root / "store", debug_bert)
    from attnscope.pipeline import run_family

    run_family("general", {"text": store}, root / "out", model=debug_bert)  # what analyze general writes
    server, url = start(create_app(store, root / "out"))
    yield url, store
    server.shutdown()


@pytest.fixture
def page(open_viewer, viewer):
    url, _ = viewer
    context, p, left, errors = open_viewer(url)
    p.wait_for_selector("#attnscope-root[data-ready=true]")
    yield p
    assert left == [], f"requests left the machine: {left}"
    assert errors == []
    context.close()


def test_search_and_open_an_example(page):
    assert page.locator("#vw-list li").count() == len(TEXTS)
    page.fill("#vw-search", "CAT")
    page.wait_for_function("() => document.querySelectorAll('#vw-list li').length === 2")
    texts = page.locator("#vw-list li .vw-text").all_text_contents()
    assert texts == [TEXTS[0], TEXTS[2]]  # "<b>who</b>" shown as text
    page.click("#vw-list li:nth-child(2)")
    page.wait_for_function("() => window.attnscope && window.attnscope.p.index === 2")
    assert "example 2" in page.text_content("#attnscope-root .as-title")
    assert page.locator("#vw-list li.vw-current").get_attribute("data-pos") == "2"


def test_stat_grid_and_scatter_open_heads(page):
    assert "entropy" in page.text_content("#vw-stat-select")
    # where a user looks first: above the list of examples, with a colour scale from the grid's
    # lowest value to its highest
    assert page.evaluate("""() => !!(document.querySelector('#vw-results').compareDocumentPosition(
        document.querySelector('#vw-list')) & Node.DOCUMENT_POSITION_FOLLOWING)""")
    values = [float(t.rsplit(": ", 1)[1]) for t in page.eval_on_selector_all(
        "#vw-stats .vw-grid rect title", "ts => ts.map(t => t.textContent)") if not t.endswith("n/a")]
    lo, hi = (float(page.text_content(f"#vw-stats .vw-scale-{end}")) for end in ("lo", "hi"))
    assert lo == pytest.approx(min(values), rel=2e-3) and hi == pytest.approx(max(values), rel=2e-3)
    page.click('.vw-grid rect[data-layer="1"][data-head="0"]')
    page.wait_for_function("() => window.attnscope.state.layer === 1")
    st = page.evaluate("() => window.attnscope.state")
    assert (st["view"], st["heads"]) == ("head", [0])
    page.click('.vw-scatter circle[data-layer="0"][data-head="1"]')
    page.wait_for_function("() => window.attnscope.state.layer === 0")
    assert page.evaluate("() => window.attnscope.state.heads") == [1]
    # the head's own page, one click away: its statistics and top examples over the store
    link = page.locator("#vw-head-link")
    assert link.is_visible() and link.get_attribute("href") == "/head/1-2"
    with page.context.expect_page() as opened:
        link.click()
    head = opened.value
    head.wait_for_selector('#attnscope-root[data-ready="true"]')
    assert "Head 1-2" in head.text_content("h2")
    assert head.locator(".hp-top .hp-strip").count() == len(TEXTS)  # five examples: all in the top 5
    head.close()


def test_neuron_tab_loads_from_the_server(page):
    page.click('.as-tabs button[data-view="neuron"]')
    page.wait_for_selector("svg.as-neuron-view", timeout=30000)
    assert page.get_attribute("#attnscope-root", "data-rendered-view") == "neuron"


def test_corrupt_shard_shows_a_message(browser, tmp_path, viewer):
    from attnscope.serve.app import create_app
    from attnscope.store import open_store

    _, store = viewer
    bad = tmp_path / "bad"
    shutil.copytree(store, bad)
    entries = open_store(bad).entries
    (bad / "shards" / entries[3]["shard"]).write_bytes(b"\x00garbage")
    server, url = start(create_app(bad))
    try:
        p = browser.new_page()
        p.goto(url)
        p.evaluate("() => window.attnscopeViewer.ready.then(() => null)")
        p.evaluate("() => window.attnscopeViewer.openExample(3).then(() => null)")
        msg = p.text_content("#vw-error")
        assert "example 3" in msg and "corrupt" in msg and "Traceback" not in msg
        assert p.is_visible("#vw-error")
        p.close()
    finally:
        server.shutdown()


def test_syntax_results_show_their_grids_and_an_empty_folder_says_what_is_missing(open_viewer, tmp_path):
    """The README's ``serve tour/maps --results tour/syntax`` on what ``analyze syntax`` wrote:
    per-relation head grids, not "start with --results"; a results folder without per-head
    statistics is named as such."""
    from attnscope.serve.app import create_app
    from tests.serve.test_serve_app import readme_syntax

    maps, syntax = readme_syntax(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    for results in (syntax, empty):
        server, url = start(create_app(maps, results))
        try:
            context, p, left, errors = open_viewer(url)
            p.wait_for_selector("#attnscope-root[data-ready=true]")
            if results == syntax:
                options = p.locator("#vw-stat-select option").all_text_contents()
                assert options[:2] == ["syntax: accuracy (all, dep->head)", "syntax: accuracy (all, head->dep)"]
                assert p.locator("#vw-stats .vw-grid rect").count() > 0
            else:
                assert p.text_content("#vw-stats") == (f"no per-head statistics in {empty} (no table with "
                                                       "one row per head, no [layer, head] array)")
            assert left == [] and errors == []
            context.close()
        finally:
            server.shutdown()
