"""The fused backend: FlexAttention gives a layer's output and, from log-sum-exps, every statistic.

No row of scores is ever held: each call of ``torch.nn.attention.flex_attention`` returns, per
query row ``i``, its output and its log-sum-exp ``L_i = ln sum_j exp(s_ij)`` over the keys its mask
allows (``s_ij = cap tanh(scale q_i . k_j / cap)`` with soft-capping, ``scale q_i . k_j``
without), so that ``p_ij = exp(s_ij - L_i)``. From those (query head ``h`` reads key head
``h // G``; the calls take the key heads as they are, ``enable_gqa``)::

    one key's weight           p_ij = exp(s_ij - L_i)                  (O(n d): the previous token,
                                                                        a probe's target key)
    largest weight             max_j p_ij = exp(max_j s_ij - L_i)
    entropy                    H_i = L_i - sum_j p_ij s_ij,   sum_j p_ij s_ij = scale q_i . (P K)_i
                               (the main call's values are [V | K]: one call gives P V and P K)
    mass in a distance bucket  exp(L_i^band - L_i)                     (a call restricted to the
                                                                        band by its block mask)
    mass on key classes        sum_band exp(L_i^band - L_i) (P_band C)_i  (the classes, one-hot
                                                                        columns, are the values
                                                                        of the band calls)

The buckets (``0 | 1 | 2 | 3-4 | 5-8 | ...`` of ``i - j``, of ``|i - j|`` in an encoder) partition
what a row sees, so the band calls together cost about one more pass, over narrow values; the
classes ride in them instead of widening the main call (``[V | K]`` is 128 columns at head size
64). Soft-capped scores are not linear in the keys, so there ``P K`` says nothing of
``sum_j p_ij s_ij``; with the row's largest score ``m_i`` a second call with the score
``s + ln(m_i - s)`` gives ``L'_i = ln sum_j exp(s_ij) (m_i - s_ij)``, and
``H_i = (L_i - m_i) + exp(L'_i - L_i)`` (every ``m_i - s_ij >= 0``; the largest key adds 0).

The largest score comes with the log-sum-exp from a CUDA call (``AuxRequest(max_scores=True)``).
Elsewhere FlexAttention runs eagerly (torch's reference implementation, which returns the
log-sum-exp but not the largest score): there it is taken exactly from ``s = scale Q K^T``
in blocks of rows (:func:`row_max`), the same scores the eager maps are made of. The rows sampled
for the head distances need every weight of the row: those few rows are computed in torch
(``O(rows x n)``), as on the other backends.

The calls see each sequence alone (``[1 H n d]``, the batch's padding cut off) under a block mask
built from the band's distances (:func:`block_mask`: blocks wholly inside the band are full,
those it crosses partial, the others skipped), never from an ``[n n]`` evaluation of the mask;
where the model hands a mask tensor (padding, a sliding window) the mask function reads it, and
no block is full. On CUDA the calls are ``torch.compile``'d (the fused kernel); elsewhere they are
eager, which materialises a call's scores: the CPU runs this backend to prove its mathematics
(``tests/engines/test_engines.py``), not to be fast.
"""

from __future__ import annotations

import dataclasses
import warnings
from functools import cache

from attnscope.engines import tiled
from attnscope.engines.rows import NUM_BUCKETS
from attnscope.engines.seam import Backend
from attnscope.engines.tiled import LOW
from attnscope.engines.tiles import tile_budget

BLOCK = 128  # FlexAttention's block of query rows and of keys


def available() -> bool:
    """Whether this torch has FlexAttention with auxiliary outputs (torch >= 2.9)."""
    try:
        from torch.nn.attention.flex_attention import (  # noqa: F401
            AuxRequest,
            BlockMask,
            flex_attention,
        )
    except ImportError:
        return False
    return True


def bands(n: int) -> list[tuple[int, int, int]]:
    """``(bucket, lo, hi)``: the distance buckets a sequence of ``n`` tokens has keys in
    (:func:`attnscope.engines.rows.bucket_of`: 0, 1, 2, 3-4, 5-8, ...).

    >>> bands(6)
    [(0, 0, 0), (1, 1, 1), (2, 2, 2), (3, 3, 4), (4, 5, 8)]
    """
    out = []
    for k in range(NUM_BUCKETS):
        lo, hi = (k, k) if k < 2 else (2 ** (k - 2) + 1, 2 ** (k - 1))
        if lo > n - 1:
            break
        out.append((k, lo, hi))
    return out


class Mask:
    """The keys row ``i`` of one sequence (``n`` tokens) sees within a band of distances
    ``lo <= i - j <= hi`` (causal; an encoder: ``lo <= |i - j| <= hi``), intersected with the
    model's own mask for the sequence where it handed one (``model``: ``[B 1 >=n >=n]``, boolean
    or additive float, of which the sequence is ``b``). ``hi = None``: no upper bound (what a
    row sees in the main call)."""

    def __init__(self, n: int, causal: bool, model=None, b: int = 0, lo: int = 0, hi: int | None = None):
        if model is not None and model.shape[2] == 1:  # one row for every query (LayoutLM's
            model = model.expand(-1, -1, model.shape[3], -1)  # [B 1 1 T] padding mask): a view
        self.n, self.causal, self.model, self.b, self.lo = n, causal, model, b, lo
        self.hi = n if hi is None else hi

    def band(self, lo: int, hi: int) -> Mask:
        return Mask(self.n, self.causal, self.model, self.b, lo, hi)

    def mask_mod(self):
        """FlexAttention's ``mask_mod(b, h, q_idx, kv_idx) -> bool``."""
        import torch

        lo, hi, causal, model = self.lo, self.hi, self.causal, self.model
        if model is None:
            def mod(b, h, q, k):
                d = q - k if causal else (q - k).abs()
                return (d >= lo) & (d <= hi)
            return mod
        # the whole batch's mask and the sequence's index as a tensor: the same compiled kernel
        # for every sequence of a batch (a view of one sequence's mask has its own offset)
        row = torch.tensor(self.b, device=model.device)
        low = torch.finfo(model.dtype).min / 2 if model.is_floating_point() else None

        def mod(b, h, q, k):
            d = q - k if causal else (q - k).abs()
            m = model[row, 0, q, k]
            return (d >= lo) & (d <= hi) & (m if low is None else m > low)
        return mod

    def allows(self, i, j):
        """Bool, elementwise over index tensors ``i`` (rows) and ``j`` (keys) of one shape
        (negative or ``>= n`` keys: False)."""
        import torch

        inside = (j >= 0) & (j < self.n)
        jj = torch.where(inside, j, torch.zeros_like(j))
        return inside & self.mask_mod()(None, None, i, jj)

    def rows(self, r0: int, r1: int, device):
        """``[r1-r0 n]`` bool: the keys rows ``r0 .. r1-1`` see (one block of rows at a time)."""
        import torch

        i = torch.arange(r0, r1, device=device)[:, None]
        j = torch.arange(self.n, device=device)[None, :]
        return self.allows(i.expand(-1, self.n), j.expand(r1 - r0, -1))

    def intervals(self) -> list[tuple[int, int]]:
        """The band as intervals of ``i - j``."""
        if self.causal:
            return [(self.lo, self.hi)]
        return [(-self.hi, self.hi)] if self.lo == 0 else [(self.lo, self.hi), (-self.hi, -self.lo)]


def block_mask(mask: Mask, device):
    """``mask`` as FlexAttention's :class:`BlockMask`, from the band's distances alone: a block
    of rows ``qs .. qe`` and keys ``ks .. ke`` holds the distances ``qs - ke .. qe - ks``; it is
    full (the kernel skips the mask function there) when one interval of the band holds them
    all and the model handed no mask, skipped when none meets them, partial otherwise. Its
    tensors are ``[1 1 nb nb]`` (``nb = ceil(n / BLOCK)``); no ``[n n]`` evaluation."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    n = mask.n
    nb = -(-n // BLOCK)
    starts = torch.arange(nb, device=device) * BLOCK
    ends = torch.clamp(starts + BLOCK, max=n) - 1
    dmin = starts[:, None] - ends[None, :]  # [nb nb]: smallest and largest q - k in each block
    dmax = ends[:, None] - starts[None, :]
    touch = torch.zeros(nb, nb, dtype=torch.bool, device=device)
    full = torch.zeros_like(touch)
    for lo, hi in mask.intervals():
        touch |= (dmax >= lo) & (dmin <= hi)
        full |= (dmin >= lo) & (dmax <= hi)
    if mask.model is not None:
        full.zero_()

    def ordered(dense):  # counts [1 1 nb] and the blocks' indices first [1 1 nb nb] (int32)
        idx = torch.argsort((~dense).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return dense.sum(-1, dtype=torch.int32)[None, None], idx[None, None]

    return BlockMask.from_kv_blocks(*ordered(touch & ~full), *ordered(full), BLOCK_SIZE=BLOCK,
                                    mask_mod=mask.mask_mod(), seq_lengths=(n, n), compute_q_blocks=False)


def _main(*args, **kwargs):  # a layer's output, P K, log-sum-exp and largest score
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(*args, **kwargs)


def _band(*args, **kwargs):  # the log-sum-exp and class masses of a band of distances
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(*args, **kwargs)


def _shifted(*args, **kwargs):  # soft-capping: ln sum exp(s) (m - s), for the entropy
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(*args, **kwargs)


KINDS = {"main": _main, "band": _band, "shifted": _shifted}


@cache
def _compiled(kind: str):
    import torch

    # one function per kind of call: dynamo counts recompilations per function (the kinds differ
    # in their score function and values), and past its limit it would run the eager version,
    # which holds [n n] scores; dynamic: one kernel for every length instead of one per document
    return torch.compile(KINDS[kind], dynamic=True)


def function(device, kind: str = "main"):
    """The FlexAttention to call on ``device`` for one ``kind`` of call (:data:`KINDS`):
    compiled (the fused kernel) on CUDA; elsewhere eager, torch's reference implementation (the
    CPU's compiled FlexAttention returns neither the log-sum-exp nor the largest score)."""
    return _compiled(kind) if getattr(device, "type", device) == "cuda" else KINDS[kind]


def attend(q, k, v, mask: Mask, scale: float, score_mod=None, max_scores: bool = False, blocks=None,
           kind: str = "main"):
    """One FlexAttention call (of ``kind``, :func:`function`): ``q`` ``[1 Hq n d]``, ``k`` ``[1 Hkv n d]``, ``v`` ``[1 Hkv n e]``
    (float32) under ``mask``. Returns the output ``[1 Hq n e]``, the log-sum-exp ``[1 Hq n]``
    (natural log; ``-inf`` for a row with no key in the band) and, where asked (CUDA only), each
    row's largest score. Values are widened to a multiple of 16 columns (zeros), which the fused
    kernel wants."""
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import AuxRequest

    e = v.shape[-1]
    if e % 16:
        v = F.pad(v, (0, 16 - e % 16))
    fn = function(q.device, kind)
    with warnings.catch_warnings():  # eager off CUDA: torch's reference implementation, on purpose
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        out, aux = fn(q, k, v, score_mod=score_mod, block_mask=blocks or block_mask(mask, q.device),
                      scale=scale, enable_gqa=q.shape[1] != k.shape[1],
                      return_aux=AuxRequest(lse=True, max_scores=max_scores))
    return out[..., :e], aux.lse, aux.max_scores


def resolves(lse, n: int) -> bool:
    """Whether float32 log-sum-exps ``lse`` ``[H n]`` resolve the statistics of rows of ``n`` keys:
    each ``L_i`` is rounded to eps32 of its own size (within ``ln n`` of the row's largest score
    ``m_i``), and that error moves every weight derived from it (``exp(s - L)``, ``exp(L_band - L)``) by as
    much of itself and the entropy ``L - sum p s`` by as much again; it stays within float32
    rounding of the row itself (:func:`~attnscope.engines.rows.row_rounding`, ``eps32 n (1 + ln
    n)``) while ``|L_i| <= n (1 + ln n)``. A random MobileBERT's scores reach 2.5e11, where ``L``
    is rounded by 16,384 and the bucket masses overflow.

    >>> import torch
    >>> resolves(torch.tensor([[3.0, -20.0]]), 8), resolves(torch.tensor([[2.5e11]]), 8)
    (True, False)
    """
    import math

    import torch

    # (one host sync: a row with no key, -inf, has no size)
    size = torch.where(torch.isfinite(lse), lse.abs(), torch.zeros((), device=lse.device)).amax()
    return float(size) <= n * (1.0 + math.log(max(n, 1)))


def on_tiles(name: str, layer, b: int, seq, lse) -> None:
    """Sequence ``b`` of ``layer`` on the tiles (each row shifted by its largest score before any
    exponential: exact to float32 rounding whatever the scores' size) where backend ``name``'s
    log-sum-exps ``lse`` do not resolve it (:func:`resolves`); said as a warning (one text per
    backend: Python shows it once)."""
    import torch

    warnings.warn(f"{name}: some layers' scores are too large for float32 log-sum-exps over their keys "
                  "(|L| above n (1 + ln n)); those layers ran on the tiles", RuntimeWarning, stacklevel=2)
    if layer.key.dtype != torch.float32:  # (the one-pass kernel's keys and values, in the model's dtype)
        layer = dataclasses.replace(layer, key=layer.key.float(), value=layer.value.float())
    tiled.TILES.run(layer, b, seq)


def score_mod(cap: float | None, bias=None):
    """The score modification of logit soft-capping, ``cap tanh(s / cap)``, then of a bias per
    head and key (ALiBi: ``bias`` ``[Hq n]`` float32, added after the cap as :mod:`.tiled` adds
    it); None without either."""
    if not cap and bias is None:
        return None

    def mod(score, b, h, q, k):
        if cap:
            score = cap * (score / cap).tanh()
        return score if bias is None else score + bias[h, k]

    return mod


def scores(q, k, rows, scale: float, cap: float | None, bias=None):
    """``[Hq c n]`` float32 scores of ``rows`` (a slice) against every key (``k`` float32; ``q``
    any float dtype), the ``G`` query heads of a key head stacked into one product (query head
    ``h`` reads key head ``h // G``); capped, then biased (:func:`score_mod`)."""
    Hq, Hkv = q.shape[1], k.shape[1]
    qr = q[0, :, rows].to(k.dtype)  # [Hq c d] (the rows only, in the keys' float32)
    c = qr.shape[1]
    s = (qr.reshape(Hkv, (Hq // Hkv) * c, -1) @ k[0].transpose(-1, -2)).view(Hq, c, -1).mul_(scale)
    if cap:
        s.div_(cap).tanh_().mul_(cap)
    if bias is not None:
        s.add_(bias[:, None, :s.shape[-1]])
    return s


def row_max(q, k, mask: Mask, scale: float, cap: float | None, rows: int, bias=None):
    """``[Hq n]``: each row's largest score over the keys ``mask`` allows, exactly, from blocks
    of ``rows`` rows (``Hq rows n`` floats at a time): FlexAttention off CUDA does not return it."""
    import torch

    n = mask.n
    out = q.new_empty(q.shape[1], n)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        s = scores(q, k, slice(r0, r1), scale, cap, bias)
        out[:, r0:r1] = s.masked_fill_(~mask.rows(r0, r1, q.device), -torch.inf).amax(-1)
    return out


def key_weight(q, k, lse, mask: Mask, j, scale: float, cap: float | None, bias=None):
    """``[Hq n]``: each row ``i``'s weight on one key ``j[i]`` (long ``[n]``; outside the keys the
    row sees: 0), ``exp(s_ij - L_i)``, in ``O(n d)``."""
    import torch

    Hq, Hkv, n = q.shape[1], k.shape[1], q.shape[2]
    i = torch.arange(n, device=q.device)
    kj = k[0][:, j.clamp(0, n - 1)]  # [Hkv n d]
    s = (q[0].view(Hkv, Hq // Hkv, n, -1) * kj[:, None]).sum(-1).view(Hq, n) * scale
    if cap:
        s = cap * torch.tanh(s / cap)
    if bias is not None:
        s = s + bias[:, j.clamp(0, n - 1)]
    ok = mask.allows(i, j)
    return torch.where(ok, torch.exp(s - lse), torch.zeros((), device=q.device))


def _bias(layer, b: int):
    """Sequence ``b``'s bias on the scores (ALiBi) ``[Hq n]`` in float32, or None."""
    bias = layer.site.bias
    return None if bias is None else bias[b, :, :layer.lengths[b]].float().contiguous()


def probe_targets(layer, seq, q, k, lse, mask: Mask, b: int) -> None:
    """A probe's rows' weights on their targets, ``exp(s_ij - L_i)`` from the rows' log-sum-exps
    ``lse`` ``[Hq n]`` (``q`` ``[1 Hq n d]``, ``k`` ``[1 Hkv n d]``, float32), into ``layer.stats``."""
    layer.stats.target_weights(layer.site.layer, seq, {
        name: key_weight(q, k, lse, mask, t, layer.site.scaling, layer.cap, _bias(layer, b))
        for name, t in seq.targets.items()})


def sampled_rows(layer, seq, q, k, mask: Mask, b: int) -> None:
    """The rows sampled for the head distances: every weight of each row from its scores, O(n)
    each, into ``layer.stats``."""
    import torch

    n = mask.n
    for r in seq.js_rows:
        width = r + 1 if layer.causal else n
        s = scores(q, k, slice(r, r + 1), layer.site.scaling, layer.cap, _bias(layer, b))[:, 0, :width]
        ok = mask.rows(r, r + 1, q.device)[0, :width]
        s = s.masked_fill(~ok, LOW)
        if layer.site.sinks is not None and layer.sink_mass:  # the sink joins the softmax and is dropped
            s = torch.cat([s, layer.site.sinks.float()[:, None]], -1)
        layer.stats.sampled_row(layer.site.layer, seq, r, torch.softmax(s, -1)[:, :width])


def run_layer(layer, b: int, seq) -> None:
    """Sequence ``b`` of ``layer`` (:class:`~attnscope.engines.seam.LayerInput`): its output
    rows into ``layer.out`` and its statistics into ``layer.stats`` (a probe: the weights on its
    targets only)."""
    import torch

    site, stats = layer.site, layer.stats
    n, cap, scale, bias = seq.n, layer.cap, site.scaling, _bias(layer, b)
    # [1 H n d]: the sequence alone, its padding cut off, in one layout whatever the batch
    q = site.query[b:b + 1, :, :n].float().contiguous()
    k, v = layer.key[b:b + 1, :, :n].contiguous(), layer.value[b:b + 1, :, :n].contiguous()
    Hq, d = q.shape[1], v.shape[-1]
    mask = Mask(n, layer.causal, site.mask, b)
    whole = block_mask(mask, q.device)
    full = n > 1 and not seq.targets  # every statistic (else the output, and a probe's targets)
    # the values are [V | K] in every main call (one kind of call to compile; P K is used where
    # the scores are linear in the keys)
    o, lse, top_score = attend(q, k, torch.cat([v, k], -1), mask, scale, score_mod(cap, bias),
                               max_scores=q.device.type == "cuda", blocks=whole)
    L = lse[0]  # [Hq n]
    if not resolves(L, n):
        return on_tiles("flex", layer, b, seq, L)
    keep = 1.0  # the share of each row's mass on its keys: 1, but a / (z + e^sink) with learned sinks
    scaled = o[0, :, :, :d]  # the layer's output
    if site.sinks is not None:  # the sink joins each row's softmax: L = ln(z + e^sink)
        with_sink = torch.logaddexp(L, site.sinks.float()[:, None])
        share = torch.exp(L - with_sink)
        scaled = scaled * share[..., None]  # the output either way
        if layer.sink_mass:  # the weights count the sink's mass too (sink-scale: the plain softmax's)
            keep, L, o = share, with_sink, o * share[None, :, :, None]
    layer.out[b, :n] = scaled.transpose(0, 1)
    if seq.targets:
        probe_targets(layer, seq, q, k, L, mask, b)
    if not full:
        stats.layer_end(seq)
        return
    if top_score is not None:
        m = top_score[0]
    else:  # blocks of rows whose scores take what a tile of the device may
        m = row_max(q, k, mask, scale, cap, max(1, tile_budget(q.device)[0] // (4 * Hq * n)), bias)
    # (with sinks p_ij = exp(s_ij - L) sum to keep_i, so H = keep L - sum p s)
    if cap or bias is not None:  # H = keep (L - m) + exp(L' - L), L' = ln sum_j exp(s_ij) (m_i - s_ij)
        modified = score_mod(cap, bias)

        def shifted(score, b, h, qi, ki):
            s = modified(score, b, h, qi, ki)
            return s + torch.log(torch.clamp(m[h, qi] - s, min=0.0))

        _, lse2, _ = attend(q, k, v[..., :1], mask, scale, shifted, blocks=whole, kind="shifted")
        ent = keep * (L - m) + torch.exp(lse2[0] - L)
    else:  # H = keep L - scale q . (P K)
        ent = keep * L - scale * (q[0] * o[0, :, :, d:]).sum(-1)
    rowv, dist = stats.row_buffers(site.layer, seq, q.device)  # [2+F Hq n], [Hq NB+1] float64
    cls = seq.key_classes(q.device)  # [n F]
    F = cls.shape[1]
    values = cls[None, None].expand(1, k.shape[1], n, F).contiguous()
    masses = q.new_zeros(Hq, n, F)
    for bucket, lo, hi in bands(n):
        ob, lb, _ = attend(q, k, values, mask.band(lo, hi), scale, score_mod(cap, bias), kind="band")
        w = torch.where(torch.isfinite(lb[0]), torch.exp(lb[0] - L), torch.zeros((), device=q.device))
        masses += w[..., None] * ob[0].nan_to_num(0.0)
        dist[:, bucket] += w[:, 1:].double().sum(-1)
    i = torch.arange(n, device=q.device)
    dist[:, NUM_BUCKETS] += key_weight(q, k, L, mask, i - 1, scale, cap, bias)[:, 1:].double().sum(-1)
    rowv[0] = ent
    rowv[1] = torch.exp(m - L)
    rowv[2:] = masses.permute(2, 0, 1)
    sampled_rows(layer, seq, q, k, mask, b)
    stats.layer_end(seq)


BACKEND = Backend("flex", devices=("cuda",), token_level=True, probes=True, run=run_layer,
                  usable=lambda kind: available(), why="this torch has no torch.nn.attention.flex_attention",
                  handles=frozenset({"sinks", "sink-scale", "value-size", "softcap", "window", "chunk", "scale",
                                     "alibi"}))
