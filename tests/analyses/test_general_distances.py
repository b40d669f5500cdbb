"""Jensen-Shannon head distances (properties, a naive reference) and clustering (labels, MDS)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import js_bound
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attnscope.analyses.clustering import (
    MDSParams,
    Thresholds,
    behaviour_labels,
    cluster_heads,
    mds_2d,
)
from attnscope.analyses.distances import HeadDistances, js_matrix, smooth
from attnscope.maps import AttentionBatch


def naive_js(p: np.ndarray, q: np.ndarray) -> float:
    """JS of two distributions from the definition, float64: 1/2 KL(p||m) + 1/2 KL(q||m)."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    m = (p + q) / 2
    kl = lambda a: sum(x * math.log(x / y) for x, y in zip(a, m) if x > 0)  # noqa: E731
    return 0.5 * kl(p) + 0.5 * kl(q)


def test_js_by_hand():
    # disjoint supports: ln 2; identical: 0; p=(1,0), q=(1/2,1/2): by hand
    h = np.array([[[1.0, 0.0], [1.0, 0.0]],
                  [[0.0, 1.0], [0.5, 0.5]]])  # [P=2 n=2 n=2]
    d = js_matrix(h, smoothing=0.0)
    row2 = 0.5 * (1 * math.log(1 / 0.75)) + 0.5 * (0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25))
    assert d[0, 1] == pytest.approx(math.log(2) + row2, abs=2 * js_bound(2))  # 2 rows of float32 terms
    assert d[0, 0] == 0.0 and d[1, 1] == 0.0


dists = arrays(np.float64, (3, 4, 4), elements=st.floats(0.0, 1.0))


@settings(max_examples=60, deadline=None)
@given(dists, st.sampled_from([0.0, 0.001, 0.2]))
def test_js_properties(raw, smoothing):
    raw = raw + 1e-3
    heads = raw / raw.sum(-1, keepdims=True)
    d = js_matrix(heads, smoothing=smoothing)
    n = heads.shape[1]
    np.testing.assert_allclose(np.diag(d), 0.0, atol=1e-12)  # JS(P, P) = 0
    np.testing.assert_array_equal(d, d.T)  # symmetric
    assert (d >= 0).all() and (d <= n * (math.log(2) + js_bound(n))).all()  # <= ln 2 per row
    s = smooth(heads, smoothing).astype(np.float64)
    for i in range(3):
        for j in range(3):
            want = sum(naive_js(s[i, r], s[j, r]) for r in range(n))
            assert d[i, j] == pytest.approx(want, abs=n * js_bound(n))  # n rows of n float32 terms


def test_distances_mean_and_sum_any_shape(map_factory):
    rng = np.random.default_rng(0)
    maps = [map_factory(rng.dirichlet(np.ones(n) * 0.4, size=(3, 5, n)), ["t"] * n, index=i)
            for i, n in enumerate([4, 7])]
    mean, total = HeadDistances(), HeadDistances(reduce="sum")
    for a in (mean, total):
        a.update(AttentionBatch(maps))
    d_sum = total.finalize().arrays["distances"]
    d_mean = mean.finalize().arrays["distances"]
    assert d_sum.shape == (15, 15)
    np.testing.assert_allclose(d_mean, d_sum / (4 + 7))
    assert (d_mean <= math.log(2) + js_bound(7)).all()
    # reference: every pair, every row, the definition (heads layer-major)
    ref = np.zeros((15, 15))
    for m in maps:
        s = smooth(m.attn, 0.001).reshape(15, m.num_units, m.num_units).astype(np.float64)
        for i in range(15):
            for j in range(15):
                ref[i, j] += sum(naive_js(s[i, r], s[j, r]) for r in range(m.num_units))
    np.testing.assert_allclose(d_sum, ref, atol=(4 + 7) * js_bound(7), rtol=0)  # 11 rows of at most 7 keys
    rows = mean.finalize().tables["head_distances"]
    assert len(rows) == 15 * 14 // 2 and rows[0]["head_a"] == "1-1" and rows[0]["head_b"] == "1-2"


def test_distances_refuse_mixed_models(map_factory):
    a = HeadDistances()
    a.update(AttentionBatch([map_factory(np.full((1, 2, 3, 3), 1 / 3), ["a", "b", "c"])]))
    with pytest.raises(ValueError):
        a.update(AttentionBatch([map_factory(np.full((2, 2, 3, 3), 1 / 3), ["a", "b", "c"])]))


# -- clustering -------------------------------------------------------------------------------
def test_behaviour_labels_thresholds_and_order():
    z = np.zeros((1, 7))
    stats = {k: z.copy() for k in ("separator", "first", "punct", "previous", "next", "entropy")}
    stats["separator"][0, 0] = 0.61
    stats["first"][0, 1] = 0.61
    stats["punct"][0, 2] = 0.61
    stats["previous"][0, 3] = 0.51
    stats["next"][0, 4] = 0.51
    stats["entropy"][0, 5] = 3.81
    stats["separator"][0, 6] = 0.6  # not above 0.6
    stats["previous"][0, 0] = 0.9  # [SEP] wins over previous (label order)
    labels = behaviour_labels(stats, uniform_entropy=math.log(128))
    assert labels[0].tolist() == ["[SEP]", "[CLS]", "punctuation", "previous", "next", "broad", "other"]


def test_broad_threshold_scales_with_length():
    t = Thresholds()
    assert t.broad_for(math.log(128)) == pytest.approx(3.8)
    assert t.broad_for(math.log(64)) == pytest.approx(math.log(64) - (math.log(128) - 3.8))
    stats = {"entropy": np.array([[3.2, 3.0]])}
    labels = behaviour_labels(stats, uniform_entropy=math.log(64))  # threshold 3.108
    assert labels.tolist() == [["broad", "other"]]


def test_mds_recovers_a_line_and_is_deterministic():
    x = np.array([0.0, 1.0, 3.0, 6.0])
    d = np.abs(x[:, None] - x[None, :])
    c1 = mds_2d(d, MDSParams(random_state=0))
    c2 = mds_2d(d, MDSParams(random_state=0))
    np.testing.assert_array_equal(c1, c2)
    got = np.sqrt(((c1[:, None] - c1[None]) ** 2).sum(-1))
    np.testing.assert_allclose(got, d, atol=0.05)


def test_cluster_heads_rows():
    d = np.array([[0, 1, 2, 2], [1, 0, 2, 2], [2, 2, 0, 1], [2, 2, 1, 0]], float)
    stats = {"previous": np.array([[0.9, 0.1], [0.0, 0.0]]), "entropy": np.zeros((2, 2))}
    out = cluster_heads(d, stats, uniform_entropy=math.log(10))
    assert [r["name"] for r in out["rows"]] == ["1-1", "1-2", "2-1", "2-2"]
    assert out["rows"][0]["behaviour"] == "previous"
    assert out["params"]["mds"]["random_state"] == 0 and out["params"]["mds"]["n_init"] == 4
    assert out["coords"].shape == (4, 2)
