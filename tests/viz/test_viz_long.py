"""Long inputs in the views: a window of query rows plus the sink, a bounded payload, and the
per-head distance profile (hand-worked maps, no model)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import one_line, says, sum_bound

from attnscope.errors import AttnscopeError
from attnscope.viz.encoding import decode
from attnscope.viz.payload import distance_profile, page_payload, window_units
from attnscope.viz.render import embed_json


def causal_uniform(n: int, L: int = 1, H: int = 2) -> np.ndarray:
    """Row i spreads its attention evenly over keys 0..i: ``[L H n n]``."""
    a = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    return np.broadcast_to(a, (L, H, n, n)).astype(np.float32).copy()


def test_window_units_keeps_the_sink_and_the_last_rows():
    assert window_units(10, 4).tolist() == [0, 6, 7, 8, 9]
    assert window_units(10, 4, offset=3).tolist() == [0, 3, 4, 5, 6]
    assert window_units(10, 4, offset=0).tolist() == [0, 1, 2, 3]  # the sink is in the window
    assert window_units(3, 8).tolist() == [0, 1, 2]
    with pytest.raises(AttnscopeError) as e:
        window_units(10, 4, offset=7)
    says(one_line(e.value), "offset 7", "0 .. 6")
    with pytest.raises(AttnscopeError) as e:
        window_units(10, 0)
    says(one_line(e.value), "window 0", "at least 1")


def test_long_payload_is_the_window_with_the_mass_left_outside(map_factory):
    n, w = 40, 8
    amap = map_factory(causal_uniform(n), [f"t{i}" for i in range(n)], level="token")
    p = page_payload(amap, long_input=20, window=w)
    units = list(range(n - w, n))
    assert p["window"]["units"] == [0] + units
    assert (p["window"]["offset"], p["window"]["size"], p["window"]["num_units"]) == (n - w, w, n)
    assert p["tokens"] == ["t0"] + [f"t{i}" for i in units]
    attn = decode(p["attn"])
    assert attn.shape == (1, 2, w + 1, w + 1)
    # row i (i >= 32) puts 1/(i+1) on each key 0..i; shown keys: 0 and 32..i
    for r, i in enumerate(units, start=1):
        shown = 1 + (i - (n - w) + 1)
        assert attn[0, 1, r, 0] == pytest.approx(1 / (i + 1), abs=1 / 509)
        outside = decode(p["window"]["outside"])[0, 1, r]
        assert outside == pytest.approx(1 - shown / (i + 1), abs=1 / 509)
    # the sink's own row sees only itself: nothing outside
    assert decode(p["window"]["outside"])[0, 0, 0] == 0
    # thumbnails still pool the whole input: a 40 x 40 map into 32 x 32 bins
    assert decode(p["thumbnails"]).shape == (1, 2, 32, 32)
    assert p["thumb_bins"][-1] == n


def test_long_payload_size_does_not_grow_with_the_input(map_factory):
    def size(n):
        amap = map_factory(causal_uniform(n, L=2, H=2), [f"t{i}" for i in range(n)], level="token")
        p = page_payload(amap, long_input=64, window=32)
        assert decode(p["attn"]).shape == (2, 2, 33, 33)
        return len(embed_json({k: v for k, v in p.items() if k != "text"}))

    small, large = size(200), size(800)
    full_800 = 2 * 2 * 800 * 800  # bytes of the u8 maps a whole-input page would carry
    assert large < full_800 / 50
    assert large < 1.5 * small + 4000  # only the token list grows... and it is the window's too


def test_short_inputs_are_whole_and_refuse_an_offset(map_factory):
    amap = map_factory(causal_uniform(10), [f"t{i}" for i in range(10)], level="token")
    p = page_payload(amap)
    assert p["window"] is None and decode(p["attn"]).shape == (1, 2, 10, 10)
    with pytest.raises(AttnscopeError) as e:
        page_payload(amap, offset=2)
    says(one_line(e.value), "offset 2", "example 0", "10 units")


def test_distance_profile_by_hand():
    # rows 1..4 of a causal uniform 5 x 5 map; distances 0..i each get 1/(i+1)
    prof = distance_profile(causal_uniform(5))
    assert prof["buckets"] == ["0", "1", "2", "3-4"]
    b01 = (1 / 2 + 1 / 3 + 1 / 4 + 1 / 5) / 4
    want = [b01, b01, (1 / 3 + 1 / 4 + 1 / 5) / 4, (1 / 4 + 2 / 5) / 4]
    assert np.allclose(prof["values"][0][1], want, atol=sum_bound(5), rtol=0)  # float32 sums of <= 5 weights
    assert sum(want) == pytest.approx(1)


def test_distance_profile_of_a_bidirectional_map_uses_absolute_distance():
    a = np.zeros((1, 1, 3, 3), np.float32)
    a[0, 0, 1] = [0.5, 0.0, 0.5]  # row 1: distance 1 both ways
    a[0, 0, 2] = [1.0, 0.0, 0.0]  # row 2: distance 2
    prof = distance_profile(a)
    assert prof["values"][0][0] == pytest.approx([0.0, 0.5, 0.5])


def test_the_window_payload_is_strict_json(map_factory):
    amap = map_factory(causal_uniform(30), ["<script>x</script>"] + [f"t{i}" for i in range(29)],
                       level="token")
    text = embed_json(page_payload(amap, long_input=10, window=4))
    assert "</script>" not in text and "<script>" not in text
    assert json.loads(text)["tokens"][0] == "<script>x</script>"


def test_show_head_view_of_a_long_bertviz_style_input():
    from attnscope.notebook import head_view
    from tests.viz.test_viz_pages import payload_of

    n = 600  # above the default threshold of 512 units
    att = [np.asarray(causal_uniform(n, L=1, H=1)[0])]  # one layer, [H n n]
    p = payload_of(head_view(att, [f"t{i}" for i in range(n)], offset=100, window=50).html)
    assert p["window"]["units"] == [0] + list(range(100, 150))
    assert decode(p["attn"]).shape == (1, 1, 51, 51)


@pytest.mark.parametrize("causal", [True, False])
def test_distance_profile_equals_a_brute_force_count(causal):
    from attnscope.analyses.longctx import bucket_of

    rng = np.random.default_rng(3)
    L, H, n = 2, 3, 37  # distances up to 36: buckets 0 .. 7 ("33-64")
    a = rng.random((L, H, n, n))
    if causal:
        a = np.tril(a)
    a /= a.sum(-1, keepdims=True)
    want = np.zeros((L, H, 8))
    for i in range(1, n):
        for j in range(n):
            want[:, :, bucket_of(np.array([abs(i - j)]))[0]] += a[:, :, i, j] / (n - 1)
    prof = distance_profile(a)
    assert prof["buckets"][-1] == "33-64"
    assert np.allclose(prof["values"], want, atol=1e-12)
