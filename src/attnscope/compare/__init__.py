"""Compare two models head by head: what fine-tuning (or another architecture) changed.

``compare(A, B, out_dir)`` takes two stores of the same inputs (or two ``run`` folders made
with ``--save-maps``); ``compare_models(model_a, model_b, inputs, out_dir)`` runs both models
first. See ``docs/compare.md``.

- :mod:`attnscope.compare.pairing`: the two sides, the same-inputs check, common units
- :mod:`attnscope.compare.stats`: paired per-head statistics with bootstrap intervals, the
  Jensen-Shannon distances between every head of A and every head of B, head matching
- :mod:`attnscope.compare.core`: the pass over the paired examples, :class:`Comparison`
"""

from attnscope.compare.core import Comparison, combine_rows, compare, compare_models
from attnscope.compare.stats import js_cross, match_heads, paired_bootstrap

__all__ = ["Comparison", "combine_rows", "compare", "compare_models", "js_cross", "match_heads",
           "paired_bootstrap"]
