"""The local viewer's Flask app, through Flask's test client (the browser tests drive it live)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from attnscope.errors import StoreError
from attnscope.viz.encoding import decode

TEXTS = ["the cat sat on the mat", "a dog ran to the house", "<b>who</b> saw the red cat",
         "she said it was old", "the man and the woman"]


def build_store(path, lm, texts=TEXTS, shard_size=2):
    from attnscope.data.io import example_from_dict
    from attnscope.store import extract_to_store

    extract_to_store([example_from_dict({"text": t}, i) for i, t in enumerate(texts)], path, lm,
                     shard_size=shard_size)
    return path


def write_results(folder, L, H):
    from attnscope.analyses.base import Result

    rows = [{"layer": layer, "head": h, "name": f"{layer + 1}-{h + 1}", "x": float(layer), "y": float(h),
             "behaviour": "broad" if h else "next"} for layer in range(L) for h in range(H)]
    (folder / "results").mkdir(parents=True)
    Result("clustering", tables={"heads": rows}).save(folder / "results" / "clustering.json")
    ent = np.arange(L * H, dtype=float).reshape(L, H)
    Result("entropy", arrays={"entropy": ent},
           tables={"per_relation": [{"layer": 0, "head": 0, "acc": 1.0},
                                    {"layer": 0, "head": 0, "acc": 0.5}]}).save(
        folder / "results" / "entropy.json")
    (folder / "results" / "broken.json").write_text("{not json", encoding="utf-8")
    (folder / "tables").mkdir()
    (folder / "tables" / "offsets.csv").write_text(
        "layer,head,name,prev\n" + "".join(f"{i},{h},{i + 1}-{h + 1},{0.1 * (i + h):.1f}\n"
                                           for i in range(L) for h in range(H)), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def store_path(tmp_path_factory, debug_bert):
    return build_store(tmp_path_factory.mktemp("serve") / "store", debug_bert)


@pytest.fixture
def client(store_path, tmp_path):
    from attnscope.serve.app import create_app

    app = create_app(store_path, write_results(tmp_path / "out", 2, 2))
    return app.test_client()


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
    np.testing.assert_allclose(decode(p["attn"]), m.attn, atol=0.5 / 255 + 1e-6)
    assert p["tokens"] == m.tokens and p["state"]["view"] == "head"
    assert "connect-src 'self'" in r.headers["Content-Security-Policy"]


def test_neuron_route(client):
    p = client.get("/api/example/0/neuron?layer=1").get_json()
    assert p["layer"] == 1 and p["softmax_matches_model"]
    assert decode(p["query"]).shape[0] == 2


def test_results_are_read(client):
    r = client.get("/api/results").get_json()
    names = [s["name"] for s in r["stats"]]
    assert "entropy: entropy" in names and "offsets.prev" in names
    assert not any("per_relation" in n for n in names)  # not one row per head: left out
    ent = next(s for s in r["stats"] if s["name"] == "entropy: entropy")["values"]
    assert ent == [[0.0, 1.0], [2.0, 3.0]]
    prev = next(s for s in r["stats"] if s["name"] == "offsets.prev")["values"]
    assert prev == [[0.0, 0.1], [0.1, 0.2]]
    pts = r["scatter"]["points"]
    assert len(pts) == 4 and pts[3] == {"layer": 1, "head": 1, "x": 1.0, "y": 1.0, "label": "broad"}
    assert any("broken.json" in p for p in r["problems"])


def readme_syntax(root):
    """The README's steps 2-3 on a small treebank: ``prepare depparse``, ``extract
    --word-level``, ``analyze syntax`` on the store; returns ``(maps, syntax results)``."""
    from attnscope.cli.main import main
    from tests.test_syntax_cli import SENTS, write_conllu

    conllu = root / "dev.conllu"
    write_conllu(conllu, SENTS * 4)
    maps, syntax = root / "maps", root / "syntax"
    for argv in (["prepare", "depparse", str(conllu), "--out", str(root / "dev.json")],
                 ["extract", str(root / "dev.json"), "--model", "debug:bert", "--word-level",
                  "--out", str(maps), "-q"],
                 ["analyze", "syntax", str(maps), "--out", str(syntax), "-q"]):
        assert main(argv) in (0, None), argv
    return maps, syntax


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
    assert r["problems"] == [f"{tmp_path / 'none'}: no such results folder"]


def test_user_errors_are_json_messages(client):
    for url, status, text in (("/api/example/99", 400, "no example at position 99"),
                              ("/api/example/0/neuron?layer=7", 400, "layer 7 out of range"),
                              ("/api/examples?offset=x", 400, "offset must be a whole number"),
                              ("/nowhere", 404, "not found")):
        r = client.get(url)
        assert r.status_code == status and text in r.get_json()["error"]
        assert b"Traceback" not in r.data


def test_wrong_store_path_and_corrupt_shard(store_path, tmp_path):
    from attnscope.serve.app import create_app

    with pytest.raises(StoreError, match="no such store folder"):
        create_app(tmp_path / "missing")
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
    assert err.startswith("error: ") and "no such store folder" in err
