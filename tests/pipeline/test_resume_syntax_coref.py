"""``attnscope run --resume`` after a kill -9 inside the syntax family, inside the coref family,
and just after coref's checkpoint: the resumed ``results.json`` equals an uninterrupted run's
(times and the command line aside; the same run and fixtures as ``test_faults_run.py``), the
families finished before the kill are read back from their checkpoints ("resumed") and the
interrupted one runs again ("done").
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.pipeline.test_faults_run import (
    _cmd,
    _differences,
    _env,
    _results,
    assert_nothing_corrupt,
)

pytestmark = pytest.mark.slow


def _kill_when(out: Path, ready) -> None:
    """Start the run in ``out`` and kill -9 it as soon as ``ready()`` holds."""
    proc = subprocess.Popen(_cmd(out), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not ready():
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before the moment to kill it"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


#: where the kill falls -> what must (not) be there after it -> each family's status on resume
CASES = {
    "inside syntax": (lambda out: (out / "run" / "syntax-maps").is_dir(), ("general",), "syntax",
                      {"general": "resumed", "syntax": "done", "coref": "done"}),
    "inside coref": (lambda out: (out / "run" / "syntax.json").exists(), ("general", "syntax"), "coref",
                     {"general": "resumed", "syntax": "resumed", "coref": "done"}),
    "after coref": (lambda out: (out / "run" / "coref.json").exists(), ("general", "syntax", "coref"),
                    None, {"general": "resumed", "syntax": "resumed", "coref": "resumed"}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.heavy
def test_a_run_killed_in_or_after_a_family_resumes_to_the_same_results(tmp_path, uninterrupted_run, case):
    ready, finished, unfinished, status = CASES[case]
    expected, _ = uninterrupted_run
    out = tmp_path / "run"
    _kill_when(out, lambda: ready(out))
    assert_nothing_corrupt(out)
    assert sorted(p.stem for p in (out / "run").glob("*.json") if p.stem != "state") == sorted(finished)
    if unfinished is not None:  # killed inside it: no results of it yet, and no report
        assert not (out / "results" / f"{unfinished}.json").exists() and not (out / "results.json").exists()
    r = subprocess.run(_cmd(out, "--resume"), env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    got = _results(out)
    assert got == expected, _differences(got, expected)[:10]
    assert json.loads((out / "results.json").read_text(encoding="utf-8"))["provenance"]["status"] == status
    assert not list((out / "run").glob("syntax-*"))  # the killed run's maps in progress are gone


#: Ctrl-C (SIGINT) or SIGTERM at a moment of the syntax family -> the family's work that must
#: be kept when it lands there
STOPS = {
    # a whole shard: the atomic write's temporary file (``.NAME.XXXX.tmp``) is not one yet
    "inside syntax extraction": (signal.SIGINT,
                                 lambda out: any(not p.name.startswith(".") for p in
                                                 (out / "run" / "syntax-maps" / "dev" / "shards").glob("*")),
                                 "extracted shard"),
    "inside probe training": (signal.SIGTERM, lambda out: (out / "run" / "syntax-probes.safetensors").is_file(),
                              "the last finished round of probes"),
}


@pytest.mark.parametrize("case", list(STOPS))
@pytest.mark.heavy
def test_ctrl_c_or_sigterm_says_what_was_kept_and_the_resumed_run_equals_the_uninterrupted_one(
        tmp_path, uninterrupted_run, case):
    """The stop is one line naming the folder, the finished families, what the syntax family kept
    (whole shards of its stores, the probes' last finished epoch) and ``--resume``; exit 130;
    ``state.json`` says interrupted; what was kept is not made again; the resumed run equals the
    uninterrupted one (that what was kept is not made again: ``tests/families/test_syntax_cli.py``)."""
    how, ready, kept = STOPS[case]
    expected, _ = uninterrupted_run
    out = tmp_path / "run"
    proc = subprocess.Popen(_cmd(out), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not ready(out):
        time.sleep(0.005)
    assert proc.poll() is None, "the run ended before the moment to stop it"
    proc.send_signal(how)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and stdout == ""
    line = stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert line.startswith(f"interrupted: {out} keeps general (finished); syntax's ") and kept in line, line
    assert line.endswith("run the same command with --resume to go on from there"), line
    state = json.loads((out / "run" / "state.json").read_text(encoding="utf-8"))
    assert (state["status"], state["finished"], state["running"]) == ("interrupted", ["general"], "syntax")
    assert_nothing_corrupt(out)
    r = subprocess.run(_cmd(out, "--resume"), env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert _results(out) == expected, _differences(_results(out), expected)[:10]
    assert not list((out / "run").glob("syntax-*"))  # kept until the results were written, then removed
