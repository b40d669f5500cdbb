"""Heads in 2-D (paper Figure 6): multidimensional scaling of the head distances, and a
behaviour label per head from the paper's thresholds.

Labels (paper section 6 / Figure 6), checked in this order, the first that holds wins:

- ``[SEP]``, ``[CLS]``, ``punctuation``: mean attention to that class > 0.6 (the paper's
  names; the classes come from :mod:`attnscope.analyses.token_classes`, so ``</s>`` counts as
  ``[SEP]`` for RoBERTa)
- ``previous`` / ``next``: mean attention to the previous / next token > 0.5
- ``broad``: mean entropy > 3.8 nats. The paper's threshold is for inputs of 128 tokens, where
  uniform attention has entropy ln 128 = 4.85; for data of another length we keep the same
  distance below uniform, ``threshold = uniform - (ln 128 - 3.8)`` (i.e. the head spreads its
  attention like a uniform distribution over at least e^3.8 / 128 = 35% of the tokens).
- ``other`` otherwise.

MDS is wrapped here with every argument pinned, because scikit-learn has renamed its
arguments (``metric`` / ``dissimilarity`` became ``metric_mds`` / ``metric``) and changed the
default ``n_init`` and ``init``.
"""

from __future__ import annotations

import inspect
import math
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from attnscope.data.records import HeadId

#: Label order: the first label whose test holds is a head's label.
LABELS = ("[SEP]", "[CLS]", "punctuation", "previous", "next", "broad", "other")


@dataclass(frozen=True)
class Thresholds:
    """The paper's thresholds (Figure 6) and the length they were set for."""

    special: float = 0.6
    position: float = 0.5
    broad_entropy: float = 3.8
    reference_length: int = 128

    def broad_for(self, uniform_entropy: float | None) -> float:
        """The entropy threshold for data whose uniform entropy is ``uniform_entropy`` nats."""
        if uniform_entropy is None or not math.isfinite(uniform_entropy):
            return self.broad_entropy
        return uniform_entropy - (math.log(self.reference_length) - self.broad_entropy)


def behaviour_labels(stats: dict[str, np.ndarray], uniform_entropy: float | None = None,
                     thresholds: Thresholds = Thresholds()) -> np.ndarray:
    """One label per head, ``[L H]`` of str.

    ``stats`` holds ``[L H]`` arrays: ``separator``, ``first``, ``punct``, ``previous``,
    ``next``, ``entropy`` (missing ones never match).
    """
    shape = next(iter(stats.values())).shape
    labels = np.full(shape, "other", dtype=object)
    done = np.zeros(shape, dtype=bool)
    broad = thresholds.broad_for(uniform_entropy)
    tests = [("[SEP]", "separator", thresholds.special), ("[CLS]", "first", thresholds.special),
             ("punctuation", "punct", thresholds.special), ("previous", "previous", thresholds.position),
             ("next", "next", thresholds.position), ("broad", "entropy", broad)]
    for label, key, limit in tests:
        if key not in stats:
            continue
        hit = np.nan_to_num(stats[key], nan=-np.inf) > limit
        labels[hit & ~done] = label
        done |= hit
    return labels


@dataclass(frozen=True)
class MDSParams:
    """Every argument of the MDS call, recorded in the result."""

    n_components: int = 2
    metric: bool = True
    n_init: int = 4
    max_iter: int = 300
    eps: float = 1e-6
    random_state: int = 0
    init: str = "random"


def mds_2d(distances: np.ndarray, params: MDSParams = MDSParams()) -> np.ndarray:
    """Embed a ``[P P]`` symmetric distance matrix in 2-D: ``[P 2]``, deterministic."""
    from sklearn.manifold import MDS

    d = np.asarray(distances, dtype=np.float64)
    if d.shape[0] < 2:
        return np.zeros((d.shape[0], params.n_components))
    d = (d + d.T) / 2
    np.fill_diagonal(d, 0.0)
    accepted = inspect.signature(MDS.__init__).parameters
    kwargs: dict[str, Any] = {"n_components": params.n_components, "n_init": params.n_init,
                              "max_iter": params.max_iter, "eps": params.eps,
                              "random_state": params.random_state, "n_jobs": 1}
    if "metric_mds" in accepted:  # scikit-learn >= 1.8
        kwargs.update(metric_mds=params.metric, metric="precomputed")
    else:
        kwargs.update(metric=params.metric, dissimilarity="precomputed")
    if "init" in accepted:
        kwargs["init"] = params.init
    if "normalized_stress" in accepted:
        kwargs["normalized_stress"] = "auto"
    return MDS(**kwargs).fit_transform(d)


def cluster_heads(distances: np.ndarray, stats: dict[str, np.ndarray],
                  uniform_entropy: float | None = None, thresholds: Thresholds = Thresholds(),
                  params: MDSParams = MDSParams()) -> dict[str, Any]:
    """Coordinates and labels of every head, plus the rows of a table.

    Returns ``{"coords": [P 2], "labels": [L H], "rows": [...], "params": {...}}``.
    """
    labels = behaviour_labels(stats, uniform_entropy, thresholds)
    L, H = labels.shape
    coords = mds_2d(distances, params)
    rows = []
    for i in range(L * H):
        layer, head = divmod(i, H)
        rows.append({"layer": layer, "head": head, "name": str(HeadId(layer, head)),
                     "x": float(coords[i, 0]), "y": float(coords[i, 1]),
                     "behaviour": str(labels[layer, head])})
    return {"coords": coords, "labels": labels, "rows": rows,
            "params": {"mds": asdict(params), "thresholds": asdict(thresholds),
                       "broad_threshold_used": thresholds.broad_for(uniform_entropy),
                       "label_order": list(LABELS)}}


def label_inputs(results: dict) -> dict[str, np.ndarray]:
    """All ``[L H]`` statistics of the general pass (its finalized results by name: relative
    position, special tokens, entropy), by statistic: the inputs of the behaviour labels."""
    out: dict[str, np.ndarray] = {}
    for key in ("relative-position", "special-tokens", "entropy"):
        if key in results:
            out.update(results[key].arrays)
    return out


def general_clusters(results: dict) -> dict[str, Any]:
    """Figure 6: :func:`cluster_heads` of the general pass's head distances, labelled by its
    statistics (:func:`label_inputs`) with the entropy of a uniform row as the broad scale."""
    with warnings.catch_warnings():  # all-NaN layers (no separators, GPT-2) are expected
        warnings.simplefilter("ignore", category=RuntimeWarning)
        return cluster_heads(results["head-distances"].arrays["distances"], label_inputs(results),
                             float(results["entropy"].meta["uniform_entropy"]), Thresholds())
