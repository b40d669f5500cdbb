"""The press (:mod:`attnscope.engines.press`) on both of its paths, torch and fused: its recorded
statistics against the eager maps, its compressed caches against StreamingLLM built independently
and transformers' own greedy decoding, its teacher-forced scores against generation. Its tasks and eager maps (``_task``, ``_eager``)
serve the atlas's tests too."""

from __future__ import annotations

import numpy as np
import pytest
import torch._dynamo
from conftest import softmax_bound

from attnscope.analyses import atlas as A
from attnscope.data import tasks as T
from attnscope.engines import press as P
from attnscope.extract import tasks as X


def _task(lm, n_words: int = 40, *, answer: str = "4711") -> X.Encoded:
    words = " ".join(f"w{i}" for i in range(n_words))
    ctx = f"{words} The code is {answer}. {words}"
    at = ctx.index(answer)
    return X.encode_task(lm.tokenizer, T.Task("file", ctx, "\n\nThe code is", (answer,), ((at, at + len(answer)),)))


def _eager(lm, ids):
    """Every layer's eager attention ``[H n n]`` (the model's own maps), float64."""
    from attnscope.models.forward import forward, pad_batch

    out = forward(lm, pad_batch(lm, [ids]), attentions=True)
    return [a[0].double().numpy() for a in out.attentions]


@pytest.mark.parametrize("fused", [False, True], ids=["torch", "fused"])
def test_recorded_scores_equal_the_eager_maps(causal_decoder, fused):
    lm, model = causal_decoder
    enc = _task(lm, 60)
    sink, w = 2, 8
    rec = P.Recorder(lm.num_layers, lm.num_heads)
    ctx = P.prefill(lm, model, enc, rec, sink=sink, window=w, fused=fused)
    gen = P.answer(lm, model, ctx, enc, None, sink=sink, window=w, recorder=rec, fused=fused)[0]
    n, q = len(enc.context), len(enc.question)
    maps = _eager(lm, enc.context + enc.question + gen)  # the whole sequence, the model's own attention
    rows = np.arange(sink + w, n)
    assert rec.rows == len(rows)
    # masses of float32 softmax rows (the press's, from its cache) against float64 sums of the maps'
    bound = softmax_bound(n + q + len(gen))
    for layer, p in enumerate(maps):
        cols = np.arange(n + q + len(gen))
        local = (cols[None] < sink) | ((cols[None] > rows[:, None] - w) & (cols[None] <= rows[:, None]))
        share = (p[:, rows] * local).sum((-1, -2)) / len(rows)
        np.testing.assert_allclose(rec.streaming[layer] / rec.rows, share, atol=bound, rtol=0)
        np.testing.assert_allclose(rec.sink_mass[layer] / rec.rows, p[:, rows, 0].mean(-1), atol=bound, rtol=0)
        np.testing.assert_allclose(rec.previous[layer] / rec.rows, p[:, rows, rows - 1].mean(-1), atol=bound, rtol=0)
        qrows = np.arange(n, n + q)  # SnapKV's observation window: the question's rows
        middle = p[:, qrows][:, :, sink:n - w].sum(-1).mean(-1)
        np.testing.assert_allclose(rec.snapkv[layer], middle, atol=bound, rtol=0)
        for i in range(len(gen)):  # the row that produced generated token i
            assert rec.top[i][layer].tolist() == p[:, n + q - 1 + i].argmax(-1).tolist()


@pytest.mark.parametrize("fused", [False, True], ids=["torch", "fused"])
def test_f1_equals_the_full_cache_token_for_token(causal_decoder, fused):
    from attnscope.models.generation import greedy_continue

    lm, model = causal_decoder
    for words in (20, 50):
        enc = _task(lm, words)
        own = greedy_continue(model, enc.context + enc.question, enc.max_new)  # eager, no hooks
        ctx = P.prefill(lm, model, enc, fused=fused)
        full = np.ones((2, lm.num_layers, lm.num_kv_heads), bool)
        eos = A.eos_ids(model)
        assert P.answer(lm, model, ctx, enc, None, sink=2, window=4, eos=eos, fused=fused)[0] == own
        assert P.answer(lm, model, ctx, enc, full, sink=2, window=4, eos=eos, fused=fused) == [own, own]


def _streaming_llm(model, enc, sink, window, steps):
    """StreamingLLM built independently: the full context's cache with every layer's entries cut
    to the first ``sink`` and last ``window`` positions, then the question and greedy steps with
    positions continuing the full context's."""
    import torch
    from transformers import DynamicCache

    n = len(enc.context)
    keep = torch.tensor(list(range(sink)) + list(range(n - window, n)))
    with torch.no_grad():
        full = model(input_ids=torch.tensor([enc.context]), use_cache=True).past_key_values
        cache = DynamicCache()
        for layer, lay in enumerate(full.layers):
            cache.update(lay.keys[:, :, keep], lay.values[:, :, keep], layer)
        ids, at, out = enc.question, n, []
        for _ in range(steps):
            pos = torch.arange(at, at + len(ids))[None]
            logits = model(input_ids=torch.tensor([ids]), past_key_values=cache, position_ids=pos,
                           use_cache=True).logits[0, -1]
            at += len(ids)
            ids = [int(logits.argmax())]
            out.append(ids[0])
    return out


@pytest.mark.parametrize("fused", [False, True], ids=["torch", "fused"])
def test_f0_equals_streaming_llm_built_independently(causal_decoder, fused):
    lm, model = causal_decoder
    enc = _task(lm, 50)
    ctx = P.prefill(lm, model, enc, sink=3, window=7, fused=fused)
    none_kept = np.zeros((1, lm.num_layers, lm.num_kv_heads), bool)
    got = P.answer(lm, model, ctx, enc, none_kept, sink=3, window=7, fused=fused)[0]
    assert got == _streaming_llm(model, enc, 3, 7, enc.max_new)


def test_f0_is_not_the_full_cache_on_this_context(causal_llama):
    """The test above can tell the two caches apart: on tiny Llama they answer differently."""
    lm, model = causal_llama
    enc = _task(lm, 50)
    ctx = P.prefill(lm, model, enc, sink=3, window=7)
    none_kept = np.zeros((1, lm.num_layers, lm.num_kv_heads), bool)
    assert (P.answer(lm, model, ctx, enc, none_kept, sink=3, window=7)[0]
            != P.answer(lm, model, ctx, enc, None, sink=3, window=7)[0])


@pytest.mark.parametrize("fused", [False, True], ids=["torch", "fused"])
def test_a_kept_head_changes_only_its_own_rows_in_a_batch(causal_llama, fused):
    lm, model = causal_llama
    enc = _task(lm, 40)
    ctx = P.prefill(lm, model, enc)
    K = lm.num_kv_heads
    rows = np.zeros((3, lm.num_layers, K), bool)
    rows[1] = True
    rows[2, 0, 0] = True
    outs = P.answer(lm, model, ctx, enc, rows, sink=2, window=4, fused=fused)
    alone = [P.answer(lm, model, ctx, enc, rows[i:i + 1], sink=2, window=4, fused=fused)[0] for i in range(3)]
    assert outs == alone


@pytest.mark.parametrize("fused", [False, True], ids=["torch", "fused"])
def test_teacher_forced_scores_agree_with_greedy_generation(causal_llama, fused):
    """Gold = what greedy decoding generated in each row: every row is then exact, and its mean
    log-probability is that of those tokens under the same row's cache."""
    import torch

    lm, model = causal_llama
    enc = _task(lm, 40)
    ctx = P.prefill(lm, model, enc)
    rows = np.zeros((3, lm.num_layers, lm.num_kv_heads), bool)
    rows[1] = True
    rows[2, 0, 1] = True
    outs = P.answer(lm, model, ctx, enc, rows, sink=2, window=4, fused=fused)
    for b, gold in enumerate(outs):
        exact, logp = P.score(lm, model, ctx, enc, rows, gold, sink=2, window=4, fused=fused)
        assert exact[b]
        ids = torch.tensor([enc.context + enc.question + gold[:-1]])
        with torch.no_grad():  # the whole cache's row: transformers' own forward over everything
            full = torch.log_softmax(model(input_ids=ids).logits[0, -len(gold):].double(), -1)
        if b == 1:
            assert logp[b] == pytest.approx(float(full[np.arange(len(gold)), gold].mean()), abs=1e-4)


def test_the_fused_press_scores_mixed_rows_as_the_torch_press(causal_decoder):
    """Rows keeping different KV heads whole (a per-row, per-head mask in one FlexAttention call),
    Gemma's soft-capping and GPT-2 included: the same arg-max and log-probabilities."""
    lm, model = causal_decoder
    enc = _task(lm, 50)
    ctx = P.prefill(lm, model, enc, sink=2, window=4)
    rows = np.random.default_rng(0).random((4, lm.num_layers, lm.num_kv_heads)) < 0.5
    gold = P.answer(lm, model, ctx, enc, None, sink=2, window=4)[0]
    want, got = (P.score(lm, model, ctx, enc, rows, gold, sink=2, window=4, fused=f) for f in (False, True))
    assert got[0].tolist() == want[0].tolist()
    np.testing.assert_allclose(got[1], want[1], atol=1e-5)
    assert np.ptp(want[1]) > 1e-3  # the rows differ: the masks matter


# dynamo's own patch, undone as it was made (a monkeypatch of its config module deletes the key)
@pytest.mark.heavy
@torch._dynamo.config.patch(fail_on_recompile_limit_hit=True)
def test_the_fused_press_traces_and_stays_within_dynamos_recompile_limit(causal_llama, monkeypatch):
    """On CUDA the press's FlexAttention calls are torch.compile'd; past dynamo's limit of
    recompilations of one function it would silently run the eager version, which holds every
    call's scores. Here they go through dynamo on the CPU (its "eager" backend: traced and guarded
    as on a GPU): two context lengths, row batches of 1 and 3, greedy steps (one row each) and
    teacher-forced rows; a recompilation past the limit fails, and the answers are the torch
    path's."""
    from functools import cache

    import torch
    from torch._dynamo.utils import counters

    from attnscope.engines import flex

    traced = cache(lambda kind: torch.compile(flex.KINDS[kind], backend="eager", dynamic=True))
    monkeypatch.setattr(flex, "function", lambda device, kind="main": traced(kind))
    torch._dynamo.reset()
    counters.clear()
    lm, model = causal_llama
    graphs = []
    for words, rows in ((30, 1), (45, 3), (60, 2)):
        enc = _task(lm, words)
        keep = np.random.default_rng(words).random((rows, lm.num_layers, lm.num_kv_heads)) < 0.5
        ctx = P.prefill(lm, model, enc, P.Recorder(lm.num_layers, lm.num_heads), sink=2, window=4, fused=True)
        fused = P.answer(lm, model, ctx, enc, keep, sink=2, window=4, fused=True)
        assert fused == P.answer(lm, model, ctx, enc, keep, sink=2, window=4, fused=False)
        P.score(lm, model, ctx, enc, keep, fused[0], sink=2, window=4, fused=True)
        graphs.append(counters["stats"]["unique_graphs"])
    # measured: 10 graphs once the second length made the shapes dynamic, and none after it
    assert graphs[1] == graphs[2] <= 12, graphs
    torch._dynamo.reset()
