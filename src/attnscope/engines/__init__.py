"""Engines: computations inside attention, through the forward helper's hook points, that never
hold an ``[n n]`` map.

- :mod:`~attnscope.engines.streaming`: the streaming engine, the long-context statistics folded
  into a :class:`~attnscope.engines.rows.RowStats` (:class:`~attnscope.analyses.longctx.LongContextStats`);
- :mod:`~attnscope.engines.seam`: what a backend is and what it is handed for a layer;
  :mod:`~attnscope.engines.backends`: the registry and the choice (which backend runs a
  sequence, by device and input), with the backends :mod:`~attnscope.engines.onepass` (attnscope's
  Triton kernel), :mod:`~attnscope.engines.flex` (FlexAttention: the statistics from
  log-sum-exps) and :mod:`~attnscope.engines.tiled` (the compiled CPU kernel of
  :mod:`~attnscope.engines.native`, and the reference: torch tiles of whole rows);
  :mod:`~attnscope.engines.tiles` sizes the tiles per device;
- :mod:`~attnscope.engines.rows`: what the engine folds per sequence (buckets, key classes,
  sampled rows, per-row sums);
- :mod:`~attnscope.engines.memory`: running out of GPU memory as one line;
- :mod:`~attnscope.engines.press`: the atlas's KV press (some KV heads cut to sink + window), its
  prefill and its greedy answers.
"""

from attnscope.engines.backends import BACKENDS, NAMES, choose, get, tile_budget
from attnscope.engines.seam import Backend, LayerInput

__all__ = ["BACKENDS", "NAMES", "Backend", "LayerInput", "choose", "get", "tile_budget"]
