"""DuoAttention's trained gates: the training data, the mixed attention against an independent
one, the first optimiser step by hand, resuming, the pattern file both ways, and the family."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import one_line, says, softmax_bound

from attnscope.analyses import duo as D
from attnscope.data import tasks as T
from attnscope.engines.duo import GateMix
from attnscope.errors import InputError
from attnscope.models.forward import hooked


def test_training_sequences_fit_their_length_and_ask_for_every_passkey(debug_llama):
    tok = debug_llama.tokenizer
    hay = [f"Sentence number {i} is here." for i in range(100)]
    a = T.passkey_training(tok, count=3, length=480, passkeys=3, words=2, haystack=hay, seed=1)
    assert a == T.passkey_training(tok, count=3, length=480, passkeys=3, words=2, haystack=hay, seed=1)
    assert a != T.passkey_training(tok, count=3, length=480, passkeys=3, words=2, haystack=hay, seed=2)
    for s in a:
        assert len(s.ids) == 480
        context, qa = tok.decode(s.ids[:s.labels_from]), tok.decode(s.ids[s.labels_from:])
        keys = [line.split("Passkey: ")[1].rstrip(".") for line in qa.strip().splitlines()]
        assert len(keys) == 3 and all(len(k.split()) == 2 and set(k.split()) <= set(T.WORDS) for k in keys)
        for ordinal, key in zip(T.ORDINALS, keys):  # each passkey is in the context, in order
            assert f"the {ordinal} passkey to the vault: {key}." in context
    with pytest.raises(ValueError, match="do not fit"):
        T.passkey_training(tok, count=1, length=40, passkeys=3, words=4, haystack=hay, seed=1)


def _manual(lm, ids, gates, sink, window):
    """Every layer's attention computed here with explicit masks: the gate's mix of softmax
    over all earlier keys and over the first ``sink`` and last ``window`` ones."""
    import torch

    def attend(site, q):
        k = site.key.repeat_interleave(q.shape[1] // site.key.shape[1], 1)
        v = site.value.repeat_interleave(q.shape[1] // site.value.shape[1], 1)
        s = q.double() @ k.double().transpose(-1, -2) * site.scaling
        T_ = q.shape[2]
        i, j = np.arange(T_)[:, None], np.arange(T_)[None, :]
        outs = []
        for allowed in (j <= i, (j <= i) & ((j < sink) | (j > i - window))):
            p = torch.softmax(s.masked_fill(~torch.as_tensor(allowed), float("-inf")), -1)
            outs.append(p @ v.double())
        a = torch.as_tensor(np.repeat(gates[site.layer], q.shape[1] // site.key.shape[1]))[None, :, None, None]
        return (a * outs[0] + (1 - a) * outs[1]).to(q.dtype).transpose(1, 2)

    with torch.no_grad(), hooked(lm, {"attend": attend}):
        return lm.model(input_ids=torch.tensor([ids])).last_hidden_state[0].double().numpy()


def test_the_mixed_attention_equals_one_computed_independently(debug_llama):
    import torch

    lm = debug_llama
    ids = list(range(5, 45))
    rng = np.random.default_rng(0)
    gates = rng.uniform(size=(lm.num_layers, lm.num_kv_heads))
    with torch.no_grad(), hooked(lm, {"attend": GateMix(torch.tensor(gates, dtype=torch.float32), 2, 5)}):
        ours = lm.model(input_ids=torch.tensor([ids])).last_hidden_state[0].double().numpy()
    # a float64 attention against float32 rows of n keys in every layer: each layer's output, a
    # weighted mean of the values, off by softmax_bound times their size, adds to the hidden states
    bound = lm.num_layers * softmax_bound(len(ids)) * float(np.abs(ours).max())
    np.testing.assert_allclose(ours, _manual(lm, ids, gates, 2, 5), atol=bound, rtol=0)
    with torch.no_grad():  # every gate at 1 is the model itself
        plain = lm.model(input_ids=torch.tensor([ids])).last_hidden_state[0].double().numpy()
    ones = np.ones_like(gates)
    np.testing.assert_allclose(_manual(lm, ids, ones, 2, 5), plain, atol=bound, rtol=0)
    assert np.abs(_manual(lm, ids, 0 * ones, 2, 5) - plain).max() > 1e-3  # and streaming is not


def _samples(lm, count=4):
    return T.passkey_training(lm.tokenizer, count=count, length=400, passkeys=2, words=3,
                              haystack=[f"Line {i} of the hay." for i in range(60)], seed=0)


def test_the_first_step_moves_every_gate_by_the_learning_rate(debug_llama):
    """At every gate 1 the mixed model is the full one, so the distillation loss and its gradient
    are 0 and the L1 term alone moves the gates: AdamW's first step is lr x sign(grad)."""
    train = D.GateTraining(_samples(debug_llama), steps=10, sink=2, window=8, lr=0.1, reg=0.05)
    rec = train(debug_llama, (0, 1), None)
    assert rec["losses"][0]["distill"] < 1e-10
    expected = 1 - D.learning_rate(0, 10, 0.1)
    np.testing.assert_allclose(rec["gates"], np.full((debug_llama.num_layers, debug_llama.num_kv_heads), expected),
                               atol=1e-6)


def test_training_in_chunks_equals_training_at_once(debug_llama):
    train = D.GateTraining(_samples(debug_llama), steps=4, sink=2, window=8, lr=0.2, reg=0.5)
    whole = train(debug_llama, (0, 4), None)
    first = train(debug_llama, (0, 2), None)
    again = train(debug_llama, (2, 4), json.loads(json.dumps(first)))  # as read back from the log
    np.testing.assert_allclose(again["gates"], whole["gates"], atol=1e-6)
    assert [r["step"] for r in first["losses"] + again["losses"]] == [1, 2, 3, 4]
    assert np.ptp(np.asarray(whole["gates"])) > 0  # the heads were told apart


def test_pattern_files_are_read_back_and_broken_ones_named_by_line(tmp_path):
    from attnscope.report.duo import write_pattern

    g = np.array([[0.25, 1.0], [0.0, 0.5], [0.75, 0.125]])
    write_pattern(tmp_path / "p", g, sink=4, window=64, extra={})
    np.testing.assert_array_equal(D.read_pattern(tmp_path / "p", (3, 2)), g)
    np.testing.assert_array_equal(D.read_pattern(tmp_path / "p" / "full_attention_heads.tsv", (3, 2)), g)
    assert json.loads((tmp_path / "p" / "config.json").read_text()) == {"sink_size": 4, "recent_size": 64}
    bad = tmp_path / "bad.tsv"
    # the file and line, what it holds, and what the model has
    for text, shape, facts in [("1\t0\n0.5\n1\t1\n", (3, 2), (f"{bad}:2: ", "1 values", "2 key/value heads")),
                               ("1\t0\nx\t1\n", (2, 2), (f"{bad}:2: ", "tab-separated numbers")),
                               ("1\t0\n", (2, 2), (f"{bad}: ", "1 lines", "2 layers"))]:
        bad.write_text(text)
        with pytest.raises(InputError) as e:
            D.read_pattern(bad, shape)
        says(one_line(e.value), *facts)


@pytest.fixture(scope="module")
def duo_run(debug_llama, tmp_path_factory):
    from attnscope.pipeline import run_family

    out = tmp_path_factory.mktemp("duo")
    hay = out / "hay.txt"
    hay.write_text("".join(f"Line {i} of the hay.\n" for i in range(60)))
    run_family("duo", {"duo": hay}, out / "run", model=debug_llama, max_seq_len=400, duo_steps=4,
               duo_passkeys=2, duo_words=3, duo_chunk=2, duo_lr=0.2)
    return out


def test_the_family_writes_duo_attentions_pattern_and_the_atlas_sweeps_it(duo_run, debug_llama):
    from attnscope.pipeline import run_family

    run = duo_run / "run"
    d = json.loads((run / "results" / "duo.json").read_text())
    gates = D.read_pattern(run / "duo", (debug_llama.num_layers, debug_llama.num_kv_heads))
    np.testing.assert_allclose(gates, np.asarray(d["arrays"]["gates"]["data"]), atol=1e-6)
    assert [r["step"] for r in d["tables"]["training"]] == [1, 2, 3, 4]
    assert sorted(r["rank"] for r in d["tables"]["gates"]) == list(range(1, gates.size + 1))
    # held: each gate's mean over the chunks' ends (2 chunks of 2 steps), at most 1, at least the final gate's share
    held = np.asarray(d["arrays"]["held"]["data"])
    assert held.shape == gates.shape and (held <= 1).all() and (held >= gates / 2 - 1e-9).all()
    assert (run / "figures" / "duo_gates.png").is_file() and not (run / "run").exists()
    run_family("atlas", {"atlas": duo_run / "hay.txt"}, duo_run / "atlas", model=debug_llama, max_seq_len=96,
               atlas_tasks=3, atlas_calibration=2, atlas_random=1, atlas_bootstrap=100, atlas_fractions="0,0.5,1",
               atlas_scores="streaming", atlas_gates=str(run / "duo"))
    a = json.loads((duo_run / "atlas" / "results" / "atlas.json").read_text())
    held = D.read_pattern(run / "duo" / "held.tsv", gates.shape)
    by_hand = sorted(range(gates.size), key=lambda i: (-gates.ravel()[i], -held.ravel()[i], i))
    assert a["meta"]["rankings"]["duo_gates"] == by_hand
    assert {r["ranking"]: r["kind"] for r in a["tables"]["areas"]}["duo_gates"] == "trained"


def test_a_killed_training_resumes_to_the_same_gates(duo_run, debug_llama, monkeypatch):
    from attnscope.pipeline import run_family

    def kill(step, done, total):
        if step == "duo: training" and done == 1:
            raise KeyboardInterrupt

    opts = dict(model=debug_llama, max_seq_len=400, duo_steps=4, duo_passkeys=2, duo_words=3, duo_chunk=2,
                duo_lr=0.2)
    out = duo_run / "killed"
    with pytest.raises(KeyboardInterrupt):
        run_family("duo", {"duo": duo_run / "hay.txt"}, out, progress=kill, **opts)
    assert len((out / "run" / "duo-training.jsonl").read_text().splitlines()) == 2  # fingerprint, chunk 1
    ran = []
    real = D.GateTraining.__call__
    monkeypatch.setattr(D.GateTraining, "__call__", lambda *a, **k: ran.append(a[2]) or real(*a, **k))
    run_family("duo", {"duo": duo_run / "hay.txt"}, out, **opts)
    assert ran == [(2, 4)]  # the second chunk only
    whole = json.loads((duo_run / "run" / "results" / "duo.json").read_text())
    again = json.loads((out / "results" / "duo.json").read_text())
    np.testing.assert_allclose(again["arrays"]["gates"]["data"], whole["arrays"]["gates"]["data"], atol=1e-6)


def test_cli_refuses_a_pattern_of_another_shape_in_one_line(duo_run, tmp_path, capsys):
    from attnscope.cli.main import main

    bad = tmp_path / "full_attention_heads.tsv"
    bad.write_text("1\t0\t1\n0\t1\t0\n")
    code = main(["analyze", "atlas", str(duo_run / "hay.txt"), "--model", "debug:llama", "--max-seq-len", "96",
                 "--atlas-gates", str(bad), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    says(err[0], f"error: {bad}:1: ", "3 values", "2 key/value heads")  # the line, what it has, what fits
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("model, lacks", [("debug:gemma2", "softcap, window"), ("debug:bloom", "alibi")])
def test_a_model_whose_mechanism_the_mixed_attention_does_not_compute_is_refused_naming_it(
        model, lacks, tmp_path, capsys):
    # the gates mix attention the hook computes itself (sdpa with its own masks): soft-capping, a
    # model's window shorter than the sequences, ALiBi would be dropped without a word
    from attnscope.cli.main import main

    hay = tmp_path / "hay.txt"
    hay.write_text("the grass is green and the sky is blue.\n" * 4)
    code = main(["analyze", "duo", str(hay), "--model", model, "--max-seq-len", "64", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    says(err[0], "DuoAttention's gates are a decoder's", f"does not compute this model's {lacks}")
    assert not (tmp_path / "o").exists()
