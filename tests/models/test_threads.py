"""The fair share of a shared machine (``attnscope.models.threads``): what the command line sets
before torch starts, and the busy cores read from ``/proc/stat``."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from attnscope.models import threads


@pytest.fixture
def clean_env(monkeypatch):
    for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "MKL_NUM_THREADS", threads.SWITCH):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    return monkeypatch


@pytest.mark.parametrize("busy, expected", [(0.2, None), (0.6, "3"), (1.4, "3"), (2.5, "1"), (3.9, "1")])
def test_torch_gets_the_cores_others_leave_and_idle_threads_sleep(clean_env, busy, expected):
    clean_env.setattr(threads, "busy_elsewhere", lambda cpus, seconds: busy)
    chosen = threads.fair_share()
    assert chosen["OMP_WAIT_POLICY"] == os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert chosen.get("OMP_NUM_THREADS") == os.environ.get("OMP_NUM_THREADS") == expected
    assert chosen.get("MKL_NUM_THREADS") == expected


def test_what_the_user_chose_is_kept(clean_env):
    clean_env.setattr(threads, "busy_elsewhere", lambda cpus, seconds: 3.0)
    clean_env.setenv("OMP_NUM_THREADS", "4")
    clean_env.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert threads.fair_share() == {}
    assert (os.environ["OMP_NUM_THREADS"], os.environ["OMP_WAIT_POLICY"]) == ("4", "ACTIVE")
    clean_env.delenv("OMP_NUM_THREADS")
    clean_env.delenv("OMP_WAIT_POLICY")
    clean_env.setenv(threads.SWITCH, "0")
    assert threads.fair_share() == {} and "OMP_NUM_THREADS" not in os.environ


@pytest.mark.skipif(not os.path.exists("/proc/stat") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two cores")
def test_a_cpu_bound_process_reads_as_about_one_busy_core():
    """Measured, not assumed: with one spinning process on the machine, the CPUs read about one
    core busier than without it (other jobs on the machine add the same to both readings)."""
    cpus = os.sched_getaffinity(0)
    before = threads.busy_elsewhere(cpus, 0.5)
    hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
    try:
        time.sleep(0.3)
        during = threads.busy_elsewhere(cpus, 0.5)
    finally:
        hog.kill()
        hog.wait()
    assert 0.6 <= during - before <= 1.4 or during >= len(cpus) - 0.4, (before, during)
