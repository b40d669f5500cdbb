"""benchmarks/gpu_session.sh's plumbing on the CPU (SHAPE=tiny DEVICE=cpu): every measurement is one
JSON line in $OUT/rows.jsonl, written as it is measured, and a step stopped by its `timeout` keeps
the rows it had. The harness comes from ../shared/gpu (model config, tokenizer, make_weights.py; no
wheels, so nothing is installed); the tiny weights it makes are kept in pytest's cache folder."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT.parent / "shared" / "gpu"
SCRIPT = ROOT / "benchmarks" / "gpu_session.sh"
MODES = ["sdpa", "streaming-onepass", "streaming"]
PRESS = ["load", "sdpa", "calibrate-torch", "rows-torch", "calibrate-fused", "rows-fused", "difference"]


def session_env(out: Path, gpu: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # onepass: a skipped row
    return {**env, "OUT": str(out), "GPU_DIR": str(gpu), "SHAPE": "tiny", "DEVICE": "cpu", **extra}


@pytest.fixture
def gpu_dir(request) -> Path:
    if not (HARNESS / "make_weights.py").is_file() or not (ROOT.parent / "shared" / "data" / "wikitext-2").is_dir():
        pytest.skip("../shared/gpu or ../shared/data/wikitext-2 is absent")
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    gpu = Path(cache.mkdir("gpu-session") if cache is not None else request.getfixturevalue("tmp_path"))
    if not (gpu / "llama1b" / "config.json").is_file():
        shutil.copytree(HARNESS / "llama1b", gpu / "llama1b", dirs_exist_ok=True)
        shutil.copy(HARNESS / "make_weights.py", gpu)
    return gpu


def _stop_when(proc: subprocess.Popen, rows: Path, done, limit_s: float = 300) -> None:
    """Fire the step's own time limit (SIGALRM to its `timeout`, which then stops the step and exits
    124, as when its clock runs out) once ``done(rows so far)``: a stop that follows the rows
    written, not how fast this machine is."""
    import psutil

    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < limit_s:
        lines = rows.read_text().splitlines() if rows.is_file() else []
        if done([json.loads(line) for line in lines if line.endswith("}")]):
            for child in psutil.Process(proc.pid).children(recursive=True):
                if child.name() == "timeout":
                    child.send_signal(signal.SIGALRM)
            return
        time.sleep(0.02)


@pytest.mark.heavy
def test_rows_are_written_as_measured_and_a_stopped_step_keeps_its_rows(tmp_path, gpu_dir):
    # the 8b step's limit (its `timeout`) fires as soon as its rows at 256 tokens are written, inside
    # its second length (16k tokens: sdpa, four runs, then the streaming engine)
    env = session_env(tmp_path, gpu_dir, LENGTHS="256", LENGTHS_8B="256 16384", T_8B="600",
                      T_PRESS="120", PRESS_LENGTH="256", PRESS_ROWS="2", MODES=" ".join(MODES))
    proc = subprocess.Popen(["bash", str(SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    _stop_when(proc, tmp_path / "rows.jsonl", lambda rows: any(
        r["model"] == "llamatiny-bf16" and r["mode"] == MODES[-1] and r.get("length") == 256 for r in rows))
    stdout, stderr = proc.communicate(timeout=400)
    p = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert p.returncode == 0, p.stderr
    lines = (tmp_path / "rows.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [ln for ln in p.stdout.splitlines() if ln.startswith("{")] == lines  # echoed as written
    assert [r["at"] for r in rows] == sorted(r["at"] for r in rows)
    assert "== pip: no wheels" in p.stdout and "== 1b: exit 0" in p.stdout
    assert "== 8b: exit 124 (stopped by its time limit)" in p.stdout
    for r in rows:
        assert {"script", "model", "device", "dtype", "mode", "at"} <= r.keys() and r["device"] == "cpu"
        if "times_s" in r:
            assert len(r["times_s"]) == 3 and r["wall_s"] == min(r["times_s"]) and r["warmup_s"] > 0

    small = [r for r in rows if r["model"] == "llamatiny" and r["script"] == "longctx"]
    assert [r["mode"] for r in small] == ["load", *MODES]
    assert small[2]["skipped"].startswith("the one-pass kernel needs CUDA")
    assert small[3]["backend"] == "compiled" and small[3]["attention_dtype"] == "bfloat16"
    # the ratio of the unrounded walls; the rows keep each wall to 3 decimals
    w, sd = small[3]["wall_s"], small[1]["wall_s"]
    assert round((w - 5e-4) / (sd + 5e-4), 2) <= small[3]["over_sdpa_wall"] <= round((w + 5e-4) / (sd - 5e-4), 2)

    stopped = [r for r in rows if r["model"] == "llamatiny-bf16"]
    assert [(r["mode"], r.get("length")) for r in stopped][:4] == [("load", None), *[(m, 256) for m in MODES]]
    assert all("times_s" in r or "skipped" in r for r in stopped[1:])  # whole rows only
    assert not any(r.get("length") == 16384 and r["mode"] == "streaming" for r in stopped)

    assert [r["mode"] for r in rows if r["script"] == "press"] == PRESS
    for step in ("weights-1b", "1b", "weights-8b", "8b", "press"):
        assert (tmp_path / f"{step}.log").is_file() or f"== {step}: made before" in p.stdout


@pytest.mark.parametrize("env, message", [
    ({"SHAPE": "13b"}, "SHAPE must be 1b or tiny, not '13b'"),
    ({"DEVICE": "tpu"}, "DEVICE must be cuda or cpu, not 'tpu'"),
    ({"GPU_DIR": "/nonexistent"}, "no /nonexistent/make_weights.py"),
])
def test_bad_settings_give_one_line_and_exit_2(tmp_path, env, message):
    p = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True,
                       env={**os.environ, "OUT": str(tmp_path), **env}, timeout=60)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and message in p.stderr


@pytest.mark.parametrize("args, message", [
    (["--compare", "flex", "onepass"], "--jsonl measures --modes in one process; it does not take --compare"),
    (["--modes", "sdpa", "streaming-torch"], "--jsonl: streaming-torch needs a process of its own"),
    (["--repeat", "0"], "--repeat must be at least 1, not 0"),
])
def test_longctx_jsonl_refusals(tmp_path, args, message):
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "longctx.py"), "--jsonl", str(tmp_path / "r"),
                        *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and message in p.stderr
    assert not (tmp_path / "r").exists()
