"""What the general family's statistics say (paper sections 3 and 6), worked out here so that the
report only lays it out (:mod:`attnscope.report.general`): the heads Figure 1 draws, the heads
that put more than half their attention on the previous or next token, the layers where
separators take more than half, where attention to the first special token and to punctuation
peaks, the range of the layers' entropies and the behaviour counts of Figure 6.

Layers and heads are array indices (the layers with attention); a report names them with
:func:`attnscope.data.records.layer_number` and :class:`~attnscope.data.records.HeadId`.

>>> s = {k: np.zeros((2, 2)) for k in ("previous", "next", "first", "separator", "punct", "entropy",
...                                    "entropy_first")}
>>> s["previous"][1, 0] = 0.8; s["separator"][1] = 0.7; s["entropy"][:] = 2.0
>>> f = general_findings(s, np.array([["other", "other"], ["previous", "[SEP]"]]))
>>> f.mostly["previous"], f.separator_layers, f.separator_peak, f.figure1[0]
([(1, 0)], [1], (1, 0.7), (1, 0, 'attends to the previous token'))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnscope.analyses.clustering import LABELS

#: The paper's section 3 cut-off: "more than half" of a head's (or a layer's) attention.
MOSTLY = 0.5
#: A separator row's share on separators that the paper calls "almost all" (over 90%).
NEARLY_ALL = 0.9

#: Figure 1's heads: the strongest head of each statistic, with what it does.
FIGURE1 = (("previous", "attends to the previous token"), ("next", "attends to the next token"),
           ("first", "attends to the first special token"), ("separator", "attends to separators"),
           ("entropy", "attends broadly"))

Head = tuple[int, int]


@dataclass(frozen=True)
class GeneralFindings:
    """What :func:`general_findings` found (array layers and heads)."""

    #: ``"previous"`` / ``"next"`` -> the heads with more than half their attention there
    mostly: dict[str, list[Head]]
    #: each layer's mean attention to separators over its heads, and the layers above one half
    separator_by_layer: np.ndarray
    separator_layers: list[int]
    separator_peak: tuple[int, float] | None  # (layer, mean) where it is largest; None: no separators
    #: heads whose separator rows put nearly all their attention on separators (None: no such rows)
    separators_to_separators: list[Head] | None
    first_peak: tuple[int, float] | None  # where attention to the first special token peaks
    punct_peak: tuple[int, float]
    entropy_range: tuple[float, float]  # the layers' mean entropies, lowest and highest (nats)
    last_first_entropy: float  # the last layer's entropy from the first token (nats)
    behaviours: dict[str, int]  # Figure 6's labels, how many heads each
    figure1: list[tuple[int, int, str]]  # (layer, head, what it does), each head once


def _heads(mask: np.ndarray) -> list[Head]:
    return [(int(a), int(b)) for a, b in zip(*np.nonzero(mask))]


def _peak(by_layer: np.ndarray) -> tuple[int, float]:
    i = int(np.nanargmax(by_layer))
    return i, float(by_layer[i])


def figure1_heads(stats: dict[str, np.ndarray]) -> list[tuple[int, int, str]]:
    """Heads drawn in Figure 1: the strongest previous, next, first-special, separator and
    broadest head (:data:`FIGURE1`), each head once."""
    picks: list[tuple[int, int, str]] = []
    for key, label in FIGURE1:
        arr = stats.get(key)
        if arr is None or not np.isfinite(arr).any():
            continue
        layer, head = (int(x) for x in np.unravel_index(int(np.nanargmax(arr)), arr.shape))
        if (layer, head) not in [(p[0], p[1]) for p in picks]:
            picks.append((layer, head, label))
    return picks


def general_findings(stats: dict[str, np.ndarray], labels: np.ndarray) -> GeneralFindings:
    """:class:`GeneralFindings` of the ``[L H]`` statistics ``stats`` (by name, as
    :func:`attnscope.analyses.clustering.label_inputs` gives them) and Figure 6's ``labels``."""
    sep = np.nanmean(stats["separator"], axis=1)
    has_sep = bool(np.nanmax(sep) > 0)
    ss = stats.get("sep_to_sep")
    first = np.nanmean(stats["first"], axis=1)
    ent = np.nanmean(stats["entropy"], axis=1)
    return GeneralFindings(
        mostly={k: _heads(np.nan_to_num(stats[k], nan=0) > MOSTLY) for k in ("previous", "next")},
        separator_by_layer=sep,
        separator_layers=[int(i) for i in np.nonzero(sep > MOSTLY)[0]],
        separator_peak=_peak(sep) if has_sep else None,
        separators_to_separators=(_heads(np.nan_to_num(ss, nan=0) > NEARLY_ALL)
                                  if has_sep and ss is not None and np.isfinite(ss).any() else None),
        first_peak=_peak(first) if np.nanmax(first) > 0 else None,
        punct_peak=_peak(np.nanmean(stats["punct"], axis=1)),
        entropy_range=(float(ent.min()), float(ent.max())),
        last_first_entropy=float(np.nanmean(stats["entropy_first"][-1])),
        behaviours={lab: int((labels == lab).sum()) for lab in LABELS},
        figure1=figure1_heads(stats))
