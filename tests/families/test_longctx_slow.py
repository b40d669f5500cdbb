"""SmolLM2-135M (the packaged GGUF): greedy decoding, and the streaming engine against eager
maps at 512 and 2,048 tokens of WikiText-2. Slow: run with --runslow."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import softmax_bound

pytestmark = pytest.mark.slow


def test_smollm2_table_entry(smollm2):
    assert smollm2.family.name == "llama" and smollm2.facts.causal and smollm2.facts.causal
    assert (smollm2.num_layers, smollm2.num_heads, smollm2.num_kv_heads) == (30, 9, 3)
    assert len(smollm2.weights_hash) == 64 and smollm2.extra["gguf"].endswith(".gguf")


def test_smollm2_greedy_paris(smollm2):
    from attnscope.models.generation import causal_lm_for, greedy_continue

    ids = smollm2.tokenizer("The capital of France is")["input_ids"]
    assert "Paris" in smollm2.tokenizer.decode(greedy_continue(causal_lm_for(smollm2), ids, 4))


@pytest.mark.parametrize("n", [512, 2048])
def test_smollm2_streaming_equals_eager_maps(smollm2, shared_data, n):
    from attnscope.analyses.longctx import LongContextStats
    from attnscope.data.unlabeled import prepare_documents
    from attnscope.engines.streaming import maps_update, stream_stats

    docs = prepare_documents(shared_data / "wikitext-2" / "valid.sentences.txt", smollm2.tokenizer,
                             max_seq_len=n, join=True, num_docs=1)
    ids = [docs[0].ids]
    assert len(ids[0]) == n
    # the same pass: the eager maps and the streamed tiles see the same queries and keys
    ref = LongContextStats(js_rows=2)
    got = LongContextStats(js_rows=2)
    stream_stats(smollm2, ids, got, chunk=200, reference=ref)
    a, b = got.means(), ref.means()
    for k in b:  # float32 rows of n keys: the tiles' and the maps' (softmax_bound)
        np.testing.assert_allclose(a[k], b[k], atol=softmax_bound(n), rtol=0, err_msg=k)
    assert (a["sink"] > 0.3).sum() > 0  # SmolLM2 has sink heads
    # a separate eager run (output from eager, not sdpa) differs only by the model's own
    # kernel rounding, amplified over 30 layers
    sep = LongContextStats(js_rows=2)
    maps_update(smollm2, ids, sep, keep_all=False)
    worst = max(float(np.nanmax(np.abs(a[k] - sep.means()[k]))) for k in a)
    print(f"n={n}: streaming (sdpa pass) vs separate eager pass, largest difference {worst:.2e}")
    assert worst < 1e-3
