"""The streaming engine's backends (engines/): the seam, the fused FlexAttention backend's mathematics
on the CPU, the tiles sized for the device, precision, and running out of GPU memory.

Every backend this machine can run is held to the eager maps: on random layers against the
definitions in float64, and on the tiny decoders (grouped-query and multi-query heads, GPT-2,
Qwen2 with a sliding window, Gemma 2 with soft-capping, padded batches) against statistics
computed independently from the eager maps (``test_longctx.reference``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
import torch._dynamo
from conftest import one_line, says, softmax_bound, sum_bound

from attnscope.analyses.longctx import (
    NUM_BUCKETS,
    LongContextStats,
    Sequence,
    bucket_of,
    sample_rows,
)
from attnscope.engines import backends, flex
from attnscope.engines.backends import choose
from attnscope.engines.seam import LayerInput
from attnscope.engines.streaming import maps_update, stream_stats
from attnscope.engines.tiled import auto_tile
from attnscope.errors import AttnscopeError
from attnscope.models import load_model
from attnscope.models.forward import Site
from tests.engines.test_longctx import (
    TEXTS,
    _docs,
    _tiny,
    assert_close,
    engine_against_own_attention,
    reference,
    stats_bound,
)

ROOT = Path(__file__).resolve().parents[2]
HERE = [b.name for b in backends.BACKENDS if backends.usable(b.name, "cpu")]
#: without a GPU the one-pass kernel runs under Triton's interpreter, 3-20 s a case: its cases
#: are heavy (not in the fast tier), but for one case of the kernel against the definitions
INTERPRETED = not torch.cuda.is_available()
heavy_here = pytest.mark.heavy if INTERPRETED else pytest.mark.usefixtures()  # (no mark)


def _backends(names):
    """``names`` as test parameters, the one-pass kernel's heavy where it is interpreted."""
    return [pytest.param(b, marks=heavy_here) if b == "onepass" else b for b in names]
needs_flex = pytest.mark.skipif(not flex.available(), reason="this torch has no FlexAttention")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: on a shared 2-core machine, torch's threads only wait for each other (10x
    slower here under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_flex_and_the_tiles_run_here():
    # torch 2.13 has FlexAttention: the fused backend's mathematics is tested on every machine;
    # the one-pass kernel's wherever Triton is installed (the test extra installs it)
    assert {"flex", "tiles"} <= set(HERE)
    assert ("onepass" in HERE) == (importlib.util.find_spec("triton") is not None)


# -- the seam ---------------------------------------------------------------------------------
def test_choose_by_device_and_input():
    every = lambda name, device: True  # noqa: E731
    kw = dict(token_level=True, probe=False, tokens=50, usable=every)
    assert choose("auto", "cuda", **kw) == choose("auto", torch.device("cuda:1"), **kw) == "onepass"
    assert choose("auto", "cuda", **{**kw, "usable": lambda n, d: n != "onepass"}) == "flex"  # no Triton
    assert choose("auto", "cpu", **kw) == "compiled"
    assert choose("auto", "cpu", **{**kw, "usable": lambda n, d: n != "compiled"}) == "tiles"
    assert choose("auto", "mps", **kw) == "tiles"
    assert choose("auto", "cuda", **{**kw, "usable": lambda n, d: n == "tiles"}) == "tiles"
    # inputs: word level needs whole rows; the compiled kernel takes no probes and no 1-token sequence
    assert choose("auto", "cuda", **{**kw, "token_level": False}) == "tiles"
    assert choose("auto", "cuda", **{**kw, "probe": True}) == "onepass"
    assert choose("auto", "cpu", **{**kw, "probe": True}) == "tiles"
    assert choose("auto", "cpu", **{**kw, "tokens": 1}) == "tiles"
    # a backend named: that one where it takes the input, else the fallback
    assert choose("flex", "cpu", **kw) == "flex"
    assert choose("tiles", "cuda", **kw) == "tiles"
    assert choose("compiled", "cpu", **{**kw, "probe": True}) == "tiles"
    # the maps: by auto only where the pass's maps fit the caller's budget, then for every input
    # on every device; by name always
    for device in ("cpu", "cuda", "mps"):
        for inputs in ({}, {"token_level": False}, {"probe": True}, {"tokens": 1}):
            assert choose("auto", device, **{**kw, **inputs}, maps_fit=True) == "maps"
            assert choose("maps", device, **{**kw, **inputs}) == "maps"
            assert choose("auto", device, **{**kw, **inputs}) != "maps"
    assert choose("tiles", "cpu", **kw, maps_fit=True) == "tiles"  # a name asked for wins


def test_a_bad_backend_is_one_line_naming_it():
    with pytest.raises(AttnscopeError) as e:
        backends.check("fast", "cpu")
    says(one_line(e.value), "backend", "'fast'", *backends.NAMES)
    assert e.value.params == ("backend",)
    with pytest.raises(AttnscopeError) as e:
        backends.check("compiled", "cuda")
    says(one_line(e.value), "backend compiled", "cuda")
    lm = load_model("debug:llama")
    with pytest.raises(AttnscopeError, match="^backend "):
        stream_stats(lm, [[1, 2, 3]], LongContextStats(), backend="bogus")


# -- the fused backend on random layers, against the definitions --------------------------------
def _definitions(q, k, v, n, causal, allowed, cap, classes, scale):
    """Per head, in float64: output [n Hq d], rows [2+F Hq n] (entropy, largest weight, mass on
    each class), mass per distance bucket over rows >= 1 and at distance +1 [Hq NB+1]."""
    G = q.shape[0] // k.shape[0]
    kr, vr = k.double().repeat_interleave(G, 0), v.double().repeat_interleave(G, 0)
    s = q.double() @ kr.transpose(1, 2) * scale
    if cap:
        s = cap * torch.tanh(s / cap)
    ok = allowed.clone()
    if causal:
        ok &= torch.ones(n, n, dtype=torch.bool).tril()
    p = torch.softmax(s.masked_fill(~ok, -math.inf), -1)
    ent = -torch.special.xlogy(p, p).sum(-1)
    dist = torch.as_tensor(bucket_of((torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().numpy()))
    buckets = torch.zeros(q.shape[0], NUM_BUCKETS + 1, dtype=torch.float64)
    for h in range(q.shape[0]):
        buckets[h, :NUM_BUCKETS].index_add_(0, dist[1:].flatten(), p[h, 1:].flatten())
        buckets[h, NUM_BUCKETS] = p[h, 1:].diagonal().sum()  # p[i, i-1]
    rows = torch.cat([ent[None], p.amax(-1)[None], (p @ classes.double()).permute(2, 0, 1)])
    return (p @ vr).transpose(0, 1), rows, buckets, p


def _score_size(q, k, scale) -> float:
    """The largest ``|score|`` of the heads ``q [Hq n d]`` on the key heads ``k [Hkv n d]``, in
    float64 (the size that conftest.softmax_bound takes)."""
    kr = k.double().repeat_interleave(q.shape[0] // k.shape[0], 0)
    return float((q.double() @ kr.transpose(-1, -2) * scale).abs().max())


class _Module:
    """What a family's eager attention (the ``maps`` backend) reads of an attention module."""

    def __init__(self, causal, groups=1):
        self.is_causal, self.num_key_value_groups, self.training = causal, groups, False


def _random_layer(Hq, Hkv, d, T, seed, spread):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, T, Hq, d, generator=g).transpose(1, 2) * spread  # the model's layout
    k = torch.randn(1, T, Hkv, d, generator=g).transpose(1, 2)
    k[:, :, 0] *= 4  # a key that draws attention (a sink)
    v = torch.randn(1, T, Hkv, d, generator=g).transpose(1, 2)
    return q, k, v, g


@needs_flex
@pytest.mark.parametrize("Hq,Hkv,d,n,causal,mask,cap", [
    (4, 2, 8, 40, True, None, None),  # grouped-query, plain causal (no mask tensor)
    (3, 1, 16, 300, True, None, None),  # multi-query; longer than a block of 128
    (4, 2, 8, 37, True, "window", None),  # a sliding window of 5 keys, as a boolean mask
    (4, 4, 8, 29, True, "padding", None),  # a padded batch: this sequence is shorter than the batch
    (4, 2, 8, 33, True, "additive", None),  # eager's additive float mask (the reference pass)
    (4, 2, 16, 45, True, None, 5.0),  # soft-capping (the entropy from the shifted second call)
    (2, 2, 8, 41, True, "window", 3.0),  # soft-capping with a sliding window
    (2, 1, 8, 30, False, None, None),  # an encoder: every key, distances |i - j|
    (2, 2, 8, 30, False, "padding", 4.0),
])
def test_flex_layer_equals_the_definitions(Hq, Hkv, d, n, causal, mask, cap):
    T = n + 5 if mask == "padding" else n  # the batch is wider than this sequence
    q, k, v, g = _random_layer(Hq, Hkv, d, T, seed=n + Hq, spread=2.5)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = torch.ones(T, T, dtype=torch.bool)
    model_mask = None
    if mask == "window":
        allowed = (j <= i) & (j > i - 5)
        model_mask = allowed[None, None]
    elif mask == "padding":  # keys past the sequence masked (and the causal triangle)
        allowed = (j < n) & ((j <= i) if causal else (i >= 0))
        model_mask = allowed[None, None]
    elif mask == "additive":
        allowed = j <= i
        model_mask = torch.zeros(1, 1, T, T).masked_fill(~allowed, torch.finfo(torch.float32).min)
    scale = d ** -0.5
    site = Site(3, _Module(causal), q, k, v, model_mask, scale)
    F = 5
    classes = (torch.rand(n, F - 3, generator=g) < 0.3).float()
    special = torch.zeros(n)
    special[[0, n // 2]] = 1
    punct = (torch.rand(n, generator=g) < 0.2).float()
    stats = LongContextStats(js_rows=3, causal=causal)
    seq = Sequence(n, special, punct, js_rows=sample_rows(list(range(n)), 3, 0), classes=classes,
                   class_names=("x", "y"))
    stats.begin(4, Hq, seq)
    out = torch.full((1, T, Hq, d), math.nan)
    layer = LayerInput(site, stats, k.float(), v.float(), out, cap, [n])
    flex.run_layer(layer, 0, seq)

    want_out, want_rows, want_dist, p = _definitions(q[0, :, :n], k[0, :, :n], v[0, :, :n], n, causal,
                                                      allowed[:n, :n], cap, seq.key_classes("cpu"), scale)
    assert want_rows.shape[0] == 2 + F
    # float32 bounds against the float64 definitions: a row is a sum of n terms, each rounded with
    # relative error eps, so a row's sums are off by at most eps n times the size of its terms
    # (the output: |v|; the entropy H = L - s.P: the largest |score| and ln n); a bucket's mass adds
    # such a row sum over n rows
    eps = torch.finfo(torch.float32).eps
    size = float((scale * q[0, :, :n].double() @ k[0, :, :n].double().repeat_interleave(Hq // Hkv, 0)
                  .transpose(-1, -2)).abs().max()) + math.log(n)
    torch.testing.assert_close(out[0, :n].double(), want_out, rtol=0, atol=eps * n * float(v.abs().max()))
    assert torch.isnan(out[0, n:]).all()  # rows past the sequence are not touched
    torch.testing.assert_close(seq.row_values[:, :, 1:].double(), want_rows[:, :, 1:], rtol=0, atol=eps * n * size)
    torch.testing.assert_close(seq.dist_buckets, want_dist, rtol=0, atol=eps * n * n)
    torch.testing.assert_close(want_dist[:, :NUM_BUCKETS].sum(-1), torch.full((Hq,), n - 1.0, dtype=torch.float64))
    for r in seq.js_rows:  # the sampled rows: every weight the row has
        width = r + 1 if causal else n
        torch.testing.assert_close(seq.js_store[r][3].double(), p[:, r, :width], rtol=0, atol=eps * n * size)
    # the entropy summed (in float64) over the n - 1 rows, each off by the row's bound
    assert stats.sums["entropy"][3].tolist() == pytest.approx(want_rows[0, :, 1:].sum(-1).tolist(),
                                                              abs=(n - 1) * eps * n * size)


@needs_flex
def test_flex_probe_weights_equal_the_definitions():
    # an induction probe: each row's weight on its target key, exp(s_ij - L_i), O(n d)
    n, Hq, Hkv, d = 25, 4, 2, 8
    q, k, v, g = _random_layer(Hq, Hkv, d, n, seed=7, spread=2.0)
    target = torch.full((n,), -1)
    target[13:] = torch.arange(1, 13)
    stats = LongContextStats(js_rows=0)
    seq = Sequence(n, torch.zeros(n), torch.zeros(n), targets={"induction": target})
    stats.begin(1, Hq, seq)
    out = torch.zeros(1, n, Hq, d)
    flex.run_layer(LayerInput(Site(0, _Module(True), q, k, v, None, 0.35), stats, k, v, out, None, [n]), 0, seq)
    _, _, _, p = _definitions(q[0], k[0], v[0], n, True, torch.ones(n, n, dtype=torch.bool), None,
                              torch.zeros(n, 1), 0.35)
    want = p[:, torch.arange(13, n), target[13:]].sum(-1)  # [Hq]
    # 12 weights of float32 softmax rows, summed, against float64
    bound = 12 * softmax_bound(n, _score_size(q[0], k[0], 0.35))
    np.testing.assert_allclose(stats.targets["induction"][0][0], want.numpy(), atol=bound, rtol=0)
    assert stats.rows == 0 and seq.row_values is None  # a probe feeds its targets only


@needs_flex
@pytest.mark.parametrize("n", [1, 127, 129, 700])
@pytest.mark.parametrize("causal", [True, False])
def test_block_masks_hold_exactly_the_masked_keys(n, causal):
    # FlexAttention's fused kernel computes a pair (i, j) when its block is full, or partial and
    # the mask function allows it, and skips every other block; eager FlexAttention applies the
    # mask function everywhere. So a block mask must hold every allowed pair in a full or partial
    # block and only allowed pairs in full blocks; then both compute the same keys.
    padded = torch.rand(n, n, generator=torch.Generator().manual_seed(n)) < 0.7  # any mask tensor
    bands = [None, (0, 0), (1, 1), (3, 4), (65, 128), (129, 256), (257, 512)]
    for model, band in [(m, b) for m in (None, padded) for b in bands]:
        m = flex.Mask(n, causal, None if model is None else model[None, None])
        if band:
            m = m.band(*band)
        bm = flex.block_mask(m, "cpu")
        nb = -(-n // flex.BLOCK)
        partial = torch.zeros(nb, nb, dtype=torch.bool)
        full = torch.zeros(nb, nb, dtype=torch.bool)
        for dense, num, idx in ((partial, bm.kv_num_blocks, bm.kv_indices),
                                (full, bm.full_kv_num_blocks, bm.full_kv_indices)):
            for qb in range(nb):
                dense[qb, idx[0, 0, qb, :num[0, 0, qb]].long()] = True
        assert not (partial & full).any()
        block = lambda x: x.repeat_interleave(flex.BLOCK, 0).repeat_interleave(flex.BLOCK, 1)[:n, :n]  # noqa: E731
        want = m.rows(0, n, "cpu")
        kernel = block(full) | (block(partial) & want)
        assert torch.equal(kernel, want)
        if model is not None:
            assert not full.any()  # a model's mask is read everywhere


@pytest.mark.heavy
@needs_flex
# dynamo's own patch, undone as it was made (a monkeypatch of its config module deletes the key)
@torch._dynamo.config.patch(fail_on_recompile_limit_hit=True)
def test_the_compiled_calls_trace_and_stay_within_dynamos_recompile_limit(monkeypatch):
    # On CUDA the calls are torch.compile'd. Past dynamo's limit of recompilations of one function
    # (8) it would silently run the eager version, which holds [n n] scores. Here the same calls
    # go through dynamo on the CPU (its "eager" backend: traced and guarded as on a GPU, then run
    # by torch's reference implementation): soft-capped, padded batches and single sequences of
    # other lengths, probes; a recompilation past the limit fails the test.
    from functools import cache

    from torch._dynamo.utils import counters

    traced = cache(lambda kind: torch.compile(flex.KINDS[kind], backend="eager", dynamic=True))
    monkeypatch.setattr(flex, "function", lambda device, kind="main": traced(kind))
    torch._dynamo.reset()
    counters.clear()
    lm = _model("tiny-gemma2")
    seqs, targets = _docs(lm)
    st = LongContextStats(js_rows=3)
    stream_stats(lm, seqs, st, batch_size=2, targets=targets, backend="flex")
    stream_stats(lm, seqs[:2], LongContextStats(js_rows=3), batch_size=1, backend="flex")
    assert_close(st.means(), reference(lm, seqs, targets, js_rows=3), stats_bound(seqs))  # float32 rows vs float64 sums
    # measured: 3 graphs per kind of call (the mask tensor as long as the sequence, then wider,
    # then none) for the 3 kinds
    assert counters["stats"]["unique_graphs"] <= 3 * len(flex.KINDS), dict(counters["stats"])
    torch._dynamo.reset()


# -- every backend on the tiny decoders, against the eager maps ----------------------------------
MODELS = ["llama", "gemma", "gpt2", "tiny-qwen2", "tiny-gemma2"]


def _model(name):
    torch.manual_seed(0)
    return _tiny(name.split("-")[1]) if name.startswith("tiny-") else load_model(f"debug:{name}")


def _case(name: str):
    """A tiny decoder, its documents and probes, and every statistic of their eager maps."""
    lm = _model(name)
    seqs, targets = _docs(lm)
    return lm, seqs, targets, reference(lm, seqs, targets, js_rows=3)


@pytest.fixture(scope="module", params=MODELS)
def decoder(request):
    return _case(request.param)


@pytest.mark.parametrize("backend", _backends(HERE))
def test_every_backend_equals_the_eager_maps(decoder, backend):
    # documents and induction probes in padded batches of 2; measured largest difference over
    # every statistic 1.5e-6 (the position buckets' entropy), on every backend and model
    lm, seqs, targets, ref = decoder
    st = LongContextStats(js_rows=3)
    stream_stats(lm, seqs, st, chunk=4, batch_size=2, targets=targets, backend=backend)
    assert_close(st.means(), ref, stats_bound(seqs))  # float32 rows against float64 sums of the maps


@pytest.mark.parametrize("backend", _backends(b for b in HERE if b in ("flex", "onepass")))
def test_the_fused_backends_on_an_encoder_and_with_extra_classes_equal_the_maps(backend):
    # bidirectional rows (distances |i - j|) and the general family's classes, row classes and
    # broad rows; the maps path is held to independent definitions in test_longctx*.py
    bert = load_model("debug:bert")
    ids = [bert.tokenizer(t)["input_ids"] for t in TEXTS]
    a, b = LongContextStats(js_rows=2, causal=False), LongContextStats(js_rows=2, causal=False)
    maps_update(bert, ids, a, batch_size=3)
    stream_stats(bert, ids, b, batch_size=2, backend=backend)
    assert_close(b.means(), a.means(), stats_bound(ids))  # float32 rows of the maps and of the backend
    lm = load_model("debug:llama")
    ids = [lm.tokenizer(t)["input_ids"] for t in TEXTS]
    g = np.random.default_rng(1)
    extras = [{"classes": {"x": g.random(len(i)) < 0.3, "y": g.random(len(i)) < 0.5},
               "from": {"r": g.random(len(i)) < 0.4}, "max_below": 0.3} for i in ids]
    a, b = LongContextStats(js_rows=2), LongContextStats(js_rows=2)
    maps_update(lm, ids, a, batch_size=3, extras=extras)
    stream_stats(lm, ids, b, batch_size=2, extras=extras, backend=backend)
    got, want = b.means(), a.means()
    names = {"to_x", "to_y", "from_r_to_x", "from_r_to_y", "rows_max_below"}
    assert names <= set(b.sums) and b.sums["rows_max_below"].sum() > 0
    for k in names:  # sums over every row, each row off by its bound
        np.testing.assert_allclose(b.sums[k], a.sums[k], atol=b.rows * stats_bound(ids), rtol=0, err_msg=k)
    assert_close(got, want, stats_bound(ids))


@needs_flex
def test_word_level_goes_to_the_tiles_under_any_backend():
    from tests.engines.test_longctx import _units

    lm = load_model("debug:llama")
    pairs = [_units(lm, t) for t in TEXTS]
    ids, units = [p[0] for p in pairs], [p[1] for p in pairs]
    ref = LongContextStats(js_rows=2)
    maps_update(lm, ids, ref, units=units, batch_size=2)
    got = LongContextStats(js_rows=2)
    stream_stats(lm, ids, got, units=units, batch_size=2, backend="flex")
    assert_close(got.means(), ref.means(), stats_bound(ids))


@pytest.mark.parametrize("backend", _backends(HERE))
@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma2"])
def test_every_backend_gives_the_models_own_attention(kind, backend):
    # the output that goes back to the model, on the very same q, k, v: sdpa's, or for Gemma 2
    # (soft-capping) the family's eager attention; a padded batch, grouped-query heads.
    # Measured largest difference per layer: 2.6e-6 (tiles), 1.9e-6 (compiled), 1.4e-6 (flex);
    # each against the float32 bound of a weighted mean of the values (see the helper)
    lm, _, _, worst, _ = engine_against_own_attention(kind, backend)
    assert len(worst) == lm.num_layers and all(d <= bound for d, bound in worst), worst


@pytest.mark.skipif("onepass" not in HERE, reason="Triton is not installed")
@pytest.mark.parametrize("cap", [None, 2.0])
def test_the_one_pass_kernel_in_half_precision_sums_in_float32(cap):
    """Half-precision q, k, v (what a GPU gives it): the products are exact in float32 and the
    sums are float32, so every statistic equals the float32 run on the same values; only the
    output rounds P to the values' precision before P V, as FlashAttention does. (float16 here:
    Triton's interpreter reads no bfloat16; the kernel's code path is the same.)"""
    from attnscope.engines import onepass

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(h, 70, 16, generator=g) for h in (4, 2, 2))
    classes = (torch.rand(70, 3, generator=g) < 0.3).float()
    half = [x.half() for x in (q, k, v)]
    got = onepass.layer_stats(*half, classes, scale=0.25, cap=cap, causal=True)
    want = onepass.layer_stats(*[x.float() for x in half], classes, scale=0.25, cap=cap, causal=True)
    s = (q.half().float().view(2, 2, 70, 16) @ k.half().float()[:, None].transpose(-1, -2)).view(4, 70, 70) * 0.25
    s = cap * torch.tanh(s / cap) if cap else s
    row = softmax_bound(70, float(s.abs().max()))  # a row's statistics, in another order of the sums
    for name, a, b, bound in zip(("lse", "rows", "dist"), got[1:], want[1:], (row, row, 69 * row)):
        torch.testing.assert_close(a, b, atol=bound, rtol=0, msg=name)  # dist: 69 rows summed
    # P rounded to float16 (relative 2^-11, or 2^-25 below float16's normals) before P V: that times
    # the largest |v| (P sums to 1), plus the float32 sums
    vmax = float(v.half().abs().max())
    torch.testing.assert_close(got[0], want[0], atol=float(torch.finfo(torch.float16).eps) * vmax
                               + softmax_bound(70) * vmax, rtol=0)
    # and the float32 run is the definition: softmax rows of the causal scores (float32 here too)
    p = torch.softmax(s.masked_fill(torch.ones(70, 70, dtype=torch.bool).triu(1), -torch.inf), -1)
    ent = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    torch.testing.assert_close(want[2][0], ent, atol=row, rtol=0)
    torch.testing.assert_close(want[2][1], p.amax(-1), atol=row, rtol=0)
    torch.testing.assert_close(want[2][2:], (p @ classes).permute(2, 0, 1), atol=row, rtol=0)



@pytest.mark.skipif("onepass" not in HERE, reason="Triton is not installed")
@pytest.mark.parametrize(("config", "causal", "window"), [
    pytest.param(config, causal, window,
                 marks=() if (config, causal, window) == ((64, 64, 4), True, None) else heavy_here)
    for config in [(32, 32, 4), (64, 64, 4), (64, 32, 8)]
    for causal, window in [(True, None), (True, 90), (False, None)]])
def test_the_one_pass_kernel_equals_the_definitions_where_blocks_lie_in_one_bucket(causal, window, config):
    """At 300 tokens many blocks lie inside one distance bucket (65-128, 129-256), where the
    kernel adds the block's row sums to that bucket; near the diagonal and across a bucket's edge
    it sums each bucket the block meets. Both against the softmax rows in float64, with
    grouped-query heads, an encoder, a sliding window handed as the model's mask, the
    interpreter's blocks (32 x 32) and those CUDA runs (``onepass.launch``)."""
    from attnscope.engines import onepass

    g = torch.Generator().manual_seed(3)
    n = 300
    BM, BN, _ = config
    spans = [(r - c - BN + 1, r + BM - 1 - c) for r in range(0, n, BM) for c in range(0, n, BN)]
    spans = [(max(lo, 0), hi) if causal else (0 if lo <= 0 <= hi else min(abs(lo), abs(hi)), max(abs(lo), abs(hi)))
             for lo, hi in spans if hi >= 0 or not causal]
    one = sum(bucket_of(np.array([lo]))[0] == bucket_of(np.array([hi]))[0] for lo, hi in spans)
    assert one >= 2 and one < len(spans)  # both ways of summing the buckets run
    q, k, v = (torch.randn(h, n, 16, generator=g) for h in (4, 2, 2))
    classes = (torch.rand(n, 3, generator=g) < 0.3).float()
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    mask = None if window is None else (j <= i) & (i - j < window)
    out, _, rows, dist = onepass.layer_stats(q, k, v, classes, scale=0.25, cap=None, causal=causal,
                                             mask=mask, config=config)
    allowed = torch.ones(n, n, dtype=torch.bool) if mask is None else mask
    want_out, want_rows, want_dist, _ = _definitions(q, k, v, n, causal, allowed, None, classes, 0.25)
    # float32 against the float64 definitions: the output a weighted mean of the values, a row's
    # statistics those of a softmax row, a bucket's mass sums the masses of 299 rows (each off by
    # about eps n: the log-sum-exp's rounding, shared by the row's weights)
    row = softmax_bound(n, _score_size(q, k, 0.25))
    torch.testing.assert_close(out.transpose(0, 1).double(), want_out, atol=row * float(v.abs().max()), rtol=0)
    torch.testing.assert_close(rows.double(), want_rows, atol=row, rtol=0)
    torch.testing.assert_close(dist, want_dist, atol=(n - 1) * sum_bound(n), rtol=0)
    assert (want_dist[:, 8] > 1).all()  # the bucket 65-128 holds mass; 129-256 only unwindowed
    assert ((want_dist[:, 9] > 1) if window is None else (dist[:, 9].abs() < 1e-12)).all()


#: Tensor methods that make the host wait for the tensor's device (on a GPU: a sync).
WAITS = ("item", "tolist", "cpu", "__bool__", "__int__", "__float__", "__index__")


@contextmanager
def host_waits():
    """The names of the :data:`WAITS` calls made inside, in order."""
    waits, saved = [], {n: torch.Tensor.__dict__.get(n) for n in WAITS}
    for n in WAITS:
        real = getattr(torch.Tensor, n)
        setattr(torch.Tensor, n, lambda self, *a, _real=real, _n=n, **k: waits.append(_n) or _real(self, *a, **k))
    try:
        yield waits
    finally:
        for n, own in saved.items():
            if own is None:
                delattr(torch.Tensor, n)
            else:
                setattr(torch.Tensor, n, own)


@heavy_here
@pytest.mark.skipif("onepass" not in HERE, reason="Triton is not installed")
def test_on_cuda_auto_runs_the_one_pass_kernel_on_the_forwards_bfloat16(monkeypatch):
    """What a GPU user gets by default: with Triton, ``auto`` is the one-pass kernel (FlexAttention
    where Triton is missing), and the attention dtype follows the forward's, so under bfloat16
    autocast the kernel reads the model's bfloat16 queries, keys and values themselves (no
    float32 copies). The device is faked for the choice; the kernel runs under the interpreter,
    with the statistics of the same bfloat16 values through the tiles."""
    from attnscope.engines import onepass

    assert choose("auto", torch.device("cuda"), token_level=True, probe=False) == "onepass"
    assert choose("auto", torch.device("cuda"), token_level=True, probe=True) == "onepass"
    assert choose("auto", "cuda", token_level=True, probe=False, usable=lambda name, d: name != "onepass") == "flex"
    assert choose("auto", torch.device("cuda"), token_level=False, probe=False) == "tiles"  # word level
    lm = load_model("debug:llama")
    ids = [lm.tokenizer(t)["input_ids"] for t in TEXTS[:2]]
    real_choose, real_run, seen = backends.choose, onepass.BACKEND.run, []
    monkeypatch.setattr(backends, "choose", lambda b, device, **kw: real_choose(b, torch.device("cuda"), **kw))

    def run(layer, b, seq):
        seen.append({x.dtype for x in (layer.site.query, layer.site.key, layer.site.value, layer.key, layer.value)})
        real_run(layer, b, seq)

    monkeypatch.setattr(backends, "BACKENDS", tuple(dataclasses.replace(b, run=run) if b.name == "onepass" else b
                                                    for b in backends.BACKENDS))
    got, want = LongContextStats(js_rows=2), LongContextStats(js_rows=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with host_waits() as waits:
            stream_stats(lm, ids, got)
        monkeypatch.setattr(backends, "choose", real_choose)
        stream_stats(lm, ids, want, backend="tiles", attention_dtype="bfloat16")
    assert len(seen) == lm.num_layers * len(ids) and all(s == {torch.bfloat16} for s in seen)
    # at most three host syncs a layer: whether float32 resolves its log-sum-exps (flex.resolves:
    # one scalar), the layer's sums in one copy, and its sampled rows (plus one per forward in
    # transformers' mask code)
    assert len(waits) <= 3 * lm.num_layers * len(ids) + len(ids), waits
    # the first layer's statistics are those of the same bfloat16 values; from the second layer
    # on the inputs differ by the bfloat16 rounding of each layer's output (measured: 2.0e-4 in
    # the per-position entropy)
    first = {k: np.asarray(v)[:1] for k, v in want.means().items() if np.ndim(v) >= 2}
    # the first layer: float32 sums of the same bfloat16 products, in another order
    assert_close({k: np.asarray(v)[:1] for k, v in got.means().items()}, first, stats_bound(ids))
    assert_close(got.means(), want.means(), tol=1e-3)


@pytest.mark.skipif("onepass" not in HERE, reason="Triton is not installed")
def test_the_one_pass_kernel_reads_the_models_mask_past_2_to_the_31_bytes():
    """The offset of row i's mask is i times the mask's row stride: past 46,341 tokens that
    passes 2^31, and an int32 product wraps. Here a mask whose rows lie 2^25 + 16 bytes apart
    (a view into 5 GB of untouched memory) puts rows 64 .. 95 there; the view starts 2^31 bytes
    into its buffer, so a wrapped offset reads zeros (every key masked) instead of crashing. With
    64-bit offsets every statistic equals the same mask held compactly."""
    from attnscope.engines import onepass

    g = torch.Generator().manual_seed(5)
    n, stride, before = 96, (1 << 25) + 16, 1 << 31
    assert 64 * stride > 2 ** 31 > 63 * stride
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    window = (j <= i) & (i - j < 40)
    buffer = torch.empty(before + (n - 1) * stride + n, dtype=torch.bool)
    far = buffer.as_strided((n, n), (stride, 1), storage_offset=before)
    far.copy_(window)
    q, k, v = (torch.randn(h, n, 16, generator=g) for h in (2, 1, 1))
    classes = (torch.rand(n, 3, generator=g) < 0.3).float()
    got = onepass.layer_stats(q, k, v, classes, scale=0.25, cap=None, causal=True, mask=far)
    want = onepass.layer_stats(q, k, v, classes, scale=0.25, cap=None, causal=True, mask=window)
    for name, a, b in zip(("out", "lse", "rows", "dist"), got, want):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)
    assert torch.isfinite(got[1]).all() and (got[2][1][:, 1:] < 1).all()  # every row but the first sees 2+ keys


@heavy_here
@pytest.mark.skipif("onepass" not in HERE, reason="Triton is not installed")
def test_the_one_pass_kernel_keeps_a_sinks_small_weights_in_half_precision():
    """A sink: every row puts nearly all its weight on the first key and about e^-16 (1e-7) on
    each other key, weights that float16 holds only as subnormals (steps of 6e-8). The kernel
    scales P by 2^14 before splitting it into two float16 parts for the class masses' product,
    so those masses equal the float32 run's to 1e-9 (unscaled, each weight would round by up to
    3e-8: about 1e-6 over 300 keys)."""
    from attnscope.engines import onepass

    g = torch.Generator().manual_seed(4)
    n = 300
    q, k, v = (torch.randn(h, n, 16, generator=g) * 0.2 for h in (2, 1, 1))
    q[..., 0], k[:, 0, 0] = 4.0, 16.0  # s_i0 = 0.25 * 4 * 16 = 16
    classes = (torch.rand(n, 3, generator=g) < 0.5).float()
    classes[0] = 0.0  # the classes see only the small weights
    half = [x.half() for x in (q, k, v)]
    got = onepass.layer_stats(*half, classes, scale=0.25, cap=None, causal=True)[2]
    want = onepass.layer_stats(*[x.float() for x in half], classes, scale=0.25, cap=None, causal=True)[2]
    tail = want[2:, :, 100:]
    assert (tail > 2e-6).all() and (tail < 1e-4).all()  # 40+ weights near 1e-7 in each class
    # float16 hi and lo parts keep 22 bits of each scaled weight (2 eps of it): a class mass, a sum
    # of n such weights, is off by at most eps n twice its size, 1e-8 here (1e-6 unscaled)
    torch.testing.assert_close(got[2:], want[2:], atol=sum_bound(n, 2 * float(tail.max())), rtol=0)

# -- precision -------------------------------------------------------------------------------
PER_HEAD = ("sink", "special", "punct", "previous", "current", "norm_entropy", "max", "dist_mass",
            "dist_weight", "sink_gu", "target_induction", "target_duplicate")


@pytest.fixture(scope="module", params=["llama", "tiny-gemma2"])
def bf16_decoder(request):
    return _case(request.param)


@pytest.mark.parametrize("backend", _backends(HERE))
def test_bfloat16_is_within_its_bounds_of_the_float32_eager_maps(bf16_decoder, backend):
    # bfloat16 autocast (the MLPs in bfloat16; attention and statistics in float32 on every
    # backend) against statistics of float32 eager maps of the same inputs, within the bounds
    # below; in float32 within the float32 rows' bound (stats_bound). What bfloat16 changes is the MLPs' rounding of the next layer's input, on every
    # backend alike (the backends differ from each other by at most 3.5e-4 under bfloat16: a
    # float32 rounding difference in one layer's output can flip a bfloat16 rounding in the next
    # MLP). Measured, llama / gemma2: entropy 1.5e-3 / 1.1e-4, the other per-head statistics
    # 9.6e-4 / 1.1e-4 at most; the head distances of the sampled rows 2.3e-3 / 2.6e-4 and the
    # per-position buckets 5.8e-3 / 1.5e-3 (means over few rows: a document has one row at
    # position 1). Bounds: the MLPs round each layer's output, the next layer's input, to bfloat16
    # (unit roundoff u = 2^-8), which moves the next layer's scores (of size about 1 in these debug
    # models) by about u: a per-head weight statistic by u, the entropy, the head distances and the
    # per-position means by u (1 + ln n). (The fixed 1e-3 of before measured 1.006e-3 for llama's
    # sink with ATEN_CPU_CAPABILITY=default.) A bfloat16 attention would move layer 0, which
    # test_longctx.py's test_bfloat16_attention_is_float32 holds to the float32 rows' bound.
    lm, seqs, targets, ref = bf16_decoder
    u = float(torch.finfo(torch.bfloat16).eps) / 2
    n = max(map(len, seqs))
    for bf16 in (False, True):
        st = LongContextStats(js_rows=3)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            stream_stats(lm, seqs, st, batch_size=2, targets=targets, backend=backend, attention_dtype="float32")
        got = st.means()
        for key, want in ref.items():
            tol = stats_bound(seqs) if not bf16 else u if key in PER_HEAD else u * (1 + math.log(n))
            np.testing.assert_allclose(got[key], want, atol=tol, rtol=0, err_msg=f"{key} bf16={bf16}")
        if bf16:
            assert np.abs(got["entropy"] - ref["entropy"]).max() > 1e-5  # bfloat16 did run



@pytest.mark.parametrize("backend", _backends(HERE))
def test_bfloat16_attention_is_the_statistics_of_the_rounded_queries_keys_and_values(backend):
    """``attention_dtype="bfloat16"``: every backend computes the statistics of q, k, v rounded
    to bfloat16 (what sdpa multiplies under bfloat16 autocast), against the float64 definitions
    on the rounded values; at this spread of scores the rounding moves them by far more."""
    from attnscope.engines.plan import Plan
    from attnscope.engines.streaming import attend_hook

    n, Hq, Hkv, d = 40, 4, 2, 16
    q, k, v, _ = _random_layer(Hq, Hkv, d, n, seed=11, spread=4.0)
    scale = d ** -0.5
    stats = LongContextStats(js_rows=0)
    seq = Sequence(n, torch.zeros(n), torch.zeros(n))
    stats.begin(1, Hq, seq)
    out = attend_hook(stats, [seq], Plan.of(backend), attention_dtype="bfloat16")(
        Site(0, _Module(True, Hq // Hkv), q, k, v, None, scale), q)
    stats.end(seq)
    rounded = [x[0].bfloat16().float() for x in (q, k, v)]
    everything = torch.ones(n, n, dtype=torch.bool)
    want_out, want, _, _ = _definitions(*rounded, n, True, everything, None, seq.key_classes("cpu"), scale)
    _, exact, _, _ = _definitions(q[0], k[0], v[0], n, True, everything, None, seq.key_classes("cpu"), scale)
    bound = softmax_bound(n, _score_size(rounded[0], rounded[1], scale))  # a float32 row of the rounded values
    for row, name in enumerate(("entropy", "max", "sink")):
        got, sums = stats.sums[name][0], want[row, :, 1:].sum(-1).numpy()
        # sums of 39 float32 rows of the rounded values against float64
        np.testing.assert_allclose(got, sums, atol=(n - 1) * bound, rtol=0, err_msg=name)
        assert np.abs(exact[row, :, 1:].sum(-1).numpy() - sums).max() > 1e-2, name
    torch.testing.assert_close(out[0].double(), want_out, atol=bound * float(rounded[2].abs().max()), rtol=0)

# -- tiles sized for the device ----------------------------------------------------------------
def test_a_gpu_never_gets_cpu_cache_tiles(monkeypatch):
    # what the device reports decides: 1/8 of an 80 GB GPU's free memory for a tile's scores
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (64 << 30, 80 << 30))
    gpu = backends.tile_budget(torch.device("cuda"))
    assert gpu == (8 << 30, 1 << 40)
    assert backends.tile_budget("cpu") == (7 << 20, 64)
    # the shape at 32k tokens: 32 query heads on 8 key heads, G = 4
    assert auto_tile(4, 8, 32768) == (16, 1)  # the CPU: 16 rows of one key head (cache-sized)
    rows, heads = auto_tile(4, 8, 32768, 0, *gpu)
    assert (rows, heads) == (16384, 1) and rows * 4 * 4 * 32768 <= 8 << 30
    assert auto_tile(4, 8, 4096, 0, *gpu) == (4096, 8)  # all rows of every head in one tile
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 << 20, 80 << 30))
    assert backends.tile_budget("cuda:0")[0] == 7 << 20  # never below a CPU tile


def test_tiles_as_large_as_a_gpu_gives_them_equal_the_eager_maps(monkeypatch):
    # the tiles backend with a GPU's budget: every row of every head in one tile
    monkeypatch.setattr(backends, "tile_budget", lambda device, cpu_bytes=0: (1 << 30, 1 << 40))
    lm = load_model("debug:qwen2")
    seqs, targets = _docs(lm)
    st = LongContextStats(js_rows=3)
    stream_stats(lm, seqs, st, batch_size=2, targets=targets, backend="tiles")
    assert_close(st.means(), reference(lm, seqs, targets, js_rows=3), stats_bound(seqs))  # float32 rows vs float64 sums


# -- a GPU user's errors -------------------------------------------------------------------------
def test_out_of_gpu_memory_is_one_line_naming_max_seq_len(tmp_path, capsys, monkeypatch):
    # simulated: torch sees one GPU (--device auto picks it), the model stays on the CPU, and the
    # pass raises torch's out-of-memory error with its own message
    from types import SimpleNamespace

    import attnscope.executor as executor
    import attnscope.models.loading as loading
    from attnscope.cli.main import main

    monkeypatch.setattr(loading, "resolve_device", lambda device: "cpu")  # the loader keeps it on the CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 70 << 30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(total_memory=80 << 30))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (3 << 29, 80 << 30))

    def boom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB. GPU 0 has a total "
                                     "capacity of 79.19 GiB of which 1.50 GiB is free.\nOf the allocated "
                                     "memory ... PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ...")

    monkeypatch.setattr(executor, "stream_stats", boom)  # where the executor calls the engine
    out = tmp_path / "out"
    code = main(["analyze", "longctx", str(ROOT / "src/attnscope/demo_data/text.txt"), "--model", "debug:llama",
                 "--device", "auto", "--max-seq-len", "256", "--longctx-engine", "streaming", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    # the flag and its value, the device, the sizes, and what to do
    says(one_line(err.strip()), "error: ", "--max-seq-len 256", "GPU memory", "cuda", "12.00 GiB",
         "70.00 GiB", "80.00 GiB", "1.50 GiB", "lower --max-seq-len")
    assert not out.exists()


def test_out_of_memory_in_the_library_names_the_parameter():
    from attnscope.engines.memory import gpu_memory_errors

    with pytest.raises(AttnscopeError) as e:
        with gpu_memory_errors(8192, "cpu"):
            raise torch.cuda.OutOfMemoryError("out of memory")
    says(one_line(e.value), "max_seq_len 8192", "GPU memory", "cpu", "lower max_seq_len")
    assert e.value.params == ("max_seq_len",)
    with pytest.raises(ValueError):  # anything else passes through
        with gpu_memory_errors(8192, "cpu"):
            raise ValueError("not memory")


def test_the_statistics_the_engines_fold_into_are_a_protocol_of_the_engines():
    """The seam is defined in ``engines/`` (no import of the layer above, not even for a type)
    and the long-context accumulator implements every method and attribute of it."""
    import ast
    import inspect

    import attnscope.engines as engines_pkg
    from attnscope.analyses.longctx import LongContextStats
    from attnscope.engines.rows import RowStats

    assert isinstance(LongContextStats(), RowStats)
    members = {n for n, v in vars(RowStats).items() if callable(v) and not n.startswith("_")}
    assert members == {"begin", "tile", "sampled_row", "target_weights", "row_buffers", "layer_probs",
                       "layer_end", "end"}
    for name in members:  # the same parameters, in the same order
        want = list(inspect.signature(getattr(RowStats, name)).parameters)
        assert list(inspect.signature(getattr(LongContextStats, name)).parameters) == want, name
    from pathlib import Path

    for path in Path(engines_pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("attnscope.analyses"), path.name


def test_a_new_backend_is_one_object_and_one_registry_line_and_a_pass_runs_through_it(monkeypatch):
    """A backend of its own (here: the reference's tiles, counting its calls, for the CPU only),
    added to the registry: named, it runs every layer of every sequence, once per pass it was
    chosen for; under ``auto`` on the CPU it is chosen ahead of the compiled kernel (it comes
    first); the statistics equal the reference's; where it cannot run, ``check`` says why in one
    line. Nothing else of the engine changes."""
    from attnscope.engines.seam import Backend
    from attnscope.engines.tiled import TILES

    calls = []

    def run(layer, b, seq):
        calls.append((layer.site.layer, b))
        TILES.run(layer, b, seq)

    fake = Backend("counting", devices=("cpu",), token_level=False, probes=True, run=run,
                   usable=lambda kind: kind == "cpu", why="it counts on the CPU only")
    monkeypatch.setattr(backends, "BACKENDS", (fake, *backends.BACKENDS))
    lm = load_model("debug:llama")
    ids = [lm.tokenizer(t)["input_ids"] for t in TEXTS[:2]]
    got, want = LongContextStats(js_rows=2), LongContextStats(js_rows=2)
    stream_stats(lm, ids, got, backend="counting", batch_size=2)  # one pass, both sequences
    assert sorted(calls) == sorted((layer, b) for layer in range(lm.num_layers) for b in range(len(ids)))
    stream_stats(lm, ids, want, backend="tiles", batch_size=2)
    assert_close(got.means(), want.means(), tol=0)
    calls.clear()
    stream_stats(lm, ids, LongContextStats(js_rows=2))  # auto: the first backend made for the CPU
    assert len(calls) == lm.num_layers * len(ids)
    from attnscope.engines.plan import plan  # the plan names it, and what it did to the others

    p = plan(lm, longest=64, engine="streaming")
    assert p.backend == "counting" and p.verdicts[0] == ("counting", "chosen", "made for cpu")
    assert [v for _, v, _ in p.verdicts[1:]] == ["not tried"] * len(backends.BACKENDS[1:])
    assert choose("auto", "cuda", token_level=True, probe=False, usable=lambda n, d: n == "tiles") == "tiles"
    with pytest.raises(AttnscopeError) as e:
        backends.check("counting", "cuda")
    says(one_line(e.value), "backend counting", "cannot run on cuda", "it counts on the CPU only")


# -- the maps backend: the eager maps, the reference ---------------------------------------------
@pytest.mark.parametrize("name", ["llama", "bert", "tiny-qwen2", "tiny-gemma2"])
def test_the_maps_backend_folds_the_very_maps_output_attentions_returns(name):
    """The maps backend in the streaming engine's hook (per sequence, from the forward's lean
    mask) against every layer's map returned by ``output_attentions`` for the whole padded batch:
    documents and induction probes (decoders), a padded encoder batch, a sliding window and
    soft-capping; the statistics equal to the last bit."""
    lm = _model(name)
    seqs, targets = _docs(lm) if lm.facts.causal else ([lm.tokenizer(t)["input_ids"] for t in TEXTS], None)
    got, want = LongContextStats(js_rows=3), LongContextStats(js_rows=3)
    stream_stats(lm, seqs, got, batch_size=3, targets=targets, backend="maps")
    maps_update(lm, seqs, want, batch_size=3, targets=targets, keep_all=True)
    assert_close(got.means(), want.means(), tol=0)


def test_the_maps_backend_takes_word_level_sequences_as_the_maps_do():
    from tests.engines.test_longctx import _units

    lm = load_model("debug:llama")
    pairs = [_units(lm, t) for t in TEXTS]
    ids, units = [p[0] for p in pairs], [p[1] for p in pairs]
    got, want = LongContextStats(js_rows=2), LongContextStats(js_rows=2)
    stream_stats(lm, ids, got, units=units, batch_size=2, maps_fit=True)  # auto, the maps fit
    maps_update(lm, ids, want, units=units, batch_size=2, keep_all=True)
    assert_close(got.means(), want.means(), tol=0)


def test_the_plan_gives_the_reason_for_every_backend_it_turned_down():
    """One plan decides the engine and the backend once and says why of each backend (as sdpa
    says why it passed over a kernel): GPT-OSS's learned sinks on the CPU go to the tiles, the
    compiled kernel and the one-pass kernel declined for the sinks, flex as made for CUDA, the
    maps as over the budget; what cannot work is one line before any pass."""
    from attnscope.engines.plan import plan

    lm = load_model("debug:gpt_oss")
    assert "sinks" in lm.facts.mechanisms
    p = plan(lm, longest=4096, batch_size=1, budget_bytes=1 << 20)
    why = {name: (verdict, reason) for name, verdict, reason in p.verdicts}
    assert (p.engine, p.backend, p.maps_fit) == ("streaming", "tiles", False)
    assert "GB" in p.engine_reason and "budget" in p.engine_reason
    assert why["maps"] == ("declined", "the pass's maps do not fit the memory budget")
    assert why["onepass"][0] == why["compiled"][0] == "declined" and "sinks" in why["compiled"][1]
    assert why["flex"] == ("declined", "made for cuda, not cpu (it runs there when asked for by name)")
    assert why["tiles"] == ("chosen", "takes every input, the last resort")
    assert [line.split(":")[0].strip() for line in p.lines()[2:7]] == [b.name for b in backends.BACKENDS]
    assert p.describe()["backends"][4] == {"name": "tiles", "verdict": "chosen", "reason": why["tiles"][1]}
    small = plan(lm, longest=64)  # its maps fit the default budget: the reference folds them
    assert (small.engine, small.backend) == ("maps", "maps")
    for kwargs, words in (({"backend": "compiled"}, ("backend compiled", "sinks", "tiles")),
                          ({"engine": "maps", "backend": "tiles"}, ("engine maps with backend tiles",)),
                          ({"attention_dtype": "half"}, ("attention_dtype half",))):
        with pytest.raises(AttnscopeError) as e:
            plan(lm, longest=64, **kwargs)
        says(one_line(e.value), *words)
    with pytest.raises(AttnscopeError) as e:  # outside AttentionInterface: maps only
        plan(load_model("debug:luke"), longest=64)
    says(one_line(e.value), "AttentionInterface", "attnscope extract")
