"""Progress when stderr is not a terminal (a log file, a pipe): plain lines now and then."""

from __future__ import annotations

from attnscope.cli.common import plain_progress, step_progress


def test_plain_progress_writes_a_line_every_so_often(capsys):
    now = [100.0]
    progress = plain_progress(every_s=30, clock=lambda: now[0])
    for t, step, done in ((100, "longctx", 0), (110, "longctx", 1), (131, "longctx", 2), (140, "longctx", 3),
                          (145, "syntax: probes epoch 1", 4), (150, "longctx", 4), (161, "longctx", 5)):
        now[0] = t
        progress(step, done, 60 if step == "longctx" else None)
    # 31 s after the start, then 30 s after that line; another family counts from the start
    assert capsys.readouterr().err.splitlines() == [
        "longctx: 2/60 after 31 s", "syntax: probes epoch 1: 4 after 45 s", "longctx: 5/60 after 61 s"]


def test_step_progress_off_a_terminal_is_plain_and_silent_for_short_runs(capsys):
    with step_progress(quiet=False, overall=True) as progress:  # pytest's stderr is not a terminal
        progress("longctx", 1, 2)
    assert progress.__qualname__.startswith("plain_progress") and capsys.readouterr().err == ""
