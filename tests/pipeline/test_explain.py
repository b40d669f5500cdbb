"""``--explain``: how a family's pass would run (its engine plan, every backend with why), printed
before anything runs; nothing is written. ``attnscope check`` prints the same plan."""

from __future__ import annotations

import json

from conftest import says

from attnscope.cli.main import main

DOCS = "The cat sat on the mat. It was warm and the dog slept.\n\nA second document of a few words.\n"


def test_explain_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "docs.txt").write_text(DOCS)
    out = tmp_path / "out"
    argv = ["analyze", "longctx", str(tmp_path / "docs.txt"), "--model", "debug:gpt_oss", "--out", str(out),
            "--explain", "--longctx-engine", "streaming"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["engine: streaming (asked for)", "backend: tiles"]
    why = dict(line.strip().split(": ", 1) for line in lines[2:7])
    assert why["compiled"] == "declined, does not compute this model's sinks"
    assert why["maps"] == "declined, the streaming engine was asked for"
    assert why["tiles"] == "chosen, takes every input, the last resort"
    assert not out.exists()
    # auto on tiny documents: their maps fit the budget, so the reference folds them
    assert main(argv[:-2]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    says(first, "engine: maps", "GB, the budget 2 GB")
    # general: the line the run would print
    (tmp_path / "text.txt").write_text("the cat sat.\nthe dog ran.\n")
    assert main(["analyze", "general", str(tmp_path / "text.txt"), "--model", "debug:llama", "--out", str(out),
                 "--explain", "--general-engine", "streaming"]) == 0
    says(capsys.readouterr().out, "Engine: streaming (forced", "no n x n maps")
    assert not out.exists()


def test_check_prints_and_records_the_long_context_plan(capsys):
    assert main(["check", "debug:gpt_oss", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    plan = report["plan"]
    assert plan["engine"] == "maps" and plan["mechanisms"] == sorted(plan["mechanisms"])
    assert {"sinks"} <= set(plan["mechanisms"]) and len(plan["backends"]) == 5
    assert main(["check", "debug:luke"]) == 0  # maps only: the plan is refused with its reason
    says(capsys.readouterr().out, "analyze longctx: refused", "AttentionInterface")


def test_run_explain_prints_each_familys_plan_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "docs.txt").write_text(DOCS)
    out = tmp_path / "out"
    assert main(["run", "--model", "debug:llama", "--text", str(tmp_path / "docs.txt"), "--documents",
                 str(tmp_path / "docs.txt"), "--out", str(out), "--explain", "--longctx-backend", "tiles"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("general: Engine: maps (chosen: ")
    assert "longctx: engine: streaming (backend tiles asked for, which only it takes)" in lines
    assert "longctx: backend: tiles" in lines and "longctx:   tiles: chosen, the one asked for" in lines
    assert not out.exists()
