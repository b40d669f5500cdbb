"""What each analysis family hands to the report: a :class:`Section`.

The analysis modules write their own tables and figures (with :mod:`attnscope.report.tables`
and :mod:`attnscope.report.figures`) and describe them in a Section; the HTML report only
assembles sections, so adding an analysis never touches the report's code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class TableArtifact:
    name: str  # file stem, e.g. "table1_syntax"
    caption: str
    rows: list[dict]
    columns: list[str]
    paths: list[Path] = field(default_factory=list)  # .csv/.json/.md/.tex


@dataclass
class FigureArtifact:
    name: str  # file stem, e.g. "figure2_special_tokens"
    caption: str
    paths: list[Path] = field(default_factory=list)  # .png and .svg


@dataclass
class Section:
    """One part of the report.

    ``findings``: plain sentences about this model. ``methods``: notes with the formula and
    the paper section each number comes from. ``paper``: rows ``{"what", "paper", "ours"}``
    setting the paper's BERT-base numbers beside ours where they compare. ``best_heads``:
    ``(layer, head, example_index, label)`` tuples (0-indexed) that the report links into the
    head view; ``maps`` holds the :class:`AttentionMap` of each example those tuples name, so
    the report can draw them without a store.
    """

    key: str
    title: str
    findings: list[str] = field(default_factory=list)
    tables: list[TableArtifact] = field(default_factory=list)
    figures: list[FigureArtifact] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)
    paper: list[dict] = field(default_factory=list)
    best_heads: list[tuple[int, int, int, str]] = field(default_factory=list)
    maps: dict[int, Any] = field(default_factory=dict)  # example index -> AttentionMap for best_heads


#: An interval wider than this (percentage points) is too wide for a number to be compared
#: with the paper's or with a baseline.
WIDE_INTERVAL = 15.0

#: Fewer items than this are too few for a number to be compared with the paper's or with a
#: baseline, whatever its interval: a bootstrap of 7 identical outcomes spans 0 points.
MIN_ITEMS = 30


def small_sample_caution(what: str, n: int, low: float | None, high: float | None) -> str | None:
    """A sentence warning that ``what`` rests on too little data, or None when it does not.

    Decided from the data, never from a flag: ``low``/``high`` is the 95% interval (in
    percent) of the section's headline accuracy over ``n`` items; too little is an interval
    wider than :data:`WIDE_INTERVAL` points or fewer than :data:`MIN_ITEMS` items.

    >>> small_sample_caution("Table 2", 22, 40.9, 81.8)
    'Caution: Table 2 rests on only 22 items; its 95% interval spans 40.9 points, too wide for these numbers to be compared with the paper or between rows.'
    >>> small_sample_caution("Table 2", 7, 100.0, 100.0)
    'Caution: Table 2 rests on only 7 items, fewer than 30: too few for these numbers to be compared with the paper or between rows (a bootstrap interval over so few items, here 0.0 points wide, understates the uncertainty).'
    >>> small_sample_caution("Table 2", 3818, 70.5, 74.1) is None
    True
    """
    interval = low is not None and high is not None
    if interval and high - low > WIDE_INTERVAL:
        return (f"Caution: {what} rests on only {n} items; its 95% interval spans {high - low:.1f} "
                "points, too wide for these numbers to be compared with the paper or between rows.")
    if n >= MIN_ITEMS:
        return None
    return (f"Caution: {what} rests on only {n} items, fewer than {MIN_ITEMS}: too few for these "
            "numbers to be compared with the paper or between rows"
            + (f" (a bootstrap interval over so few items, here {high - low:.1f} points wide, "
               "understates the uncertainty)." if interval else "."))
