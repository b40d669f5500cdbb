"""The leaner extraction paths found by benchmarks/extract.py give the same maps.

- ``run_batch`` copies each example's ``[L H n n]`` out of torch's per-layer outputs instead
  of stacking the whole padded batch first: checked against the model's own output.
- ``to_word_level`` averages rows with a BLAS matmul instead of ``einsum``: checked against
  the definition written as loops.
- ``ShardWriter`` holds maps waiting for their shard in the store's dtype: checked that it
  does not touch the caller's map and writes exactly the rounded values.
"""

import numpy as np
import torch
from conftest import softmax_bound, sum_bound
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file

from attnscope.data.records import Example
from attnscope.extract import ExtractOptions, Extractor
from attnscope.extract.wordlevel import to_word_level
from attnscope.maps import AttentionMap
from attnscope.store.format import array_key, shard_name
from attnscope.store.writer import ShardWriter

WORDS = [["The", "unbelievable", "cat", "sat", "."], ["a"], ["Where", "is", "the", "red", "house", "?"]]


def test_run_batch_slices_each_example_out_of_the_models_own_attention(debug_bert):
    extractor = Extractor(debug_bert, ExtractOptions(batch_size=3))
    planned = next(extractor.plan(Example(words=w) for w in WORDS))
    assert len({len(e) for e in planned}) == 3  # three lengths: the batch is padded
    batch = extractor.run_batch(planned)
    for e, m in zip(planned, batch.items):
        with torch.inference_mode():  # the example alone, no padding at all
            out = debug_bert.model(input_ids=torch.tensor([e.input_ids]),
                                   token_type_ids=torch.tensor([e.token_type_ids]),
                                   output_attentions=True)
        n = len(e)
        assert m.attn.shape == (2, 2, n, n) and m.attn.flags["C_CONTIGUOUS"]
        for layer, a in enumerate(out.attentions):  # layer order kept
            # float32 softmax rows of n keys, in a padded batch and alone (other kernels' orders)
            np.testing.assert_allclose(m.attn[layer], a[0].numpy(), atol=softmax_bound(n), rtol=0)


@st.composite
def maps_and_units(draw):
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=6))  # pieces per unit
    units = np.repeat(np.arange(len(sizes)), sizes)
    n = len(units)
    seed = draw(st.integers(0, 2**16))
    raw = np.random.default_rng(seed).random((2, 3, n, n)).astype(np.float32) + 0.01
    return raw / raw.sum(-1, keepdims=True), units


@settings(max_examples=50, deadline=None)
@given(maps_and_units())
def test_word_level_mean_matches_the_definition(case):
    attn, units = case  # [L H n n] float32
    u = int(units[-1]) + 1
    want = np.zeros(attn.shape[:2] + (u, u))
    for i in range(u):  # FROM unit i: mean over its pieces; TO unit j: sum over its pieces
        for j in range(u):
            block = attn[:, :, units == i][:, :, :, units == j].astype(np.float64)
            want[:, :, i, j] = block.sum(-1).mean(-1)
    got = to_word_level(attn, units)
    assert got.dtype == np.float32  # float32 in, float32 out: no silent doubling of memory
    # float32 sums of a row's weights over a unit's pieces (and a mean of its rows) against float64
    np.testing.assert_allclose(got, want, rtol=0, atol=sum_bound(len(units)))


def _map(index: int, n: int, seed: int) -> AttentionMap:
    raw = np.random.default_rng(seed).random((2, 2, n, n)).astype(np.float32)
    attn = raw / raw.sum(-1, keepdims=True)
    return AttentionMap(index, attn, [f"t{k}" for k in range(n)], np.zeros(n, bool),
                        np.zeros(n, np.int64), np.arange(n), "token", Example(words=["w"] * n))


def test_shard_writer_holds_pending_maps_in_the_store_dtype(tmp_path):
    (tmp_path / "shards").mkdir()
    writer = ShardWriter(tmp_path, shard_size=3, dtype="float16", done=set())
    items = [_map(i, n, seed=i) for i, n in enumerate((3, 5, 4))]
    before = [it.attn.copy() for it in items]
    writer.add(0, items[0])
    writer.add(1, items[1])
    waiting = writer.pending[0]
    assert all(m.attn.dtype == np.float16 for m in waiting.values())
    assert not (tmp_path / "shards" / shard_name(0)).exists()  # shard not full yet
    writer.add(2, items[2])
    assert writer.pending == {}
    for it, b in zip(items, before):  # the caller's maps are left as they were
        assert it.attn.dtype == np.float32
        np.testing.assert_array_equal(it.attn, b)
    arrays = load_file(str(tmp_path / "shards" / shard_name(0)))
    for pos, b in enumerate(before):
        np.testing.assert_array_equal(arrays[array_key(pos)], b.astype(np.float16))


def test_shard_writer_float32_store_keeps_exact_values(tmp_path):
    (tmp_path / "shards").mkdir()
    writer = ShardWriter(tmp_path, shard_size=2, dtype="float32", done=set())
    items = [_map(i, 4, seed=10 + i) for i in range(2)]
    for pos, it in enumerate(items):
        writer.add(pos, it)
    arrays = load_file(str(tmp_path / "shards" / shard_name(0)))
    for pos, it in enumerate(items):
        assert arrays[array_key(pos)].dtype == np.float32
        np.testing.assert_array_equal(arrays[array_key(pos)], it.attn)
