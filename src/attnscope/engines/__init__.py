"""Statistics inside attention: the streaming engine's backends (no ``[n n]`` maps).

:mod:`attnscope.engines.backends` is the seam (which backend runs a layer of a sequence, chosen by
device and input; the tiles' sizes per device); :mod:`attnscope.engines.flex` the fused backend
(FlexAttention: the statistics from log-sum-exps); :mod:`attnscope.engines.memory` turns running
out of GPU memory into one line. The engine that dispatches through the seam, with the torch
tiles and the compiled CPU kernel, is :mod:`attnscope.analyses.streaming` (and
:mod:`attnscope.analyses.native`).
"""

from attnscope.engines.backends import BACKENDS, NAMES, Backend, LayerInput, choose, tile_budget

__all__ = ["BACKENDS", "NAMES", "Backend", "LayerInput", "choose", "tile_budget"]
