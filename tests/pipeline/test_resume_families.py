"""``attnscope run --resume`` for the general, patterns, attribution and long-context families:
a run killed (SIGKILL) just after a family's checkpoint, then resumed, writes the same
``results.json`` as an uninterrupted run (times and the command line aside). The kill falls
inside the next family, so each family is once resumed from its checkpoint and once run by
the resumed job; attribution, which uses the general family's results, gets them from the
resumed general family (its checkpointed results file) and labels its heads the same."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.pipeline.test_faults_run import _differences, _env, _results

pytestmark = pytest.mark.slow

DEMO = Path(__file__).resolve().parents[2] / "src" / "attnscope" / "demo_data" / "text.txt"
#: The families in the order the job runs them (general before attribution, which uses it).
ORDER = ("general", "patterns", "attribution", "longctx")


def _cmd(out: Path, *extra: str) -> list[str]:
    import sys

    # shared settings and the inputs only: the families' own options keep their defaults
    return [sys.executable, "-m", "attnscope", "run", "--model", "debug:bert", "--out", str(out),
            "--max-seq-len", "64", "--batch-size", "8", "--text", str(DEMO), "--patterns", str(DEMO),
            "--attribution", str(DEMO), "--documents", str(DEMO), "-q", *extra]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("resume-families") / "reference"
    r = subprocess.run(_cmd(out), env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return _results(out)


@pytest.mark.parametrize("after", ORDER[:-1])
def test_killed_after_a_family_then_resumed_equals_the_uninterrupted_run(tmp_path, reference, after):
    expected = reference
    assert set(expected["families"]) == set(ORDER)
    heads = [r for r in expected["results"]["attribution"]["tables"]["attribution_heads"]]
    assert heads and all(r["behaviour"] for r in heads)  # labelled from the general family
    out = tmp_path / "run"
    proc = subprocess.Popen(_cmd(out), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not (out / "run" / f"{after}.json").exists():
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    done = {p.stem for p in (out / "run").glob("*.json")} - {"state"}
    assert after in done and not set(ORDER[ORDER.index(after) + 1:]) <= done  # killed mid-job
    r = subprocess.run(_cmd(out, "--resume"), env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    status = json.loads((out / "results.json").read_text())["provenance"]["status"]
    assert {k for k, v in status.items() if v == "resumed"} == done
    got = _results(out)
    assert got == expected, _differences(got, expected)[:10]
