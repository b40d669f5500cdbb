"""A fair share of a shared machine: torch's threads fitted to the cores that are free.

torch runs each operator on as many threads as the machine has cores, and OpenMP's idle
threads spin while they wait for the next parallel region. Beside another CPU-bound job both
hurt: a thread that waits on one the scheduler has parked spins, and the CPU time of a command
grew with its wall time (issue 49: ``extract`` 75 s against 10 s idle on 2 cores with one other
job). So attnscope

- lets idle OpenMP threads sleep (``OMP_WAIT_POLICY=PASSIVE``), and
- gives torch the cores of its affinity mask that other processes are not keeping busy,
  measured over 0.1 s when a command starts (:func:`fair_share`, called by the command line
  before torch is imported, since both are read when torch's OpenMP runtime starts).

Either is skipped where the user chose: ``OMP_WAIT_POLICY`` or ``OMP_NUM_THREADS`` set, or
``ATTNSCOPE_FAIR_SHARE=0`` (``benchmarks/shared_machine.py`` measures both ways). From Python,
``torch.set_num_threads`` is the user's.
"""

from __future__ import annotations

import os
import time

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


def busy_elsewhere(cpus: set[int], seconds: float = 0.1) -> float:
    """How many of ``cpus`` other processes kept busy over the next ``seconds``: the busy share
    of those CPUs (``/proc/stat``) less this process's own CPU time, in cores (0 where it cannot
    be read)."""
    start, own = _cpu_ticks(cpus), time.process_time()
    t0 = time.perf_counter()
    time.sleep(seconds)
    end, own = _cpu_ticks(cpus), time.process_time() - own
    wall = time.perf_counter() - t0
    if start is None or end is None or end[1] <= start[1]:
        return 0.0
    share = (end[0] - start[0]) / (end[1] - start[1])  # of all ``cpus`` together
    return max(0.0, share * len(cpus) - own / wall)


def free_cores(cpus: set[int], busy: float) -> int:
    """Cores of ``cpus`` left when others keep ``busy`` of them busy: a core counts as taken
    from 0.5 on, and at least one is left.

    >>> free_cores({0, 1}, 0.04), free_cores({0, 1}, 1.0), free_cores({0, 1}, 2.3), free_cores(set(range(16)), 3.6)
    (2, 1, 1, 12)
    """
    return max(1, len(cpus) - int(busy + 0.5))


def fair_share(seconds: float = 0.1) -> dict[str, str]:
    """Before torch is loaded (the command line calls it first): let OpenMP's idle threads
    sleep, and give torch (and MKL) the cores of this process's affinity mask that other
    processes are not keeping busy over ``seconds`` (:func:`free_cores`), through the
    environment variables they read when they start. Returns what it set; nothing where the
    user chose (``OMP_WAIT_POLICY`` or ``OMP_NUM_THREADS`` set, ``ATTNSCOPE_FAIR_SHARE=0``)."""
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
    os.environ.update(chosen)
    return chosen
