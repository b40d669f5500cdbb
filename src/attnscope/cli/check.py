"""``attnscope check MODEL``: every engine and backend that can take the model, compared with
transformers' own eager attention (:mod:`attnscope.pipeline.check`)."""

from __future__ import annotations

import json

import typer

from attnscope.cli.options import MODEL_HELP, device_option, seed_option
from attnscope.cli.output import results
from attnscope.errors import AttnscopeError


def _shown(value: float | None) -> str:
    return "" if value is None else "0" if value == 0 else f"{value:.1e}"


def register(app: typer.Typer, analyze_app: typer.Typer) -> None:
    @app.command("check")
    def check_cli(
        model: str = typer.Argument(..., help=MODEL_HELP),
        seed: int = seed_option(),
        device: str = device_option(),
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    ) -> None:
        """Compare attnscope's maps and every streaming backend with transformers' own eager
        attention on a short built-in text: what a model is (kind, layers with attention, heads,
        mechanisms) and each backend's largest difference. Exits 2 when one disagrees beyond
        float32 rounding."""
        from attnscope.pipeline.check import check

        report = check(model, seed=seed, device=device)
        if as_json:
            print(json.dumps(report.describe(), indent=1))
        else:
            from rich.table import Table

            # one table: what the model is, then each comparison with transformers' eager attention
            t = Table(title=f"attnscope check {model}", show_header=True)
            for column in ("", "largest difference from transformers' eager attention", "float32 bound", "verdict"):
                t.add_column(column)
            for label, value in report.summary():
                t.add_row(label, value, "", "")
            t.add_section()
            for r in report.rows:
                t.add_row(r.what, _shown(r.difference), _shown(r.bound),
                          r.verdict + (f": {r.reason}" if r.reason else ""))
            results.print(t)
            results.print("\n".join(report.plan_lines()), markup=False, highlight=False)
        bad = [r for r in report.rows if not r.ok]
        if bad:
            r = bad[0]
            raise AttnscopeError(f"{model}: {r.what} disagrees with transformers' eager attention by "
                                 f"{_shown(r.difference)} (float32 rounding bounds it by {_shown(r.bound)})"
                                 + (f": {r.reason}" if r.reason else ""))
