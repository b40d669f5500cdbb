"""The run's overall clock (``pipeline.progress.ProgressRouter``) with a stub clock: counted in
seconds, estimated from the rates measured so far, re-made at every call, and equal to the time
taken when the run ends."""

from __future__ import annotations

import pytest

from attnscope.pipeline.progress import ProgressRouter


def test_the_overall_estimate_is_remade_from_measured_rates():
    now = [0.0]
    seen: list[tuple[str, int, int]] = []
    router = ProgressRouter(lambda step, done, total: seen.append((step, done, total)),
                            {"a": 100, "b": 300, "c": 50}, clock=lambda: now[0])

    def at(t):
        now[0] = t

    router.start("c")
    at(2.0)
    router.finish("c", resumed=True)  # read back from a checkpoint: no time, no rate
    assert not seen  # nothing measured yet: no estimate shown
    router.start("a")
    report = router.family_progress("a")
    at(1.0 + 2.0)
    report("x", 5, 100)  # 2.5% of the family: too little to estimate from
    assert not any(s == "overall" for s, _, _ in seen)
    at(12.0)
    report("x", 100, 100)  # half of "a" (at least two steps assumed) in 10 s: 20 s for "a", 0.2 s a unit
    assert seen[-1] == ("overall", 10, 10 + 10 + 300 * 0.2)
    at(20.0)
    router.finish("a")  # 18 s for 100 units: 0.18 s a unit, so "b" is 54 s
    assert seen[-1] == ("overall", 18, 18 + 54)
    router.start("b")
    report = router.family_progress("b")
    at(22.0)
    report("y", 1, 10)  # 5%: "b" is still the finished families' rate
    assert seen[-1] == ("overall", 20, 18 + 54)
    at(50.0)
    report("y", 10, 10)
    report("z", 5, 10)  # (1 + 0.5) / 3 of "b" in 30 s: 60 s for "b"
    assert seen[-1] == ("overall", 48, 18 + 60)
    at(80.0)
    router.finish("b")
    assert seen[-1] == ("overall", 78, 78)  # the end: the total is the time taken
    done = [d for s, d, _ in seen if s == "overall"]
    assert done == sorted(done)


@pytest.mark.parametrize("share", [0.2, 0.35, 0.5])
def test_a_family_running_at_a_steady_rate_is_estimated_at_its_length(share):
    """A family of two steps of equal time, in its first: from a tenth on, the estimate is its
    length (a family's steps are not announced: one more than those seen is assumed, at least two)."""
    now = [0.0]
    seen = []
    router = ProgressRouter(lambda *a: seen.append(a), {"a": 7}, clock=lambda: now[0])
    router.start("a")
    report = router.family_progress("a")
    now[0] = 40.0 * share  # a 40 s family, 2 steps of 20 s
    report("first", int(100 * 2 * share), 100)
    assert seen[-1][2] == pytest.approx(40, abs=1)
