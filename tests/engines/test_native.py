"""The streaming engine's compiled tile kernel (engines/native.py, native_tiles.c) against the
torch path it replaces and against the definitions."""

import os
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import softmax_bound, sum_bound, weights_tolerance
from hypothesis import given, settings
from hypothesis import strategies as st

from attnscope.analyses.longctx import diagonal_sums
from attnscope.engines import native
from attnscope.engines.tiled import LOW
from attnscope.engines.tiled import softmax_entropy as _softmax_entropy

needs_kernel = pytest.mark.skipif(native.kernel() is None, reason="no C compiler here")


def test_the_kernel_builds_where_there_is_a_compiler():
    # CI and the development machines have gcc: a failed build would fall back to the torch path
    # silently and every other test here would be skipped
    if shutil.which("cc") or shutil.which("gcc"):
        assert native.kernel() is not None


def _tile(h, c, K, q0, seed, mask="causal", scale=3.0):
    """Scores [h c K] as the engine hands them to the softmax: masked keys hold LOW."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(h, c, K, generator=g) * scale
    if mask == "causal":  # row i = q0 + r sees keys 0 .. i
        allowed = torch.arange(K)[None, :] <= (q0 + torch.arange(c))[:, None]
    elif mask == "random":  # padding / sliding windows: any pattern, some rows empty
        allowed = torch.rand(c, K, generator=g) < 0.6
        allowed[0] = False
    else:
        allowed = torch.ones(c, K, dtype=torch.bool)
    return s.masked_fill(~allowed, LOW)


def _reference(s, q0):
    """The definitions in float64: softmax, -sum p ln p, max p, mass per distance."""
    p = torch.softmax(s.double(), -1)
    ent = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)
    h, c, K = s.shape
    diag = torch.zeros(h, K + c - 1, dtype=torch.float64)
    for r in range(c):
        diag[:, c - 1 - r:c - 1 - r + K] += p[:, r]
    return p, ent, p.amax(-1), diag


@needs_kernel
@pytest.mark.parametrize("h,c,K,q0,mask,F", [(3, 4, 9, 5, "causal", 3), (1, 1, 1, 0, "causal", 0),
                                             (2, 16, 300, 284, "causal", 5), (3, 5, 40, 0, "random", 1),
                                             (9, 37, 1025, 0, "none", 4), (2, 3, 70000, 69997, "causal", 9)])
def test_kernel_equals_the_definitions_and_the_torch_path(h, c, K, q0, mask, F):
    s = _tile(h, c, K, q0, seed=h * K + c, mask=mask)
    classes = torch.rand(F, K + 11, generator=torch.Generator().manual_seed(F))[:, 3:K + 3]  # rows of a wider matrix
    p_ref, ent_ref, top_ref, diag_ref = _reference(s, q0)
    t_p, t_ent, t_top = _softmax_entropy(s.clone(), torch.empty_like(s))
    _, t_diag = diagonal_sums(t_p, q0)
    got = s.clone()
    diag = torch.full((h, K + c - 1), float("nan"))  # every column is written
    ent, top, mass = native.softmax_stats(got, diag, classes if F else None)
    assert mass.shape == (h, c, F)
    # float32 rounding of sums over up to 70k keys; measured largest differences to the float64
    # definitions 1.2e-7 (p), 1.9e-6 (entropy, ~11 nats at 70k keys), 3e-8 (max), 6e-7 (diag),
    # 2.4e-7 (classes). The bounds: a weight, the largest and a class mass (classes in [0, 1)) are
    # weights of a row of K keys, a diagonal sums c rows' weights (weights_tolerance, relative);
    # the entropy is a statistic of the row (softmax_bound: the kernel shifts each row by its
    # maximum, so no score term). At K = 70k the worst-case entropy bound is 0.1 nats (1% of it)
    w, row = weights_tolerance(K), {"rtol": 0, "atol": softmax_bound(K)}
    refs = ((got, p_ref, w), (ent, ent_ref, row), (top, top_ref, w), (diag, diag_ref, weights_tolerance(K, c)),
            (mass, p_ref @ classes.double().T, w))
    for a, b, tol in refs:
        torch.testing.assert_close(a.double(), b, **tol)
    for a, b, tol in zip((got, ent, top, diag), (t_p, t_ent, t_top, t_diag), (x[2] for x in refs)):
        torch.testing.assert_close(a, b, **tol)  # the torch path: the same bounds, another order
    some = (s > LOW).any(-1, keepdim=True)  # a row with no key at all is uniform, as in torch
    assert torch.all(got[(s == LOW) & some] == 0)  # a masked key gets exactly 0
    torch.testing.assert_close(got[~some.expand_as(s)], torch.full(((~some).sum().item() * K,), 1 / K))


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(h=st.integers(1, 4), c=st.integers(1, 9), K=st.integers(1, 200), q0=st.integers(0, 50),
       F=st.integers(0, 6), seed=st.integers(0, 2 ** 16), scale=st.sampled_from([0.1, 3.0, 60.0]))
def test_kernel_equals_the_torch_path_on_any_tile(h, c, K, q0, F, seed, scale):
    s = _tile(h, c, K, q0, seed, mask="causal" if seed % 2 else "random", scale=scale)
    classes = (torch.rand(F, K, generator=torch.Generator().manual_seed(seed)) < 0.3).float()
    t_p, t_ent, t_top = _softmax_entropy(s.clone(), torch.empty_like(s))
    got = s.clone()
    diag = torch.empty(h, K + c - 1)
    ent, top, mass = native.softmax_stats(got, diag, classes)
    # two float32 orders of the same rows: weights, sums of them and the entropy (as above)
    w = weights_tolerance(K)
    torch.testing.assert_close(got, t_p, **w)
    torch.testing.assert_close(ent, t_ent, rtol=0, atol=softmax_bound(K))
    torch.testing.assert_close(top, t_top, **w)
    torch.testing.assert_close(diag, diagonal_sums(t_p, q0)[1], **weights_tolerance(K, c))
    torch.testing.assert_close(mass, t_p @ classes.T, **w)
    torch.testing.assert_close(got.sum(-1), torch.ones(h, c), rtol=0, atol=w["rtol"] + w["atol"])  # weights of mass 1


@needs_kernel
def test_kernel_without_distances_or_classes_on_a_view_of_a_buffer():
    buf = torch.full((2000,), 7.0)
    s = buf[:3 * 4 * 50].view(3, 4, 50)
    s.copy_(_tile(3, 4, 50, 46, seed=1))
    want = _softmax_entropy(s.clone(), torch.empty_like(s))
    ent, top, mass = native.softmax_stats(s, None)
    torch.testing.assert_close(s, want[0], **weights_tolerance(50))  # rows of 50 keys, as above
    torch.testing.assert_close(ent, want[1], rtol=0, atol=softmax_bound(50))
    assert mass.shape == (3, 4, 0)
    assert torch.all(buf[3 * 4 * 50:] == 7.0)  # nothing past the tile is touched


def test_available_on_the_cpu_only():
    assert native.available(torch.device("meta")) is False
    assert native.available("cpu") == (native.kernel() is not None)


def _run(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


@pytest.mark.heavy
@needs_kernel
def test_a_fresh_build_keeps_denormals_and_is_reused(tmp_path):
    # -ffast-math at link time would make gcc add a start-up file that sets the CPU to flush
    # denormals to zero for the whole process (torch included) as soon as the library is loaded
    # and that the process keeps one OpenMP runtime: the kernel's is torch's own libgomp.so.1
    code = ("import torch; from attnscope.engines import native; "
            "x = torch.tensor([1e-39]); assert (x * 1).item() > 0; "
            "assert native.kernel() is not None; print((x * 1).item() > 0, torch.finfo(torch.float32).tiny / 2 > 0); "
            "import os; maps = open('/proc/self/maps').read() if os.path.exists('/proc/self/maps') else ''; "
            "print(len({line.split()[-1] for line in maps.splitlines() if 'libgomp' in line}) <= 1)")
    first = _run(code, ATTNSCOPE_CACHE=str(tmp_path))
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["True", "True", "True"]
    built = sorted((tmp_path / "native").iterdir())
    assert len(built) == 1 and built[0].suffix == ".so"  # no temporary build folder left behind
    stamp = built[0].stat().st_mtime_ns
    assert _run(code, ATTNSCOPE_CACHE=str(tmp_path)).returncode == 0
    assert [(p, p.stat().st_mtime_ns) for p in (tmp_path / "native").iterdir()] == [(built[0], stamp)]


@pytest.mark.heavy
def test_no_kernel_without_a_compiler_or_when_disabled(tmp_path):
    code = "from attnscope.engines import native; print(native.kernel() is None)"
    no_cc = _run(code, ATTNSCOPE_CACHE=str(tmp_path), PATH=str(tmp_path), CC="")
    assert no_cc.returncode == 0, no_cc.stderr
    assert no_cc.stdout.strip() == "True" and not (tmp_path / "native").exists()
    off = _run(code, ATTNSCOPE_CACHE=str(tmp_path), ATTNSCOPE_NATIVE="0")
    assert off.stdout.strip() == "True"


@pytest.mark.heavy
@needs_kernel
def test_a_broken_cached_library_is_rebuilt(tmp_path):
    code = "from attnscope.engines import native; print(native.kernel() is not None)"
    assert _run(code, ATTNSCOPE_CACHE=str(tmp_path)).stdout.strip() == "True"
    (lib,) = (tmp_path / "native").iterdir()
    lib.write_bytes(b"not a shared library")
    again = _run(code, ATTNSCOPE_CACHE=str(tmp_path))
    assert again.stdout.strip() == "True", again.stderr
    assert [p.name for p in (tmp_path / "native").iterdir()] == [lib.name]
    assert lib.read_bytes() != b"not a shared library"


# -- the one-call layer kernel (attnscope_flash) ---------------------------------------------------
needs_flash = pytest.mark.skipif(native.flash_kernel() is None, reason="no kernel or no sgemm_ in torch")


def _layer(Hq, Hkv, d, n, seed, scale=1.0, rising=False):
    """Queries [Hq n d], keys and values [Hkv n d] in the model's layout (rows of [n H d]
    transposed), and the key classes [F n] (the first token, then random 0/1 columns)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, Hq, d, generator=g).transpose(0, 1) * scale
    k = torch.randn(n, Hkv, d, generator=g).transpose(0, 1)
    if rising:  # later keys score ever higher: each new key block brings a new maximum
        k = k + torch.linspace(0, 6, n)[None, :, None] * q.mean(0, keepdim=True) / scale
    v = torch.randn(n, Hkv, d, generator=g).transpose(0, 1)
    classes = (torch.rand(4, n, generator=g) < 0.3).float()
    classes[0] = 0
    classes[0, 0] = 1
    return q, k, v, classes


def _layer_reference(q, k, v, n, causal, mask, cap, classes):
    """The definitions in float64: output, entropy, largest weight, class masses, and each head's
    mass over rows >= 1 per distance bucket and at distance +1."""
    import numpy as np

    from attnscope.analyses.longctx import NUM_BUCKETS, bucket_of

    G = q.shape[0] // k.shape[0]
    kr, vr = k.double().repeat_interleave(G, 0), v.double().repeat_interleave(G, 0)
    s = q.double()[:, :n] @ kr[:, :n].transpose(1, 2) / q.shape[-1] ** 0.5
    if cap:
        s = cap * torch.tanh(s / cap)
    allowed = torch.ones(n, n, dtype=torch.bool) if mask is None else mask[:n, :n].clone()
    if causal:
        allowed &= torch.ones(n, n, dtype=torch.bool).tril()
    empty = ~allowed.any(-1)
    s = s.masked_fill(~allowed, float("-inf"))
    s[:, empty] = 0.0  # a row with no key at all is uniform, as in torch
    p = torch.softmax(s, -1)
    ent = -torch.special.xlogy(p, p).sum(-1)
    dist = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs()
    b = torch.as_tensor(bucket_of(dist.numpy()))
    buckets = torch.zeros(q.shape[0], NUM_BUCKETS + 1, dtype=torch.float64)
    for h in range(q.shape[0]):
        buckets[h, :NUM_BUCKETS].index_add_(0, b[1:].flatten(), p[h, 1:].flatten())
        buckets[h, NUM_BUCKETS] = p[h, 1:].diagonal().sum()  # p[i, i-1]
    rows = torch.cat([ent[None], p.amax(-1)[None], (p @ classes[:, :n].double().T).permute(2, 0, 1)])
    return (p @ vr[:, :n]).transpose(0, 1), rows, buckets, np.asarray(empty)


def _flash_bounds(q, k, v, n):
    """The float32 bounds of the one-call kernel's statistics against float64 on ``_layer``'s
    inputs: ``(weights, entropy, output)``. Its scores are float32 dot products of d terms, off
    by sum_bound(d, scale |q| . |k|) (the cap's tanh shrinks errors); a weight moves by that much of
    itself, the entropy ``L - sum p s`` by up to twice the largest |score| times it, on top of
    its softmax_bound; an output row ``sum p v`` by the weights' error times the largest |v|."""
    G, d = q.shape[0] // k.shape[0], q.shape[-1]
    prods = q.double()[:, :n].abs() @ k.double()[:, :n].abs().repeat_interleave(G, 0).transpose(1, 2) / d ** 0.5
    size = float(prods.max())  # the largest sum of |q_i k_i| terms, also at least the largest |score|
    score_error = sum_bound(d, size)
    w = weights_tolerance(n, score_error=score_error)
    ent = softmax_bound(n, size) + 2 * size * score_error
    out = (w["rtol"] + w["atol"]) * float(v[:, :n].abs().max())
    return w, ent, out, score_error


def _flash(q, k, v, n, causal, mask, cap, classes):
    from attnscope.analyses.longctx import NUM_BUCKETS

    Hq, d = q.shape[0], q.shape[-1]
    out = torch.full((q.shape[1], Hq, d), float("nan"))
    rowv = torch.full((2 + classes.shape[0], Hq, n), float("nan"))
    dist = torch.zeros(Hq, NUM_BUCKETS + 1, dtype=torch.float64)
    native.flash(q, k, v, out, n, n, d ** -0.5, cap, causal, mask, classes, rowv, dist)
    return out, rowv, dist


@needs_flash
@pytest.mark.parametrize("Hq,Hkv,d,n,causal,mask,cap,blocks", [
    (9, 3, 64, 50, True, None, None, (21, 8)),  # GQA: 7 rows of 3 heads, 8 keys a block
    (9, 3, 64, 700, True, None, None, None),  # the real blocks: 384 / 3 rows, 256 keys
    (4, 4, 16, 33, False, None, None, (5, 4)),  # bidirectional
    (6, 2, 32, 40, True, "window", None, (4, 3)),  # a sliding window of 5 keys
    (6, 2, 32, 40, True, "keys", None, (12, 5)),  # key padding only (one row for all): no triangle in it
    (2, 1, 8, 30, False, "random", None, (3, 5)),  # any pattern, with an empty row
    (8, 2, 128, 45, True, None, 5.0, (16, 16)),  # soft-capping; rows scaled down for d = 128
])
def test_flash_equals_the_definitions(Hq, Hkv, d, n, causal, mask, cap, blocks, monkeypatch):
    if blocks:  # small blocks: many key blocks per row (the online softmax) and many row blocks
        monkeypatch.setattr(native, "BLOCK_ROWS", blocks[0])
        monkeypatch.setattr(native, "BLOCK_KEYS", blocks[1])
    q, k, v, classes = _layer(Hq, Hkv, d, n + 3, seed=n, scale=3.0, rising=True)  # 3 rows of padding
    g = torch.Generator().manual_seed(d)
    m = None
    if mask == "window":
        i, j = torch.arange(n + 3)[:, None], torch.arange(n + 3)[None, :]
        m = (j <= i) & (j > i - 5)
    elif mask == "keys":  # a mask broadcast over the rows (row stride 0), keys 3 and 7 masked
        m = torch.ones(n + 3, dtype=torch.bool)
        m[[3, 7]] = False
        m = m[None].expand(n + 3, n + 3)
    elif mask == "random":
        m = torch.rand(n + 3, n + 3, generator=g) < 0.5
        m[2] = False
    out, rowv, dist = _flash(q, k, v, n, causal, m, cap, classes)
    want_out, want_rows, want_dist, empty = _layer_reference(q, k, v, n, causal, m, cap, classes)
    assert empty.any() == (mask == "random")
    # measured largest differences to float64: 1.2e-6 (output), 1.9e-6 (entropy), 2.4e-7
    # (weights), 1.5e-6 (distance buckets, sums over up to 700 rows); bounds: _flash_bounds
    w, ent, out_bound, score_error = _flash_bounds(q, k, v, n)
    torch.testing.assert_close(out[:n].double(), want_out, rtol=0, atol=out_bound)
    assert torch.isnan(out[n:]).all()  # rows past n are not touched
    torch.testing.assert_close(rowv[0].double(), want_rows[0], rtol=0, atol=ent)
    torch.testing.assert_close(rowv[1:].double(), want_rows[1:], **w)
    torch.testing.assert_close(dist, want_dist, **weights_tolerance(n, n - 1, score_error))  # n - 1 rows' weights
    torch.testing.assert_close(dist[:, :-1].sum(-1), torch.full((Hq,), n - 1.0, dtype=torch.float64))


@needs_flash
def test_flash_gives_the_same_values_on_any_number_of_threads():
    q, k, v, classes = _layer(9, 3, 64, 600, seed=5)
    before = torch.get_num_threads()
    try:
        got = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            got.append(_flash(q, k, v, 600, True, None, None, classes))
    finally:
        torch.set_num_threads(before)
    for out, rowv, dist in got[1:]:
        assert torch.equal(out, got[0][0]) and torch.equal(rowv, got[0][1])  # each row one thread's
        # the rows' float64 sums, in any order: eps64 n of the (non-negative) sum
        torch.testing.assert_close(dist, got[0][2], rtol=torch.finfo(torch.float64).eps * 600, atol=0)


@needs_flash
@settings(max_examples=30, deadline=None)
@given(G=st.integers(1, 3), Hkv=st.integers(1, 2), n=st.integers(2, 60), rows=st.integers(1, 9),
       keys=st.integers(1, 20), causal=st.booleans(), seed=st.integers(0, 2 ** 16),
       scale=st.sampled_from([0.1, 3.0, 20.0]))
def test_flash_equals_the_definitions_on_any_blocks(G, Hkv, n, rows, keys, causal, seed, scale):
    q, k, v, classes = _layer(G * Hkv, Hkv, 8, n, seed, scale=scale, rising=bool(seed % 2))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(native, "BLOCK_ROWS", rows * G)
        mp.setattr(native, "BLOCK_KEYS", keys)
        out, rowv, dist = _flash(q, k, v, n, causal, None, None, classes)
    want_out, want_rows, want_dist, _ = _layer_reference(q, k, v, n, causal, None, None, classes)
    w, ent, out_bound, score_error = _flash_bounds(q, k, v, n)  # as above
    torch.testing.assert_close(out.double(), want_out, rtol=0, atol=out_bound)
    torch.testing.assert_close(rowv[0].double(), want_rows[0], rtol=0, atol=ent)
    torch.testing.assert_close(rowv[1:].double(), want_rows[1:], **w)
    torch.testing.assert_close(dist, want_dist, **weights_tolerance(n, n - 1, score_error))
