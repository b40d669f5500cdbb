"""Progress of a run: every family's steps under its key, plus one overall count in estimated
seconds, re-made from measured rates as the work goes."""

from __future__ import annotations

import time
from collections.abc import Callable

from attnscope.progress import Progress, Step, unit_of

OVERALL = Step("overall", "s")


def prefixed(progress: Progress | None, key: str) -> Progress | None:
    """``progress`` with each step named under the family ``key`` ("syntax: extract dev"),
    keeping the step's unit; what ``run`` and ``analyze`` show alike."""
    if progress is None:
        return None

    def report(step: str, done: int, total: int | None) -> None:
        progress(Step(f"{key}: {step}", unit_of(step)), done, total)

    return report


class ProgressRouter:
    """Turns each family's ``progress(step, done, total)`` calls into prefixed step names and
    an ``overall`` count in seconds, so a display can show one ETA for the run.

    The overall count is ``done`` seconds of ``total`` estimated seconds: the finished families'
    measured times, the time spent in the family in progress, and an estimate of the rest. The
    family in progress is estimated from its own rate once a tenth of it is done (its time so
    far over the share of its steps done); a family not started yet from its work estimate
    (``weights``, in examples) times the seconds per unit of weight the finished families took
    (before any finished, the family in progress's rate). Every estimate is re-made at each call
    from what was measured on this machine, so a slower machine or a busy one shows it within
    the run; the total reaches ``done`` when the run ends."""

    #: the share of a family done from which its own rate estimates it
    OWN_RATE_FROM = 0.1

    def __init__(self, progress: Progress | None, weights: dict[str, int],
                 clock: Callable[[], float] = time.perf_counter):
        self.progress, self.clock = progress, clock
        self.weights = {k: max(1, int(v)) for k, v in weights.items()}
        self.taken: dict[str, float] = {}  # finished families: seconds
        self.key: str | None = None
        self.started = 0.0
        self.current = 0.0  # share of the family in progress done, never decreasing
        self.steps: dict[str, float] = {}

    def start(self, key: str) -> None:
        self.key, self.current, self.steps, self.started = key, 0.0, {}, self.clock()
        self._overall()

    def finish(self, key: str, resumed: bool = False) -> None:
        """``key`` is done; ``resumed``: read back from a checkpoint (its time says nothing of
        this machine's rate)."""
        self.taken[key] = 0.0 if resumed else self.clock() - self.started
        if resumed:
            self.weights.pop(key, None)
        self.key, self.current = None, 0.0
        self._overall()

    def family_progress(self, key: str) -> Progress:
        shown = prefixed(self.progress, key)

        def report(step: str, done: int, total: int | None) -> None:
            if shown is not None:
                shown(step, done, total)
            if total:
                self.steps[step] = min(1.0, done / total)
                # Steps seen so far share the family's weight; at least two are assumed so
                # that the first step does not claim the whole family.
                frac = sum(self.steps.values()) / max(2, len(self.steps) + 1)
                self.current = max(self.current, min(0.99, frac))
                self._overall()

        return report

    def estimate(self) -> tuple[float, float]:
        """(seconds done, seconds in all) as measured and estimated now."""
        now = self.clock()
        spent = now - self.started if self.key is not None else 0.0
        measured = {k: t for k, t in self.taken.items() if k in self.weights and t > 0}
        rate = None  # seconds per unit of weight
        if measured:
            rate = sum(measured.values()) / sum(self.weights[k] for k in measured)
        elif self.key is not None and self.current >= self.OWN_RATE_FROM:
            rate = spent / self.current / self.weights.get(self.key, 1)
        if self.key is not None and self.current >= self.OWN_RATE_FROM:
            this = spent / self.current
        elif self.key is not None:
            this = max(spent, rate * self.weights.get(self.key, 1)) if rate else None
        else:
            this = 0.0
        rest = [k for k in self.weights if k not in self.taken and k != self.key]
        done = sum(self.taken.values()) + spent
        if rate is None or this is None:
            return done, 0.0  # nothing measured yet: no estimate
        return done, max(done, sum(self.taken.values()) + this + rate * sum(self.weights[k] for k in rest))

    def _overall(self) -> None:
        if self.progress is None:
            return
        done, total = self.estimate()
        if total > 0:  # once something was measured
            self.progress(OVERALL, int(round(done)), int(round(total)))
