"""Faults during ``attnscope extract``: kill -9 at seeded random moments, then ``--resume``; and
a full disk (a small tmpfs: needs root and mount, else skipped with the reason).

After every kill the folder holds nothing corrupt (every shard on disk reads back), and the
resumed store equals an uninterrupted one: every shard and index.json byte for byte, the
manifest except the recorded command line (the resumed one says ``--resume``).

``ATTNSCOPE_FAULT_KILLS`` sets the number of kill points (default 1; e.g. 12 for a full run).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
KILLS = int(os.environ.get("ATTNSCOPE_FAULT_KILLS", "1"))
TEXTS = [f"example {i}: the {'quick ' * (i % 7)}brown fox number {i} jumps over the lazy dog"
         for i in range(48)]


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
                OMP_NUM_THREADS="1")


def _cmd(inp: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "attnscope", "extract", str(inp), "--model", "debug", "--out",
            str(out), "--shard-size", "3", "--batch-size", "3", "-q", *extra]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    p = tmp_path_factory.mktemp("faults") / "in.jsonl"
    p.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    return p


@pytest.fixture(scope="module")
def reference(inputs):
    out = inputs.parent / "reference"
    t0 = time.perf_counter()
    r = subprocess.run(_cmd(inputs, out), env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out, time.perf_counter() - t0


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same_store(got: Path, ref: Path) -> None:
    a, b = _files(got), _files(ref)
    assert sorted(a) == sorted(b)
    for name in a:
        if name == "manifest.json":
            ma, mb = json.loads(a[name]), json.loads(b[name])
            ma.pop("command"), mb.pop("command")
            assert ma == mb
        else:
            assert a[name] == b[name], name


def assert_nothing_corrupt(root: Path) -> None:
    """What a killed run leaves reads back: the manifest, every shard; or only leftovers."""
    from attnscope.store import open_store

    if not (root / "manifest.json").exists():
        return  # killed before the manifest: resume starts afresh
    store = open_store(root)
    assert not store.complete or (root / "index.json").exists()
    for batch in store.batches():  # every whole shard on disk reads back
        for m in batch:
            assert m.attn.shape[2] == len(m.tokens)


@pytest.mark.parametrize("k", range(KILLS))
@pytest.mark.heavy
def test_kill_9_then_resume_gives_the_same_store(tmp_path, inputs, reference, k):
    ref, ref_seconds = reference
    rng = random.Random(1000 + k)
    out = tmp_path / "s"
    proc = subprocess.Popen(_cmd(inputs, out), env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    if k % 2 == 0:  # a random moment of the run (start-up included)
        time.sleep(rng.uniform(0.0, ref_seconds))
    else:  # a random moment after a random number of shards is on disk
        want = rng.randrange(0, len(TEXTS) // 3)
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if len(list((out / "shards").glob("*.safetensors"))) >= want if (out / "shards").exists() else False:
                break
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.05))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert_nothing_corrupt(out)
    r = subprocess.run(_cmd(inputs, out, "--resume"), env=_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert_same_store(out, ref)


def _mount_tmpfs(folder: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` on ``folder``; the reason when that is not possible."""
    if shutil.which("mount") is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root and mount(8) for a size-limited tmpfs"
    folder.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                       capture_output=True, text=True)
    return None if r.returncode == 0 else f"mount refused: {r.stderr.strip()}"


@pytest.mark.heavy
def test_full_disk_stops_with_one_line_then_resumes(tmp_path, inputs, reference):
    ref, _ = reference
    size = sum(len(v) for v in _files(ref).values())
    disk = tmp_path / "disk"
    reason = _mount_tmpfs(disk, f"{max(64, size // 2 // 1024)}k")  # about half the store fits
    if reason:
        pytest.skip(reason)
    try:
        out = disk / "s"
        r = subprocess.run(_cmd(inputs, out), env=_env(), capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr
        assert lines[0].startswith(f"error: {out}: cannot write ") and "no space left on device" in lines[0]
        assert "--resume" in lines[0]
        # nothing corrupt: no temporary files, and every shard on disk reads back
        assert not [p for p in out.rglob(".*.tmp")]
        assert_nothing_corrupt(out)
        assert list((out / "shards").glob("*.safetensors")), "no finished shard was kept"
        # space is back
        subprocess.run(["mount", "-o", f"remount,size={4 * size // 1024 + 1024}k", str(disk)], check=True)
        r = subprocess.run(_cmd(inputs, out, "--resume"), env=_env(), capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        assert_same_store(out, ref)
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
