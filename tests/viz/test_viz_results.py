"""The results views on the real producers' output: ``attnscope analyze attribution`` on
debug:bert and ``attnscope analyze longctx`` on debug:llama (run here, into temporary folders),
read by viz.results, ``attnscope view`` and the serve app; two tests drive headless Chromium.
"""

from __future__ import annotations

import json
import random
import shutil
import threading

import numpy as np
import pytest
from conftest import says, weights_tolerance

from attnscope.errors import AttnscopeError
from attnscope.views import results_payload
from attnscope.viz.encoding import decode

EVIL = "<script>window.pwned=1</script>"
LONG_INPUT, WINDOW = 128, 64  # debug:llama allows 512 positions: a "long" input is made shorter


@pytest.fixture(scope="module")
def attr_out(tmp_path_factory):
    from attnscope.pipeline import run_family

    root = tmp_path_factory.mktemp("attr")
    text = root / "text.txt"
    text.write_text("The cat sat on the mat. It was happy.\nA dog ran far away.\n\n"
                    "Birds fly south in winter. They come back.\nThe sun is warm.\n", encoding="utf-8")
    # by name, as `attnscope analyze attribution --model debug:bert` loads it (with its masked-LM head)
    run_family("attribution", {"attribution": text}, root / "out", model="debug:bert",
               attribution_examples=2, attribution_map_examples=1, max_seq_len=32)
    return root / "out"


@pytest.fixture(scope="module")
def longctx(tmp_path_factory):
    """One 512-token document: stored (float32 maps) and analysed by the longctx family."""
    from attnscope.data.io import example_from_dict
    from attnscope.extract.runner import ExtractOptions
    from attnscope.jobs import extract_to_store
    from attnscope.models import load_model
    from attnscope.pipeline import run_family

    root = tmp_path_factory.mktemp("longctx")
    lm = load_model("debug:llama")  # 2 layers x 4 heads
    rng = random.Random(0)
    words = "the cat sat on a mat while dogs ran far away and birds sang".split()
    text = " ".join(rng.choice(words) for _ in range(400)) + "."
    (root / "doc.txt").write_text(text + "\n", encoding="utf-8")
    extract_to_store([example_from_dict({"text": text}, 0)], root / "store", lm,
                     options=ExtractOptions(max_seq_len=512, batch_size=1, truncate=True), dtype="float32")
    run_family("longctx", {"documents": root / "doc.txt"}, root / "out", model=lm, max_seq_len=512,
               induction=0)
    return root / "store", root / "out"


def _example(folder):
    return json.loads((folder / "results" / "attribution.json").read_text(encoding="utf-8"))["example"]


@pytest.mark.heavy
def test_attribution_maps_come_through_unchanged(attr_out):
    p = results_payload(attr_out)
    ex = _example(attr_out)
    ap = p["attribution"]
    assert p["problems"] == [] and ap["tokens"] == ex["tokens"] and ap["index"] == ex["index"]
    # every method ran; the example is short enough for flow (<= 32 tokens) and value zeroing
    assert [m["key"] for m in ap["methods"]] == ["weights", "rollout", "flow", "norms", "value_zeroing"]
    assert ap["num_layers"] == 2
    for m in ap["methods"]:
        want = np.asarray(ex[m["key"]], dtype=np.float32)
        assert m["per_layer"] == (want.ndim == 3)
        assert np.array_equal(decode(m["map"]), want)


def test_a_malformed_example_map_is_named_and_left_out(attr_out, tmp_path):
    bad = tmp_path / "out"
    shutil.copytree(attr_out, bad)
    path = bad / "results" / "attribution.json"
    d = json.loads(path.read_text(encoding="utf-8"))
    d["example"]["rollout"] = d["example"]["rollout"][:-1]  # one row short
    path.write_text(json.dumps(d), encoding="utf-8")
    p = results_payload(bad)
    assert [m["key"] for m in p["attribution"]["methods"]] == ["weights", "flow", "norms", "value_zeroing"]
    n = len(d["example"]["tokens"])
    assert len(p["problems"]) == 1
    says(p["problems"][0], "results/attribution.json", "'rollout'", f"[{n - 1}, {n}]", f"[{n}, {n}]",
         f"{n} tokens")


def test_a_malformed_array_is_named_and_left_out_by_the_viewers_and_refused_by_the_typed_reader(longctx, tmp_path):
    """The viewers read what a family wrote as a FamilyResult that names a malformed part and
    shows the rest; a report or compare reading it strictly refuses the file in one line."""
    from attnscope.analyses.family_result import FamilyResult

    _, out = longctx
    bad = tmp_path / "out"
    shutil.copytree(out, bad)
    path = bad / "results" / "longctx.json"
    d = json.loads(path.read_text(encoding="utf-8"))
    good = results_payload(out)
    assert good["problems"] == [] and any(p["name"] == "longctx-stats: dist_mass" for p in good["profiles"])
    d["arrays"]["dist_mass"]["data"] = d["arrays"]["dist_mass"]["data"][:-1]  # a layer short of its shape
    path.write_text(json.dumps(d), encoding="utf-8")
    p = results_payload(bad)
    assert p["problems"] == ["results/longctx.json: array 'dist_mass' is malformed"]
    assert [x["name"] for x in p["profiles"]] == [x["name"] for x in good["profiles"] if x["name"] != "longctx-stats: dist_mass"]
    assert p["sinks"] == good["sinks"]
    with pytest.raises(AttnscopeError, match=r"longctx\.json: a malformed array"):
        FamilyResult.read(bad, "longctx")


def test_an_unreadable_results_file_is_named(attr_out, tmp_path, capsys):
    """A results file cut short (a killed copy) is named, not passed over as absent."""
    from attnscope.cli.main import main

    bad = tmp_path / "out"
    shutil.copytree(attr_out, bad)
    path = bad / "results" / "attribution.json"
    path.write_text(path.read_text(encoding="utf-8")[:200], encoding="utf-8")
    problems = results_payload(bad)["problems"]
    assert len(problems) == 1
    says(problems[0], "results/attribution.json", "JSON")
    assert main(["view", str(bad), "-o", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    says(err, "results/attribution.json", "JSON")
    assert not (tmp_path / "x.html").exists()


def test_longctx_profiles_and_sink(longctx):
    _, out = longctx
    d = json.loads((out / "results" / "longctx.json").read_text(encoding="utf-8"))
    p = results_payload(out)
    prof = {x["name"].split(": ")[1]: x for x in p["profiles"]}
    assert {"dist_mass", "dist_weight", "pos_sink", "pos_entropy", "pos_norm_entropy"} <= set(prof)
    # rows reach distance 511 (bucket ceil(log2 511) + 1 = 10, "257-512"): buckets 0..10 kept
    dm = prof["dist_mass"]
    assert dm["axis"] == "distance bucket (log-spaced)"
    assert prof["pos_sink"]["axis"] == "query-position bucket (log-spaced)"
    assert dm["buckets"] == d["meta"]["buckets"][:11] and dm["buckets"][-1] == "257-512"
    full = np.asarray(d["arrays"]["dist_mass"]["data"])
    assert np.array_equal(np.asarray(dm["values"]), full[..., :11])
    assert np.allclose(np.asarray(dm["values"]).sum(-1), 1.0, atol=1e-9)  # nothing with mass dropped
    sink = p["sinks"][0]
    assert sink["threshold"] == 0.3
    assert np.array_equal(np.asarray(sink["values"]), np.asarray(d["arrays"]["sink"]["data"]))


def test_page_distance_profile_equals_the_longctx_statistic(longctx):
    """The seam: the view's profile of the stored map is the family's dist_mass of that document."""
    from attnscope.store import open_store
    from attnscope.viz.payload import page_payload

    store, out = longctx
    amap = open_store(store)[0]
    assert amap.num_units == 512
    d = json.loads((out / "results" / "longctx.json").read_text(encoding="utf-8"))
    assert d["meta"]["tokens"] == 512
    page = page_payload(amap, long_input=LONG_INPUT, window=WINDOW)
    ours = np.asarray(page["profile"]["values"])
    theirs = np.asarray(d["arrays"]["dist_mass"]["data"])
    assert ours.shape == (2, 4, 11)
    # mean bucket masses of float32 softmax rows of 512 keys, by the page and by the family
    np.testing.assert_allclose(ours, theirs[..., :11], **weights_tolerance(512))


def test_view_cli_writes_results_pages(attr_out, longctx, tmp_path, capsys):
    from attnscope.cli.main import main

    for folder in (attr_out, longctx[1]):
        html = tmp_path / f"{folder.parent.name}.html"
        assert main(["view", str(folder), "-o", str(html)]) == 0
        assert "results view" in capsys.readouterr().out
        page = html.read_text(encoding="utf-8")
        assert "AttnScope.mountResults(" in page and "default-src 'none'" in page
    assert main(["view", str(attr_out), "-o", str(tmp_path / "x.html"), "--png", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip()
    says(err, "--png", "--svg")
    assert len(err.splitlines()) == 1 and not (tmp_path / "x.html").exists()
    empty = tmp_path / "empty"
    (empty / "results").mkdir(parents=True)
    assert main(["view", str(empty), "-o", str(tmp_path / "y.html")]) == 2
    assert "nothing to view" in capsys.readouterr().err and not (tmp_path / "y.html").exists()


def test_serve_without_a_store(attr_out):
    from attnscope.serve.app import create_app

    c = create_app(None, attr_out).test_client()
    info = c.get("/api/info").get_json()
    assert info["examples"] == 0 and info["summary"]["layers"] == 2 and info["summary"]["heads"] == 2
    assert c.get("/api/examples").get_json()["items"] == []
    r = c.get("/api/example/0")
    assert r.status_code == 400 and "no store" in r.get_json()["error"]
    views = c.get("/api/results-views").get_json()
    assert views["attribution"]["tokens"] == _example(attr_out)["tokens"]
    with pytest.raises(AttnscopeError) as e:
        create_app(None, None)
    says(e.value, "store", "results folder")


def test_serve_shows_the_longctx_arrays_per_head(longctx):
    """An [L, H] array of a family's results is a per-head grid of the viewer: the long-context
    sink mass, worked out from the stored map of the same document as the mean over rows i >= 1
    of a[i, 0]."""
    from attnscope.serve.app import create_app
    from attnscope.store import open_store

    store, out = longctx
    got = create_app(store, out).test_client().get("/api/results").get_json()
    assert got["problems"] == []
    stats = {s["name"]: np.asarray(s["values"], dtype=float) for s in got["stats"]}
    # the heads' MDS placement the family writes among its results is the viewer's scatter
    rows = json.loads((out / "results" / "longctx.json").read_text())["tables"]["clusters"]
    assert len(rows) == len(got["scatter"]["points"]) == stats["longctx-stats: sink"].size
    assert [(p["layer"], p["head"], p["x"], p["y"], p["label"]) for p in got["scatter"]["points"]] == [
        (r["layer"], r["head"], r["x"], r["y"], r["behaviour"]) for r in rows]
    assert not any(name.startswith("longctx-stats: clusters.") and name.endswith((".x", ".y")) for name in stats)
    attn = open_store(store)[0].attn.astype(float)  # [L H n n], float32 maps
    # a weight of float32 softmax rows, its mean against float64 of the stored maps
    np.testing.assert_allclose(stats["longctx-stats: sink"], attn[:, :, 1:, 0].mean(-1), **weights_tolerance(attn.shape[-1]))
    np.testing.assert_allclose(stats["longctx-stats: heads.sink"], stats["longctx-stats: sink"])


def test_serve_sends_a_window_of_a_long_example(longctx):
    from attnscope.serve.app import create_app

    store, out = longctx
    c = create_app(store, out, long_input=LONG_INPUT, window=WINDOW).test_client()
    p = json.loads(c.get("/api/example/0").get_data())
    assert p["window"]["units"] == [0] + list(range(512 - WINDOW, 512))
    assert decode(p["attn"]).shape == (2, 4, WINDOW + 1, WINDOW + 1)
    p = json.loads(c.get("/api/example/0?offset=10").get_data())
    assert p["window"]["units"] == [0] + list(range(10, 10 + WINDOW))
    r = c.get("/api/example/0?offset=1000")
    assert r.status_code == 400
    says(r.get_json()["error"], "offset 1000", "512", "64", "0 .. 448")
    r = c.get("/api/example/0?window=5000")
    assert r.status_code == 400 and "between 1 and 1024" in r.get_json()["error"]
    whole = create_app(store, None).test_client().get("/api/example/0").get_data()
    windowed = c.get("/api/example/0").get_data()
    assert len(windowed) < len(whole) / 3  # 65^2 instead of 512^2 weights per head


# ---- headless Chromium ------------------------------------------------------------------

def _serve(app):
    from attnscope.serve.app import make_server

    server = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=server.run, daemon=True).start()
    return server, f"http://127.0.0.1:{server.effective_port}/"


@pytest.mark.browser
def test_browser_attribution_maps_side_by_side(open_viewer, attr_out, tmp_path):
    from attnscope.serve.app import create_app

    folder = tmp_path / "out"
    shutil.copytree(attr_out, folder)
    path = folder / "results" / "attribution.json"
    d = json.loads(path.read_text(encoding="utf-8"))
    d["example"]["tokens"][1] = EVIL  # a token that is markup must show as text
    path.write_text(json.dumps(d), encoding="utf-8")
    server, url = _serve(create_app(None, folder))
    try:
        context, page, left, errors = open_viewer(url)
        page.wait_for_selector("#vw-resviews[data-ready=true]")
        box = page.locator("#vw-resviews .rs-attribution")
        assert box.get_attribute("data-maps") == "5"
        assert page.locator("svg.rs-attr-map").count() == 5
        assert page.evaluate("() => window.pwned") is None
        titles = page.eval_on_selector_all("svg.rs-attr-map[data-method=rollout] .rs-row title",
                                           "ts => ts.map(t => t.textContent)")
        assert titles == d["example"]["tokens"]
        assert page.locator("#vw-resviews script, #vw-resviews img").count() == 0
        page.uncheck("input.rs-method[data-method=flow]")
        assert box.get_attribute("data-maps") == "4"
        page.select_option("select.rs-layer", "0")
        assert "layer 1," in page.text_content("svg.rs-attr-map[data-method=weights]")
        assert left == [] and errors == []
        context.close()
    finally:
        server.close()


@pytest.mark.browser
def test_browser_long_example_window_and_profiles(open_viewer, longctx):
    from attnscope.serve.app import create_app

    store, out = longctx
    server, url = _serve(create_app(store, out, long_input=LONG_INPUT, window=WINDOW))
    try:
        context, page, left, errors = open_viewer(url)
        page.wait_for_selector("#attnscope-root[data-ready=true]")
        assert page.evaluate("() => window.attnscope.p.window.offset") == 512 - WINDOW
        assert page.locator(".as-head-view .as-q .as-token").count() == WINDOW + 1
        lines = int(page.get_attribute("#attnscope-root", "data-lines"))
        assert 0 < lines <= 4 * (WINDOW + 1) ** 2  # never 4 x 512^2
        assert 0 <= float(page.get_attribute("#attnscope-root", "data-outside")) <= 1
        page.click("button.as-window-step >> text=earlier")
        page.wait_for_function(f"() => window.attnscope.p.window.offset === {512 - 2 * WINDOW}")
        page.wait_for_selector("#attnscope-root[data-ready=true]")
        page.click(".as-tabs button[data-view=profile]")
        page.wait_for_selector("#attnscope-root[data-rendered-view=profile]")
        assert page.locator(".as-profile-view .as-profile-line").count() == 4
        # the results views: the longctx profiles (one line per head) and the sink heatmap
        page.wait_for_selector("#vw-resviews[data-ready=true]")
        assert page.locator("#vw-resviews .rs-profile-chart .as-profile-line").count() == 4
        page.select_option("select.rs-profile", label="longctx-stats: pos_sink: "
                           "mass on the first token (sink) by query position")
        assert page.text_content("#vw-resviews .rs-profile-chart .as-x-axis") == \
            "query-position bucket (log-spaced)"
        assert page.locator("#vw-resviews .rs-sink-cell").count() == 8
        assert left == [] and errors == []
        context.close()
    finally:
        server.close()


def test_view_cli_window_options_on_a_long_store(longctx, tmp_path, capsys):
    from attnscope.cli.main import main
    from tests.viz.test_viz_pages import payload_of

    store, _ = longctx
    html = tmp_path / "long.html"
    args = ["view", str(store), "-o", str(html), "--long-input", "128", "--window", "64"]
    assert main(args + ["--offset", "0"]) == 0
    p = payload_of(html.read_text(encoding="utf-8"))
    assert p["window"]["units"] == list(range(64)) and p["window"]["num_units"] == 512
    capsys.readouterr()
    assert main(args + ["--offset", "449", "-o", str(tmp_path / "bad.html")]) == 2
    err = capsys.readouterr().err.strip()
    says(err, "--offset 449", "512", "64", "0 .. 448")
    assert len(err.splitlines()) == 1 and not (tmp_path / "bad.html").exists()


@pytest.mark.browser
def test_the_results_page_says_what_it_is_and_fills_1280_px_without_colliding_labels(browser, longctx):
    """The long-context page had no title, a chart across 40% of a 1280 px page, and its axis title
    over its slanted bucket labels: it is titled with the family and the model, the chart spans
    most of the page, and no text box of the chart overlaps another."""
    from attnscope.views import results_view_html

    _, out = longctx
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        page.set_content(results_view_html(out))
        page.wait_for_selector("#attnscope-root[data-ready=true]")
        title = page.text_content("h2.rs-title")
        assert title.startswith("Long-context") and "debug:llama" in title and out.name in title, title
        chart = page.locator("svg.rs-profile-chart").bounding_box()
        assert chart["width"] >= 0.8 * 1280 - 64, chart
        boxes = page.eval_on_selector_all("svg.rs-profile-chart text", """ts => ts.map(t => {
            const b = t.getBoundingClientRect(); return [t.textContent, b.left, b.top, b.right, b.bottom]; })""")
        hits = [(a[0], b[0]) for i, a in enumerate(boxes) for b in boxes[i + 1:]
                if min(a[3], b[3]) - max(a[1], b[1]) > 1 and min(a[4], b[4]) - max(a[2], b[2]) > 1]
        assert len(boxes) > 10 and hits == []
    finally:
        page.close()
