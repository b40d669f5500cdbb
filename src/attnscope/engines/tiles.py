"""How large the streaming engine's tiles of whole rows may be on a device (:func:`tile_budget`):
the backends and the engine read it, so it sits below both."""

from __future__ import annotations

#: the float32 scores of one tile at most, for the automatic tiles on a CPU (its cache; see
#: ``tiled.auto_tile``, where it was measured)
CPU_TILE_BYTES = 7 << 20
#: rows of a CPU tile at most (measured with ``CPU_TILE_BYTES``; see ``tiled.auto_tile``)
CPU_TILE_ROWS = 64
#: the share of a GPU's free memory that one tile's scores may take: the tile's weights and its
#: ``P V`` come on top of it, and the model's own activations must still fit
GPU_TILE_SHARE = 8


def tile_budget(device, cpu_bytes: int = CPU_TILE_BYTES) -> tuple[int, int]:
    """``(bytes, rows)``: how large the automatic tiles of whole rows may be on ``device``: the
    float32 scores of one tile at most, and its rows at most.

    A CPU gets tiles that stay in its cache (``cpu_bytes``, :data:`CPU_TILE_ROWS`). A CUDA
    device gets tiles sized from what it reports: ``1 / GPU_TILE_SHARE`` of its free memory, with
    as many rows as fit (a GPU runs thousands of rows per product, where 16-64-row tiles left it
    launch-bound: issue 38 measured about 262,000 tiles per pass at 32k tokens).
    """
    import torch

    kind = getattr(device, "type", str(device).split(":")[0])
    if kind == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return max(CPU_TILE_BYTES, int(free) // GPU_TILE_SHARE), 1 << 40
    return cpu_bytes, CPU_TILE_ROWS
