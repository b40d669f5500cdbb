"""``attnscope serve``: the web viewer over a store, served by waitress.

On a loopback address (the default) the viewer is open to the local user. On any other address
it needs an access token: a new random one (``secrets``) unless ``--token`` gives one; the
address to open, with ``?token=...``, is printed on stdout as Jupyter does.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import typer

from attnscope.cli.common import console
from attnscope.cli.options import (
    HEAD_HELP,
    LAYER_HELP,
    LONG_HELP,
    LONG_MAX_SEQ_LEN_HELP,
    QUERIES_HELP,
    long_document,
    max_seq_len_option,
)
from attnscope.cli.output import results as out
from attnscope.errors import AttnscopeError
from attnscope.serve.app import create_app, is_loopback, make_server


def register(app: typer.Typer, analyze_app: typer.Typer) -> None:
    @app.command("serve")
    def serve_cli(
        store: Path = typer.Argument(None, help="Store folder (attnscope extract); may be left out "
                                                "when --results is given."),
        results: Path = typer.Option(None, "--results", help="Analysis output folder (its results/*.json)."),
        host: str = typer.Option("127.0.0.1", "--host",
                                 help="Address to bind. Loopback (the default) needs no token; any "
                                      "other address gets an access token."),
        port: int = typer.Option(8765, "--port", min=0, max=65535,
                                 help="TCP port to listen on (0 picks a free one)."),
        token: str = typer.Option(None, "--token",
                                  help="Access token to require (default: a new random one when "
                                       "--host is not a loopback address, none on loopback)."),
        model: str = typer.Option(None, "--model", "-m", help="Model for the neuron view (default: the "
                                  "store's); with --long, the model to run."),
        long: Path = typer.Option(None, "--long", help=LONG_HELP),
        layer: int = typer.Option(1, "--layer", min=1, help=LAYER_HELP),
        head: int = typer.Option(None, "--head", min=1, help=HEAD_HELP),
        queries: str = typer.Option(None, "--queries", help=QUERIES_HELP),
        max_seq_len: int = max_seq_len_option(16384, help=LONG_MAX_SEQ_LEN_HELP),
    ) -> None:
        """Browse a store: examples with search, every view, per-head statistics."""
        import socket

        if store is None and results is None and long is None:
            raise AttnscopeError("give a store folder, --results DIR, or both (or --long DOC)")
        document = None if long is None else long_document(
            long, model=model, layer=layer, head=head, queries=queries, max_seq_len=max_seq_len)
        if token is not None and len(token) < 16:
            raise AttnscopeError("--token: use at least 16 characters")
        if token is None and not is_loopback(host):
            token = secrets.token_urlsafe(32)
        app_ = create_app(store, results, model=model, token=token, document=document)
        try:
            server = make_server(app_, host, port)
        except OSError as exc:
            raise AttnscopeError(f"--host {host} --port {port}: cannot listen ({exc.strerror})") from None
        port = server.effective_port
        query = f"?token={token}" if token else ""
        shown = [host]
        if host in ("0.0.0.0", "::", ""):
            shown = [socket.gethostname(), "127.0.0.1"]
        what = store if store is not None else results if results is not None else long
        console.print(f"attnscope viewer for {what} (Ctrl+C to stop); open:")
        for h in shown:
            h = f"[{h}]" if ":" in h else h
            out.print(f"    http://{h}:{port}/{query}", highlight=False)
        if token:
            console.print("requests without the token are refused (403); it is kept in a cookie "
                          "after the first visit, or send it as 'Authorization: token ...'")
        try:
            server.run()
        except KeyboardInterrupt:
            console.print("stopped")
        finally:
            server.close()
