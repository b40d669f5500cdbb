"""The local viewer's Flask app, through Flask's test client (the browser tests drive it live)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import EPS32, one_line, says, sum_bound

from attnscope.errors import StoreError
from attnscope.viz.encoding import decode

TEXTS = ["the cat sat on the mat", "a dog ran to the house", "<b>who</b> saw the red cat",
         "she said it was old", "the man and the woman"]


def build_store(path, lm, texts=TEXTS, shard_size=2):
    from attnscope.data.io import example_from_dict
    from attnscope.jobs import extract_to_store

    extract_to_store([example_from_dict({"text": t}, i) for i, t in enumerate(texts)], path, lm,
                     shard_size=shard_size)
    return path


@pytest.fixture(scope="module")
def store_path(tmp_path_factory, debug_bert):
    return build_store(tmp_path_factory.mktemp("serve") / "store", debug_bert)


@pytest.fixture(scope="module")
def general_out(store_path, debug_bert):
    """What ``attnscope analyze general STORE`` writes for the store (the real producer)."""
    from attnscope.pipeline import run_family

    out = store_path.parent / "general"
    run_family("general", {"text": store_path}, out, model=debug_bert)
    return out


@pytest.fixture
def client(store_path, general_out):
    from attnscope.serve.app import create_app

    return create_app(store_path, general_out).test_client()


def test_app_opens_lazily(store_path, monkeypatch):
    from attnscope.serve.app import create_app
    from attnscope.store.reader import Store

    calls = []
    orig = Store._records
    monkeypatch.setattr(Store, "_records", lambda self, shard: calls.append(shard) or orig(self, shard))
    app = create_app(store_path)
    assert calls == []  # no shard read to open
    c = app.test_client()
    assert c.get("/").status_code == 200
    assert calls == []
    c.get("/api/examples?limit=2")
    assert len(set(calls)) == 1  # the first page needs only the first shard


def test_examples_paging_and_search(client):
    page = client.get("/api/examples?limit=2").get_json()
    assert [it["text"] for it in page["items"]] == TEXTS[:2]
    assert page["total"] == 5 and page["next"] == 2
    res = client.get("/api/examples?q=CAT").get_json()
    assert [it["index"] for it in res["items"]] == [0, 2] and res["next"] is None
    res = client.get("/api/examples?q=the&limit=2").get_json()
    assert [it["index"] for it in res["items"]] == [0, 1] and res["next"] == 2
    more = client.get(f"/api/examples?q=the&limit=2&offset={res['next']}").get_json()
    assert [it["index"] for it in more["items"]] == [2, 4]
    assert client.get("/api/examples?q=zebra").get_json()["items"] == []


def test_example_payload_matches_the_store(client, store_path):
    from attnscope.store import open_store

    r = client.get("/api/example/2")
    assert r.status_code == 200 and b"<b>" not in r.data  # escaped even in the API
    p = json.loads(r.data)
    m = open_store(store_path)[2]
    # 1/255 steps: half a step, plus the float32 rounding of a * 255 (eps/2 of a <= 1) and of the decode
    np.testing.assert_allclose(decode(p["attn"]), m.attn, atol=0.5 / 255 + EPS32)
    assert p["tokens"] == m.tokens and p["state"]["view"] == "head"
    assert "connect-src 'self'" in r.headers["Content-Security-Policy"]


def test_neuron_route(client):
    p = client.get("/api/example/0/neuron?layer=1").get_json()
    assert p["layer"] == 1 and p["softmax_matches_model"]
    assert decode(p["query"]).shape[0] == 2


def test_results_are_read(client, store_path, general_out, tmp_path):
    """The general family's results of the store: its per-head table as [L][H] grids (checked
    against the stored maps) and its MDS placement of the heads as the scatter."""
    from attnscope.serve.app import create_app
    from attnscope.store import open_store

    r = client.get("/api/results").get_json()
    assert r["problems"] == [] and r["folder"] == str(general_out)
    stats = {s["name"]: np.array(s["values"], dtype=float) for s in r["stats"]}
    assert all(s["source"] == "results/general.json" for s in r["stats"])
    # previous-token attention worked out from the stored maps: per example
    # sum_{i>=1} a[i, i-1] / (n - 1), then the mean over examples (paper section 3.1)
    maps = list(open_store(store_path))
    want = np.mean([np.diagonal(m.attn.astype(float), offset=-1, axis1=2, axis2=3).mean(-1)
                    for m in maps], axis=0)  # [L H]
    assert want.shape == (2, 2)
    # the family's means of the same float32 weights, over a document's rows and then the examples,
    # summed in float32 at worst: eps of their count, relative
    rel = sum_bound(max(len(m.tokens) for m in maps) + len(maps))
    np.testing.assert_allclose(stats["general: general_heads.previous"], want, rtol=rel, atol=0)
    current = np.mean([np.diagonal(m.attn.astype(float), axis1=2, axis2=3).mean(-1) for m in maps], axis=0)
    np.testing.assert_allclose(stats["general: general_heads.current"], current, rtol=rel, atol=0)
    # the scatter: every head once, at the clustering's mds_x / mds_y, with its behaviour label;
    # those two columns are placed, not drawn as grids
    res = json.loads((general_out / "results" / "general.json").read_text(encoding="utf-8"))
    rows = {(x["layer"], x["head"]): x for x in res["tables"]["general_heads"]}
    pts = r["scatter"]["points"]
    assert sorted((p["layer"], p["head"]) for p in pts) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for p in pts:
        row = rows[(p["layer"], p["head"])]
        assert (p["x"], p["y"], p["label"]) == (row["mds_x"], row["mds_y"], row["behaviour"])
    assert len({(p["x"], p["y"]) for p in pts}) == 4  # four places, not one default
    assert not any(n.endswith((".mds_x", ".mds_y")) for n in stats)
    assert r["summaries"] == [{"analysis": "general", "summary": res["summary"]}]
    # without a store, the shape comes from the results; an unreadable file is named
    shutil.copytree(general_out, tmp_path / "out")
    (tmp_path / "out" / "results" / "broken.json").write_text("{not json", encoding="utf-8")
    c = create_app(None, tmp_path / "out").test_client()
    assert c.get("/api/info").get_json()["summary"]["layers"] == 2
    got = c.get("/api/results").get_json()
    assert len(got["problems"]) == 1  # the file, and that it is not JSON
    says(one_line(got["problems"][0]), "results/broken.json: ", "JSON")
    assert [s["name"] for s in got["stats"]] == [s["name"] for s in r["stats"]]


def readme_syntax(root):
    """The README's steps 2-3 on a small treebank: ``prepare depparse``, ``extract
    --word-level``, ``analyze syntax`` on the store; returns ``(maps, syntax results)``."""
    from attnscope.cli.main import main
    from tests.families.test_syntax_cli import SENTS, write_conllu

    conllu = root / "dev.conllu"
    write_conllu(conllu, SENTS * 4)
    maps, syntax = root / "maps", root / "syntax"
    for argv in (["prepare", "depparse", str(conllu), "--out", str(root / "dev.json")],
                 ["extract", str(root / "dev.json"), "--model", "debug:bert", "--word-level",
                  "--out", str(maps), "-q"],
                 ["analyze", "syntax", str(maps), "--out", str(syntax), "-q"]):
        assert main(argv) in (0, None), argv
    return maps, syntax


@pytest.mark.heavy
def test_head_page_route(client, general_out):
    """``/head/L-H``: the page of one head from the results folder; a head the model lacks, or
    a name that is not one, is a one-line error."""
    page = client.get("/head/2-1")
    assert page.status_code == 200 and page.mimetype == "text/html"
    html = page.get_data(as_text=True)
    data = json.loads(html.split('type="application/json">', 1)[1].split("</script>", 1)[0])
    kept = json.loads((general_out / "heads" / "general.json").read_text())
    assert data["head"] == "2-1" and data["examples"]["previous"] == kept["heads"]["previous"][1][0]
    assert client.get("/api/info").get_json()["head_pages"] is True
    for bad in ("9-1", "x"):
        r = client.get(f"/head/{bad}")
        assert r.status_code == 400 and "head" in r.get_json()["error"]


def test_syntax_results_show_per_relation_head_grids(tmp_path):
    """``attnscope serve tour/maps --results tour/syntax`` (README): the syntax results have
    per-relation tables, not one row per head; the viewer shows the heads' accuracy per
    relation and direction from the result's [relation, layer, head, direction] array."""
    from attnscope.serve.app import create_app

    maps, syntax = readme_syntax(tmp_path)
    r = create_app(maps, syntax).test_client().get("/api/results").get_json()
    res = json.loads((syntax / "results" / "syntax.json").read_text())
    relations = res["meta"]["relations"]
    assert r["folder"] == str(syntax) and r["problems"] == []
    names = [st["name"] for st in r["stats"]]
    assert names[:2] == ["syntax: accuracy (all, dep->head)", "syntax: accuracy (all, head->dep)"]
    assert len(names) == 2 * len(relations) and "syntax: accuracy (det, dep->head)" in names
    # Table 1's 'all' row: its best head's accuracy is the largest cell of the two 'all' grids
    row = next(x for x in res["tables"]["table1"] if x["relation"] == "all")
    grid = dict(zip(names, (st["values"] for st in r["stats"])))
    best = grid[f"syntax: accuracy (all, {row['direction']})"][row["layer"]][row["head_index"]]
    assert best == pytest.approx(row["accuracy"] / 100)
    assert best == max(v for d in ("dep->head", "head->dep") for line in grid[f"syntax: accuracy (all, {d})"]
                       for v in line)


def test_no_results_degrades(store_path, tmp_path):
    from attnscope.serve.app import create_app

    r = create_app(store_path).test_client().get("/api/results").get_json()
    assert r == {"folder": None, "stats": [], "scatter": None, "summaries": [], "problems": []}
    r = create_app(store_path, tmp_path / "none").test_client().get("/api/results").get_json()
    assert len(r["problems"]) == 1  # the folder given, and that there is none
    says(one_line(r["problems"][0]), f"{tmp_path / 'none'}: ", "no such")


def test_user_errors_are_json_messages(client):
    # the position and the store's size; the layer given and the model's; the parameter and value
    for url, status, facts in (("/api/example/99", 400, ("99", f"has {len(TEXTS)}")),
                               ("/api/example/0/neuron?layer=7", 400, ("layer 7", "out of range", "2 layers")),
                               ("/api/examples?offset=x", 400, ("offset", "whole number", "'x'")),
                               ("/nowhere", 404, ("not found",))):
        r = client.get(url)
        assert r.status_code == status
        says(one_line(r.get_json()["error"]), *facts)
        assert b"Traceback" not in r.data


def test_wrong_store_path_and_corrupt_shard(store_path, tmp_path):
    from attnscope.serve.app import create_app

    with pytest.raises(StoreError) as e:
        create_app(tmp_path / "missing")
    says(one_line(e.value), f"{tmp_path / 'missing'}: ", "no such store folder")
    bad = tmp_path / "bad"
    shutil.copytree(store_path, bad)
    from attnscope.store import open_store

    entries = open_store(bad).entries
    (bad / "shards" / entries[2]["shard"]).write_bytes(b"\x00garbage")
    ok = next(i for i, e in enumerate(entries) if e["shard"] != entries[2]["shard"])
    c = create_app(bad).test_client()
    assert c.get(f"/api/example/{ok}").status_code == 200
    r = c.get("/api/example/2")
    assert r.status_code == 400 and "corrupt" in r.get_json()["error"]


def test_serve_command_rejects_a_wrong_store(tmp_path, capsys):
    from attnscope.cli.main import main

    assert main(["serve", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    says(one_line(err.strip()), str(tmp_path / "missing"), "no such store folder")
