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

What each block of keys costs beyond FlashAttention's loop is kept to what the statistics need
(:mod:`attnscope.engines.onepass_triton`, which holds the Triton code, says how): on the common
path, a block wholly below the diagonal and inside one distance bucket, one FFMA per score for the
entropy's sum and the class masses' two float16 products of ``P`` split in two (float32 ``P`` to
about 2^-22) on the tensor cores; the bucket's mass is the row sum, added to a running sum per row;
the mask only on the diagonal's blocks; the previous token's weight once per row after the loop.
Compiled for an H100 with the JIT's specialisation, that loop issues 16.2 instructions per score
at head size 64 and 17.3 at 128, 1.83x and 1.79x a bare flash forward at the same launch sizes
(``benchmarks/kernel_budget.py``; 39.8 and 100.6 before). Float32 inputs keep float32 products.

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
from attnscope.engines.seam import Backend

#: launch sizes on CUDA: (half-precision inputs, the model's mask, head size > 64) -> query rows and
#: keys per block, warps, pipeline stages; each compiles for an H100 without spilling a register
#: (``benchmarks/kernel_budget.py --all``, held there by ``tests/engines/test_onepass_cuda.py``)
CUDA_LAUNCH = {(True, False, False): (64, 64, 4, 3), (True, False, True): (128, 64, 8, 1),
               (True, True, False): (64, 32, 8, 3), (True, True, True): (64, 32, 8, 3),
               (False, False, False): (64, 32, 8, 3), (False, True, False): (32, 32, 4, 1),
               (False, False, True): (32, 16, 8, 1), (False, True, True): (32, 16, 4, 1)}


def launch(device, dtype, masked: bool, head_dim: int) -> tuple[int, int, int, int]:
    """Query rows and keys per block, warps per program and pipeline stages. Under the interpreter
    32 x 32. On CUDA :data:`CUDA_LAUNCH`: the largest blocks that compile for an H100 (sm_90a)
    without spilling, where the loop issues the fewest instructions per score (read from the SASS
    by ``benchmarks/kernel_budget.py``): for half-precision inputs at head size 64, 64 x 64 with
    4 warps (16.2 instructions per score against the bare flash forward's 8.8 at the same sizes);
    at 128 (Llama-3.1-8B), 128 x 64 with 8 warps and one stage (17.3 against 9.6; with more
    stages the pipeline's registers spill). Not yet timed on a GPU."""
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        return 32, 32, 4, 1
    return CUDA_LAUNCH[dtype in (torch.float16, torch.bfloat16), masked, head_dim > 64]


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
    from attnscope.engines import onepass_triton

    return onepass_triton.stats_kernel


def layer_stats(q, k, v, classes, *, scale: float, cap: float | None, causal: bool, mask=None,
                config: tuple[int, int, int] | None = None):
    """One sequence's layer: ``q`` ``[Hq n d]``, ``k`` / ``v`` ``[Hkv n d]`` (any float dtype; the
    sums are float32), ``classes`` ``[n F]`` float32, ``mask``: the model's own for the sequence
    (``[>=n >=n]``, boolean or additive float; None: the sequence's causal triangle, or none).
    Returns the output ``[Hq n d]`` (float32), the log-sum-exps ``[Hq n]``, the per-row values
    ``[2+F Hq n]`` (entropy, largest weight, the class masses) and the per-head sums over rows
    ``>= 1`` ``[Hq NB+1]`` (float64: the buckets' masses, then the previous token's).
    ``config``: query rows and keys per block, warps per program and (optionally) pipeline stages
    (default :func:`launch`)."""
    grid, args, consts, (warps, stages) = arguments(q, k, v, classes, scale=scale, cap=cap, causal=causal,
                                                    mask=mask, config=config)
    _kernel()[grid](*args, **consts, num_warps=warps, num_stages=stages)
    out, lse, rows, dist = args[5:9]
    return out[..., :q.shape[-1]], lse, rows, dist.double().sum(1)[:, :NUM_BUCKETS + 1]


def arguments(q, k, v, classes, *, scale: float, cap: float | None, causal: bool, mask=None,
              config: tuple[int, int, int] | None = None):
    """The kernel's launch for :func:`layer_stats`: ``(grid, positional arguments, constexprs,
    (warps, stages))``, the output buffers among the arguments. ``benchmarks/kernel_budget.py`` compiles
    the kernel from exactly these (the JIT's specialisation of each argument included)."""
    import torch
    import triton

    Hq, n, d = q.shape
    G, F = Hq // k.shape[0], classes.shape[1]
    D = max(16, triton.next_power_of_2(d))  # tl.dot wants 16 or more; zeros change no product
    if D != d:
        q, k, v = (torch.nn.functional.pad(x, (0, D - d)) for x in (q, k, v))
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    BM, BN, warps, *stages = config or launch(q.device, q.dtype, mask is not None, D)
    blocks = triton.cdiv(n, BM)
    out = torch.empty(Hq, n, D, device=q.device, dtype=torch.float32)
    lse = torch.empty(Hq, n, device=q.device, dtype=torch.float32)
    rows = torch.empty(2 + F, Hq, n, device=q.device, dtype=torch.float32)
    dist = torch.zeros(Hq, blocks, 32, device=q.device, dtype=torch.float32)  # NB + 1 <= 32 columns
    kind, low = 0, 0.0
    if mask is not None:
        kind = 2 if mask.is_floating_point() else 1
        low = torch.finfo(mask.dtype).min / 2 if kind == 2 else 0.0
        mask = mask if kind == 2 else mask.view(torch.uint8)  # the same bytes
    m = mask if mask is not None else lse  # (unread without a mask)
    # the key classes (0 / 1: exact in float16) padded to FP columns, in the dtype of their product
    FP = max(16, triton.next_power_of_2(F))
    cls = torch.zeros(n, FP, device=q.device, dtype=torch.float32 if q.dtype == torch.float32 else torch.float16)
    cls[:, :F] = classes
    log2e = 1.4426950408889634
    # the scores in base 2: u = xs x from the product x = q . k (soft-capped: x = log2(e) cap
    # tanh(x tc / 2) from x tc = 2 scale q . k / cap, and xs = 1)
    xs, tc, capl = (1.0, 2.0 * scale / cap, cap * log2e) if cap else (scale * log2e, 1.0, 1.0)
    args = (q, k, v, cls, m, out, lse, rows, dist, n, float(xs), float(tc), float(capl),
            float(low), q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            m.stride(0) if mask is not None else 0, m.stride(1) if mask is not None else 0,
            out.stride(0), out.stride(1), rows.stride(0), rows.stride(1), dist.stride(0), dist.stride(1))
    consts = dict(G=G, D=D, F=F, FP=FP, NB=NUM_BUCKETS, CAUSAL=causal, CAP=bool(cap), BM=BM, BN=BN,
                  PREC="ieee" if q.dtype == torch.float32 else None, MASK=kind)
    return (blocks, Hq), args, consts, (warps, stages[0] if stages else 3)


def run_layer(layer, b: int, seq) -> None:
    """Sequence ``b`` of ``layer`` (:class:`~attnscope.engines.seam.LayerInput`) through the
    kernel: its output rows into ``layer.out`` and its statistics into ``layer.stats``."""
    import torch

    site, stats = layer.site, layer.stats
    n, cap, scale = seq.n, layer.cap, site.scaling
    own = None if site.mask is None else site.mask[b, 0]  # [T T]
    if own is not None and own.shape[0] == 1:
        # one row for every query (a BERT-style [B 1 1 T] mask: LayoutLM, MarkupLM): the kernel
        # steps its rows by stride(0), which a size-1 axis need not make 0; expanded, it is
        own = own.expand(site.query.shape[2], -1)
    # the model's own q, k, v (bfloat16 on a GPU: half the bytes; the sums are float32)
    q, k, v = site.query[b, :, :n], site.key[b, :, :n], site.value[b, :, :n]
    dt = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    if dt == torch.bfloat16 and q.device.type != "cuda":  # the interpreter reads no bfloat16:
        dt = torch.float32  # the same products, exact in float32
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    out, lse, rowv, dist = layer_stats(q, k, v, seq.key_classes(q.device), scale=scale, cap=cap,
                                       causal=layer.causal, mask=own)
    if not flex.resolves(lse, n):
        return flex.on_tiles("onepass", layer, b, seq, lse)
    layer.out[b, :n] = out.transpose(0, 1)
    mask = flex.Mask(n, layer.causal, site.mask, b)
    # the keys in float32 for the few rows computed in torch (a probe's targets, the sampled
    # rows); the queries are taken a row at a time
    kf = k[None].float() if seq.targets or (n > 1 and seq.js_rows) else None
    if seq.targets:
        flex.probe_targets(layer, seq, q[None].float(), kf, lse, mask, b)
    if n <= 1 or seq.targets:
        stats.layer_end(seq)
        return
    buffers, sums = stats.row_buffers(site.layer, seq, q.device)
    buffers.copy_(rowv)
    sums += dist
    flex.sampled_rows(layer, seq, q[None], kf, mask, b)
    stats.layer_end(seq)


BACKEND = Backend("onepass", devices=("cuda",), token_level=True, probes=True, run=run_layer,
                  usable=available,
                  why="it needs Triton (pip install triton) and a CUDA device, or TRITON_INTERPRET=1 to run "
                      "Triton's interpreter on the CPU",
                  handles=frozenset({"softcap", "window", "chunk", "scale"}), native_dtype=True)
