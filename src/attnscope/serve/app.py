"""The local viewer: a small Flask app over one store (and optionally a results folder).

``create_app(store)`` opens the store at once (manifest and index only; shards are read when
an example is shown or a search reaches them) and raises :class:`StoreError` for a wrong
path. Every API error comes back as ``{"error": "..."}`` with a 4xx/5xx status and is shown
in the page as a message, never as a stack trace. The page loads nothing from outside
(its own inline JS/CSS; a Content-Security-Policy allows only this server).

Access: bound to a loopback address the viewer is open to the local user. ``token=...`` makes
every request need that token: as ``?token=`` once (the answer sets a cookie, and the page is
reloaded without the token in its address), or as a header ``Authorization: token <t>`` (or
``Bearer <t>``); requests without it get 403. Error answers never carry internal paths or
exception text (those go to the server's log).

Routes: ``/`` the viewer; ``/api/info``; ``/api/examples?q=&offset=&limit=``;
``/api/example/<pos>`` (the page payload of the ``pos``-th stored example);
``/api/example/<pos>/neuron?layer=`` (runs the store's model, loaded on first use);
``/api/results`` (per-head statistics); ``/api/results-views`` (one example's attribution maps,
per-head distance / position profiles and the sink heatmap, see :mod:`attnscope.viz.results_views`).

``/api/example/<pos>?offset=&window=``: an example longer than 512 units comes as a window of
query rows (the last 256 by default) plus the first token (:func:`attnscope.viz.payload.page_payload`);
the page moves the window with these parameters.

Without a store (``store_path=None``) the viewer shows only the results folder: the example
list is empty and the results views fill the page.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import re
import threading
from pathlib import Path

from attnscope.data.records import numbers_of, recorded_layers
from attnscope.errors import AttnscopeError, StoreError
from attnscope.serve.catalog import Catalog
from attnscope.serve.head_stats import load_results, results_shape
from attnscope.store import open_store
from attnscope.store.results import RESULTS_DIR
from attnscope.views import head_page_html, model_for_store, results_payload
from attnscope.viz.neuron import capture_qk, neuron_payload
from attnscope.viz.payload import LONG_INPUT, WINDOW, page_payload
from attnscope.viz.render import embed_json, static_text

log = logging.getLogger("attnscope.serve")
COOKIE = "attnscope_token"
_ABS_PATH = re.compile(r"(?:[A-Za-z]:)?[\\/](?:[^\s'\"\\/:]+[\\/])*([^\s'\"\\/:]*)")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
#: Largest window of query rows one request may ask for (a payload stays bounded whatever ``n``).
MAX_WINDOW = 1024
CSP = ("default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
       "img-src data: blob:; connect-src 'self'")


def public_message(exc: AttnscopeError) -> str:
    """A user error's message fit for an HTTP answer: file names only, no folders, no detail
    from a library's exception (the part in parentheses at the end)."""
    message = str(exc)
    if isinstance(exc, StoreError):
        message = re.sub(r"\s*\([^()]*\)$", "", message)
    return _ABS_PATH.sub(lambda m: m.group(1), message)


def _cookie_value(token: str) -> str:
    """What the cookie holds: derived from the token, so the token itself is not stored."""
    return hmac.new(token.encode(), b"attnscope-viewer-cookie", hashlib.sha256).hexdigest()


def is_loopback(host: str) -> bool:
    """True for an address that only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def create_app(store_path: str | Path | None, results: str | Path | None = None, *,
               model: str | None = None, token: str | None = None, long_input: int | None = None,
               window: int | None = None, document=None):
    """The viewer app for ``store_path``; ``results`` is an analysis output folder (either may
    be None, not both, unless ``document`` is given: a :class:`~attnscope.views.LongDocumentView`,
    whose page is then the viewer's, and whose rows it computes for any token clicked).

    ``long_input`` / ``window``: examples longer than ``long_input`` units are sent as a window
    of ``window`` query rows (defaults :data:`~attnscope.viz.payload.LONG_INPUT`,
    :data:`~attnscope.viz.payload.WINDOW`).

    ``token``: when given, every request must carry it (see the module docstring).
    """
    from flask import Flask, Response, jsonify, redirect, render_template, request
    from werkzeug.exceptions import HTTPException

    if store_path is None:
        if results is None and document is None:
            raise AttnscopeError("the viewer needs a store, a results folder (--results), or both")
        store = None
        current = {"store": None, "catalog": None,
                   "shape": results_shape(results) if results is not None else document.doc.shape}
        found = load_results(results, *current["shape"])
    else:
        current = {"store": open_store(store_path)}
        current["catalog"] = Catalog(current["store"])
        store = current["store"]
        if not store.complete:
            current["shards"] = tuple(sorted(p.name for p in (store.path / "shards").glob("*.safetensors")))
        found = load_results(results, store.num_layers, store.num_heads)
    views = results_payload(results) if results is not None else None
    refresh_lock = threading.Lock()

    def live():
        """The store and catalog; an unfinished store is re-read when its shard files change,
        so a store still being written shows its finished shards (never a partial one)."""
        st = current["store"]
        if st is None or st.complete:
            return st, current["catalog"]
        shards = tuple(sorted(p.name for p in (st.path / "shards").glob("*.safetensors")))
        if shards != current.get("shards"):
            with refresh_lock:
                if shards != current.get("shards"):
                    fresh = open_store(st.path)
                    current.update(store=fresh, catalog=Catalog(fresh), shards=shards)
        return current["store"], current["catalog"]
    app = Flask("attnscope.serve", template_folder=str(Path(__file__).parent / "templates"))
    app.config["JSON_SORT_KEYS"] = False
    state = {"lm": None, "lm_warnings": []}
    lock = threading.Lock()

    def error(message: str, status: int):
        return jsonify({"error": message}), status

    cookie = _cookie_value(token) if token else None

    @app.before_request
    def check_token():
        if token is None:
            return None
        given = request.args.get("token")
        header = request.headers.get("Authorization", "")
        for prefix in ("token ", "Bearer "):
            if header.startswith(prefix):
                given = header[len(prefix):].strip()
        if given is not None and hmac.compare_digest(given.encode(), token.encode()):
            if "token" in request.args and request.method == "GET" and request.path == "/":
                resp = redirect("/", code=302)  # the page without the token in its address
            else:
                return None
            resp.set_cookie(COOKIE, cookie, httponly=True, samesite="Strict")
            return resp
        if hmac.compare_digest(request.cookies.get(COOKIE, "").encode(), cookie.encode()):
            return None
        return error("forbidden: this viewer needs its access token (open the address with "
                     "?token=... that was printed when it started)", 403)

    @app.errorhandler(AttnscopeError)
    def on_user_error(exc):
        log.info("viewer: %s", exc)
        return error(public_message(exc), 400)

    @app.errorhandler(HTTPException)
    def on_http_error(exc):
        return error("not found" if exc.code == 404 else (exc.name or "error").lower(), exc.code or 500)

    @app.errorhandler(Exception)
    def on_error(exc):  # no stack traces, paths or exception text in the answer
        log.exception("viewer error")
        return error("internal error (details are in the server's log)", 500)

    @app.after_request
    def headers(resp):
        resp.headers["Content-Security-Policy"] = CSP
        resp.headers["X-Content-Type-Options"] = "nosniff"
        return resp

    def _pos(store, pos: int) -> int:
        if store is None:
            raise AttnscopeError("this viewer has no store (it was started with --results only)")
        if not 0 <= pos < len(store):
            raise AttnscopeError(f"no example at position {pos} (the store has {len(store)})")
        return pos

    def _int_arg(name: str, default: int) -> int:
        raw = request.args.get(name)
        if raw is None or raw == "":
            return default
        try:
            return int(raw)
        except ValueError:
            raise AttnscopeError(f"{name} must be a whole number, not {raw!r}") from None

    @app.get("/")
    def index():
        from markupsafe import Markup

        store, _ = live()
        if document is not None and store is None and results is None:
            return Response(document.html(served=True), mimetype="text/html")
        info = _info(store)
        return render_template(
            "viewer.html.j2", title=f"attnscope: {info['store']}",
            css=Markup(static_text("attnscope.css") + static_text("viewer.css")),
            js=Markup((static_text("attnscope.js") + static_text("results.js") +
                       static_text("viewer.js")).replace("</", "<\\/")),
            info_json=Markup(embed_json(info)))

    @app.get("/api/info")
    def info():
        store, _ = live()
        return jsonify({**_info(store), "has_results": bool(found["stats"] or found["scatter"])})

    head_pages = results is not None and (Path(results) / RESULTS_DIR / "general.json").is_file()

    def _info(store) -> dict:
        if store is None:
            L, H = current["shape"]
            return {"store": Path(results).name if results is not None else "long document",
                    "examples": 0, "head_pages": head_pages,
                    "summary": {"model": None, "layers": L, "heads": H, "level": "-", "status": None}}
        return {"store": store.path.name, "summary": _summary(store), "examples": len(store),
                "head_pages": head_pages}

    @app.get("/api/examples")
    def examples():
        q = request.args.get("q", "")
        offset, limit = _int_arg("offset", 0), min(200, max(1, _int_arg("limit", 50)))
        _, catalog = live()
        if catalog is None:
            return jsonify({"items": [], "total": 0, "next": None})
        return jsonify(catalog.search(q, offset, limit))

    @app.get("/api/example/<int:pos>")
    def example(pos: int):
        store, _ = live()
        amap = store[_pos(store, pos)]
        rows = _int_arg("window", window or WINDOW)
        if not 1 <= rows <= MAX_WINDOW:
            raise AttnscopeError(f"window must be between 1 and {MAX_WINDOW} query rows, not {rows}")
        payload = page_payload(amap, request.args.get("view", "head"),
                               layer=_int_arg("layer", 0),
                               title=f"{store.path.name}: example {amap.index}",
                               model=store.manifest.get("model", {}).get("name"),
                               offset=_int_arg("offset", None),
                               window=rows,
                               long_input=long_input or LONG_INPUT)
        return Response(embed_json(payload), mimetype="application/json")

    @app.get("/api/example/<int:pos>/neuron")
    def neuron(pos: int):
        store, _ = live()
        amap = store[_pos(store, pos)]
        with lock:
            if state["lm"] is None:
                state["lm"], state["lm_warnings"] = model_for_store(store, model)
            lm = state["lm"]
            qk = capture_qk(lm, amap.example, _int_arg("layer", 0), index=amap.index)
        payload = neuron_payload(qk, head=_int_arg("head", 0))
        if state["lm_warnings"]:
            payload["note"] = "; ".join(filter(None, [payload["note"], *state["lm_warnings"]]))
        return Response(embed_json(payload), mimetype="application/json")

    @app.get("/api/long/row")
    def long_row():
        """One head's whole row at a token of the long document, computed now (O(n))."""
        if document is None:
            raise AttnscopeError("no long document (attnscope serve --long DOC --model M)")
        with lock:
            row = document.row(_int_arg("layer", 0), _int_arg("head", 0), _int_arg("query", 0))
        return Response(embed_json(row), mimetype="application/json")

    @app.get("/api/long/head")
    def long_head():
        """Another head of the long document: its profiles and its rows at ``queries`` (comma
        separated; default: the page's), from the same forward pass."""
        if document is None:
            raise AttnscopeError("no long document (attnscope serve --long DOC --model M)")
        given = request.args.get("queries")
        try:
            queries = None if not given else [int(q) for q in given.split(",")]
        except ValueError:
            raise AttnscopeError(f"queries {given!r}: token positions separated by commas") from None
        with lock:
            part = document.head(_int_arg("layer", 0), _int_arg("head", 0), queries)
        return Response(embed_json(part), mimetype="application/json")

    @app.get("/head/<name>")
    def head_page(name: str):
        """The page of head ``name`` (``5-3``) from the results folder; the grids and the
        scatter link to it."""
        if results is None:
            raise AttnscopeError("head pages need a results folder (attnscope serve --results DIR)")
        if not re.fullmatch(r"\d{1,4}-\d{1,4}", name):
            raise AttnscopeError(f"head {name!r}: name a head as layer-head from 1 (e.g. 5-3)")
        return Response(head_page_html(results, name), mimetype="text/html")

    @app.get("/api/results")
    def results_api():
        return jsonify(found)

    @app.get("/api/results-views")
    def results_views():
        empty = {"folder": None, "profiles": [], "sinks": [], "attribution": None, "problems": []}
        return Response(embed_json(views or empty), mimetype="application/json")

    app.extensions["attnscope"] = {"store": store, "catalog": current["catalog"], "results": found,
                                   "live": live}
    return app


def _summary(store) -> dict:
    m = store.manifest
    own = recorded_layers(m.get("model"))  # a hybrid's attention layers, by the model's own index
    return {"model": m.get("model", {}).get("name"), "layers": store.num_layers,
            "layer_numbers": numbers_of(own),
            "heads": store.num_heads, "level": store.level, "status": m.get("status")}


def make_server(app, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, threads: int = 8):
    """A waitress WSGI server for ``app`` (not started; ``.run()`` serves until ``.close()``).

    ``port=0`` picks a free port: ``server.effective_port``.
    """
    from waitress import create_server

    return create_server(app, host=host, port=port, threads=threads, ident="attnscope",
                         clear_untrusted_proxy_headers=True)


def serve(store_path: str | Path, results: str | Path | None = None, *, host: str = DEFAULT_HOST,
          port: int = DEFAULT_PORT, model: str | None = None, token: str | None = None) -> None:
    """Run the viewer with waitress until interrupted. A non-loopback ``host`` needs a ``token``."""
    if token is None and not is_loopback(host):
        raise AttnscopeError(f"--host {host}: binding to an address other computers can reach "
                             "needs an access token")
    app = create_app(store_path, results, model=model, token=token)
    server = make_server(app, host, port)
    try:
        server.run()
    finally:
        server.close()
