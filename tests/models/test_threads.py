"""The fair share of a shared machine (``attnscope.models.threads``): what the command line sets
before torch starts, and the busy cores read from ``/proc/stat``."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from attnscope import progress
from attnscope.models import threads


@pytest.fixture
def clean_env(monkeypatch):
    for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "MKL_NUM_THREADS", threads.SWITCH):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(progress, "_AT_UNIT", [])  # what fair_share registers stays in the test
    return monkeypatch


@pytest.mark.parametrize("busy, expected", [(0.2, None), (0.6, "3"), (1.4, "3"), (2.5, "1"), (3.9, "1")])
def test_torch_gets_the_cores_others_leave_and_idle_threads_sleep(clean_env, busy, expected):
    clean_env.setattr(threads, "busy_elsewhere", lambda cpus, seconds: busy)
    chosen = threads.fair_share()
    assert chosen["OMP_WAIT_POLICY"] == os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert chosen.get("OMP_NUM_THREADS") == os.environ.get("OMP_NUM_THREADS") == expected
    assert chosen.get("MKL_NUM_THREADS") == expected
    assert [type(fn) for fn in progress._AT_UNIT] == [threads.Refit]  # and refit as the run goes


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
    assert progress._AT_UNIT == []  # nothing refits what the user chose


class FakeTorch:
    def __init__(self, threads: int):
        self.threads, self.set = threads, []

    def get_num_threads(self) -> int:
        return self.threads

    def set_num_threads(self, n: int) -> None:
        self.threads = n
        self.set.append(n)


def test_the_threads_are_refit_to_the_cores_others_leave_as_the_run_goes(clean_env):
    """4 CPUs at 100 ticks a second. From 0 to 6 s: 3 cores busy, 1 of them this process's own
    (6 CPU seconds), so others keep 2 busy: 2 threads. From 6 to 12 s: only this process's own
    core busy: all 4. Calls less than 5 s after the last measure read nothing; an unreadable
    /proc/stat changes nothing."""
    now, own, ticks = [0.0], [0.0], [(0, 0)]
    clean_env.setattr(threads, "_cpu_ticks", lambda cpus: ticks.pop(0))
    torch = FakeTorch(4)
    clean_env.setitem(sys.modules, "torch", torch)
    refit = threads.Refit({0, 1, 2, 3}, every_s=5.0, clock=lambda: now[0], own=lambda: own[0])
    progress.at_each_unit(refit)
    for t, cpu_s, reading, threads_after in ((2, 2, None, 4), (6, 6, (1800, 2400), 2), (9, 9, None, 2),
                                             (12, 12, (2400, 4800), 4), (20, 20, None, 4)):
        now[0], own[0] = t, cpu_s
        if reading is not None or t == 20:
            ticks.append(reading)
        progress.check_stop()  # every finished unit runs the refit
        assert torch.threads == threads_after, t
    assert torch.set == [2, 4] and ticks == []


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
