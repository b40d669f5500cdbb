"""Progress when stderr is not a terminal (a log file, a pipe): plain lines now and then, each
count with its unit, and a last line for every count shown, so the totals are seen reached."""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

import pytest
from conftest import says

from attnscope.cli.common import plain_progress, step_progress
from attnscope.progress import Step

LINE = re.compile(r"^(?P<step>.+?): (?:(?P<once>started|done)|(?P<done>\d+)(?:/(?P<total>\d+))? "
                  r"(?P<unit>[a-z][a-z ()]*)) after (?P<s>\d+) s(?:, about (?P<left>[\d.]+ (?:s|min|h)) left)?$")


def test_plain_progress_writes_a_line_every_so_often_and_one_when_a_total_is_reached(capsys):
    now = [100.0]
    progress = plain_progress(every_s=30, clock=lambda: now[0])
    docs, epoch = Step("longctx: statistics", "documents"), Step("syntax: probes epoch 1", "sentences")
    for t, step, done, total in ((100, docs, 0, 60), (110, docs, 1, 60), (131, docs, 2, 60), (140, docs, 3, 60),
                                 (145, epoch, 4, 9), (150, docs, 4, 60), (161, docs, 5, 60),
                                 (170, docs, 60, 60), (171, epoch, 9, 9), (172, "report", 0, 1),
                                 (210, "report", 1, 1)):
        now[0] = t
        progress(step, done, total)
    # 31 s after the start, then 30 s after that line; another family counts from the start;
    # a count shown reaches its total on a line of its own, however soon; a step done once
    # (the report) that took long enough to be shown says when it is done
    # each line: the step, its count out of the total with the unit, the seconds since the start;
    # on its way, the time left at the step's rate since its first report: 58 documents at 2 in
    # 31 s is 899 s (15 min), 55 at 5 in 61 s is 671 s (11 min); none at the first report
    # (no rate yet: the epoch's line) or at a total
    lines = capsys.readouterr().err.splitlines()
    shown = [("longctx: statistics", "2/60", "documents", "31 s", "15 min"),
             ("syntax: probes epoch 1", "4/9", "sentences", "45 s", None),
             ("longctx: statistics", "5/60", "documents", "61 s", "11 min"),
             ("longctx: statistics", "60/60", "documents", "70 s", None),
             ("syntax: probes epoch 1", "9/9", "sentences", "71 s", None),
             ("report", "started", "72 s", None), ("report", "done", "110 s", None)]
    assert len(lines) == len(shown), lines
    for line, facts in zip(lines, shown):
        assert line.startswith(f"{facts[0]}: "), line
        says(line, *facts[:-1])
        assert LINE.match(line)["left"] == facts[-1], line


def test_the_time_left_is_not_taken_from_units_a_resumed_run_read_back(capsys):
    """A resumed atlas said "6/8 tasks after 30 s, about 9 s left": its 5 logged tasks, counted at
    once, were taken for work. What a step counts within a second of its first report is not:
    1 task in the 30 s after that second leaves 2 at 30 s each, 60 s."""
    now = [0.0]
    progress = plain_progress(every_s=30, clock=lambda: now[0])
    step = Step("atlas: calibration", "tasks")
    for t, done in ((0.0, 0), (0.1, 1), (0.2, 3), (0.3, 5), (30.0, 6), (70.0, 8)):
        now[0] = t
        progress(step, done, 8)
    lines = capsys.readouterr().err.splitlines()
    assert [LINE.match(line)["left"] for line in lines] == ["60 s", None], lines
    says(lines[0], "6/8", "tasks", "30 s")


def test_a_step_never_shown_prints_nothing_when_it_ends(capsys):
    now = [0.0]
    progress = plain_progress(every_s=30, clock=lambda: now[0])
    for t, done in ((1, 1), (2, 2), (3, 3)):
        now[0] = t
        progress(Step("general: general", "examples"), done, 3)
    assert capsys.readouterr().err == ""


def test_step_progress_off_a_terminal_is_plain_and_silent_for_short_runs(capsys):
    with step_progress(quiet=False, overall=True) as progress:  # pytest's stderr is not a terminal
        progress("longctx", 1, 2)
    assert progress.__qualname__.startswith("plain_progress") and capsys.readouterr().err == ""


def _sentences(path: Path) -> int:
    return len([b for b in path.read_text(encoding="utf-8").split("\n\n") if b.strip()])


@pytest.mark.heavy
def test_a_run_without_a_terminal_reaches_every_total_it_shows(tmp_path, capsys, monkeypatch):
    """`run` off a terminal printed "overall: 4/86 after 32 s" and ended there, "report: 0/1",
    and "syntax: probes epoch 8: 3" (no total, no unit). With a line for every call (every_s
    0), each count names its unit, the last line of each step reaches its total, and the totals
    are the inputs' sizes counted here."""
    import json

    import attnscope.cli.common as common
    from attnscope.cli.main import main

    monkeypatch.setattr(common, "PLAIN_EVERY_S", 0.0)
    demo = Path(str(files("attnscope") / "demo_data"))
    dev, train = demo / "deps-dev.conllu", demo / "deps-train.conllu"
    out = tmp_path / "out"
    code = main(["run", "--model", "debug:bert", "--out", str(out), "--text", str(demo / "text.txt"),
                 "--general-gradients", "off", "--deps", str(dev), "--deps-train", str(train),
                 "--syntax-epochs", "2"])
    err = capsys.readouterr().err.splitlines()
    assert code == 0, err
    progress = [m.groupdict() for m in map(LINE.match, err) if m]
    assert len(progress) > 10
    last: dict[str, dict] = {}
    for p in progress:
        assert p["once"] or (p["unit"] and p["total"]), p  # every count has a total and a unit
        last[p["step"]] = p
    for step, p in last.items():
        assert p["once"] == "done" or p["done"] == p["total"], (step, p)
    assert last["report"]["once"] == "done" and last["load model"]["once"] == "done"
    assert last["overall"]["unit"] == "s"  # the overall clock counts seconds
    counts = json.loads((out / "results.json").read_text())["provenance"]["counts"]
    assert int(last["general: maps and statistics"]["total"]) == counts["text examples"]
    assert int(last["syntax: score heads (dev)"]["total"]) == _sentences(dev)
    for epoch in (1, 2):
        assert int(last[f"syntax: probes epoch {epoch}"]["total"]) == _sentences(train)
        assert last[f"syntax: probes epoch {epoch}"]["unit"] == "sentences"
