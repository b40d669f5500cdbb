"""Faults during ``attnscope run``: kill -9 at seeded moments spread over the whole run (every
family and the report step), then ``--resume``; and a full disk (a small tmpfs: needs root and
mount, else skipped with the reason).

After every kill nothing in the folder is corrupt (every JSON file parses), and the resumed
``results.json`` equals an uninterrupted run's, times and the command line aside.

``ATTNSCOPE_FAULT_KILLS`` sets the number of kill points (default 5, one per phase; 10 or more
for a full check). Kill ``k`` falls at a seeded random moment of phase ``k % 5``: anywhere in the
run, inside syntax, inside coref, inside the report step (just after the last checkpoint), and
anywhere again.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.extract.test_faults_extract import _mount_tmpfs

SRC = Path(__file__).resolve().parents[2] / "src"
KILLS = int(os.environ.get("ATTNSCOPE_FAULT_KILLS", "5"))
#: Keys whose values are times, the command line or whether a family was resumed: they differ
#: between any two runs, or between a resumed run and an uninterrupted one.
VOLATILE = {"elapsed_s", "analysis_time_s", "family_times_s", "started", "finished", "command",
            "seconds", "seconds_per_epoch", "analysis_seconds", "status"}


def _differences(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in (
            _differences(a.get(k), b.get(k), f"{path}.{k}") if k in a and k in b else [f"{path}.{k}"])]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]

pytestmark = pytest.mark.slow

#: Where kill ``k`` falls: anywhere (None), or soon after this file appears, i.e. inside the next
#: family (general -> syntax -> coref) or, after the last checkpoint, the report step.
PHASES = (None, "run/general.json", "run/syntax.json", "run/coref.json", None)


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
                OMP_NUM_THREADS="1")


def _cmd(out: Path, *extra: str) -> list[str]:
    from attnscope.pipeline import demo_inputs

    d = demo_inputs()
    return [sys.executable, "-m", "attnscope", "run", "--model", "debug:bert", "--out", str(out),
            "--text", str(d["text"]), "--deps", str(d["deps"]), "--deps-train", str(d["deps_train"]),
            "--coref", str(d["coref"]), "--syntax-epochs", "2", "--coref-n-boot", "200", "-q", *extra]


def _stable(x):
    if isinstance(x, dict):
        return {k: _stable(v) for k, v in x.items() if k not in VOLATILE}
    if isinstance(x, list):
        return [_stable(v) for v in x]
    return x


def _results(out: Path) -> dict:
    return _stable(json.loads((out / "results.json").read_text(encoding="utf-8")))


def assert_nothing_corrupt(out: Path) -> None:
    """Every JSON file a killed run leaves parses (all are written atomically)."""
    for p in out.rglob("*.json"):
        json.loads(p.read_text(encoding="utf-8"))


@pytest.mark.parametrize("k", range(KILLS))
def test_kill_9_then_resume_gives_the_same_results(tmp_path, uninterrupted_run, k):
    expected, seconds = uninterrupted_run
    rng = random.Random(2000 + k)
    out = tmp_path / "run"
    proc = subprocess.Popen(_cmd(out), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = PHASES[k % len(PHASES)]
    if after is None:  # a random moment of the whole run, start-up included
        time.sleep(rng.uniform(0.0, seconds))
    else:  # a random moment soon after a family's checkpoint: inside the next family or the report
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None and not (out / after).exists():
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.4))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    done = sorted(p.stem for p in (out / "run").glob("*.json") if p.stem != "state")
    print(f"kill {k}: families finished {done or 'none'}; report {'written' if (out / 'report.html').exists() else 'not yet'}")
    assert_nothing_corrupt(out)
    args = ["--resume"] if (out / "run" / "state.json").exists() else []
    r = subprocess.run(_cmd(out, *args), env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    got = _results(out)
    assert got == expected, _differences(got, expected)[:10]
    assert not list(out.glob("attnscope-syntax-*"))  # no temporary maps left behind


def test_full_disk_stops_with_one_line_then_resumes(tmp_path, uninterrupted_run):
    expected, _ = uninterrupted_run
    disk = tmp_path / "disk"
    reason = _mount_tmpfs(disk, "600k")  # the run writes a few MB: it cannot finish
    if reason:
        pytest.skip(reason)
    try:
        out = disk / "run"
        r = subprocess.run(_cmd(out), env=_env(), capture_output=True, text=True, timeout=600)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert lines[0].startswith(f"error: {out}") and "no space left on device" in lines[0]
        assert "--resume" in lines[0]
        assert_nothing_corrupt(out)
        # space is back: the same folder, grown, keeps what was written; --resume finishes it
        r = subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        r = subprocess.run(_cmd(out, "--resume"), env=_env(), capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        assert _results(out) == expected
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
