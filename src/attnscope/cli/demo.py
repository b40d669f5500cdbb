"""``attnscope demo``: the whole pipeline on the packaged model and the packaged sample."""

from __future__ import annotations

from pathlib import Path

import typer

from attnscope.cli.common import check_writable, command_line, console, step_progress
from attnscope.cli.options import quiet_option
from attnscope.cli.run import print_outcome
from attnscope.pipeline import run_demo

#: Where the demo writes unless --out says otherwise: a folder in the current directory,
#: named so that it is easy to find and to delete (the checkout's .gitignore lists it).
DEFAULT_DEMO_DIR = Path("attnscope-demo")


def register(app: typer.Typer, analyze_app: typer.Typer) -> None:
    @app.command("demo")
    def demo_cli(
        out_dir: Path = typer.Option(DEFAULT_DEMO_DIR, "--out", "-o",
                                 help="Folder for the demo's report, tables and figures (default: "
                                      "./attnscope-demo in the current directory; an earlier demo "
                                      "run there is replaced, any other folder is never touched)."),
        model: str = typer.Option("default", "--model", "-m", help="Model to run (default: the packaged MiniLM)."),
        resume: bool = typer.Option(False, "--resume", help="Continue an interrupted demo run."),
        quiet: bool = quiet_option(),
    ) -> None:
        """Run every analysis on a small sample that ships with attnscope; print the report's path."""
        check_writable(out_dir, folder=True)
        if not quiet:
            console.print(f"demo: writing to {out_dir.resolve()} (change with --out)")
        with step_progress(quiet, overall=True) as progress:
            outcome = run_demo(out_dir, model=model, resume=resume, progress=progress, command=command_line())
        print_outcome(outcome, quiet)
