"""``attnscope serve``: the local web viewer over a store."""

from __future__ import annotations

from pathlib import Path

import typer

from attnscope.cli.common import console


def register(app: typer.Typer, analyze_app: typer.Typer) -> None:
    @app.command("serve")
    def serve_cli(
        store: Path = typer.Argument(..., help="Store folder (attnscope extract)."),
        results: Path = typer.Option(None, "--results", help="Analysis output folder (results/*.json, tables/*.csv)."),
        host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (local only by default)."),
        port: int = typer.Option(8765, "--port"),
        model: str = typer.Option(None, "--model", "-m", help="Model for the neuron view (default: the store's)."),
    ) -> None:
        """Browse a store: examples with search, every view, per-head statistics."""
        from attnscope.serve.app import create_app

        app_ = create_app(store, results, model=model)
        if host not in ("127.0.0.1", "localhost", "::1"):
            console.print(f"[yellow]warning:[/] binding to {host}: anyone who can reach it can read the store")
        console.print(f"attnscope viewer for {store} on http://{host}:{port}/ (Ctrl+C to stop)")
        app_.run(host=host, port=port, debug=False, use_reloader=False, threaded=True)
