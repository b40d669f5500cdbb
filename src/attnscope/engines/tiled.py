"""Two backends of the streaming engine that work in torch on rows of scores (:mod:`.backends`):

- ``tiles``, the fallback: a layer in tiles of whole rows (every key a row sees, so no online
  softmax is needed), any device, any input (word level, probes); each tile holds a block of key
  heads and their query heads, and the blocks go one after the other, each through all its rows,
  so one block's keys and values stay in the cache;
- ``compiled``: the whole layer of a sequence in one call of the compiled CPU kernel
  (:func:`attnscope.engines.native.flash`), then its sampled rows' weights from their scores.

Where the compiled kernel built, the tiles' softmax, entropies and key-class masses are its row
kernel (:func:`attnscope.engines.native.softmax_stats`, one pass over each row); elsewhere torch's
softmax, with the classes as extra value columns.
"""

from __future__ import annotations

import math
from functools import partial

from attnscope.engines import native
from attnscope.engines.rows import Sequence
from attnscope.engines.seam import Backend, LayerInput
from attnscope.engines.tiles import CPU_TILE_BYTES, CPU_TILE_ROWS, tile_budget

TILE_BYTES = CPU_TILE_BYTES  # a CPU tile's float32 scores at most (automatic tiles)
LOW = -3.4028234663852886e38  # float32's most negative finite value: "masked"


def _upper(c: int, device):
    """``[c c]`` bool, True above the diagonal (a query must not see later keys)."""
    import torch

    return torch.ones(c, c, dtype=torch.bool, device=device).triu(1)


def softmax_entropy(s, e):
    """Row softmax of the scores ``s`` ``[H c K]``, each row's entropy and its largest weight.

    ``s`` is used up (shifted in place so that each row's maximum is 0, then overwritten); ``e``
    (same shape) receives the weights ``p = exp(s) / z``, ``z = sum exp(s)``. The largest weight
    is ``exp(0) / z = 1 / z``, so ``H = -sum p ln p = ln z - sum p s = -ln max p - sum p s``.
    Masked scores give ``p = 0`` exactly. torch's softmax writes ``p`` in one pass over memory
    (it works a row at a time, within the cache), where ``exp``, a sum and a scaling written out
    took three (on a ``[9 17 16384]`` tile: 1.5 ms against 2.6 ms); ``e`` is a buffer the
    caller keeps, not a fresh allocation.
    """
    import torch

    s.sub_(s.amax(-1, keepdim=True))
    p = torch.softmax(s, -1, out=e)
    top = p.amax(-1)
    ent = s.mul_(p).sum(-1).neg_().sub_(torch.log(top))  # (s is spent: p s in its place)
    return p, ent, top


def with_sinks(p, ent, top, peak, sink):
    """A row's weights ``p`` ``[h c K]`` (its entropy and largest weight ``[h c]``), softmaxed over
    its keys, as a model with a learned sink logit ``sink`` ``[h 1]`` per head has them (GPT-OSS:
    the sink joins the softmax and is dropped, so the row keeps ``a = z / (z + exp(sink))`` of its
    mass, ``z = sum_j exp(s_j)``): ``a p``, entropy ``-sum a p ln(a p) = a (H - ln a)`` and
    largest weight ``a max p``. ``peak``: each row's largest score ``[h c]``; ``ln z = peak - ln max p``.
    In place on ``p``."""
    import torch

    log_keep = -torch.nn.functional.softplus(sink - peak + torch.log(top))  # ln a = -ln(1 + e^sink / z)
    keep = torch.exp(log_keep)
    p.mul_(keep[..., None])
    return p, keep * (ent - log_keep), keep * top


def auto_tile(kv_groups: int, kv_heads: int, n: int, rows: int = 0,
              tile_bytes: int = TILE_BYTES, max_rows: int = CPU_TILE_ROWS) -> tuple[int, int]:
    """``(query rows, key heads)`` per tile. Rows (unless given): ``max_rows``, fewer where the
    float32 ``[G rows n]`` scores of one key head's ``G = kv_groups`` query heads would take more
    than ``tile_bytes``, and at least 16 (at most ``n``); then as many key heads as fit in
    ``tile_bytes`` (at least one). The budget is the device's
    (:func:`attnscope.engines.tiles.tile_budget`): on a CPU 7 MB and 64 rows, measured here;
    on a GPU a share of its free memory, with no cap on the rows. Measured on CPU with SmolLM2
    (one thread, 9 query heads on 3 key heads, one layer's tiles against sdpa's 1.0 s at 8k and 3.85 s at 16k): at 8k, 64 rows of one key head 1.42 s,
    35 rows of all three 1.60 s; at 16k, 32 rows of one key head 5.83 s, 64 rows 6.21 s, 17 rows
    of all three 7.14 s. A tile, its weights and its key head's keys and values should stay
    within the 32 MB cache, and the products want as many rows as that allows."""
    row_bytes = 4 * kv_groups * max(1, n)
    rows = rows or int(min(max_rows, max(16, tile_bytes // row_bytes), max(1, n)))
    return rows, int(min(kv_heads, max(1, tile_bytes // (row_bytes * rows))))


# -- the layer's rows of scores, a tile at a time ------------------------------------------------
def _buffer(layer: LayerInput, i: int, shape):
    """Scratch buffer ``i`` viewed as ``shape``, sized at once for rows as wide as the longest
    sequence, and kept from one layer to the next."""
    v, T, tiles = layer.value, layer.out.shape[1], layer.scratch
    size = math.prod(shape)
    if tiles[i] is None or tiles[i].numel() < size or tiles[i].device != v.device:
        tiles[i] = v.new_empty(max(size, size // shape[-1] * T))
    return tiles[i][:size].view(shape)


def scores(layer: LayerInput, b: int, block, r0: int, r1: int, k1: int, out=None):
    """The scaled, capped, biased (ALiBi) and masked scores of rows r0 .. r1-1 of sequence b over keys
    0 .. k1-1, for a block of key heads and their query heads (two slices): [h c k1].

    Grouped-query attention without copies of the keys: the G query heads that share a
    key head (query head h reads key head h // G) are one matrix of G c rows, so each
    product reads a key block once for all of them."""
    import torch

    site, q, k, cap = layer.site, layer.site.query, layer.key, layer.cap
    G = site.kv_groups
    c = r1 - r0
    kv, hq = block
    nk = kv.stop - kv.start
    qr = (q[b, hq, r0:r1].float() * site.scaling).reshape(nk, G * c, -1)
    s = torch.matmul(qr, k[b, kv, :k1].transpose(-1, -2), out=out).view(nk * G, c, k1)
    if cap:
        s.div_(cap).tanh_().mul_(cap)
    if site.bias is not None:  # ALiBi: each head's bias on each key, the same for every row; a
        # position bias: on each query and key
        s.add_((site.bias[b, hq, None, :k1] if site.bias.dim() == 3 else site.bias[b, hq, r0:r1, :k1]).float())
    if site.mask is None and layer.causal:  # keys < r0 are all visible; mask the upper triangle of the last block
        s[:, :, r0:r1].masked_fill_(_upper(c, s.device), LOW)
    else:
        s.masked_fill_(~site.allowed(r0, r1, k1)[b], LOW)
    return s


def probs(layer: LayerInput, b: int, block, r0: int, r1: int, vb, cls=None, dist: bool = False,
          fast: bool = False):
    """Rows r0 .. r1-1 of sequence b (:func:`scores`): P [h c k1], entropies and largest
    weights [h c], the rows' mass on each key class [h c F], and, with dist, their mass
    per distance (:func:`~attnscope.engines.rows.diagonal_sums`; None where the
    torch path leaves it to the statistics). The compiled kernel (:mod:`.native`) takes
    the key classes as ``cls`` [F n]; the torch path has them as the columns of the
    values vb [Hkv n d+C] past the first d. ``fast``: the compiled row kernel runs here
    (:func:`attnscope.engines.native.available`, asked once per layer)."""
    import torch

    G, d = layer.site.kv_groups, layer.value.shape[-1]
    k1 = r1 if layer.causal else layer.lengths[b]
    c = r1 - r0
    kv, hq = block
    nk = kv.stop - kv.start
    shape = (nk, G * c, k1)
    s = scores(layer, b, block, r0, r1, k1, out=_buffer(layer, 0, shape))
    per_d = None
    sinks = layer.site.sinks
    if sinks is not None:  # the rows' weights are scaled after the softmax (torch's path: not fast)
        peak = s.amax(-1)
    if fast:  # one pass over each row: p in place of s, the classes' mass, the distances
        if dist:
            per_d = _buffer(layer, 2, (nk * G, k1 + c - 1))
        ent, top, masses = native.softmax_stats(s, per_d, cls)
        p = s
    else:
        p, ent, top = softmax_entropy(s, _buffer(layer, 1, s.shape))
    keep = None  # sink-scale: the weights stay the plain softmax; the output keeps a of its size
    if sinks is not None and layer.sink_mass:
        p, ent, top = with_sinks(p, ent, top, peak, sinks[hq].float()[:, None])
    elif sinks is not None:
        keep = torch.exp(-torch.nn.functional.softplus(sinks[hq].float()[:, None] - peak + torch.log(top)))
    pv = torch.matmul(p.view(shape), vb[kv, :k1]).view(nk * G, c, -1)
    out = pv[..., :d] if keep is None else pv[..., :d] * keep[..., None]
    layer.out[b, r0:r1, hq] = out.transpose(0, 1)
    return p, ent, top, (masses if fast else pv[..., d:]), per_d


# -- the two backends --------------------------------------------------------------------------
def whole_layer(layer: LayerInput, b: int, seq: Sequence) -> None:
    """Every row of sequence b in one call of the compiled one-pass kernel
    (:func:`~attnscope.engines.native.flash`), then its sampled rows' weights."""
    import torch

    site, stats, q, k, v = layer.site, layer.stats, layer.site.query, layer.key, layer.value
    H = q.shape[1]
    Hkv = H // site.kv_groups
    n = seq.n
    nkeys = n if stats.causal else layer.lengths[b]
    mask = None
    if site.mask is not None:  # (a mask broadcast over the rows keeps its row stride 0)
        mask = site.allowed(0, n, nkeys)[b, 0].expand(n, nkeys)
        mask = mask if mask.stride(-1) == 1 else mask.contiguous()
    rowv, dist = stats.row_buffers(site.layer, seq, v.device)
    native.flash(q[b].float(), k[b], v[b], layer.out[b], n, nkeys, site.scaling, layer.cap, stats.causal, mask,
                 seq.key_classes(v.device).t().contiguous(), rowv, dist)
    every = (slice(0, Hkv), slice(0, H))
    for r in seq.js_rows:
        width = r + 1 if stats.causal else nkeys
        stats.sampled_row(site.layer, seq, r, torch.softmax(scores(layer, b, every, r, r + 1, width), -1)[:, 0])
    stats.layer_end(seq)


def tile_layer(layer: LayerInput, b: int, seq: Sequence) -> None:
    """Sequence b in tiles of whole rows (word level: of whole words)."""
    site, stats, v = layer.site, layer.stats, layer.value
    G = site.kv_groups
    Hkv = site.query.shape[1] // G
    d = v.shape[-1]
    fast = native.available(v.device) and site.sinks is None  # (sinks scale the weights after the softmax)
    rows, nk = auto_tile(G, Hkv, layer.lengths[b], layer.chunk, *tile_budget(v.device, TILE_BYTES))
    blocks = [(slice(k, min(Hkv, k + nk)), slice(k * G, min(Hkv, k + nk) * G))  # key heads, query heads
              for k in range(0, Hkv, nk)]
    if seq.units is not None:
        for block in blocks:
            _unit_tiles(layer, site.layer, partial(probs, layer, b, block, vb=v[b], fast=fast), seq, rows,
                        block[1])
        stats.layer_end(seq)
        return
    kc = seq.key_classes(v.device)  # [n F]
    if fast:  # the classes go to the kernel, and P V has the values' d columns only
        vb, cls = v[b, :, :seq.n].contiguous(), kc.t().contiguous()
    else:  # the classes as extra value columns (padded to a multiple of 4, which the
        # matrix product runs faster on): one product gives each row's output and its
        # mass on every class
        cls = None
        vb = v.new_zeros(Hkv, seq.n, d + kc.shape[1] + (-(d + kc.shape[1])) % 4)
        vb[:, :, :d] = v[b, :, :seq.n]
        vb[:, :, d:d + kc.shape[1]] = kc
    for block in blocks:
        probs(layer, b, block, 0, 1, vb, fast=fast)  # row 0: its output only (a statistics row has other keys to see)
        for q0 in range(1, seq.n, rows):
            q1 = min(seq.n, q0 + rows)
            p, ent, top, masses, per_d = probs(layer, b, block, q0, q1, vb, cls, dist=not seq.targets, fast=fast)
            stats.tile(site.layer, seq, q0, p, ent, top, masses, heads=block[1], per_d=per_d)
    stats.layer_end(seq)


def _unit_tiles(layer: LayerInput, index: int, probs, seq: Sequence, rows: int, heads) -> None:
    # word level: tiles of whole units, about `rows` tokens each, from unit 1 on
    n, U, starts = seq.token_n, seq.n, seq.unit_start
    probs(0, starts[1] if U > 1 else n)  # unit 0's rows: their output only
    u0 = 1
    while u0 < U:
        t0 = starts[u0]
        u1 = u0 + 1
        while u1 < U and starts[u1] - t0 < rows:
            u1 += 1
        t1 = starts[u1] if u1 < U else n
        p = probs(t0, t1)[0]
        pw, ent = _unit_tile(p, seq, t0, u0, u1, u1 if layer.causal else U)
        layer.stats.tile(index, seq, u0, pw, ent, heads=heads)
        u0 = u1


def _unit_tile(p, seq: Sequence, t0: int, u0: int, u1: int, ku: int):
    """Token rows ``t0 ..`` of ``p`` ``[H c K]`` as unit rows ``u0 .. u1-1`` over keys ``0 .. ku-1``:
    the mass TO a unit is the sum over its pieces, the row FROM a unit the mean of its pieces'
    rows (paper section 4.1, as :func:`attnscope.extract.wordlevel.to_word_level`); and each
    unit row's entropy. Every piece of units ``u0 .. u1-1`` is in the tile."""
    import torch

    H, c, K = p.shape
    cols = p.new_zeros(H, c, ku).index_add_(2, seq.units[:K], p)  # [H c ku]
    pw = p.new_zeros(H, u1 - u0, ku).index_add_(1, seq.units[t0:t0 + c] - u0, cols)
    pw.div_(seq.unit_counts[u0:u1].to(p.dtype)[None, :, None])
    return pw, -torch.special.xlogy(pw, pw).sum(-1)


COMPILED = Backend(
    "compiled", devices=("cpu",), token_level=True, probes=False, min_tokens=2, run=whole_layer,
    usable=lambda kind: native.available(kind) and native.flash_kernel() is not None,
    why="the compiled kernel runs on the CPU only, and only where a C compiler built it and torch's "
        "library exports sgemm_",
    handles=frozenset({"softcap", "window", "chunk", "scale"}))
TILES = Backend("tiles", devices=(), token_level=False, probes=True, run=tile_layer,
                usable=lambda kind: True, fallback=True,
                handles=frozenset({"sinks", "sink-scale", "value-size", "softcap", "window", "chunk", "scale", "alibi",
                                   "position-bias"}))
