"""Engines: computations inside attention, through the forward helper's hook points, that never
hold an ``[n n]`` map.

- :mod:`~attnscope.engines.streaming`: the streaming engine, the long-context statistics folded
  into a :class:`~attnscope.engines.rows.RowStats` (:class:`~attnscope.analyses.longctx.LongContextStats`);
- :mod:`~attnscope.engines.backends`: its seam (which backend runs a layer of a sequence, chosen
  by device and input), with the backends :mod:`~attnscope.engines.flex` (FlexAttention: the
  statistics from log-sum-exps), :mod:`~attnscope.engines.native` (the compiled CPU kernel) and
  the engine's own torch tiles; :mod:`~attnscope.engines.tiles` sizes the tiles per device;
- :mod:`~attnscope.engines.rows`: what the engine folds per sequence (buckets, key classes,
  sampled rows, per-row sums);
- :mod:`~attnscope.engines.memory`: running out of GPU memory as one line;
- :mod:`~attnscope.engines.press`: the atlas's KV press (some KV heads cut to sink + window), its
  prefill and its greedy answers.
"""

from attnscope.engines.backends import BACKENDS, NAMES, Backend, LayerInput, choose, tile_budget

__all__ = ["BACKENDS", "NAMES", "Backend", "LayerInput", "choose", "tile_budget"]
