"""The packaged model on the real EWT dev set."""

import numpy as np
import pytest
from conftest import float16_row_bound

from attnscope.data.depparse import iter_depparse
from attnscope.extract import ExtractOptions
from attnscope.jobs import extract_to_store
from attnscope.store import open_store


@pytest.mark.slow
def test_packaged_model_on_ewt_dev(tmp_path, shared_data, default_model):
    examples = list(iter_depparse(shared_data / "ud-ewt" / "en_ewt-ud-dev.conllu"))
    assert len(examples) == 2001
    stats = extract_to_store(examples, tmp_path / "s", default_model,
                             options=ExtractOptions(word_level=True, batch_size=32))
    tok = default_model.tokenizer
    lengths = [len(tok(" ".join(e.words))["input_ids"]) for e in examples]
    assert [s["index"] for s in stats.skipped] == [i for i, n in enumerate(lengths) if n > 128]
    store = open_store(tmp_path / "s")
    assert len(store) == 2001 - len(stats.skipped)
    assert store.num_layers == 6 and store.num_heads == 12
    for m in (store[0], store[len(store) // 2], store[-1]):
        words = [t for t, s in zip(m.tokens, m.special) if not s]
        assert words == examples[m.index].words
        assert m.tokens[0] == "[CLS]" and m.tokens[-1] == "[SEP]"
        # float16 word rows, each summing a token row of at most max_seq_len = 128 keys
        np.testing.assert_allclose(m.attn.sum(-1), 1.0, atol=float16_row_bound(128), rtol=0)
        assert m.example.heads == examples[m.index].heads
