"""Confidence intervals shared by the analyses."""

from __future__ import annotations

import numpy as np


def bootstrap_ci(values: np.ndarray, *, n_boot: int = 1000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (e.g. 0/1 correctness).

    Resamples the items with replacement ``n_boot`` times with a seeded generator.

    >>> lo, hi = bootstrap_ci(np.array([1, 1, 0, 1]), seed=0); 0 <= lo <= 0.75 <= hi <= 1
    True
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(n_boot, values.size))
    means = values[idx].mean(axis=1)
    alpha = (1.0 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(lo), float(hi)
