"""Rows on demand (engines/document.py): one head's row at any query of a document, from the kept
queries and keys, equals the same row of the eager maps, and its entropy, largest weight and sink
mass equal the values the streaming engine folds for that row."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import softmax_bound

from attnscope.analyses.longctx import LongContextStats
from attnscope.engines.document import DocumentRows, row_summary
from attnscope.engines.rows import bucket_labels, bucket_of, bucket_ranges
from attnscope.engines.streaming import stream_stats
from attnscope.models import capture
from attnscope.models.capture import document_queries_keys


class Recorder(LongContextStats):
    """The engine's own per-row values of every layer ([F H n]: entropy, largest weight, mass on
    the first token, ...), copied as each layer is folded."""

    def __init__(self):
        super().__init__()
        self.per_row = {}

    def _fold_layer(self, seq):
        self.per_row[seq.layer] = seq.row_values.detach().cpu().numpy().copy()
        super()._fold_layer(seq)


def _check(lm, ids, picks, tol_row=None):
    doc = DocumentRows(ids, *document_queries_keys(lm, ids), causal=lm.facts.causal)
    layers = {}
    seen = iter(range(lm.num_layers))
    capture.attention(lm, ids, each_layer=lambda probs: layers.__setitem__(next(seen), probs))
    rec = Recorder()
    stream_stats(lm, [ids], rec)
    for layer, head, query in picks:
        row = doc.row(layer, head, query)
        eager = layers[layer][head, query]
        # p_j = exp(s_j - L): L sums n terms in float32, so p_j is off by at most about
        # eps n |s_j - L| = eps n |ln p_j| of itself (the row and the maps order the sums differently)
        bound = float(np.finfo(np.float32).eps * len(ids) * (1 + np.abs(np.log(eager[eager > 0])).max()))
        assert np.abs(row - eager).max() <= (tol_row if tol_row is not None else bound)
        s = row_summary(row, query)
        ent, top, sink = rec.per_row[layer][:3, head, query]
        assert s["entropy"] == pytest.approx(float(ent), abs=softmax_bound(len(ids)))  # a statistic of the row
        assert s["max_weight"] == pytest.approx(float(top), abs=bound)
        assert s["sink"] == pytest.approx(float(sink), abs=bound)
        # every weight of the row, in buckets or in the strip, adds up to 1
        assert sum(b["mass"] for b in s["buckets"]) == pytest.approx(1.0, abs=softmax_bound(len(ids)))
        assert sum(s["strip"]) == pytest.approx(1.0, abs=softmax_bound(len(ids)))
        # the largest keys, worked out from the eager row: the same weights, each at its key
        want = np.sort(eager[eager > 0])[::-1][:len(s["top"])]
        assert [w for _, w in s["top"]] == pytest.approx(want.tolist(), abs=bound)
        assert [w for _, w in s["top"]] == pytest.approx([float(eager[j]) for j, _ in s["top"]], abs=bound)


def test_rows_equal_eager_maps_and_the_engines_values(debug_llama):
    ids = debug_llama.tokenizer(" ".join(["the cat sat on the mat, and then it slept."] * 12))["input_ids"]
    n = len(ids)
    _check(debug_llama, ids, [(layer, head, q) for layer in range(2) for head in range(4)
                              for q in (1, n // 2, n - 1)])


def test_a_row_of_a_decoder_sees_only_its_past_and_bad_picks_are_one_line(debug_llama):
    doc = DocumentRows(ids := debug_llama.tokenizer("a b c d e f")["input_ids"], *document_queries_keys(debug_llama, ids), causal=True)
    row = doc.row(0, 1, 3)
    assert row[4:].tolist() == [0.0] * (doc.n - 4) and row[:4].sum() == pytest.approx(1.0, abs=softmax_bound(4))
    from attnscope.errors import AttnscopeError

    with pytest.raises(AttnscopeError, match="query 99"):
        doc.row(0, 0, 99)
    with pytest.raises(AttnscopeError, match="head 3-1"):
        doc.row(2, 0, 1)


def test_distance_buckets_cover_every_distance_once_as_every_page_buckets_them():
    """A long page's row and the profiles of every other page bucket distances one way (the
    long page had 0, 1, 2-3, 4-7 where the others had 0, 1, 2, 3-4, 5-8)."""
    labels = bucket_labels()
    for n in (1, 2, 3, 17, 1024, 1025):
        b = bucket_ranges(n)
        covered = [d for lo, hi in b for d in range(lo, hi + 1)]
        assert covered == list(range(n))
        for k, (lo, hi) in enumerate(b):
            assert set(bucket_of(np.arange(lo, hi + 1)).tolist()) == {k}
            assert k == len(b) - 1 or labels[k] == (str(lo) if lo == hi else f"{lo}-{hi}")
    row = row_summary(np.full(10, 0.1), 9)
    assert [(x["lo"], x["hi"]) for x in row["buckets"]] == [(0, 0), (1, 1), (2, 2), (3, 4), (5, 8), (9, 9)]


@pytest.mark.slow
def test_smollm2_rows_at_2k_tokens_equal_eager_maps(smollm2, shared_data):
    from attnscope.data.unlabeled import prepare_documents

    doc = prepare_documents(shared_data / "wikitext-2" / "valid.sentences.txt", smollm2.tokenizer,
                            max_seq_len=2048, join=True, num_docs=1)[0]
    assert len(doc.ids) == 2048
    _check(smollm2, doc.ids, [(0, 0, 2047), (5, 3, 1000), (14, 4, 1500), (29, 8, 7)])
