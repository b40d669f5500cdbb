"""Engines: computations inside attention, through the forward helper's hook points, that never
hold an ``[n n]`` map.

:mod:`attnscope.engines.streaming` is the streaming engine (the long-context statistics folded
into :class:`~attnscope.analyses.longctx.LongContextStats`); :mod:`attnscope.engines.backends` its seam (which backend runs a layer of a
sequence, chosen by device and input; the tiles' sizes per device); :mod:`attnscope.engines.flex`
the fused backend (FlexAttention: the statistics from log-sum-exps), :mod:`attnscope.engines.native`
the compiled CPU kernel; :mod:`attnscope.engines.rows` what the engine folds per sequence;
:mod:`attnscope.engines.memory`
turns running out of GPU memory into one line; :mod:`attnscope.engines.press` is the atlas's KV
press (some KV heads cut to sink + window), its prefill and its greedy answers.
"""

from attnscope.engines.backends import BACKENDS, NAMES, Backend, LayerInput, choose, tile_budget

__all__ = ["BACKENDS", "NAMES", "Backend", "LayerInput", "choose", "tile_budget"]
