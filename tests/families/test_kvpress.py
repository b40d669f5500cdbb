"""The seam with kvpress: its ``DuoAttentionPress``, given what an atlas exported (``kvpress/``),
generates the answers the atlas's sweep measured, task by task and fraction by fraction.

kvpress 0.5.5 needs transformers < 5.3 and attnscope >= 5.24, so kvpress runs in its own
environment (``interop/kvpress/``): a venv over the system's packages (its CPU torch) built once
from ``requirements.txt`` into attnscope's cache folder, ``kvpress-<sha256 of the file>``, and
reused while it holds the pinned versions. The test skips, with the reason, where that
environment cannot be built (no network, pip fails) or the model or the corpora are absent.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EPS32

ROOT = Path(__file__).resolve().parents[2]
INTEROP = ROOT / "interop" / "kvpress"
REQUIREMENTS = INTEROP / "requirements.txt"
DONE = "attnscope-complete"  # written last into a finished environment
#: both ends and the middle (each fraction is 6 answers by attnscope's sweep and 6 by kvpress)
FRACTIONS = ("0", "0.5", "1")


def _pins() -> dict[str, str]:
    pins = {}
    for line in REQUIREMENTS.read_text().splitlines():
        name, sep, ver = line.split("#")[0].strip().partition("==")
        if sep:
            pins[name.lower()] = ver
    return pins


def _env_versions(python: Path) -> dict[str, str] | None:
    """kvpress's, transformers' and torch's versions as ``python`` sees them (None: broken)."""
    code = ("import json; from importlib.metadata import version; "
            "print(json.dumps({n: version(n) for n in ('kvpress', 'transformers', 'torch')}))")
    try:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
    except OSError:
        return None
    return json.loads(out.stdout) if out.returncode == 0 else None


def _valid(env: Path) -> bool:
    """A finished environment with the pinned kvpress and transformers over this process's
    (system) torch, never a torch of its own."""
    import torch

    got = (env / DONE).is_file() and _env_versions(env / "bin" / "python")
    pins = _pins()
    return bool(got) and got["kvpress"] == pins["kvpress"] and got["transformers"] == pins["transformers"] \
        and got["torch"] == torch.__version__


@pytest.fixture(scope="session")
def kvpress_python() -> Path:
    """The python of kvpress's environment, built on first use (about 15 s with a warm pip
    cache) under a lock, so that two sessions never build it at once."""
    from attnscope.models.cache import cache_root

    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    env = root / f"kvpress-{digest}"
    with open(root / f"kvpress-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _valid(env):
            shutil.rmtree(env, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(env)], check=True)
            try:
                pip = subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "--quiet",
                                      "--disable-pip-version-check", "-r", str(REQUIREMENTS)],
                                     capture_output=True, text=True, timeout=900)
            except subprocess.TimeoutExpired:
                pip = None
            if pip is None or pip.returncode != 0:
                shutil.rmtree(env, ignore_errors=True)
                why = "timed out" if pip is None else (pip.stderr.strip().splitlines() or ["no output"])[-1]
                pytest.skip(f"kvpress's environment (pip install -r {REQUIREMENTS.relative_to(ROOT)}) "
                            f"could not be built: {why}")
            (env / DONE).write_text(REQUIREMENTS.read_text())
            if not _valid(env):
                pytest.fail(f"{env}: built, but not kvpress {_pins()['kvpress']} with transformers "
                            f"{_pins()['transformers']} over the system's torch: {_env_versions(env / 'bin' / 'python')}")
    return env / "bin" / "python"


@pytest.fixture(scope="module")
def atlas_out(tmp_path_factory, smollm2, shared_data):
    """A small smollm2 atlas: 6 tasks of 512 tokens, 3 calibration tasks, three fractions."""
    from attnscope.pipeline import run_family

    out = tmp_path_factory.mktemp("atlas-kvpress")
    run_family("atlas", {"atlas": shared_data / "wikitext-2" / "valid.sentences.txt"}, out, model=smollm2,
               max_seq_len=512, atlas_tasks=6, atlas_calibration=3, atlas_fractions=",".join(FRACTIONS),
               atlas_random=0, atlas_probes=0, atlas_bootstrap=100)
    return out


@pytest.mark.slow
def test_kvpress_with_the_exported_pattern_answers_as_the_sweep(kvpress_python, smollm2_file, atlas_out):
    import torch

    cmd = [str(kvpress_python), str(INTEROP / "apply_pattern.py"), str(atlas_out), "--gguf", str(smollm2_file),
           "--threads", str(torch.get_num_threads()), "--output", str(atlas_out / "replay")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads((atlas_out / "replay.json").read_text())
    pins = _pins()
    assert (got["versions"]["kvpress"], got["versions"]["transformers"]) == (pins["kvpress"], pins["transformers"])
    results = json.loads((atlas_out / "results" / "atlas.json").read_text())
    cfg = json.loads((atlas_out / "kvpress" / "config.json").read_text())
    order = results["meta"]["rankings"][results["meta"]["exported"]]
    assert list(got["summary"]) == list(FRACTIONS)
    for f, s in got["summary"].items():
        # kvpress's own streaming heads are the ranking's bottom heads at every fraction
        m = cfg["fractions"][f]["kv_heads_kept"]
        assert s["kvpress_streaming_heads"] == sorted(order[m:]), f
        assert s["tasks"] == 6
    rows = got["rows"]
    assert len(rows) == 6 * len(FRACTIONS)
    for r in rows:
        assert r["kv_heads_kept"] == r["attnscope_kv_heads_kept"]
        # kvpress's compression ratio (computed in float32) is the share of entries the sweep removed
        assert r["kvpress_compression_ratio"] == pytest.approx(1 - r["attnscope_kv_entries_kept"], abs=EPS32)  # one float32 rounding of a share <= 1
    differ = [(r["task"], r["fraction"], r["kvpress_answer"], r["attnscope_answer"]) for r in rows
              if not r["same_answer"]]
    assert not differ, f"{len(differ)} of {len(rows)} answers differ: {differ}"
    assert all(r["same_correct"] for r in rows)
    # not vacuous: the press changes answers (all streaming answers differently from the whole cache)
    by = {(r["task"], r["fraction"]): r["kvpress_answer"] for r in rows}
    assert any(by[(t, "0")] != by[(t, "1")] for t in range(6))
