"""The long-context statistics: the streaming engine against eager maps, merge, hand cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import one_line, says, softmax_bound

from attnscope.analyses.longctx import (
    NUM_BUCKETS,
    LongContextStats,
    Sequence,
    bucket_labels,
    bucket_of,
    is_punct,
    js_rows_matrix,
    pairs_per_bucket,
    sample_rows,
)
from attnscope.engines import native, tiled
from attnscope.engines.plan import choose_engine
from attnscope.engines.streaming import (
    induction_sequences,
    maps_update,
    stream_stats,
)
from attnscope.models import load_model
from attnscope.models.forward import forward, pad_batch

torch = pytest.importorskip("torch")

TEXTS = ["the cat sat on the mat. a dog ran, she said; " * 3,
         "when the old man saw the red house, he ran.",
         "it is big"]


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma"])
def decoder(request):
    return load_model(f"debug:{request.param}")


def _docs(lm):
    seqs = [lm.tokenizer(t)["input_ids"] for t in TEXTS]
    iseq, itg = induction_sequences(lm, 2, 12, seed=3)
    return seqs + iseq, [None] * len(seqs) + itg


# -- an independent reference: every statistic straight from the eager maps ------------------
def reference(lm, seqs, targets, js_rows, smoothing=0.001, seed=0):
    L, H = lm.num_layers, lm.num_heads
    specials = set(lm.tokenizer.all_special_ids)
    sums = {k: np.zeros((L, H)) for k in ("sink", "special", "punct", "previous", "current",
                                           "entropy", "norm_entropy", "max")}
    dist = np.zeros((L, H, NUM_BUCKETS))
    pairs = np.zeros(NUM_BUCKETS)
    pos_sink = np.zeros((L, H, NUM_BUCKETS))
    pos_ent = np.zeros((L, H, NUM_BUCKETS))
    pos_rows = np.zeros(NUM_BUCKETS)
    tsum = {"induction": np.zeros((L, H)), "duplicate": np.zeros((L, H))}
    tcount = {"induction": 0, "duplicate": 0}
    js_sum, js_n = np.zeros((L * H, L * H)), 0
    rows = 0
    for s, ids in enumerate(seqs):
        out = forward(lm, pad_batch(lm, [ids]), attentions=True)
        A = np.stack([a[0].double().numpy() for a in out.attentions])  # [L H n n]
        n = len(ids)
        toks = lm.tokenizer.convert_ids_to_tokens(ids)
        sp = np.array([i in specials for i in ids], float)
        pu = np.array([(i not in specials) and is_punct(t) for i, t in zip(ids, toks)], float)
        if targets[s]:  # a probe: only the weight of each row on its target key
            for i in range(1, n):
                for name in tsum:
                    t = targets[s][name][i]
                    if t >= 0:
                        tsum[name] += A[:, :, i, t]
                        tcount[name] += 1
            continue
        for i in range(1, n):
            rows += 1
            p = A[:, :, i, :i + 1]  # [L H m]
            sums["sink"] += p[..., 0]
            sums["special"] += (p * sp[:i + 1]).sum(-1)
            sums["punct"] += (p * pu[:i + 1]).sum(-1)
            sums["previous"] += p[..., i - 1]
            sums["current"] += p[..., i]
            with np.errstate(divide="ignore", invalid="ignore"):
                ent = -np.where(p > 0, p * np.log(p), 0.0).sum(-1)
            sums["entropy"] += ent
            sums["norm_entropy"] += ent / math.log(i + 1)
            sums["max"] += p.max(-1)
            b = bucket_of(np.array([i]))[0]
            pos_sink[..., b] += p[..., 0]
            pos_ent[..., b] += ent
            pos_rows[b] += 1
            for j in range(i + 1):
                k = bucket_of(np.array([i - j]))[0]
                dist[..., k] += p[..., j]
                pairs[k] += 1
        for r in sample_rows(ids, js_rows, seed):
            m = r + 1
            P = A[:, :, r, :m].reshape(L * H, m) * (1 - smoothing) + smoothing / m
            for a in range(L * H):
                for c in range(L * H):
                    mid = (P[a] + P[c]) / 2
                    js_sum[a, c] += 0.5 * (P[a] * np.log(P[a] / mid)).sum() + \
                        0.5 * (P[c] * np.log(P[c] / mid)).sum()
            js_n += 1
    ref = {k: v / rows for k, v in sums.items()}
    ref["dist_mass"] = dist / rows
    ref["dist_weight"] = np.where(pairs > 0, dist / np.where(pairs > 0, pairs, 1), np.nan)
    ref["pos_sink"] = np.where(pos_rows > 0, pos_sink / np.where(pos_rows > 0, pos_rows, 1), np.nan)
    ref["pos_entropy"] = np.where(pos_rows > 0, pos_ent / np.where(pos_rows > 0, pos_rows, 1), np.nan)
    for name in tsum:
        ref[f"target_{name}"] = tsum[name] / tcount[name]
    ref["js"] = js_sum / js_n
    return ref


def stats_bound(seqs) -> float:
    """The float32 bound of every per-row statistic of ``seqs`` (conftest.softmax_bound over the
    longest row). A mean over rows is no further off than its worst row (rows are summed in
    float64); a layer past the first reads hidden states that the one pass and the maps round
    differently, by eps n |v| (sum_bound), which these small debug models do not amplify."""
    return softmax_bound(max(map(len, seqs)))


def assert_close(got: dict, ref: dict, tol: float):
    for k, v in ref.items():
        assert k in got, k
        np.testing.assert_allclose(got[k], v, atol=tol, rtol=0, err_msg=k)


# -- unit cases -----------------------------------------------------------------------------
def test_buckets_by_hand():
    assert bucket_of(np.array([0, 1, 2, 3, 4, 5, 8, 9, 16, 17, 1024, 1025])).tolist() == \
        [0, 1, 2, 3, 3, 4, 4, 5, 5, 6, 11, 12]
    assert bucket_labels()[:6] == ["0", "1", "2", "3-4", "5-8", "9-16"]
    with pytest.raises(ValueError):
        bucket_of(np.array([2 ** 21]))


@pytest.mark.parametrize("n", [1, 2, 5, 17])
@pytest.mark.parametrize("causal", [True, False])
def test_pairs_per_bucket_counts_every_pair_once(n, causal):
    want = np.zeros(NUM_BUCKETS)
    for i in range(1, n):
        for j in range(n if not causal else i + 1):
            want[bucket_of(np.array([abs(i - j)]))[0]] += 1
    np.testing.assert_array_equal(pairs_per_bucket(n, causal), want)


def test_uniform_attention_by_hand():
    # one head, 3 tokens, each row uniform over what it sees
    p = torch.tensor([[[1, 0, 0], [0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3]]], dtype=torch.float32)
    st = LongContextStats(js_rows=0)
    seq = Sequence(3, torch.tensor([1.0, 0, 0]), torch.tensor([0.0, 0, 1]))
    st.begin(1, 1, seq)
    st.layer_probs(0, seq, p)
    m = st.means()
    assert st.rows == 2
    assert m["sink"][0, 0] == pytest.approx((0.5 + 1 / 3) / 2)
    assert m["special"][0, 0] == pytest.approx((0.5 + 1 / 3) / 2)
    assert m["punct"][0, 0] == pytest.approx((0 + 1 / 3) / 2)
    assert m["previous"][0, 0] == pytest.approx((0.5 + 1 / 3) / 2)
    assert m["entropy"][0, 0] == pytest.approx((math.log(2) + math.log(3)) / 2)
    assert m["norm_entropy"][0, 0] == pytest.approx(1.0)
    assert m["max"][0, 0] == pytest.approx((0.5 + 1 / 3) / 2)
    # distances: row 1 has 0.5 at d=0 and d=1; row 2 has 1/3 at d=0, 1, 2
    assert m["dist_mass"][0, 0, :3].tolist() == pytest.approx([(0.5 + 1 / 3) / 2, (0.5 + 1 / 3) / 2, 1 / 6])
    assert m["dist_mass"][0, 0].sum() == pytest.approx(1.0)
    # mean weight per key: d=0 pairs (1,1),(2,2); d=2 one pair (2,0)
    assert m["dist_weight"][0, 0, 2] == pytest.approx(1 / 3)


def test_js_rows_matrix_properties():
    rows = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    d = js_rows_matrix(rows, smoothing=0.0)
    assert d[0, 1] == pytest.approx(math.log(2))
    assert np.allclose(d, d.T) and np.allclose(np.diag(d), 0)
    # JS([1,0], [.5,.5]) by the definition
    want = 0.5 * math.log(1 / 0.75) + 0.5 * (0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25))
    assert d[0, 2] == pytest.approx(want)
    rng = np.random.default_rng(0)
    r = torch.as_tensor(rng.dirichlet(np.ones(7), size=5))
    d = js_rows_matrix(r, smoothing=0.001)
    assert (d >= 0).all() and (d <= math.log(2) + 1e-12).all()


def test_js_rows_matrix_in_float32_is_within_its_documented_size_of_float64():
    # The sampled rows' distances use the paper script's arithmetic (float32 terms, as
    # distances.js_matrix). On rows as long as a 2k document's (2,000 keys, peaked like real
    # heads), that is within 2e-5 nats of the same formula in float64 (SmolLM2 at 2k: 1.0e-5 at
    # most, docs/long-context.md).
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((12, 2000)) * rng.uniform(0.5, 6, size=(12, 1))
    rows = torch.softmax(torch.as_tensor(logits), -1)
    got = js_rows_matrix(rows.float(), smoothing=0.001)
    x = rows.double() * 0.999 + 0.001 / 2000
    want = np.zeros((12, 12))
    for a in range(12):
        for c in range(12):
            mid = (x[a] + x[c]) / 2
            want[a, c] = float(0.5 * (x[a] * torch.log(x[a] / mid)).sum() + 0.5 * (x[c] * torch.log(x[c] / mid)).sum())
    assert np.abs(got - want).max() < 2e-5 and want.max() > 0.3


def test_sample_rows_depends_on_document_not_batch():
    ids = list(range(100, 160))
    a = sample_rows(ids, 5, seed=1)
    assert a == sample_rows(ids, 5, seed=1) and len(set(a)) == 5 and min(a) >= 1
    assert a != sample_rows(ids, 5, seed=2)
    assert sample_rows([5], 3, 0) == [] and sample_rows([5, 6], 3, 0) == [1]


def test_is_punct():
    assert is_punct("Ġ.") and is_punct(",") and is_punct("...")
    assert not is_punct("Ġthe") and not is_punct("Ġ") and not is_punct("a.")


def test_induction_targets_point_at_the_right_tokens():
    lm = load_model("debug:llama")
    seqs, tg = induction_sequences(lm, 2, 10, seed=0)
    for ids, t in zip(seqs, tg):
        assert len(ids) == 21 and ids[1:11] == ids[11:]
        for i in range(11, 21):
            assert ids[t["duplicate"][i]] == ids[i]
            assert ids[t["induction"][i]] == ids[i - 10 + 1] if i < 20 else True
            assert t["induction"][i] == t["duplicate"][i] + 1
        assert all(x == -1 for x in t["induction"][:11])


def test_choose_engine():
    lm = load_model("debug:llama")  # 2 layers x 4 heads
    assert choose_engine(lm, 16, budget_bytes=2 * 4 * 16 * 16 * 4) == "maps"
    assert choose_engine(lm, 17, budget_bytes=2 * 4 * 16 * 16 * 4) == "streaming"
    assert choose_engine(lm, 10 ** 6, engine="maps") == "maps"
    with pytest.raises(ValueError):
        choose_engine(lm, 10, engine="fast")


# -- the forward helper's lean mask -----------------------------------------------------------
def test_lean_mask_same_output_and_same_allowed_keys(decoder):
    lm = decoder
    ids = [lm.tokenizer(t)["input_ids"] for t in TEXTS]
    inputs = pad_batch(lm, ids)
    seen = {}

    def grab(name):
        def hook(site, key):
            seen[(name, site.layer)] = site.allowed(0, key.shape[2]).clone()
        return hook

    full = forward(lm, inputs, hooks={"k": grab("eager")}, attentions=True).output.last_hidden_state
    lean = forward(lm, inputs, hooks={"k": grab("lean")}, lean_mask=True).output.last_hidden_state
    for b, n in enumerate(inputs.lengths):
        # the same weights: the two masks change only which kernel sums a row. Each layer's output,
        # a weighted mean over n keys, moves by its weights' rounding, and those of the next layer
        # by their scores' (sums of hidden-size products): a softmax row of n + hidden terms, a
        # layer, of the hidden states' size
        size = float(full[b, :n].abs().max())
        bound = lm.num_layers * softmax_bound(n + lm.model.config.hidden_size) * size
        assert torch.allclose(full[b, :n], lean[b, :n], atol=bound, rtol=0)
    for layer in range(lm.num_layers):
        e, g = seen[("eager", layer)], seen[("lean", layer)]
        for b, n in enumerate(inputs.lengths):  # rows of real tokens: the same keys
            assert torch.equal(e[b, 0, :n, :n], g[b, 0, :n, :n])
            assert torch.equal(e[b, 0, :n, :n], torch.ones(n, n, dtype=torch.bool).tril())
    single = forward(lm, pad_batch(lm, ids[:1]), hooks={"k": grab("none")}, lean_mask=True)
    assert single is not None and torch.equal(seen[("none", 0)][0, 0], torch.ones(
        len(ids[0]), len(ids[0]), dtype=torch.bool).tril())


# -- exactness: streaming == maps == independent reference ---------------------------------------
@pytest.mark.parametrize("one_key_head,kernel", [(False, "flash"), (True, "tiles"), (False, "tiles"),
                                                 (False, "torch")])
def test_streaming_equals_reference_from_eager_maps(decoder, one_key_head, kernel, monkeypatch):
    lm = decoder
    if one_key_head:  # a tile of one key head's query heads, the key heads one after another
        monkeypatch.setattr(tiled, "TILE_BYTES", 1)
    if kernel != "flash":  # tiles of whole rows (word level, probes, no sgemm_ in torch)
        monkeypatch.setattr(native, "flash_kernel", lambda: None)
    if kernel == "torch":  # the torch path (GPUs, no C compiler), where the compiled kernel is built
        monkeypatch.setattr(native, "kernel", lambda: None)
    seqs, targets = _docs(lm)
    ref = reference(lm, seqs, targets, js_rows=3)
    st = LongContextStats(js_rows=3)
    stream_stats(lm, seqs, st, chunk=4, targets=targets)
    assert_close(st.means(), ref, stats_bound(seqs))  # float32 rows against float64 sums of the maps
    mp = LongContextStats(js_rows=3)
    maps_update(lm, seqs, mp, batch_size=2, targets=targets)
    assert_close(mp.means(), ref, stats_bound(seqs))


@pytest.mark.parametrize("chunk,batch", [(1, 1), (3, 2), (7, 5), (1000, 3)])
def test_streaming_independent_of_chunk_and_batch(chunk, batch):
    lm = load_model("debug:llama")
    seqs, targets = _docs(lm)
    base = LongContextStats(js_rows=2)
    stream_stats(lm, seqs, base, chunk=16, batch_size=1, targets=targets)
    st = LongContextStats(js_rows=2)
    stream_stats(lm, seqs, st, chunk=chunk, batch_size=batch, targets=targets)
    assert_close(st.means(), base.means(), stats_bound(seqs))  # the same rows, tiled in other orders
    assert st.rows == base.rows == sum(len(s) - 1 for s, t in zip(seqs, targets) if not t)


def test_merge_of_split_documents_equals_one_run():
    lm = load_model("debug:qwen2")
    seqs, targets = _docs(lm)
    whole = LongContextStats(js_rows=2)
    stream_stats(lm, seqs, whole, chunk=5, targets=targets)
    parts = []
    for lo, hi in ((0, 1), (1, 4), (4, len(seqs))):
        p = LongContextStats(js_rows=2)
        stream_stats(lm, seqs[lo:hi], p, chunk=3, targets=targets[lo:hi])
        parts.append(p)
    merged = LongContextStats(js_rows=2).merge(parts[2]).merge(parts[0]).merge(parts[1])
    assert_close(merged.means(), whole.means(), stats_bound(seqs))  # the same rows in other tiles
    assert merged.documents == 3 and merged.target_sequences == 2 and merged.js_count == whole.js_count
    with pytest.raises(ValueError):
        merged.merge(LongContextStats(js_rows=5))


def test_probes_feed_their_targets_only():
    # documents and induction probes folded together == the documents alone, for every
    # document statistic and count; the targets == the probes alone
    lm = load_model("debug:llama")
    seqs, targets = _docs(lm)
    both, docs, probes = (LongContextStats(js_rows=3) for _ in range(3))
    stream_stats(lm, seqs, both, chunk=4, batch_size=2, targets=targets)
    stream_stats(lm, seqs[:3], docs, chunk=4)
    stream_stats(lm, seqs[3:], probes, chunk=4, targets=targets[3:])
    got, want = both.means(), docs.means()
    assert set(got) == set(want) | {"target_induction", "target_duplicate"}
    # the same rows, batched with others (padding changes the tiles' order of the sums)
    assert_close({k: got[k] for k in want}, want, stats_bound(seqs))
    for name in ("induction", "duplicate"):
        np.testing.assert_allclose(got[f"target_{name}"], probes.means()[f"target_{name}"],
                                   atol=stats_bound(seqs))
    assert (both.documents, both.tokens, both.rows) == (3, sum(map(len, seqs[:3])), sum(map(len, seqs[:3])) - 3)
    assert (both.target_sequences, both.target_tokens) == (2, 2 * 25)
    meta = both.finalize().meta
    assert meta["documents"] == 3 and meta["target_sequences"] == 2
    assert meta["target_rows"] == {"duplicate": 2 * 12, "induction": 2 * 12}
    summary = probes.finalize().summary  # one line: no rows, and why (the least length)
    assert len(summary) == 1
    says(one_line(summary[0]), "no rows", "2 tokens")


def test_gu2024_sink_metric_by_hand():
    # one layer, two heads; document A has 4 tokens, B has 2. Row i puts `sink` on token 0 and
    # the rest on itself. Head 0: A's rows 1-3 put 0.1 on token 0, B's row 1 puts 0.2; head 1:
    # A's rows put 0, B's row 1 puts 0.9.
    def doc(n, sinks):  # sinks[h][i - 1] for rows i >= 1
        p = torch.zeros(2, n, n)
        p[:, 0, 0] = 1.0
        for h in range(2):
            for i in range(1, n):
                p[h, i, 0], p[h, i, i] = sinks[h][i - 1], 1 - sinks[h][i - 1]
        return Sequence(n, torch.zeros(n), torch.zeros(n)), p

    def run(metric):
        st = LongContextStats(js_rows=0, sink_metric=metric)
        for seq, p in (doc(4, [[0.1] * 3, [0.0] * 3]), doc(2, [[0.2], [0.9]])):
            st.begin(1, 2, seq)
            st.layer_probs(0, seq, p)
            st.end(seq)
        return st

    st = run("pooled")
    m = st.means()
    # pooled over rows >= 1: head 0 (0.3 + 0.2) / 4, head 1 0.9 / 4: neither above 0.3
    np.testing.assert_allclose(m["sink"], [[0.125, 0.225]])
    # Gu et al.: per document, the mean over ALL rows (row 0: 1). Head 0: A (1 + 0.3) / 4 = 0.325,
    # B (1 + 0.2) / 2 = 0.6, a sink in both; head 1: A 1 / 4 = 0.25, B (1 + 0.9) / 2 = 0.95, a sink
    # in B only (its mean score, 0.6, is above 0.3, but the threshold is per document)
    np.testing.assert_allclose(m["sink_gu"], [[(0.325 + 0.6) / 2, (0.25 + 0.95) / 2]])
    np.testing.assert_allclose(m["sink_rate"], [[1.0, 0.5]])
    res = st.finalize()
    assert res.meta["sink_heads"] == {"pooled": 0, "gu2024": 1.5} and res.meta["sink_samples"] == 2
    assert [r["sink_head"] for r in res.tables["heads"]] == [False, False]
    gu = run("gu2024").finalize()  # labels: a sink in more than half of the documents
    assert [r["sink_head"] for r in gu.tables["heads"]] == [True, False]
    assert gu.meta["sink_heads"] == res.meta["sink_heads"]
    with pytest.raises(ValueError) as e:
        LongContextStats(causal=False, sink_metric="gu2024")
    says(one_line(e.value), "sink_metric", "'gu2024'", "causal")  # the option, its value, what it needs
    with pytest.raises(ValueError) as e:
        LongContextStats(sink_metric="mean")
    says(one_line(e.value), "sink_metric", "'mean'", "'pooled'", "'gu2024'")  # the value, and the choices


def test_gu2024_sink_metric_equals_eager_maps(decoder):
    # each document's mean attention on token 0 over all rows, row 0 included, straight from
    # the eager maps; averaged over documents, and the share of documents above 0.3
    lm = decoder
    seqs = [lm.tokenizer(t)["input_ids"] for t in TEXTS]
    st = LongContextStats(js_rows=0, sink_metric="gu2024")
    stream_stats(lm, seqs, st, chunk=4, batch_size=2)
    scores = []
    for ids in seqs:
        out = forward(lm, pad_batch(lm, [ids]), attentions=True)
        A = np.stack([a[0].double().numpy() for a in out.attentions])  # [L H n n]
        scores.append(A[..., 0].mean(-1))  # [L H]
    scores = np.stack(scores)
    m = st.means()
    # a weight of a float32 softmax row against the float64 mean of the maps' weights
    np.testing.assert_allclose(m["sink_gu"], scores.mean(0), atol=softmax_bound(max(map(len, seqs))), rtol=0)
    np.testing.assert_array_equal(m["sink_rate"], (scores > 0.3).mean(0))
    res = st.finalize()
    assert res.meta["sink_heads"]["gu2024"] == pytest.approx((scores > 0.3).sum(axis=(1, 2)).mean())
    assert [r["sink_head"] for r in res.tables["heads"]] == ((scores > 0.3).mean(0) > 0.5).reshape(-1).tolist()


def test_finalize_tables_and_empty():
    empty = LongContextStats().finalize()
    assert empty.summary and not empty.arrays
    lm = load_model("debug:gemma")
    st = LongContextStats(js_rows=1, sink_threshold=0.0)  # every head is a "sink head"
    stream_stats(lm, [lm.tokenizer(TEXTS[0])["input_ids"]], st)
    res = st.finalize()
    assert len(res.tables["heads"]) == lm.num_layers * lm.num_heads
    assert len(res.tables["sink_heads"]) == lm.num_layers * lm.num_heads
    assert res.tables["heads"][5]["name"] == "2-2"
    n = len(lm.tokenizer(TEXTS[0])["input_ids"])
    # a row's weights add up to 1, each rounded in float32
    assert np.allclose(res.arrays["dist_mass"].sum(-1), 1.0, atol=softmax_bound(n), rtol=0)


def test_encoder_maps_path_matches_streaming_on_bidirectional_model():
    lm = load_model("debug:bert")
    ids = [lm.tokenizer(t)["input_ids"] for t in TEXTS]
    a = LongContextStats(js_rows=2, causal=False)
    maps_update(lm, ids, a, batch_size=3)
    b = LongContextStats(js_rows=2, causal=False)
    stream_stats(lm, ids, b, chunk=4, batch_size=2)
    assert_close(b.means(), a.means(), stats_bound(ids))  # float32 rows of the maps and of the tiles
    assert np.allclose(a.means()["dist_mass"].sum(-1), 1.0, atol=stats_bound(ids), rtol=0)  # a row's weights


def test_streaming_never_runs_eager_attention(monkeypatch):
    # nor sdpa: one pass, the layers' outputs come from the engine's tiles
    import transformers.integrations.sdpa_attention as sdpa

    import attnscope.models.forward as fw

    def boom(module, *args, **kwargs):
        raise AssertionError("the model's own attention was used")

    lm = load_model("debug:llama")  # (loading reads what the model is with one short eager pass)
    monkeypatch.setattr(fw, "family_eager", boom)
    monkeypatch.setattr(sdpa, "sdpa_attention_forward", boom)
    st = LongContextStats(js_rows=1)
    stream_stats(lm, [lm.tokenizer(TEXTS[0])["input_ids"]], st, chunk=8)
    assert st.rows == len(lm.tokenizer(TEXTS[0])["input_ids"]) - 1


@pytest.mark.parametrize("c,K,q0", [(1, 5, 4), (3, 7, 4), (4, 9, 0), (5, 5, 0),
                                    (4, 20, 3), (16, 64, 10), (2, 4, 1)])
def test_diagonal_sums_match_brute_force(c, K, q0):
    # K >= 2c (c > 1) takes the path that sums a shifted view of p (no copy) and the two end
    # bands; the rest copy every row into a shifted buffer; both against the definition, on a
    # tile that is a non-contiguous slice (as the maps path hands it over)
    from attnscope.analyses.longctx import diagonal_sums

    p = torch.rand(2, c + 1, K + 3)[:, 1:, :K]
    d, sums = diagonal_sums(p, q0)
    want = {}
    for r in range(c):
        for j in range(K):
            want[q0 + r - j] = want.get(q0 + r - j, 0.0) + p[:, r, j]
    assert sorted(d.tolist()) == sorted(want)
    for x, dd in enumerate(d.tolist()):
        assert torch.allclose(sums[:, x], want[dd])


def test_auto_tile():
    from attnscope.engines.tiled import TILE_BYTES, auto_tile

    # SmolLM2: 3 query heads on each of 3 key heads; a key head's rows take 4 * 3 * n bytes
    assert TILE_BYTES == 7 << 20
    assert auto_tile(3, 3, 2048) == (64, 3)  # 64 rows of all three: 4.7 MB
    assert auto_tile(3, 3, 4096) == (64, 2)  # 64 rows of two key heads: 6.3 MB
    assert auto_tile(3, 3, 8192) == (64, 1)  # 64 rows of one: 6.3 MB
    assert auto_tile(3, 3, 16384) == ((7 << 20) // (4 * 3 * 16384), 1) == (37, 1)
    assert auto_tile(3, 3, 131072) == auto_tile(3, 3, 10 ** 7) == (16, 1)  # never fewer rows
    assert auto_tile(1, 12, 512) == (64, 12)  # an encoder: every head in one tile
    assert auto_tile(3, 3, 2048, rows=5) == (5, 3)  # rows given: the key heads that fit
    assert auto_tile(3, 3, 8192, rows=1000) == (1000, 1)  # at least one key head


def test_encoder_rows_see_every_key_in_norm_entropy_and_distances():
    # bidirectional: row i sees all n keys, so the normalised entropy divides by ln n and the
    # sampled rows for the head distances are whole rows (checked against the eager maps)
    lm = load_model("debug:bert")
    ids = lm.tokenizer(TEXTS[1])["input_ids"]
    n = len(ids)
    st = LongContextStats(js_rows=3, causal=False, smoothing=0.0)
    stream_stats(lm, [ids], st, chunk=4)
    out = forward(lm, pad_batch(lm, [ids]), attentions=True)
    A = np.stack([a[0].double().numpy() for a in out.attentions])  # [L H n n]
    L, H = A.shape[:2]
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(A > 0, A * np.log(A), 0.0).sum(-1)  # [L H n]
    # float32 rows against the float64 entropy of the maps' weights
    np.testing.assert_allclose(st.means()["norm_entropy"], ent[:, :, 1:].mean(-1) / math.log(n),
                               atol=softmax_bound(n), rtol=0)
    def kl(x, m):  # sum x ln(x / m), 0 ln 0 = 0
        return float(np.where(x > 0, x * np.log(np.where(x > 0, x, 1) / np.where(m > 0, m, 1)), 0).sum())

    js = np.zeros((L * H, L * H))
    rows = sample_rows(ids, 3, 0)
    for r in rows:
        P = A[:, :, r, :].reshape(L * H, n)
        for a in range(L * H):
            for b in range(L * H):
                m = (P[a] + P[b]) / 2
                js[a, b] += 0.5 * kl(P[a], m) + 0.5 * kl(P[b], m)
    np.testing.assert_allclose(st.means()["js"], js / len(rows), atol=softmax_bound(n), rtol=0)  # as above


# -- word level -------------------------------------------------------------------------------
def _units(lm, text):
    from attnscope.extract.encode import token_units

    enc = lm.tokenizer(text)
    words = np.array([-1 if w is None else w for w in enc.word_ids()])
    return enc["input_ids"], token_units(words, words < 0)


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_word_level_streaming_equals_word_level_maps(name, monkeypatch):
    from attnscope.extract.wordlevel import to_word_level

    lm = load_model(f"debug:{name}")
    causal = lm.facts.causal
    pairs = [_units(lm, t) for t in TEXTS + ["the cats sat on the mats , dogs ran ."]]
    ids, units = [p[0] for p in pairs], [p[1] for p in pairs]
    assert any(len(u) > u[-1] + 1 for u in units)  # some words are split into pieces
    ref = LongContextStats(js_rows=3, causal=causal)
    maps_update(lm, ids, ref, units=units, batch_size=2)
    for chunk, bs, tile_bytes in ((1, 1, None), (3, 2, 1), (1000, 3, None)):
        if tile_bytes:  # one key head per tile, and the torch path where the kernel is built
            monkeypatch.setattr(tiled, "TILE_BYTES", tile_bytes)
            monkeypatch.setattr(native, "kernel", lambda: None)
        got = LongContextStats(js_rows=3, causal=causal)
        stream_stats(lm, ids, got, chunk=chunk, batch_size=bs, units=units)
        monkeypatch.undo()
        assert got.rows == sum(int(u[-1]) for u in units)  # unit rows 1 .. U-1
        assert_close(got.means(), ref.means(), stats_bound(ids))  # a unit row sums float32 token rows
    # independently: the word-level sink mass straight from eager maps converted by to_word_level
    sink, rows = np.zeros((lm.num_layers, lm.num_heads)), 0
    for i, u in zip(ids, units):
        out = forward(lm, pad_batch(lm, [i]), attentions=True)
        A = np.stack([a[0].double().numpy() for a in out.attentions])
        W = to_word_level(A, u)  # [L H U U]
        sink += W[:, :, 1:, 0].sum(-1)
        rows += W.shape[2] - 1
    # a unit's weight sums float32 token weights of a row: against the float64 sums of the maps
    np.testing.assert_allclose(got.means()["sink"], sink / rows, atol=stats_bound(ids), rtol=0)
    np.testing.assert_allclose(got.means()["dist_mass"].sum(-1), 1.0, atol=stats_bound(ids), rtol=0)


def test_unit_sequence_marks_special_and_punctuation_units():
    from attnscope.engines.streaming import unit_sequence

    lm = load_model("debug:llama")
    ids, units = _units(lm, "the cat , sat .")
    seq = unit_sequence(lm, ids, units, LongContextStats(js_rows=2), None, {})
    assert seq.n == int(units[-1]) + 1 and seq.token_n == len(ids)
    assert seq.special.tolist()[0] == 1.0 and sum(seq.special.tolist()) == 1.0  # <s> alone
    words = ["<s>", "the", "cat", ",", "sat", "."]
    assert seq.n == len(words)
    assert seq.punct.tolist() == [float(w in ",.") for w in words]
    with pytest.raises(ValueError, match="units"):
        unit_sequence(lm, ids, np.arange(len(ids))[::-1], LongContextStats(), None, {})


# -- one pass: the engine's own attention output ---------------------------------------------------
def _tiny(kind):
    """Tiny random decoders with grouped-query attention (4 query heads, 2 key/value heads):
    Llama; Qwen2 with a 4-token sliding window in every layer; Gemma 2 with its attention
    logits soft-capped at 1.0 (small enough that the cap changes the softmax)."""
    import transformers

    from attnscope.models.families import family_for
    from attnscope.models.forward import install
    from attnscope.models.loading import LoadedModel

    tok = load_model("debug:llama").tokenizer
    common = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                  pad_token_id=tok.pad_token_id, initializer_range=0.3)
    if kind == "llama":
        model = transformers.LlamaModel(transformers.LlamaConfig(**common))
    elif kind == "qwen2":
        model = transformers.Qwen2Model(transformers.Qwen2Config(
            **common, use_sliding_window=True, sliding_window=4, max_window_layers=0))
    else:
        model = transformers.Gemma2Model(transformers.Gemma2Config(
            **common, attn_logit_softcapping=1.0, query_pre_attn_scalar=8))
    model.config._attn_implementation = "eager"
    model.eval()
    assert install(model)
    return LoadedModel(model=model, tokenizer=tok, family=family_for("llama"), name=f"tiny-{kind}",
                       source="test", weights_hash="-")


def engine_against_own_attention(kind: str, backend: str = "auto"):
    """The streaming engine's one pass (``backend``) over a padded batch of the tiny ``kind``
    decoder, each layer's output set against the model's own attention on the very same q, k, v
    (sdpa's; for Gemma 2's soft-capping the family's eager attention):
    ``(lm, inputs, lean, (worst difference, its bound) per layer, the last hidden states)``.

    The bound: an output row is the weighted mean ``sum_j p_j v_j`` over n keys, so two float32
    computations of it differ by the weights' rounding (conftest.softmax_bound) times the largest
    ``|v|``, plus the sum's own (sum_bound, inside the same eps n)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from attnscope.engines.plan import Plan
    from attnscope.engines.streaming import attend_hook, make_sequences
    from attnscope.models.forward import family_eager

    torch.manual_seed(0)
    lm = _tiny(kind)
    ids = [lm.tokenizer(t)["input_ids"] for t in TEXTS]
    inputs = pad_batch(lm, ids)
    lean = kind != "gemma2"  # eager attention needs the additive float mask
    st = LongContextStats(js_rows=2)
    seqs = make_sequences(lm, ids, st)
    for seq in seqs:
        st.begin(lm.num_layers, lm.num_heads, seq)
    engine = attend_hook(st, seqs, Plan.of(backend), chunk=3)
    worst = []

    def both(site, query):
        got = engine(site, query)  # [B T Hq d]
        if lean:
            own = sdpa_attention_forward(site.module, site.query, site.key, site.value, site.mask,
                                         scaling=site.scaling)[0]
        else:
            own = family_eager(site.module)(site.module, site.query, site.key, site.value, site.mask,
                                             scaling=site.scaling,
                                             softcap=lm.model.config.attn_logit_softcapping)[0]
        diff = max(float((got[b, :n] - own[b, :n]).abs().max()) for b, n in enumerate(inputs.lengths))
        worst.append((diff, softmax_bound(site.key.shape[-2]) * float(site.value.abs().max())))
        return got

    one = forward(lm, inputs, hooks={"attend": both}, lean_mask=lean).output.last_hidden_state
    return lm, inputs, lean, worst, one


@pytest.mark.parametrize("kernel", ["flash", "tiles"])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma2"])
def test_one_pass_output_equals_the_models_own_attention(kind, kernel, monkeypatch):
    # The engine's P V replaces the layer's attention output. On the very same q, k, v (inside
    # one pass) it must equal the model's own attention: sdpa, or for Gemma 2, whose
    # soft-capping sdpa cannot do, the family's eager code; a padded batch, grouped-query
    # attention. Measured max |difference| over real rows (float32, values up to ~5), for the
    # one-call CPU kernel / the tiles of whole rows: per layer llama 1.9e-6 / 2.6e-6, qwen2
    # 1.2e-6 / 1.2e-6, gemma2 1.2e-6 / 7.2e-7; the last hidden states of a whole one-pass run
    # against a whole run of the model's own attention (rounding carried through the layers of
    # this 0.3-initialised model): llama 3.7e-6 / 6.8e-6, qwen2 2.0e-6 / 2.4e-6, gemma2 1.3e-6 /
    # 1.1e-6. (The 2 query heads of a key head are one product of stacked rows.)
    if kernel == "tiles":  # tiles of whole rows (else, on the CPU, one call per layer)
        monkeypatch.setattr(native, "flash_kernel", lambda: None)
    lm, inputs, lean, worst, one = engine_against_own_attention(kind)
    assert len(worst) == lm.num_layers and all(d <= bound for d, bound in worst), worst
    own = forward(lm, inputs, lean_mask=lean, attentions=not lean).output.last_hidden_state
    whole = max(float((one[b, :n] - own[b, :n]).abs().max()) for b, n in enumerate(inputs.lengths))
    # each layer adds its output's rounding (its bound above) to the hidden states, which this
    # model carries about unchanged to the last (measured: 1 to 3 times the largest layer's
    # difference); the sum stays below the 1e-3 that a missing window or cap moves them
    assert whole <= sum(bound for _, bound in worst) < 1e-3, (whole, worst)
    # the window / the cap matter here: without them the output is different
    if kind == "qwen2":
        lm.model.config.sliding_window = 10 ** 6
    if kind == "gemma2":
        for layer in lm.model.layers:
            layer.self_attn.attn_logit_softcapping = None
    if kind != "llama":
        changed = forward(lm, inputs, lean_mask=lean, attentions=not lean).output.last_hidden_state
        assert float((changed[0, :inputs.lengths[0]] - own[0, :inputs.lengths[0]]).abs().max()) > 1e-3


@pytest.mark.parametrize("name", ["llama", "qwen2", "gemma"])
def test_bfloat16_attention_is_float32(name):
    # bfloat16 autocast against float32 on the same documents. The attention modules run in
    # float32 (float32_attention) and the tiles (scores, log-sum-exp, entropy, P V) are float32,
    # so layer 0, whose input is the same float32 embedding in both, gives the float32
    # statistics exactly (measured difference 0.0; with bfloat16 projections it was up to 8e-4,
    # 1.2e-3 and 2.6e-3 nats of entropy for llama, qwen2 and gemma). Layer 1 reads hidden states
    # that the bfloat16 MLP has rounded: measured largest per-head entropy difference 0.0015,
    # 0.0012, 0.0017 (0.0017, 0.0040, 0.0026 with bfloat16 projections).
    lm = load_model(f"debug:{name}")
    seqs, _ = _docs(lm)
    means = {}
    for bf16 in (False, True):
        st = LongContextStats(js_rows=2)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            stream_stats(lm, seqs, st, chunk=4, attention_dtype="float32")
        means[bf16] = st.means()
    assert not any("forward" in vars(m) for m in lm.model.modules())  # the projections are restored
    for key in ("entropy", "max", "sink", "previous"):
        # layer 0: the same float32 rows, maybe by other kernels under autocast
        np.testing.assert_allclose(means[True][key][0], means[False][key][0], rtol=0, atol=stats_bound(seqs))
    diff = np.abs(means[True]["entropy"] - means[False]["entropy"])
    assert 0 < diff.max() < 2.5e-3, diff.max()


# -- architectures the family table did not know (issue 56): read from the model itself -------
@pytest.mark.parametrize("model_type, kind, mechanisms", [
    ("qwen3", "causal", ()),  # loaded as an encoder before: every query saw the tokens after it
    ("gpt_oss", "causal", ("sinks", "window")),  # learned sinks, dropped from every backend before
    # sinks that scale only the output, its maps the plain softmax: tiles and flex were off by 0.91
    ("granite_swa", "causal", ("sink-scale", "window", "scale")),
    ("deepseek_v3", "causal", ("value-size",)),  # MLA: value heads smaller than query/key heads
    ("gemma2", "causal", ("softcap", "window", "scale")),
    # a hybrid: attention in its layer 1 only (layer 0 is Mamba); its cache refused use_cache before
    ("granitemoehybrid", "causal", ("scale", "hybrid")),
])
def test_streaming_equals_maps_on_architectures_read_from_the_model(model_type, kind, mechanisms):
    from attnscope.engines import backends
    from attnscope.errors import AttnscopeError

    lm = load_model(f"debug:{model_type}")
    assert lm.facts.kind == kind and lm.facts.mechanisms == mechanisms
    seqs, targets = _docs(lm)
    n = max(len(s) for s in seqs)
    # float32 rounding of a softmax row of n terms and of its log terms (entropy: ln n)
    bound = np.finfo(np.float32).eps * n * (1 + math.log(n))
    ref = LongContextStats(js_rows=2)
    maps_update(lm, seqs, ref, targets=targets)
    needs = backends.needs(lm.facts)
    for b in backends.BACKENDS:
        if b.name == "maps" or not b.usable("cpu"):
            continue
        st = LongContextStats(js_rows=2)
        if b.lacks(needs):  # an explicit choice is refused in one line naming what is missing
            with pytest.raises(AttnscopeError, match=f"backend {b.name}: does not compute this model's"):
                stream_stats(lm, seqs, st, targets=targets, backend=b.name)
            continue
        stream_stats(lm, seqs, st, targets=targets, backend=b.name)
        assert_close(st.means(), ref.means(), tol=bound)
    auto = LongContextStats(js_rows=2)
    stream_stats(lm, seqs, auto, targets=targets)  # auto never picks a backend that lacks one
    assert_close(auto.means(), ref.means(), tol=bound)
