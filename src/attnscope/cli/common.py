"""Pieces shared by the command modules: console, progress bars, input reading, and the check
of every output location before any work."""

from __future__ import annotations

import itertools
import shlex
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from attnscope.data.depparse import iter_depparse
from attnscope.data.io import check_writable as check
from attnscope.data.io import read_examples
from attnscope.errors import AttnscopeError, InputError
from attnscope.progress import duration, unit_of

console = Console(stderr=True, soft_wrap=True)
#: Seconds between the plain progress lines written when stderr is not a terminal.
PLAIN_EVERY_S = 30.0
#: What a step counts within this many seconds of its first report is not taken for its rate.
BASE_S = 1.0


def command_line() -> str:
    return "attnscope " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _progress(description: str, *fields: str, transient: bool):
    """A rich ``Progress``: description, bar, done/total, extra text ``fields``, elapsed, ETA."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [TextColumn(description), BarColumn(), MofNCompleteColumn(),
               *(TextColumn(f) for f in fields), TimeElapsedColumn(), TextColumn("ETA"),
               TimeRemainingColumn()]
    # A transient display draws nothing where stderr is not a terminal (a log file, a pipe), but
    # rich still ends it with an empty line there, before the error or summary that follows.
    return Progress(*columns, console=console, transient=transient,
                    disable=transient and not console.is_interactive)


@contextmanager
def progress_bar(description: str, total: int | None, quiet: bool = False, unit: str = "examples"):
    """A rich progress bar with throughput and ETA; yields ``advance(done, **fields)``."""
    if quiet:
        yield lambda done, tokens=0: None
        return
    with _progress("[bold]{task.description}", "{task.fields[rate]}", transient=False) as prog:
        task = prog.add_task(description, total=total, rate="")

        def advance(done: int, tokens: int = 0) -> None:
            elapsed = prog.tasks[0].elapsed or 1e-9
            rate = f"{done / elapsed:.1f} {unit}/s"
            if tokens:
                rate += f", {tokens / elapsed:.0f} tok/s"
            prog.update(task, completed=done, rate=rate)

        yield advance


@contextmanager
def step_progress(quiet: bool, overall: bool = False):
    """A rich display with one bar per step and an ``overall`` bar with the run's ETA.

    ``overall`` adds the bar that :func:`attnscope.pipeline.run_pipeline` drives across
    families. Yields the ``progress(step, done, total)`` callback that the library's long functions take
    (``run_pipeline``, ``run_family``); None when ``quiet``.
    """
    if quiet:
        yield None
        return
    if not console.is_terminal:  # no live bars (a log file, a pipe): a plain line now and then
        yield plain_progress()
        return
    with _progress("[bold]{task.description:<28}", "{task.fields[unit]}", transient=True) as prog:
        tasks: dict[str, int] = {}
        current: dict[str, str] = {}

        def progress(step: str, done: int, total: int | None) -> None:
            # One bar per family ("syntax: probes epoch 3" -> the "syntax" bar); a new step of
            # the family restarts that bar with the step's own total.
            bar, unit = step.split(": ", 1)[0], unit_of(step) or ""
            if bar not in tasks:
                tasks[bar] = prog.add_task(step, total=total, unit=unit)
            elif current.get(bar) != step:
                prog.reset(tasks[bar], total=total, description=step, unit=unit)
            current[bar] = step
            prog.update(tasks[bar], completed=done, total=total)

        if overall:
            progress("overall", 0, None)
        yield progress


def plain_progress(every_s: float | None = None, clock=None):
    """A ``progress(step, done, total)`` callback for a stderr that is not a terminal: one
    line, e.g. ``longctx: statistics: 3/60 sequences after 95 s``, when a step moves on at least
    ``every_s`` seconds (default :data:`PLAIN_EVERY_S`) after the last line of its family (or
    the start), so short commands print nothing; and, for a step that has shown a line, one
    more when it reaches its total (``... 60/60 sequences after 140 s``), so every count
    shown is seen to end. A step done once (loading the model, writing the report) says
    ``started`` and ``done``; every other count names its unit (:func:`attnscope.progress.unit_of`)
    and, on its way, the time left at the rate the step has kept since its first second
    (``..., about 2 min left``), re-made on every line: what a step counts within a second of
    its first report (the units a resumed run read back from its log) is not taken for its rate."""
    every_s = PLAIN_EVERY_S if every_s is None else every_s
    clock = clock or time.monotonic
    start = clock()
    last: dict[str, float] = {}
    shown: set[str] = set()  # steps with a line whose total has not been reached yet
    base: dict[str, tuple[float, int]] = {}  # each step's rate is counted from: (time, done)

    def say(step: str, done: int, total: int | None, now: float) -> None:
        unit = unit_of(step)
        if unit is None and total == 1:
            what = "done" if done >= 1 else "started"
        else:
            what = f"{done}" + ("" if total is None else f"/{total}") + (f" {unit}" if unit else "")
        left = ""
        t0, d0 = base[str(step)]
        if total is not None and d0 < done < total and now > t0:
            left = f", about {duration((total - done) * (now - t0) / (done - d0))} left"
        console.print(f"{step}: {what} after {now - start:.0f} s{left}", highlight=False)

    def progress(step: str, done: int, total: int | None) -> None:
        now, bar, key = clock(), step.split(": ", 1)[0], str(step)
        t0, _ = base.setdefault(key, (now, done))
        if now - t0 < BASE_S:
            base[key] = (t0, done)
        reached = total is not None and done >= total
        if reached and key in shown:
            shown.discard(key)
        elif now - last.get(bar, start) < every_s:
            return
        elif not reached:
            shown.add(key)
        last[bar] = now
        say(step, done, total, now)

    return progress


def read_inputs(path: Path):
    """Examples from a JSON / JSON Lines file; paper-format or CoNLL-U dependency files too."""
    if path.suffix.lower() in (".conllu", ".conll"):
        return read_depparse(path)
    return read_examples(path)


def read_depparse(path: Path, limit: int | None = None) -> list:
    """The sentences of a dependency file (at most ``limit``); a file with none is refused, as
    an empty JSON file is, rather than making an empty output."""
    examples = list(itertools.islice(iter_depparse(path), limit))
    if not examples:
        raise InputError(path, "holds no sentences")
    return examples


def check_new_files(paths, *, overwrite: bool) -> None:
    """Refuse to replace an existing output file unless ``overwrite`` (``--overwrite``), before
    any work: a command never overwrites a file silently."""
    for path in paths:
        if Path(path).is_file() and not overwrite:
            raise AttnscopeError(f"{path}: already exists (use overwrite to replace it)",
                                 params=("overwrite",))


def check_writable(path: Path, *, folder: bool, option: str = "--out") -> None:
    """:func:`attnscope.data.io.check_writable` naming the command's ``option``."""
    check(path, folder=folder, name=option)
