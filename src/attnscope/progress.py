"""Progress reports: the ``progress(step, done, total)`` callback that every long function takes,
and the unit that each step counts.

A step's name may be a :class:`Step`, a ``str`` that also carries its unit ("examples",
"batches", "documents"), so a display can say what ``done`` and ``total`` count while a
callback that only wants three plain arguments sees an ordinary string.

>>> s = Step("extract", "examples")
>>> s == "extract", unit_of(s), unit_of(s.within("syntax")), s.within("syntax")
(True, 'examples', 'examples', 'syntax: extract')
>>> unit_of("report") is None
True
"""

from __future__ import annotations

import threading
from collections.abc import Callable

#: ``progress(step, done, total)``: ``total`` None when it is not known.
Progress = Callable[[str, int, "int | None"], None]


class Step(str):
    """The name of a progress step and what its counts count (``unit``; None: a step done
    once, such as writing the report)."""

    unit: str | None

    def __new__(cls, name: str, unit: str | None = None) -> "Step":
        step = super().__new__(cls, name)
        step.unit = unit
        return step

    def within(self, prefix: str) -> "Step":
        """The step under ``prefix`` (a family's key), with the same unit."""
        return Step(f"{prefix}: {self}", self.unit)


def unit_of(step: str) -> str | None:
    """The unit a step counts, or None (a plain string, or a step done once)."""
    return getattr(step, "unit", None)


def with_unit(name: str, unit: str | None) -> Step:
    """``name`` as a :class:`Step` counting ``unit``, keeping the unit ``name`` already has."""
    return Step(name, unit_of(name) or unit)


def duration(seconds: float) -> str:
    """A time as a progress line says it.

    >>> duration(30), duration(170), duration(5400)
    ('30 s', '3 min', '1.5 h')
    """
    return (f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400
            else f"{seconds / 3600:.1f} h")


#: a stop asked for by a signal (process-wide, as signals are): :func:`request_stop`, :func:`check_stop`
_STOP = threading.Event()


def request_stop(asked: bool = True) -> None:
    """Note that a stop was asked for (the command line's SIGINT and SIGTERM handler, beside the
    KeyboardInterrupt it raises), or forget it (``asked=False``: a new command begins)."""
    if asked:
        _STOP.set()
    else:
        _STOP.clear()


#: what runs at every unit a pass finishes (:func:`at_each_unit`)
_AT_UNIT: list[Callable[[], None]] = []


def at_each_unit(fn: Callable[[], None]) -> None:
    """Run ``fn`` at every unit a pass finishes, in this process (the command line's refitting
    of torch's threads to the cores free: :class:`attnscope.models.threads.Refit`)."""
    _AT_UNIT.append(fn)


def check_stop() -> None:
    """Raise KeyboardInterrupt again if a stop was asked for: called at every unit a pass
    finishes, so that a stop a library swallowed (CPython drops an exception raised inside a
    finalizer, which is where a signal can land) still stops the job at its next unit. Runs
    what :func:`at_each_unit` asked for first."""
    for fn in _AT_UNIT:
        fn()
    if _STOP.is_set():
        raise KeyboardInterrupt

