"""The one-pass kernel's Triton code (:mod:`attnscope.engines.onepass` describes and launches it).

Imported at the kernel's first use, never with ``import attnscope``: the ``@triton.jit``
decorators read ``TRITON_INTERPRET`` when this module is imported, and a kernel's helpers must be
module-level functions for Triton to find them.

The loop is FlashAttention's, as Triton's fused-attention tutorial and FlashAttention-2/3 write
it, and its common path (a block of keys wholly below the diagonal and inside one distance
bucket) adds to the bare forward only what the statistics cannot do without: one FFMA per score
for ``sum_j p_ij s_ij`` and the class masses' two small tensor-core products. Everything is in
base 2 with the scale folded in (``u = log2(e) s``: one FFMA and ``exp2`` per score) and the
weights are those of the row's running largest score ``m`` times ``2^14`` (``p' = 2^(u - m + 14)``,
the shift folded into the per-row term): the float16 split of ``P'`` for the classes' product
needs no multiplication (float16's normal range reaches down to ``2^-14``, so weights down to
``2^-28`` keep their 11 bits), and every statistic is a ratio to ``z' = sum_j p'_ij``, so the
factor cancels. Per row, outside the loop: the previous token's weight (one dot of ``q_i`` and
``k_(i-1)``, from the row's final ``m`` and ``z``); per block of keys, on scalars: its distance
bucket. The mass of the current bucket is a per-row running sum (``cur``) that goes into the
``[BM NB]`` buckets only when the bucket changes (about ``log2 n`` times a row), so the buckets are
not rescaled at every block: ``gal`` keeps the product of the rescalings since.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _bucket(d):
    """The distance bucket of a scalar ``d >= 0``: 0, 1, 2, then ``bit_length(d - 1) + 1``
    (3-4 -> 3, 5-8 -> 4, ...), the exponent of ``float(d - 1)`` read from its bits (exact below
    2^24)."""
    bits = (tl.maximum(d - 1, 0).to(tl.float32)).to(tl.int32, bitcast=True)
    return tl.where(d >= 1, tl.maximum((bits >> 23) - 126, 0) + 1, 0)


@triton.jit
def _flush(bkt, cur, gal, cb, bb):
    """The buckets at the current block's scale, with the current bucket's running mass in."""
    return bkt * gal[:, None] + cur[:, None] * (bb[None, :] == cb).to(tl.float32)


@triton.jit
def _block(q, K, V, C, M, rows, live, start, kv, n, xs, tc, capl, low, sk_h, sk_n, sm_q, sm_k, blk,
           m, z, acc, ps, cls, bkt, cur, gal, cb,
           D: tl.constexpr, FP: tl.constexpr, CAUSAL: tl.constexpr, CAP: tl.constexpr,
           PREC: tl.constexpr, MASK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
           DIAG: tl.constexpr):
    """One block of ``BN`` keys from ``start`` folded into a block of rows' running sums.
    ``DIAG``: the block may hold keys a row must not see (the causal diagonal, the sequence's
    end, the model's own mask); otherwise every score of the block counts."""
    cols = start + tl.arange(0, BN)
    dd = tl.arange(0, D)
    ff = tl.arange(0, FP)
    bb = tl.arange(0, 32)
    kp = K + kv * sk_h + cols[:, None] * sk_n + dd[None, :]
    vp = V + kv * sk_h + cols[:, None] * sk_n + dd[None, :]
    cp = C + cols[:, None] * FP + ff[None, :]
    if DIAG:
        seen = cols < n
        k = tl.load(kp, mask=seen[:, None], other=0.0)
        v = tl.load(vp, mask=seen[:, None], other=0.0)
        c = tl.load(cp, mask=seen[:, None], other=0.0)
    else:
        k = tl.load(kp)
        v = tl.load(vp)
        c = tl.load(cp)
    x = tl.dot(q, tl.trans(k), input_precision=PREC)  # float32 sums of exact products
    if CAP:
        x = capl * (2.0 * tl.sigmoid(x * tc) - 1.0)  # log2(e) cap tanh(scale q.k / cap)
    if DIAG:
        ok = live[:, None] & seen[None, :]
        if CAUSAL:
            ok = ok & (rows[:, None] >= cols[None, :])
        at = rows.to(tl.int64)[:, None] * sm_q + cols[None, :] * sm_k  # 64 bits: rows * n passes 2^31
        if MASK == 1:  # the model's own boolean mask (as bytes): a sliding window, padding
            ok = ok & (tl.load(M + at, mask=ok, other=0) != 0)
        elif MASK == 2:  # its additive float mask: very negative = masked
            ok = ok & (tl.load(M + at, mask=ok, other=low) > low)
        m_new = tl.maximum(m, tl.max(tl.where(ok, x, float("-inf")), 1) * xs)
        top = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: any finite shift
        x = tl.where(ok, x, 0.0)
        p = tl.where(ok, tl.exp2(x * xs - (top - 14.0)[:, None]), 0.0)
    else:
        m_new = tl.maximum(m, tl.max(x, 1) * xs)
        top = m_new
        p = tl.exp2(x * xs - (top - 14.0)[:, None])
    alpha = tl.exp2(m - top)
    row = tl.sum(p, 1)
    z = z * alpha + row
    ps = ps * alpha + tl.sum(p * x, 1)
    if PREC is None:  # half-precision values: P V on the tensor cores, as FlashAttention does it
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        hi = p.to(tl.float16)  # P' in two float16 parts, exact to about 2^-22 of P
        lo = (p - hi.to(tl.float32)).to(tl.float16)
        cls = tl.dot(lo, c, tl.dot(hi, c, cls * alpha[:, None]))
    else:
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision=PREC)
        cls = tl.dot(p, c, cls * alpha[:, None], input_precision="ieee")
    # the distance buckets this block's distances fall in, from its smallest and largest i - j
    d_lo = blk * BM - start - BN + 1
    d_hi = blk * BM + BM - 1 - start
    if CAUSAL:
        b_lo = _bucket(tl.maximum(d_lo, 0))
        b_hi = _bucket(d_hi)
    else:
        b_lo = _bucket(tl.where(d_lo > 0, d_lo, tl.where(d_hi < 0, -d_hi, 0)))
        b_hi = _bucket(tl.maximum(d_hi, -d_lo))
    cur = cur * alpha
    gal = gal * alpha
    if b_lo == b_hi:  # one bucket (every block but those near the diagonal and a bucket's edge)
        if b_lo != cb:
            bkt = _flush(bkt, cur, gal, cb, bb)
            gal = tl.full([BM], 1.0, tl.float32)
            cur = tl.zeros([BM], tl.float32)
            cb = b_lo
        cur += row
    else:  # one masked sum per bucket the block meets
        bkt = _flush(bkt, cur, gal, cb, bb)
        gal = tl.full([BM], 1.0, tl.float32)
        cur = tl.zeros([BM], tl.float32)
        cb = tl.full([], -1, tl.int32)
        dist = rows[:, None] - cols[None, :]
        if not CAUSAL:
            dist = tl.abs(dist)
        for kb in range(b_lo, b_hi + 1):
            up = tl.maximum(kb - 2, 0)
            first = tl.where(kb < 3, kb, (1 << up) + 1)  # the bucket's distances
            last = tl.where(kb < 3, kb, 2 << up)
            mass = tl.sum(tl.where((dist >= first) & (dist <= last), p, 0.0), 1)
            bkt += mass[:, None] * (bb[None, :] == kb).to(tl.float32)
    return m_new, z, acc, ps, cls, bkt, cur, gal, cb


@triton.jit
def stats_kernel(Q, K, V, C, M, OUT, LSE, ROWS, DIST, n, xs, tc, capl, low,
                 sq_h, sq_n, sk_h, sk_n, sm_q, sm_k, so_h, so_n, sr_f, sr_h, sd_h, sd_b,
                 G: tl.constexpr, D: tl.constexpr, F: tl.constexpr, FP: tl.constexpr,
                 NB: tl.constexpr, CAUSAL: tl.constexpr, CAP: tl.constexpr,
                 PREC: tl.constexpr, MASK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """One block of ``BM`` query rows of query head ``program_id(1)``: its output, log-sum-exps,
    per-row statistics and the sums over its rows ``>= 1`` of the buckets' and previous token's
    masses (:func:`attnscope.engines.onepass.layer_stats` says what each buffer holds)."""
    blk = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)  # 64-bit bases: a head's offset h * n * d
    kv = h // G
    rows = blk * BM + tl.arange(0, BM)
    live = rows < n
    dd = tl.arange(0, D)
    bb = tl.arange(0, 32)
    q = tl.load(Q + h * sq_h + rows[:, None] * sq_n + dd[None, :], mask=live[:, None], other=0.0)
    m = tl.full([BM], float("-inf"), tl.float32)  # the running largest u = log2(e) s
    z = tl.zeros([BM], tl.float32)  # sum_j p'
    acc = tl.zeros([BM, D], tl.float32)
    ps = tl.zeros([BM], tl.float32)  # sum_j p' x (u = xs x)
    cls = tl.zeros([BM, FP], tl.float32)
    bkt = tl.zeros([BM, 32], tl.float32)  # the buckets' masses
    cur = tl.zeros([BM], tl.float32)  # the current bucket's mass
    gal = tl.full([BM], 1.0, tl.float32)  # the rescaling of bkt since it was last brought up to date
    cb = tl.full([], -1, tl.int32)  # the current bucket (none yet)
    # the blocks wholly below the diagonal need no mask (a causal sequence, no mask of the model's)
    below = (blk * BM // BN) * BN if CAUSAL and MASK == 0 else 0
    for start in range(0, below, BN):
        m, z, acc, ps, cls, bkt, cur, gal, cb = _block(
            q, K, V, C, M, rows, live, start, kv, n, xs, tc, capl, low, sk_h, sk_n, sm_q, sm_k, blk,
            m, z, acc, ps, cls, bkt, cur, gal, cb, D, FP, CAUSAL, CAP, PREC, MASK, BM, BN, False)
    end = tl.minimum(n, (blk + 1) * BM) if CAUSAL else n
    for start in range(below, end, BN):
        m, z, acc, ps, cls, bkt, cur, gal, cb = _block(
            q, K, V, C, M, rows, live, start, kv, n, xs, tc, capl, low, sk_h, sk_n, sm_q, sm_k, blk,
            m, z, acc, ps, cls, bkt, cur, gal, cb, D, FP, CAUSAL, CAP, PREC, MASK, BM, BN, True)
    bkt = _flush(bkt, cur, gal, cb, bb)
    z = tl.where(live, z, 1.0)
    lse = (m - 14.0) * 0.6931471805599453 + tl.log(z)  # ln sum_j e^s = ln 2 (m - 14) + ln z'
    # the previous token's weight, from the row's final m and z': e^(s_i,i-1 - L_i)
    pr = rows - 1
    okp = live & (rows >= 1)
    kprev = tl.load(K + kv * sk_h + pr[:, None] * sk_n + dd[None, :], mask=okp[:, None], other=0.0)
    # q read again: held through the loop in registers, it would spill at head size 128
    q = tl.load(Q + h * sq_h + rows[:, None] * sq_n + dd[None, :], mask=okp[:, None], other=0.0)
    xp = tl.sum(q.to(tl.float32) * kprev.to(tl.float32), 1)
    if CAP:
        xp = capl * (2.0 * tl.sigmoid(xp * tc) - 1.0)
    at = rows.to(tl.int64) * sm_q + pr * sm_k
    if MASK == 1:
        okp = okp & (tl.load(M + at, mask=okp, other=0) != 0)
    elif MASK == 2:
        okp = okp & (tl.load(M + at, mask=okp, other=low) > low)
    prev = tl.where(okp, tl.exp2(xp * xs - (m - 14.0)), 0.0)
    bkt += prev[:, None] * (bb[None, :] == NB).to(tl.float32)
    tl.store(OUT + h * so_h + rows[:, None] * so_n + dd[None, :], acc / z[:, None], mask=live[:, None])
    tl.store(LSE + h * n + rows, lse, mask=live)
    tl.store(ROWS + h * sr_h + rows, lse - ps * (xs * 0.6931471805599453) / z, mask=live)  # entropy
    tl.store(ROWS + sr_f + h * sr_h + rows, 16384.0 / z, mask=live)  # largest weight: 2^14 / z'
    ff = tl.arange(0, FP)
    cm = live[:, None] & (ff[None, :] < F)
    tl.store(ROWS + (2 + ff[None, :]) * sr_f + h * sr_h + rows[:, None], cls / z[:, None], mask=cm)
    counted = tl.where((live & (rows >= 1))[:, None], bkt / z[:, None], 0.0)
    tl.store(DIST + h * sd_h + blk * sd_b + bb, tl.sum(counted, 0), mask=bb <= NB)
