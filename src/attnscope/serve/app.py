"""The local viewer: a small Flask app over one store (and optionally a results folder).

``create_app(store)`` opens the store at once (manifest and index only; shards are read when
an example is shown or a search reaches them) and raises :class:`StoreError` for a wrong
path. Every API error comes back as ``{"error": "..."}`` with a 4xx/5xx status and is shown
in the page as a message, never as a stack trace. The page loads nothing from outside
(its own inline JS/CSS; a Content-Security-Policy allows only this server).

Routes: ``/`` the viewer; ``/api/info``; ``/api/examples?q=&offset=&limit=``;
``/api/example/<pos>`` (the page payload of the ``pos``-th stored example);
``/api/example/<pos>/neuron?layer=`` (runs the store's model, loaded on first use);
``/api/results``.
"""

from __future__ import annotations

import threading
from pathlib import Path

from attnscope.errors import AttnscopeError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
CSP = ("default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
       "img-src data: blob:; connect-src 'self'")


def create_app(store_path: str | Path, results: str | Path | None = None, *,
               model: str | None = None):
    """The viewer app for ``store_path``; ``results`` is an analysis output folder."""
    from flask import Flask, Response, jsonify, render_template, request

    from attnscope.serve.catalog import Catalog
    from attnscope.serve.results import load_results
    from attnscope.store import open_store
    from attnscope.viz.payload import page_payload
    from attnscope.viz.render import embed_json, static_text

    store = open_store(store_path)
    catalog = Catalog(store)
    found = load_results(results, store.num_layers, store.num_heads)
    app = Flask("attnscope.serve", template_folder=str(Path(__file__).parent / "templates"))
    app.config["JSON_SORT_KEYS"] = False
    state = {"lm": None, "lm_warnings": []}
    lock = threading.Lock()

    def error(message: str, status: int):
        return jsonify({"error": message}), status

    @app.errorhandler(AttnscopeError)
    def on_user_error(exc):
        return error(str(exc), 400)

    @app.errorhandler(404)
    def on_404(exc):
        return error("not found", 404)

    @app.errorhandler(Exception)
    def on_error(exc):  # no stack traces in the page
        app.logger.exception("viewer error")
        return error(f"internal error: {type(exc).__name__}: {exc}", 500)

    @app.after_request
    def headers(resp):
        resp.headers["Content-Security-Policy"] = CSP
        resp.headers["X-Content-Type-Options"] = "nosniff"
        return resp

    def _pos(pos: int) -> int:
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

        info = {"store": str(store.path), "summary": _summary(store), "examples": len(store)}
        return render_template(
            "viewer.html.j2", title=f"attnscope: {store.path.name}",
            css=Markup(static_text("attnscope.css") + static_text("viewer.css")),
            js=Markup((static_text("attnscope.js") + static_text("viewer.js")).replace("</", "<\\/")),
            info_json=Markup(embed_json(info)))

    @app.get("/api/info")
    def info():
        return jsonify({"store": str(store.path), "summary": _summary(store),
                        "examples": len(store), "has_results": bool(found["stats"] or found["scatter"])})

    @app.get("/api/examples")
    def examples():
        q = request.args.get("q", "")
        offset, limit = _int_arg("offset", 0), min(200, max(1, _int_arg("limit", 50)))
        return jsonify(catalog.search(q, offset, limit))

    @app.get("/api/example/<int:pos>")
    def example(pos: int):
        amap = store[_pos(pos)]
        payload = page_payload(amap, request.args.get("view", "head"),
                               layer=_int_arg("layer", 0),
                               title=f"{store.path.name}: example {amap.index}",
                               model=store.manifest.get("model", {}).get("name"))
        return Response(embed_json(payload), mimetype="application/json")

    @app.get("/api/example/<int:pos>/neuron")
    def neuron(pos: int):
        from attnscope.viz.neuron import capture_qk, neuron_payload
        from attnscope.viz.write import model_for_store

        amap = store[_pos(pos)]
        with lock:
            if state["lm"] is None:
                state["lm"], state["lm_warnings"] = model_for_store(store, model)
            lm = state["lm"]
            qk = capture_qk(lm, amap.example, _int_arg("layer", 0), index=amap.index)
        payload = neuron_payload(qk, head=_int_arg("head", 0))
        if state["lm_warnings"]:
            payload["note"] = "; ".join(filter(None, [payload["note"], *state["lm_warnings"]]))
        return Response(embed_json(payload), mimetype="application/json")

    @app.get("/api/results")
    def results_api():
        return jsonify(found)

    app.extensions["attnscope"] = {"store": store, "catalog": catalog, "results": found}
    return app


def _summary(store) -> dict:
    m = store.manifest
    return {"model": m.get("model", {}).get("name"), "layers": store.num_layers,
            "heads": store.num_heads, "level": store.level, "status": m.get("status")}


def serve(store_path: str | Path, results: str | Path | None = None, *, host: str = DEFAULT_HOST,
          port: int = DEFAULT_PORT, model: str | None = None) -> None:
    """Run the viewer until interrupted (Flask's built-in server, local use only)."""
    app = create_app(store_path, results, model=model)
    app.run(host=host, port=port, debug=False, use_reloader=False, threaded=True)
