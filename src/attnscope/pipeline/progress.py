"""Progress of a run: every family's steps under its key, plus one overall count weighted by
each family's work estimate."""

from __future__ import annotations

from attnscope.progress import Progress, Step, unit_of

OVERALL = Step("overall", "examples")


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
    an ``overall`` count in units of examples, so a display can show one ETA for the run."""

    def __init__(self, progress: Progress | None, weights: dict[str, int]):
        self.progress = progress
        self.weights = {k: max(1, int(v)) for k, v in weights.items()}
        self.total = sum(self.weights.values()) or 1
        self.done = 0.0  # weight of finished families
        self.current = 0.0  # fraction of the family in progress, never decreasing
        self.key: str | None = None
        self.steps: dict[str, float] = {}

    def start(self, key: str) -> None:
        self.key, self.current, self.steps = key, 0.0, {}
        self._overall()

    def finish(self, key: str) -> None:
        self.done += self.weights.get(key, 0)
        self.current = 0.0
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

    def _overall(self) -> None:
        if self.progress is None:
            return
        w = self.weights.get(self.key or "", 0)
        self.progress(OVERALL, int(round(self.done + self.current * w)), self.total)
