"""Per-head statistics, each declared once: what it measures, who makes it, how it merges, how it
is ranked and shown.

A :class:`Stat` is declared next to the code that computes it (``relative-position``,
``special-tokens`` and ``entropy`` declare the paper's section 3 statistics in their own
modules) and every consumer reads the declarations rather than a list of its own: the general
family's per-head and per-layer tables, the results file (``results/general.json`` carries
the records, :func:`records`), a head's page, ``attnscope compare`` and the streaming general
family. A statistic that is the mass a row puts on a class of keys needs no code at all: a
``keys`` predicate on the key's text (word markers removed) and its special flag is enough,
and ``special-tokens`` computes it on the maps, the streaming engine inside attention:

>>> s = Stat("to_digits", what="attention to numbers", formula="sum_i sum_{j digit} a[i,j] / n",
...          source="attnscope", analysis="special-tokens", keys=lambda text, special: text.isdigit())
>>> with declared_for_now(s):
...     [d.name for d in declared(analysis="special-tokens")][-1]
'to_digits'
>>> "to_digits" in [d.name for d in declared()]
False
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

#: How every statistic here merges: each example gives one value per head; the analysis keeps
#: their sums, the sums of their squares (for the intervals) and how many examples defined it,
#: which add across batches, shards and machines (:class:`~attnscope.analyses.relative_position.PerExampleMeans`).
MEAN_OF_MEANS = ("mean over examples of per-example means (sums, sums of squares and counts add "
                 "across batches, shards and machines)")


@dataclass(frozen=True)
class Stat:
    """One per-head statistic.

    ``what``: plain words (table captions, head pages, compare's findings); ``formula`` and
    ``source``: its definition and the paper section (or ``attnscope``) it comes from;
    ``analysis``: the registered analysis that computes it; ``families``: the jobs that report
    it (``general``; ``compare`` when the paired comparison also tests it); ``higher``: what a
    larger value means, and ``higher_is_more``: whether rank 1 is the largest value; ``digits``
    and ``unit``: how it is shown; ``per_layer``: also in the per-layer table; ``keys``: for a
    statistic that is a row's mass on a class of keys, the predicate ``(text, special) -> bool``
    that picks them.
    """

    name: str
    what: str
    formula: str
    source: str
    analysis: str
    higher: str = "more of the row's attention there"
    higher_is_more: bool = True
    unit: str = "share of a row's attention"
    digits: int = 3
    families: tuple[str, ...] = ("general", "compare")
    merge: str = MEAN_OF_MEANS
    per_layer: bool = False
    keys: Callable[[str, bool], bool] | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["families"] = list(self.families)
        out["keys"] = None if self.keys is None else "a predicate on each key's text and special flag"
        return out


_DECLARED: dict[str, Stat] = {}


def declare(*stats: Stat) -> tuple[str, ...]:
    """Add ``stats`` to the declarations (in this order); returns their names, the order in which
    the declaring analysis computes them. Declaring a name twice with other fields is an error."""
    for s in stats:
        old = _DECLARED.get(s.name)
        if old is not None and old != s:
            raise ValueError(f"statistic {s.name!r} is already declared (by {old.analysis})")
        _DECLARED[s.name] = s
    return tuple(s.name for s in stats)


def undeclare(name: str) -> None:
    _DECLARED.pop(name, None)


@contextmanager
def declared_for_now(*stats: Stat) -> Iterator[tuple[str, ...]]:
    """Declare ``stats`` for the ``with`` block only (a test's or a notebook's own statistic)."""
    names = declare(*stats)
    try:
        yield names
    finally:
        for name in names:
            undeclare(name)


def declared(*, family: str | None = None, analysis: str | None = None) -> list[Stat]:
    """The declared statistics, in declaration order, of one ``family`` and/or ``analysis``."""
    return [s for s in _DECLARED.values()
            if (family is None or family in s.families) and (analysis is None or s.analysis == analysis)]


def key_class_stats() -> tuple[Stat, ...]:
    """The declared statistics that are a row's mass on a class of keys (a ``keys`` predicate)."""
    return tuple(s for s in _DECLARED.values() if s.keys is not None)


def of_results(results: dict[str, Any], family: str = "general") -> list[Stat]:
    """The declared statistics of ``family`` that ``results`` (finalized analyses by name, each
    with its ``arrays``) hold, in the order of their analyses."""
    return [s for name, r in results.items() for s in declared(family=family, analysis=name)
            if s.name in r.arrays]


def records(stats: list[Stat]) -> list[dict[str, Any]]:
    """What a results file carries about its statistics: one :meth:`Stat.to_json` each."""
    return [s.to_json() for s in stats]


def read_records(results: dict, family: str = "general") -> list[dict[str, Any]]:
    """The records a results file carries (``results["stats"]``); a file written before the
    records existed gets today's declarations."""
    return list(results.get("stats") or records(declared(family=family)))


#: The two-sided 95% quantile of the standard normal.
Z95 = 1.959963984540054


def rank_of(values: np.ndarray, layer: int, head: int, higher_is_more: bool = True) -> int | None:
    """1 + how many heads have a strictly higher value (strictly lower where a lower value
    ranks first); NaN heads are not ranked.

    >>> rank_of(np.array([[0.1, 0.5], [0.5, 0.2]]), 1, 0)
    1
    >>> rank_of(np.array([[0.1, 0.5], [0.5, 0.2]]), 0, 0)
    4
    >>> rank_of(np.array([[0.1, 0.5], [0.5, 0.2]]), 0, 0, higher_is_more=False)
    1
    """
    v = values[layer, head]
    if not np.isfinite(v):
        return None
    others = values[np.isfinite(values)]
    return int(np.sum(others > v if higher_is_more else others < v)) + 1


def interval95(value: float, standard_error: float | None, floor: float | None = None) -> tuple:
    """``(low, high)``: ``value -+ 1.96`` standard errors (the per-example values' spread), ``low``
    cut at ``floor``; ``(None, None)`` without a standard error.

    >>> [round(x, 3) for x in interval95(0.5, 0.1)], interval95(0.1, 0.1, floor=0.0)[0]
    ([0.304, 0.696], 0.0)
    """
    if standard_error is None:
        return None, None
    low = value - Z95 * standard_error
    return (low if floor is None else max(low, floor)), value + Z95 * standard_error
