"""The one-pass backend: a Triton kernel of attnscope's own that computes a layer's output and every
per-row statistic in one pass over the keys, never holding a row of scores.

It is FlashAttention's forward loop (blocks of ``BM`` query rows against blocks of ``BN`` keys,
the row's running largest score ``m``, its running sum ``z`` and its output rescaled by
``exp(m_old - m_new)`` as each block arrives) with more running sums beside ``z``, each rescaled
the same way::

    sum_j p_ij s_ij          the entropy, H_i = L_i - (sum_j e^(s_ij - m) s_ij) / z,  L_i = m + ln z
    sum_j p_ij C_jc          the mass on each key class c (one-hot columns C: first token, special,
                             punctuation, ...)
    sum_j p_ij [b(i - j) = k] the mass in each distance bucket k (0 | 1 | 2 | 3-4 | 5-8 | ...;
                             of |i - j| in an encoder)
    p_i,i-1                  the previous token's weight

and the largest weight is ``exp(m - L_i) = 1 / z``. The scores are accumulated in float32 from the
model's queries and keys (bfloat16 on a GPU) and ``sum_j p_ij s_ij`` is summed directly, so the
entropy needs no cancellation between two large terms (FlexAttention's ``L - scale q . (P K)``
does, which is why :mod:`attnscope.engines.flex` computes in float32), and soft-capped scores
(Gemma 2) need no second call. What FlashAttention was asked for and did not take (its issue
#1878; pull request #2359, closed unmerged) is this sum.

What each block of scores costs beyond FlashAttention's loop is kept to a few operations per score:

- the buckets: a block of rows ``i0 .. i1`` and keys ``j0 .. j1`` holds the distances
  ``i0 - j1 .. i1 - j0``; where they lie in one bucket (every block but those near the diagonal
  and across a bucket's edge: the buckets widen with the distance) the bucket's mass is the row
  sum ``z`` already takes; elsewhere one masked sum per bucket the block meets (at most
  ``log2(BM + BN) + 2``); the previous token's weight only in the blocks that hold ``i - j = 1``;
- the classes: with half-precision inputs (a GPU), ``P C`` is two float16 products on the tensor
  cores, of ``P`` scaled by 2^14 (float16's normal range reaches down to ``2^-14 / 2^14``, far
  below any weight that adds to a mass) and split into a float16 part and its float16
  remainder: float32 ``P`` to about 2^-22, where one float32 product of few columns runs on
  the CUDA cores at a fraction of their rate. Float32 inputs keep the float32 product.

Each program writes, per block of rows, the bucket and previous-token masses already summed over
its rows ``>= 1`` (``[H blocks NB+1]``); the torch wrapper adds the blocks in float64, in order
(no atomics: the numbers are the same on every run). A probe's target weights come from the
row's log-sum-exp (:func:`attnscope.engines.flex.probe_targets`) and the sampled rows of the head
distances from their scores in torch (:func:`attnscope.engines.flex.sampled_rows`), as on the
FlexAttention backend.

The sequence's causal triangle (none in an encoder), and where the model hands a mask of its own
(a sliding window, a padded batch) each block of it as the block's keys arrive (boolean, read as
bytes, or additive float).
On CUDA the kernel is compiled by Triton; on the CPU it runs under ``TRITON_INTERPRET=1``
(Triton's interpreter, numpy), which proves its numbers (``tests/engines/test_engines.py``), not its
speed.
"""

from __future__ import annotations

import os
from functools import cache

from attnscope.engines import flex
from attnscope.engines.rows import NUM_BUCKETS


def launch(device, dtype, masked: bool, head_dim: int) -> tuple[int, int, int]:
    """Query rows and keys per block, and warps per program. Under the interpreter 32 x 32. On
    CUDA blocks that ptxas compiles for an H100 (sm_90a) without spilling a register
    (``tests/engines/test_onepass_cuda.py`` compiles them on the CPU). Each row carries its
    output (``head_dim`` sums) and 48 more (the buckets' and the classes'), so the blocks shrink
    as the head grows: at head size 64, 64 x 64 with 4 warps for half-precision inputs, 64 x 32
    with 8 warps where the kernel also reads the model's mask or the inputs are float32, 32 x 32
    with 8 warps for both; above 64 (128: Llama-3.1-8B), 64 x 32 with 8 warps for half-precision
    inputs and 32 x 32 for float32. Not yet timed."""
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        return 32, 32, 4
    half = dtype in (torch.float16, torch.bfloat16)
    if head_dim > 64:
        return (64, 32, 8) if half else (32, 32, 8)
    return {(True, False): (64, 64, 4), (True, True): (64, 32, 8), (False, False): (64, 32, 8),
            (False, True): (32, 32, 8)}[half, masked]


def available(device=None) -> bool:
    """Whether the kernel can run on ``device`` here: Triton installed, and a CUDA device (or
    any device under ``TRITON_INTERPRET=1``)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    kind = getattr(device, "type", str(device).split(":")[0]) if device is not None else "cuda"
    return kind == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


@cache
def _kernel():
    """The Triton kernel, made at first use (``TRITON_INTERPRET`` is read then)."""
    import triton
    import triton.language as tl

    @triton.jit
    def stats_kernel(Q, K, V, C, M, OUT, LSE, ROWS, DIST, n, scale, cap, low,
                     sq_h, sq_n, sk_h, sk_n, sm_q, sm_k, so_h, so_n, sr_f, sr_h, sd_h, sd_b,
                     G: tl.constexpr, D: tl.constexpr, F: tl.constexpr, FP: tl.constexpr,
                     NB: tl.constexpr, NBP: tl.constexpr, CAUSAL: tl.constexpr, CAP: tl.constexpr,
                     PREC: tl.constexpr, MASK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        blk = tl.program_id(0)
        h = tl.program_id(1)
        kv = h // G
        rows = blk * BM + tl.arange(0, BM)
        live = rows < n
        dd = tl.arange(0, D)
        ff = tl.arange(0, FP)
        bb = tl.arange(0, NBP)
        q = tl.load(Q + h * sq_h + rows[:, None] * sq_n + dd[None, :], mask=live[:, None], other=0.0)
        m = tl.full([BM], float("-inf"), tl.float32)
        z = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        ps = tl.zeros([BM], tl.float32)  # sum_j e^(s - m) s
        cls = tl.zeros([BM, FP], tl.float32)
        bkt = tl.zeros([BM, NBP], tl.float32)  # the buckets, then (column NB) the previous token
        end = tl.minimum(n, (blk + 1) * BM) if CAUSAL else n
        for start in range(0, end, BN):
            cols = start + tl.arange(0, BN)
            seen = cols < n
            k = tl.load(K + kv * sk_h + cols[:, None] * sk_n + dd[None, :], mask=seen[:, None], other=0.0)
            v = tl.load(V + kv * sk_h + cols[:, None] * sk_n + dd[None, :], mask=seen[:, None], other=0.0)
            c = tl.load(C + cols[:, None] * F + ff[None, :], mask=seen[:, None] & (ff[None, :] < F), other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale  # float32 sums of exact products
            if CAP:
                s = cap * (2.0 * tl.sigmoid(2.0 * s / cap) - 1.0)  # cap tanh(s / cap)
            dist = rows[:, None] - cols[None, :]
            ok = live[:, None] & seen[None, :]
            if CAUSAL:
                ok = ok & (dist >= 0)
            else:
                dist = tl.abs(dist)
            if MASK == 1:  # the model's own boolean mask (as bytes): a sliding window, padding
                ok = ok & (tl.load(M + rows[:, None] * sm_q + cols[None, :] * sm_k, mask=ok, other=0) != 0)
            elif MASK == 2:  # its additive float mask: very negative = masked
                ok = ok & (tl.load(M + rows[:, None] * sm_q + cols[None, :] * sm_k, mask=ok, other=low) > low)
            s = tl.where(ok, s, 0.0)  # finite: the masked entries' weights are set to 0 below
            m_new = tl.maximum(m, tl.max(tl.where(ok, s, float("-inf")), 1))
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: any finite shift
            alpha = tl.exp(m - shift)
            p = tl.where(ok, tl.exp(s - shift[:, None]), 0.0)
            row = tl.sum(p, 1)
            z = z * alpha + row
            if PREC is None:  # half-precision values: P V as FlashAttention does it
                pv = tl.dot(p.to(v.dtype), v)
            else:
                pv = tl.dot(p, v, input_precision=PREC)
            acc = acc * alpha[:, None] + pv
            ps = ps * alpha + tl.sum(p * s, 1)
            if PREC is None:  # on tensor cores: P (scaled into float16's normal range) split in two
                hi = (p * 16384.0).to(tl.float16)  # float16 parts, exact to about 2^-22 of P
                lo = (p * 16384.0 - hi.to(tl.float32)).to(tl.float16)
                pc = (tl.dot(hi, c.to(tl.float16)) + tl.dot(lo, c.to(tl.float16))) * (1.0 / 16384.0)
            else:
                pc = tl.dot(p, c, input_precision="ieee")
            cls = cls * alpha[:, None] + pc
            # the distance buckets (0, 1, 2, then k for 2^(k-2) < d <= 2^(k-1)) this block's
            # distances fall in, from its smallest and largest i - j: one bucket (its mass is the
            # row sum) except near the diagonal and the buckets' edges
            d_lo = blk * BM - start - BN + 1
            d_hi = blk * BM + BM - 1 - start
            if CAUSAL:
                a = tl.maximum(d_lo, 0)
                e = d_hi
            else:
                a = tl.where(d_lo > 0, d_lo, tl.where(d_hi < 0, -d_hi, 0))
                e = tl.maximum(d_hi, -d_lo)
            b_lo = (a >= 1).to(tl.int32) + (a >= 2).to(tl.int32)
            b_hi = (e >= 1).to(tl.int32) + (e >= 2).to(tl.int32)
            for kk in tl.static_range(3, NB):
                b_lo += (a > (1 << (kk - 2))).to(tl.int32)
                b_hi += (e > (1 << (kk - 2))).to(tl.int32)
            bkt = bkt * alpha[:, None]
            if b_lo == b_hi:
                bkt += row[:, None] * (bb[None, :] == b_lo).to(tl.float32)
            else:
                for kb in range(b_lo, b_hi + 1):
                    up = tl.maximum(kb - 2, 0)
                    first = tl.where(kb < 3, kb, (1 << up) + 1)  # the bucket's distances
                    last = tl.where(kb < 3, kb, 2 << up)
                    mass = tl.sum(tl.where((dist >= first) & (dist <= last), p, 0.0), 1)
                    bkt += mass[:, None] * (bb[None, :] == kb).to(tl.float32)
            if (d_lo <= 1) & (d_hi >= 1):  # the previous token's key is in this block
                prev = tl.sum(tl.where(rows[:, None] - cols[None, :] == 1, p, 0.0), 1)
                bkt += prev[:, None] * (bb[None, :] == NB).to(tl.float32)
            m = m_new
        z = tl.where(live, z, 1.0)
        lse = m + tl.log(z)
        tl.store(OUT + h * so_h + rows[:, None] * so_n + dd[None, :], acc / z[:, None], mask=live[:, None])
        tl.store(LSE + h * n + rows, lse, mask=live)
        tl.store(ROWS + h * sr_h + rows, lse - ps / z, mask=live)  # entropy
        tl.store(ROWS + sr_f + h * sr_h + rows, 1.0 / z, mask=live)  # largest weight
        cm = live[:, None] & (ff[None, :] < F)
        tl.store(ROWS + (2 + ff[None, :]) * sr_f + h * sr_h + rows[:, None], cls / z[:, None], mask=cm)
        counted = tl.where((live & (rows >= 1))[:, None], bkt / z[:, None], 0.0)
        tl.store(DIST + h * sd_h + blk * sd_b + bb, tl.sum(counted, 0), mask=bb <= NB)

    return stats_kernel


def layer_stats(q, k, v, classes, *, scale: float, cap: float | None, causal: bool, mask=None,
                config: tuple[int, int, int] | None = None):
    """One sequence's layer: ``q`` ``[Hq n d]``, ``k`` / ``v`` ``[Hkv n d]`` (any float dtype; the
    sums are float32), ``classes`` ``[n F]`` float32, ``mask``: the model's own for the sequence
    (``[>=n >=n]``, boolean or additive float; None: the sequence's causal triangle, or none).
    Returns the output ``[Hq n d]`` (float32), the log-sum-exps ``[Hq n]``, the per-row values
    ``[2+F Hq n]`` (entropy, largest weight, the class masses) and the per-head sums over rows
    ``>= 1`` ``[Hq NB+1]`` (float64: the buckets' masses, then the previous token's).
    ``config``: query rows and keys per block and warps per program (default :func:`launch`)."""
    grid, args, consts, warps = arguments(q, k, v, classes, scale=scale, cap=cap, causal=causal,
                                          mask=mask, config=config)
    _kernel()[grid](*args, **consts, num_warps=warps)
    out, lse, rows, dist = args[5:9]
    return out[..., :q.shape[-1]], lse, rows, dist.double().sum(1)[:, :NUM_BUCKETS + 1]


def arguments(q, k, v, classes, *, scale: float, cap: float | None, causal: bool, mask=None,
              config: tuple[int, int, int] | None = None):
    """The kernel's launch for :func:`layer_stats`: ``(grid, positional arguments, constexprs,
    warps)``, the output buffers among the arguments. ``benchmarks/kernel_budget.py`` compiles
    the kernel from exactly these (the JIT's specialisation of each argument included)."""
    import torch
    import triton

    Hq, n, d = q.shape
    G, F = Hq // k.shape[0], classes.shape[1]
    D = max(16, triton.next_power_of_2(d))  # tl.dot wants 16 or more; zeros change no product
    if D != d:
        q, k, v = (torch.nn.functional.pad(x, (0, D - d)) for x in (q, k, v))
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    BM, BN, warps = config or launch(q.device, q.dtype, mask is not None, D)
    blocks = triton.cdiv(n, BM)
    out = torch.empty(Hq, n, D, device=q.device, dtype=torch.float32)
    lse = torch.empty(Hq, n, device=q.device, dtype=torch.float32)
    rows = torch.empty(2 + F, Hq, n, device=q.device, dtype=torch.float32)
    dist = torch.zeros(Hq, blocks, triton.next_power_of_2(NUM_BUCKETS + 1), device=q.device, dtype=torch.float32)
    kind, low = 0, 0.0
    if mask is not None:
        kind = 2 if mask.is_floating_point() else 1
        low = torch.finfo(mask.dtype).min / 2 if kind == 2 else 0.0
        mask = mask if kind == 2 else mask.view(torch.uint8)  # the same bytes
    m = mask if mask is not None else lse  # (unread without a mask)
    args = (q, k, v, classes.contiguous().float(), m, out, lse, rows, dist, n, float(scale), float(cap or 1.0),
            float(low), q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            m.stride(0) if mask is not None else 0, m.stride(1) if mask is not None else 0,
            out.stride(0), out.stride(1), rows.stride(0), rows.stride(1), dist.stride(0), dist.stride(1))
    consts = dict(G=G, D=D, F=F, FP=max(16, triton.next_power_of_2(F)), NB=NUM_BUCKETS,
                  NBP=dist.shape[-1], CAUSAL=causal, CAP=bool(cap), BM=BM, BN=BN,
                  PREC="ieee" if q.dtype == torch.float32 else None, MASK=kind)
    return (blocks, Hq), args, consts, warps


def run_layer(layer, b: int, seq) -> None:
    """Sequence ``b`` of ``layer`` (:class:`~attnscope.engines.backends.LayerInput`) through the
    kernel: its output rows into ``layer.out`` and its statistics into ``layer.stats``."""
    import torch

    site, stats = layer.site, layer.stats
    n, cap, scale = seq.n, layer.cap, site.scaling
    own = None if site.mask is None else site.mask[b, 0]  # [T T] (a broadcast row: stride 0)
    # the model's own q, k, v (bfloat16 on a GPU: half the bytes; the sums are float32)
    q, k, v = site.query[b, :, :n], site.key[b, :, :n], site.value[b, :, :n]
    dt = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    if dt == torch.bfloat16 and q.device.type != "cuda":  # the interpreter reads no bfloat16:
        dt = torch.float32  # the same products, exact in float32
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    out, lse, rowv, dist = layer_stats(q, k, v, seq.key_classes(q.device), scale=scale, cap=cap,
                                       causal=layer.causal, mask=own)
    layer.out[b, :n] = out.transpose(0, 1)
    qf, kf = q[None].float(), k[None].float()
    mask = flex.Mask(n, layer.causal, site.mask, b)
    if seq.targets:
        flex.probe_targets(layer, seq, qf, kf, lse, mask)
    if n <= 1 or seq.targets:
        stats.layer_end(seq)
        return
    buffers, sums = stats.row_buffers(site.layer, seq, q.device)
    buffers.copy_(rowv)
    sums += dist
    flex.sampled_rows(layer, seq, qf, kf, mask)
    stats.layer_end(seq)
