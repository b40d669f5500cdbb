"""A fair share of a shared machine: torch's threads fitted to the cores that are free.

torch runs each operator on as many threads as the machine has cores, and OpenMP's idle
threads spin while they wait for the next parallel region. Beside another CPU-bound job both
hurt: a thread that waits on one the scheduler has parked spins, and the CPU time of a command
grew with its wall time (issue 49: ``extract`` 75 s against 10 s idle on 2 cores with one other
job). So attnscope

- lets idle OpenMP threads sleep (``OMP_WAIT_POLICY=PASSIVE``), and
- gives torch the cores of its affinity mask that other processes are not keeping busy,
  measured over 0.1 s when a command starts (:func:`fair_share`, called by the command line
  before torch is imported, since both are read when torch's OpenMP runtime starts), and
  measures again over every 5 s or more of the run, at the end of a unit of work (a batch, a
  task), refitting torch's threads when the cores free have changed (:class:`Refit`): a
  snapshot of 0.1 s can catch another process's last moments (it gave ``extract`` one thread on
  an idle machine, 22.7 s against 17.0 s), and another job can start or end mid-run.

Either is skipped where the user chose: ``OMP_WAIT_POLICY`` or ``OMP_NUM_THREADS`` set, or
``ATTNSCOPE_FAIR_SHARE=0`` (``benchmarks/shared_machine.py`` measures both ways). From Python,
``torch.set_num_threads`` is the user's.
"""

from __future__ import annotations

import os
import sys
import time

from attnscope.progress import at_each_unit

#: ``ATTNSCOPE_FAIR_SHARE=0`` turns the fitting off (torch's own defaults).
SWITCH = "ATTNSCOPE_FAIR_SHARE"


def _cpu_ticks(cpus: set[int]) -> tuple[int, int] | None:
    """(busy, total) clock ticks of ``cpus`` so far, from ``/proc/stat`` (None elsewhere)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            rows = [line.split() for line in f if line.startswith("cpu") and line[3:4].isdigit()]
    except OSError:
        return None
    busy = total = 0
    for row in rows:
        if int(row[0][3:]) in cpus:
            ticks = [int(x) for x in row[1:9]]  # user nice system idle iowait irq softirq steal
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    return (busy, total) if total else None


def _others(start: tuple[int, int] | None, end: tuple[int, int] | None, cores: int, own_s: float,
            wall_s: float) -> float | None:
    """Cores that other processes kept busy between two ``/proc/stat`` readings of ``cores``
    CPUs, ``wall_s`` apart, in which this process used ``own_s`` CPU seconds (None: unreadable)."""
    if start is None or end is None or end[1] <= start[1]:
        return None
    share = (end[0] - start[0]) / (end[1] - start[1])  # of all the CPUs together
    return max(0.0, share * cores - own_s / wall_s)


def busy_elsewhere(cpus: set[int], seconds: float = 0.1) -> float:
    """How many of ``cpus`` other processes kept busy over the next ``seconds``: the busy share
    of those CPUs (``/proc/stat``) less this process's own CPU time, in cores (0 where it cannot
    be read)."""
    start, own = _cpu_ticks(cpus), time.process_time()
    t0 = time.perf_counter()
    time.sleep(seconds)
    end, own = _cpu_ticks(cpus), time.process_time() - own
    busy = _others(start, end, len(cpus), own, time.perf_counter() - t0)
    return 0.0 if busy is None else busy


def free_cores(cpus: set[int], busy: float) -> int:
    """Cores of ``cpus`` left when others keep ``busy`` of them busy: a core counts as taken
    from 0.5 on, and at least one is left.

    >>> free_cores({0, 1}, 0.04), free_cores({0, 1}, 1.0), free_cores({0, 1}, 2.3), free_cores(set(range(16)), 3.6)
    (2, 1, 1, 12)
    """
    return max(1, len(cpus) - int(busy + 0.5))


class Refit:
    """At most every ``every_s`` seconds (called at each finished unit: :func:`check_stop
    <attnscope.progress.check_stop>`), the cores of ``cpus`` other processes kept busy since the
    last measure (``/proc/stat`` less this process's own CPU time) and, where the cores free
    (:func:`free_cores`) differ from torch's threads, ``torch.set_num_threads`` to them."""

    def __init__(self, cpus: set[int], every_s: float = 5.0, clock=time.perf_counter, own=time.process_time):
        self.cpus, self.every_s, self.clock, self.own = cpus, every_s, clock, own
        self.last = (self.clock(), self.own(), _cpu_ticks(cpus))

    def __call__(self) -> None:
        t, own = self.clock(), self.own()
        if t - self.last[0] < self.every_s:
            return
        ticks = _cpu_ticks(self.cpus)
        (t0, own0, ticks0), self.last = self.last, (t, own, ticks)
        busy = _others(ticks0, ticks, len(self.cpus), own - own0, t - t0)
        torch = sys.modules.get("torch")
        if busy is None or torch is None:
            return
        n = free_cores(self.cpus, busy)
        if n != torch.get_num_threads():
            torch.set_num_threads(n)


def fair_share(seconds: float = 0.1) -> dict[str, str]:
    """Before torch is loaded (the command line calls it first): let OpenMP's idle threads
    sleep, and give torch (and MKL) the cores of this process's affinity mask that other
    processes are not keeping busy over ``seconds`` (:func:`free_cores`), through the
    environment variables they read when they start, and refit them as the run goes
    (:class:`Refit`). Returns what it set; nothing where the user chose (``OMP_WAIT_POLICY`` or ``OMP_NUM_THREADS`` set, ``ATTNSCOPE_FAIR_SHARE=0``)."""
    if os.environ.get(SWITCH, "1") == "0":
        return {}
    chosen: dict[str, str] = {}
    if "OMP_WAIT_POLICY" not in os.environ:
        chosen["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        cpus = set(range(os.cpu_count() or 1))
    if "OMP_NUM_THREADS" not in os.environ and len(cpus) > 1:
        n = free_cores(cpus, busy_elsewhere(cpus, seconds))
        if n < len(cpus):
            chosen["OMP_NUM_THREADS"] = chosen["MKL_NUM_THREADS"] = str(n)
        at_each_unit(Refit(cpus))
    os.environ.update(chosen)
    return chosen
