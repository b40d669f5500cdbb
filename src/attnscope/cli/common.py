"""Pieces shared by the command modules: console, progress bars, input reading."""

from __future__ import annotations

import shlex
import sys
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

console = Console(stderr=True, soft_wrap=True)


def command_line() -> str:
    return "attnscope " + " ".join(shlex.quote(a) for a in sys.argv[1:])


@contextmanager
def progress_bar(description: str, total: int | None, quiet: bool = False, unit: str = "examples"):
    """A rich progress bar with throughput and ETA; yields ``advance(done, **fields)``."""
    if quiet:
        yield lambda done, tokens=0: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"),
               TimeRemainingColumn()]
    with Progress(*columns, console=console, transient=False) as prog:
        task = prog.add_task(description, total=total, rate="")

        def advance(done: int, tokens: int = 0) -> None:
            elapsed = prog.tasks[0].elapsed or 1e-9
            rate = f"{done / elapsed:.1f} {unit}/s"
            if tokens:
                rate += f", {tokens / elapsed:.0f} tok/s"
            prog.update(task, completed=done, rate=rate)

        yield advance


def read_inputs(path: Path):
    """Examples from a JSON / JSON Lines file; paper-format or CoNLL-U dependency files too."""
    from attnscope.data.depparse import iter_depparse
    from attnscope.data.io import read_examples

    if path.suffix.lower() in (".conllu", ".conll"):
        return list(iter_depparse(path))
    return read_examples(path)
