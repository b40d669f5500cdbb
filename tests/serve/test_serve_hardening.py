"""The viewer on a shared machine: access token, error answers without internal detail, a store
still being written, and one real waitress server on 127.0.0.1 with an ephemeral port."""

from __future__ import annotations

import json
import re
import shutil
import threading
import urllib.error
import urllib.request

import pytest
from conftest import one_line, says

from attnscope.serve.app import COOKIE, create_app, is_loopback, make_server

TOKEN = "s3cret-token-0123456789abcdef"
TEXTS = ["the cat sat", "a dog ran", "who saw it", "she said so", "the man left"]


@pytest.fixture(scope="module")
def store_path(tmp_path_factory, debug_bert):
    from attnscope.data.io import example_from_dict
    from attnscope.jobs import extract_to_store

    path = tmp_path_factory.mktemp("hardening") / "store"
    extract_to_store([example_from_dict({"text": t}, i) for i, t in enumerate(TEXTS)], path,
                     debug_bert, shard_size=2)
    return path


@pytest.mark.parametrize("host,expect", [("127.0.0.1", True), ("127.5.0.1", True), ("::1", True),
                                         ("localhost", True), ("0.0.0.0", False), ("::", False),
                                         ("192.168.1.5", False), ("example.org", False)])
def test_is_loopback(host, expect):
    assert is_loopback(host) is expect


def test_without_a_token_everything_is_open(store_path):
    c = create_app(store_path).test_client()
    assert c.get("/api/info").status_code == 200 and c.get("/").status_code == 200


def test_token_query_then_cookie(store_path):
    c = create_app(store_path, token=TOKEN).test_client()
    for url in ("/", "/api/info", "/api/examples", "/api/example/0", "/nowhere"):
        r = c.get(url)
        assert r.status_code == 403 and "access token" in r.get_json()["error"], url
    assert c.get(f"/api/info?token={TOKEN}x").status_code == 403
    r = c.get(f"/?token={TOKEN}")
    assert r.status_code == 302 and r.headers["Location"].endswith("/")
    set_cookie = r.headers["Set-Cookie"]
    assert set_cookie.startswith(f"{COOKIE}=") and "HttpOnly" in set_cookie and TOKEN not in set_cookie
    # the same client now sends the cookie
    assert c.get("/").status_code == 200
    assert c.get("/api/info").get_json()["examples"] == 5
    # a forged cookie does not pass
    c2 = create_app(store_path, token=TOKEN).test_client()
    c2.set_cookie(COOKIE, "0" * 64)
    assert c2.get("/api/info").status_code == 403


@pytest.mark.parametrize("scheme", ["token", "Bearer"])
def test_token_header(store_path, scheme):
    c = create_app(store_path, token=TOKEN).test_client()
    assert c.get("/api/info", headers={"Authorization": f"{scheme} {TOKEN}"}).status_code == 200
    assert c.get("/api/info", headers={"Authorization": f"{scheme} nope"}).status_code == 403
    # an API call with ?token= is answered at once (no redirect)
    assert c.get(f"/api/examples?token={TOKEN}").status_code == 200


def test_errors_carry_no_paths_or_exception_text(store_path, tmp_path, monkeypatch):
    bad = tmp_path / "deep" / "folder" / "bad"
    shutil.copytree(store_path, bad)
    shard = sorted((bad / "shards").glob("*.safetensors"))[1]
    shard.write_bytes(b"\x00garbage")
    app = create_app(bad)
    c = app.test_client()
    r = c.get("/api/example/2")  # example 2 is in the second shard (2 per shard)
    message = r.get_json()["error"]
    assert r.status_code == 400 and "corrupt" in message and shard.name in message
    assert str(tmp_path) not in message and "/deep/" not in message and "(" not in message
    info = c.get("/api/info").get_json()
    assert info["store"] == "bad"
    # an unexpected failure: a generic 500, nothing of the exception
    from attnscope.store.reader import Store

    def boom(*a, **k):
        raise RuntimeError(f"secret detail at {tmp_path}/x.py")

    monkeypatch.setattr(Store, "__getitem__", boom)
    r = c.get("/api/example/0")
    assert r.status_code == 500
    body = r.get_json()  # only a generic error pointing at the log: no detail, path or type
    assert list(body) == ["error"]
    says(one_line(body["error"]), "internal error", "log")
    assert not any(s in body["error"] for s in ("secret", str(tmp_path), "x.py", "RuntimeError"))
    r = c.post("/api/info")
    assert r.status_code == 405 and list(r.get_json()) == ["error"]
    says(one_line(r.get_json()["error"]), "method not allowed")


def test_a_store_still_being_written_serves_its_finished_shards(store_path, tmp_path):
    live = tmp_path / "live"
    shutil.copytree(store_path, live)
    manifest = json.loads((live / "manifest.json").read_text())
    manifest["status"] = "incomplete"
    manifest.pop("summary", None)
    (live / "manifest.json").write_text(json.dumps(manifest))
    (live / "index.json").unlink()
    shards = sorted((live / "shards").glob("*.safetensors"))
    assert len(shards) == 3  # 5 examples, 2 per shard
    held = {s.name: s.read_bytes() for s in shards[1:]}
    for s in shards[1:]:
        s.unlink()
    # a shard in flight: the writer's temporary file, half written
    (live / "shards" / f".{shards[1].name}.abc123.tmp").write_bytes(held[shards[1].name][:100])
    c = create_app(live).test_client()
    assert c.get("/api/info").get_json()["examples"] == 2
    items = c.get("/api/examples").get_json()["items"]
    assert [it["text"] for it in items] == TEXTS[:2]
    for pos in range(2):
        assert c.get(f"/api/example/{pos}").status_code == 200
    assert c.get("/api/example/2").status_code == 400
    # the writer finishes the next shard (an atomic rename): the viewer picks it up
    shards[1].write_bytes(held[shards[1].name])
    assert c.get("/api/info").get_json()["examples"] == 4
    assert [it["text"] for it in c.get("/api/examples").get_json()["items"]] == TEXTS[:4]
    assert c.get("/api/example/3").status_code == 200


def _get(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def test_real_waitress_server_on_an_ephemeral_port(store_path):
    server = make_server(create_app(store_path, token=TOKEN), "127.0.0.1", 0)
    port = server.effective_port
    assert port != 0
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{port}"
        status, headers, body = _get(f"{base}/api/info")
        assert status == 403 and b"access token" in body
        status, headers, body = _get(f"{base}/api/info", {"Authorization": f"token {TOKEN}"})
        assert status == 200 and json.loads(body)["examples"] == 5
        assert headers["Server"] == "attnscope"  # waitress, not werkzeug's development server
        status, _, body = _get(f"{base}/api/examples?q=dog&token={TOKEN}")
        assert status == 200 and [i["text"] for i in json.loads(body)["items"]] == ["a dog ran"]
    finally:
        server.close()
        thread.join(timeout=10)


class _FakeServer:
    effective_port = 45678

    def run(self):
        raise KeyboardInterrupt

    def close(self):
        pass


@pytest.mark.parametrize("host,needs_token", [("127.0.0.1", False), ("0.0.0.0", True)])
def test_serve_command_prints_the_url_with_a_token_off_loopback(store_path, capsys, monkeypatch,
                                                                 host, needs_token):
    import attnscope.cli.serve as serve_cli
    from attnscope.cli.main import main

    seen = {}

    def fake_make_server(app, h, p, threads=8):
        seen["app"] = app
        return _FakeServer()

    monkeypatch.setattr(serve_cli, "make_server", fake_make_server)  # where the command calls it
    code = main(["serve", str(store_path), "--host", host, "--port", "0"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "\x1b[" not in out + err  # no raw colour codes when not on a terminal
    urls = re.findall(r"http://\S+", out)
    assert urls and all(":45678/" in u for u in urls)
    tokens = {u.split("?token=")[1] for u in urls if "?token=" in u}
    if needs_token:
        assert len(tokens) == 1 and all("?token=" in u for u in urls)
        (token,) = tokens
        assert len(token) >= 40  # secrets.token_urlsafe(32)
        c = seen["app"].test_client()
        assert c.get("/api/info").status_code == 403
        assert c.get("/api/info", headers={"Authorization": f"token {token}"}).status_code == 200
    else:
        assert not tokens
        assert seen["app"].test_client().get("/api/info").status_code == 200


def test_short_token_is_refused(store_path, capsys):
    from attnscope.cli.main import main

    assert main(["serve", str(store_path), "--token", "short"]) == 2
    err = capsys.readouterr().err.strip()
    says(one_line(err), "error: ", "--token", "16")  # the flag and the least length
