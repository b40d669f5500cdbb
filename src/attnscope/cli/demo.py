"""``attnscope demo``: the whole pipeline on the packaged model and the packaged sample."""

from __future__ import annotations

from pathlib import Path

import typer

from attnscope.cli.common import command_line, step_progress
from attnscope.cli.run import print_outcome


def register(app: typer.Typer, analyze_app: typer.Typer) -> None:
    @app.command("demo")
    def demo_cli(
        out: Path = typer.Option(Path("attnscope-demo"), "--out", "-o",
                                 help="Folder for the demo report (an earlier demo run there is replaced)."),
        model: str = typer.Option("default", "--model", "-m", help="Model to run (default: the packaged MiniLM)."),
        resume: bool = typer.Option(False, "--resume", help="Continue an interrupted demo run."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars; print only the report's path."),
    ) -> None:
        """Run every analysis on a small sample that ships with attnscope; print the report's path."""
        from attnscope.pipeline import run_demo

        with step_progress(quiet, overall=True) as progress:
            outcome = run_demo(out, model=model, resume=resume, progress=progress, command=command_line())
        print_outcome(outcome, quiet)
