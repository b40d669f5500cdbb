"""Long-document pages: one head over a document, its profiles along it and its whole row at any
query, without n x n maps; checked against the eager maps of the same document, in the CLI, and in
a real browser (the static page, and the viewer that computes a clicked token's row)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import softmax_bound, weights_tolerance

from attnscope.cli.main import main
from attnscope.models import capture
from attnscope.views import LongDocumentView

SENTENCE = "the cat sat on the mat, and then it slept while the dog ran to the big house."


@pytest.fixture(scope="module")
def doc_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("long") / "doc.txt"
    path.write_text("\n\n".join(" ".join([SENTENCE] * 8) for _ in range(6)) + "\n")
    return path


@pytest.fixture(scope="module")
def view(doc_file):
    return LongDocumentView(doc_file, model="debug:llama", layer=1, head=2, queries=[5, 300, 599],
                            max_seq_len=600)


def _payload(html: str) -> dict:
    return json.loads(re.search(r'id="attnscope-data" type="application/json">(.*?)</script>', html, re.S).group(1))


def test_rows_and_profiles_equal_the_eager_maps(view):
    lm, ids = view.lm, view.doc.ids
    layers = {}
    seen = iter(range(lm.num_layers))
    capture.attention(lm, ids, each_layer=lambda probs: layers.__setitem__(next(seen), probs))
    a = layers[1][2].astype(np.float64)  # [n n] of head 2-3
    n = len(ids)
    p = view.payload
    assert p["n"] == n == 600 and (p["layer"], p["head"]) == (1, 2)
    # the page's rows are float32 softmax rows of n keys recomputed from the kept queries and keys:
    # weights and sums of them (weights_tolerance), the entropy (softmax_bound), a row's mean
    # distance (its weights times distances up to n)
    wt = weights_tolerance(n)
    weight = dict(rel=wt["rtol"], abs=wt["atol"])
    for r in p["rows"]:
        row = a[r["query"]]
        assert r["max_weight"] == pytest.approx(row.max(), **weight)
        assert r["sink"] == pytest.approx(row[0], **weight)
        assert [w for _, w in r["top"][:5]] == pytest.approx(np.sort(row)[::-1][:5], **weight)
        dist = np.abs(np.arange(n) - r["query"])
        for b in r["buckets"]:
            assert b["mass"] == pytest.approx(row[(dist >= b["lo"]) & (dist <= b["hi"])].sum(), **weight)
    # the profiles: each row's value from the eager map, then the mean over each stretch
    ent = np.array([-(x[x > 0] * np.log(x[x > 0])).sum() for x in a])
    dist_mean = (a * np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])).sum(-1)
    edges = p["profile_edges"]
    assert edges[0] == 0 and edges[-1] == n
    tolerance = {"entropy": dict(abs=softmax_bound(n)), "sink": weight, "max_weight": weight,
                 "distance": dict(rel=wt["rtol"], abs=wt["atol"] * n)}
    for name, per_row in (("entropy", ent), ("sink", a[:, 0]), ("max_weight", a.max(-1)), ("distance", dist_mean)):
        want = [per_row[lo:hi].mean() for lo, hi in zip(edges[:-1], edges[1:])]
        assert p["profiles"][name] == pytest.approx(want, **tolerance[name]), name
    # any other row, on demand
    extra = view.row(0, 1, 123)
    assert extra["max_weight"] == pytest.approx(float(layers[0][1][123].max()), **weight)
    # any other head, on demand: its profiles and the page's rows, from the same forward pass
    other = view.head(0, 1)
    b = layers[0][1].astype(np.float64)
    assert (other["layer"], other["head"], other["title"]) == (0, 1, "Head 1-2 over 600 tokens of debug:llama")
    assert [r["query"] for r in other["rows"]] == [5, 300, 599]
    assert [r["max_weight"] for r in other["rows"]] == pytest.approx([b[q].max() for q in (5, 300, 599)], **weight)
    want = [b[lo:hi, 0].mean() for lo, hi in zip(edges[:-1], edges[1:])]
    assert other["profile_edges"] == edges and other["profiles"]["sink"] == pytest.approx(want, **weight)


def test_a_head_or_query_past_the_model_or_the_document_is_one_line(view):
    from attnscope.errors import AttnscopeError
    from attnscope.serve.app import create_app

    for call in (lambda: view.head(2, 0), lambda: view.row(0, 4, 3), lambda: view.head(0, -1)):
        with pytest.raises(AttnscopeError, match=r"^head \d+-\d+: debug:llama has 2 layers of 4 heads \(1-1 to 2-4\)$"):
            call()
    with pytest.raises(AttnscopeError, match="^query 600: the document has 600 tokens"):
        view.head(0, 0, [3, 600])
    client = create_app(None, None, document=view).test_client()
    ok = client.get("/api/long/head?layer=1&head=3&queries=7,8")
    assert ok.status_code == 200 and [r["query"] for r in ok.get_json()["rows"]] == [7, 8]
    for bad in ("layer=5&head=0", "layer=0&head=0&queries=7,x", "layer=0&head=0&queries=900"):
        r = client.get("/api/long/head?" + bad)
        assert r.status_code == 400 and "\n" not in r.get_json()["error"], bad


def test_cli_writes_the_page_and_refuses_a_query_past_the_end(doc_file, tmp_path, capsys):
    out = tmp_path / "long.html"
    assert main(["view", "--long", str(doc_file), "--model", "debug:llama", "--layer", "2", "--head", "3",
                 "--queries", "10,20", "--max-seq-len", "300", "--out", str(out)]) == 0
    p = _payload(out.read_text())
    assert [r["query"] for r in p["rows"]] == [10, 20] and p["n"] == 300
    assert main(["view", "--long", str(doc_file), "--model", "debug:llama", "--head", "1",
                 "--queries", "300", "--max-seq-len", "300", "--out", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert "queries 300" in err and "300 tokens" in err and not (tmp_path / "x.html").exists()


def test_the_notebook_shows_the_page_and_keeps_the_document(doc_file):
    from attnscope import notebook

    v = notebook.long_document(doc_file, model="debug:llama", layer=1, head=2, queries=[5, 7], max_seq_len=100)
    assert v.caption == "attnscope long document \u00b7 head 2-3 \u00b7 100 tokens \u00b7 2 rows"
    row = v.document.row(1, 2, 50)  # any other row, from the kept queries and keys
    assert row["query"] == 50 and sum(b["mass"] for b in row["buckets"]) == pytest.approx(1.0, abs=softmax_bound(100))
    assert _payload(v.html)["rows"][1]["query"] == 7


@pytest.mark.slow
def test_a_32k_page_of_one_head_and_five_queries_is_under_5_mb(tmp_path):
    path = tmp_path / "doc.txt"
    path.write_text(" ".join([SENTENCE] * 2200) + "\n")
    v = LongDocumentView(path, model="debug:llama", layer=1, head=0, queries=[0, 100, 8000, 20000, 32767],
                         max_seq_len=32768)
    html = v.html()
    assert v.doc.n == 32768
    assert len(html.encode("utf-8")) < 5 * 2 ** 20
    p = _payload(html)
    assert len(p["profile_edges"]) == 1025 and all(len(r["strip"]) == 1024 for r in p["rows"])


@pytest.mark.browser
def test_the_page_and_the_viewer_in_a_browser(browser, view, tmp_path):
    from attnscope.serve.app import create_app
    from tests.serve.test_browser_serve import start

    page_file = tmp_path / "long.html"
    page_file.write_text(view.html())
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    errors = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(page_file.as_uri())
    pg.wait_for_selector('#attnscope-root[data-ready="true"]')
    assert pg.get_attribute("#attnscope-root", "data-query") == "5"
    pg.select_option("select.lp-pick", "300")
    assert pg.get_attribute("#attnscope-root", "data-query") == "300"
    assert pg.locator(".lp-top li").count() == 10
    roles = {r["statistic"]: r for r in view.payload["roles"]}
    said = pg.text_content(".lp-roles")
    assert said.startswith("What it does here: ") and f"sink {roles['sink']['mean']:.3f}" in said, said
    assert pg.evaluate("document.documentElement.scrollWidth") <= 1280
    # served: a click on any token asks the viewer for that head's row
    server, url = start(create_app(None, None, document=view))
    try:
        pg.goto(url)
        pg.wait_for_selector('#attnscope-root[data-ready="true"]')
        pg.click('.lp-doc .lp-tok[data-pos="2"]')
        pg.wait_for_function("() => document.getElementById('attnscope-root').getAttribute('data-query') === '2'")
        assert "row of token 2 in" in pg.text_content(".lp-status")
        assert pg.locator("select.lp-pick option").count() == 4
        # another head of the same pass: its title, profiles and the rows of the queries shown
        pg.select_option("select.lp-layer", "0")
        pg.wait_for_function("() => document.getElementById('attnscope-root').getAttribute('data-head') === '1-3'")
        assert pg.text_content(".rs-title").startswith("Head 1-3 over 600 tokens")
        assert pg.get_attribute("#attnscope-root", "data-query") == "2"
        assert pg.locator("select.lp-pick option").count() == 4
        pg.keyboard.press("Tab")  # the pickers are keyboard-usable selects
        assert pg.evaluate("document.documentElement.scrollWidth") <= 1280
    finally:
        server.shutdown()
    assert errors == []
    ctx.close()


def test_the_page_names_what_the_head_does_on_the_document(view):
    """The page says whether the head is an attention sink or a previous-token head on this
    document (a head with 0.868 of every row on the first token went unnamed), by the family's
    thresholds, from the head's own rows: the means checked against the eager map."""
    from attnscope.analyses.longctx import PREVIOUS_THRESHOLD, SINK_THRESHOLD

    lm, ids = view.lm, view.doc.ids
    layers = {}
    seen = iter(range(lm.num_layers))
    capture.attention(lm, ids, each_layer=lambda probs: layers.__setitem__(next(seen), probs))
    n = len(ids)
    for layer, head in ((1, 2), (0, 1)):
        a = layers[layer][head].astype(np.float64)
        part = view.payload if (layer, head) == (1, 2) else view.head(layer, head)
        roles = {r["statistic"]: r for r in part["roles"]}
        want = {"sink": a[1:, 0].mean(), "previous": a[np.arange(1, n), np.arange(n - 1)].mean()}
        bound = np.finfo(np.float32).eps * n  # each weight is a float32 softmax of an n-term row
        for key, limit in (("sink", SINK_THRESHOLD), ("previous", PREVIOUS_THRESHOLD)):
            assert abs(roles[key]["mean"] - want[key]) <= bound, key
            assert roles[key]["threshold"] == limit and roles[key]["holds"] == (want[key] > limit)
        edges = part["profile_edges"]
        per_row = np.r_[0.0, a[np.arange(1, n), np.arange(n - 1)]]
        assert part["profiles"]["previous"] == pytest.approx(
            [per_row[lo:hi].mean() for lo, hi in zip(edges[:-1], edges[1:])], rel=0, abs=float(bound))
