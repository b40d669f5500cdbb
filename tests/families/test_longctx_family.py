"""The longctx family and its report writer, driven through prepare/run with a Context."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import says, softmax_bound, weights_tolerance

from attnscope.errors import AttnscopeError, InputError
from attnscope.families import Context, load_families
from attnscope.families.longctx import LongContext, Options
from attnscope.models import load_model

DOCS = ("the cat sat on the mat. the dog ran.\nshe said it was big.\n\n"
        "when the old man saw the red house , he ran . then there was one .\n\n"
        "a small dog.\n")


@pytest.fixture(scope="module")
def llama():
    return load_model("debug:llama")


def _run(tmp_path, lm, text=DOCS, suffix=".txt", max_seq_len=64, **opts):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"docs{suffix}"
    path.write_text(text)
    fam = LongContext()
    options = Options(**{"induction": 2, "induction_length": 10, "js_rows": 3, **opts})
    ctx = Context(model=lm, out_dir=tmp_path / "out", max_seq_len=max_seq_len, batch_size=2)
    prepared = fam.prepare({"documents": path}, options, ctx)
    return prepared, fam.run(prepared, options, ctx).section, ctx


def test_sink_is_the_pooled_mass_on_the_first_token(tmp_path, llama):
    """The family's [L, H] sink array, worked out from the model's own attention probabilities
    (transformers' ``output_attentions``) of the same documents: the mass on token 0 pooled over
    every row i >= 1 of every document."""
    import torch

    prepared, _, ctx = _run(tmp_path, llama)
    num, rows = 0.0, 0
    for doc in prepared.data["documents"]:
        with torch.no_grad():
            out = llama.model(input_ids=torch.tensor([doc.ids]), output_attentions=True)
        attn = torch.stack(out.attentions)[:, 0].double().numpy()  # [L H n n]
        num, rows = num + attn[:, :, 1:, 0].sum(-1), rows + attn.shape[2] - 1
    assert rows == 27 + 32 + 9 - 3  # three documents of 27, 32 and 9 tokens
    data = json.loads((ctx.out_dir / "results" / "longctx.json").read_text())
    # a weight of float32 softmax rows of at most 32 keys, against the float64 mean of the maps'
    np.testing.assert_allclose(np.asarray(data["arrays"]["sink"]["data"]), num / rows, atol=softmax_bound(32), rtol=0)
    assert "longctx" in {f.key for f in load_families()}


def test_run_writes_results_tables_figures(tmp_path, llama):
    prepared, sec, ctx = _run(tmp_path, llama)
    assert prepared.counts["documents"] == 3
    data = json.loads((ctx.out_dir / "results" / "longctx.json").read_text())
    assert data["meta"]["engine"] == "maps"  # tiny maps fit the default budget
    sink = np.asarray(data["arrays"]["sink"]["data"])
    assert sink.shape == (2, 4) and ((sink > 0) & (sink < 1)).all()
    names = {t.name for t in sec.tables}
    assert {"longctx_heads", "longctx_sink_heads", "longctx_clusters"} <= names
    figs = {f.name for f in sec.figures}
    assert figs == {"longctx_sink_heatmap", "longctx_distance", "longctx_position", "longctx_clusters"}
    for f in sec.figures:
        assert all(p.is_file() and p.stat().st_size > 0 for p in f.paths)
    assert any("sink" in s for s in sec.findings) and any("Engine: maps" in s for s in sec.findings)
    heads = json.loads((ctx.out_dir / "tables" / "longctx_heads.json").read_text())
    assert len(heads) == 8 and heads[0]["name"] == "1-1" and heads[0]["induction"] is not None


def test_streaming_and_maps_engines_agree(tmp_path, llama):
    _, _, c1 = _run(tmp_path / "a", llama, engine="maps")
    _, _, c2 = _run(tmp_path / "b", llama, engine="streaming", chunk=3)
    a = json.loads((c1.out_dir / "results" / "longctx.json").read_text())
    b = json.loads((c2.out_dir / "results" / "longctx.json").read_text())
    assert b["meta"]["engine"] == "streaming"
    for k in ("sink", "entropy", "dist_mass", "target_induction", "js"):
        x = np.asarray(a["arrays"][k]["data"], dtype=float)
        y = np.asarray(b["arrays"][k]["data"], dtype=float)
        np.testing.assert_allclose(x, y, atol=softmax_bound(32), rtol=0)  # float32 rows of <= 32 keys, two ways


def test_auto_picks_streaming_when_maps_do_not_fit(tmp_path, llama):
    _, sec, ctx = _run(tmp_path, llama, maps_budget_gb=1e-9)
    data = json.loads((ctx.out_dir / "results" / "longctx.json").read_text())
    assert data["meta"]["engine"] == "streaming"
    assert any("chosen" in s and "budget" in s for s in sec.findings)


def test_bfloat16_close_to_float32(tmp_path, llama):
    _, _, c1 = _run(tmp_path / "a", llama, engine="streaming")
    _, _, c2 = _run(tmp_path / "b", llama, engine="streaming", dtype="bfloat16")
    a = json.loads((c1.out_dir / "results" / "longctx.json").read_text())
    b = json.loads((c2.out_dir / "results" / "longctx.json").read_text())
    x, y = np.asarray(a["arrays"]["sink"]["data"]), np.asarray(b["arrays"]["sink"]["data"])
    assert 0 < np.abs(x - y).max() < 5e-2  # bfloat16 changes the numbers, a little


def test_json_and_join_inputs(tmp_path, llama):
    rows = [{"text": "the cat sat on the mat."}, {"text": "a dog ran."}]
    prepared, _, _ = _run(tmp_path / "j", llama, text="\n".join(json.dumps(r) for r in rows),
                          suffix=".jsonl", induction=0)
    assert prepared.counts["documents"] == 2
    prepared, _, _ = _run(tmp_path / "k", llama, join=True, max_seq_len=30, induction=0)
    docs = prepared.data["documents"]
    assert docs[0].documents >= 2 and len(docs[0].ids) == 30 and docs[0].cut


def test_bad_inputs_name_the_file(tmp_path, llama):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"words": ["a", "b"]}\n')
    fam = LongContext()
    ctx = Context(model=llama, out_dir=tmp_path / "out", max_seq_len=64)
    with pytest.raises(InputError, match="bad.jsonl.*text"):
        fam.prepare({"documents": bad}, Options(), ctx)
    with pytest.raises(AttnscopeError) as refused:
        fam.prepare({"documents": bad}, Options(chunk=-1), ctx)
    says(refused.value, "chunk", "at least 0")
    assert refused.value.params == ("chunk",)
    enc = load_model("debug:bert")
    with pytest.raises(AttnscopeError) as refused:
        fam.prepare({"documents": bad}, Options(), Context(model=enc, out_dir=tmp_path, max_seq_len=10 ** 5))
    says(refused.value, "max_seq_len 100000", "debug:bert", "512")
    assert refused.value.params == ("max_seq_len",)
    assert not (tmp_path / "out").exists()


def test_encoder_section_works(tmp_path):
    enc = load_model("debug:bert")
    prep, sec, ctx = _run(tmp_path, enc, induction=1)
    data = json.loads((ctx.out_dir / "results" / "longctx.json").read_text())
    assert data["params"]["causal"] is False
    n = max(len(d.ids) for d in prep.data["documents"])  # a row's weights add up to 1
    assert np.allclose(np.asarray(data["arrays"]["dist_mass"]["data"]).sum(-1), 1.0, atol=softmax_bound(n), rtol=0)
    assert sec.figures


def test_greedy_continuation_equals_generate(llama):
    torch = pytest.importorskip("torch")
    from attnscope.models.generation import causal_lm_for, greedy_continue

    model = causal_lm_for(llama, seed=5)
    assert model.model is llama.model  # the loaded decoder's own weights, not a copy
    ids = llama.tokenizer("when the old man saw the red house")["input_ids"]
    ours = greedy_continue(model, ids, 12)
    ref = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
    assert ours == ref and 1 <= len(ours) <= 12
    # the same seed gives the same head (a debug model has none: it is drawn from the seed)
    again = greedy_continue(causal_lm_for(llama, seed=5), ids, 12)
    assert again == ours


def test_generate_records_prompt_and_continuation(tmp_path, llama):
    prepared, sec, ctx = _run(tmp_path, llama, generate=5, induction=0, max_seq_len=20)
    docs = prepared.data["documents"]
    assert all(len(d.ids) <= 15 for d in docs) and docs[0].cut  # cut to --max-seq-len - 5
    data = json.loads((ctx.out_dir / "results" / "longctx.json").read_text())
    gen = data["meta"]["generated"]
    assert [g["document"] for g in gen] == [0, 1, 2]
    for g, d in zip(gen, docs):
        assert g["generated_from"] == len(d.ids)
        assert g["length"] == len(d.ids) + len(g["continuation_ids"]) and 1 <= len(g["continuation_ids"]) <= 5
    # the statistics were computed over prompt + continuation
    assert data["meta"]["tokens"] == sum(g["length"] for g in gen)
    assert data["meta"]["generate"] == 5
    assert any("continued greedily" in f for f in sec.findings)


def test_generate_refused_for_an_encoder(tmp_path, capsys):
    from attnscope.cli.main import main

    docs = tmp_path / "d.txt"
    docs.write_text(DOCS)
    code = main(["analyze", "longctx", str(docs), "--model", "debug:bert", "--out", str(tmp_path / "o"),
                 "--longctx-generate", "3", "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--longctx-generate 3" in err and "encoder" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "o").exists()


@pytest.mark.parametrize("flag, value", [("--longctx-js-rows", "-1"), ("--longctx-induction-length", "0"),
                                         ("--longctx-chunk", "-8")])
def test_a_count_below_its_minimum_names_the_flag_and_the_value(tmp_path, capsys, flag, value):
    from attnscope.cli.main import main

    docs = tmp_path / "d.txt"
    docs.write_text(DOCS)
    code = main(["analyze", "longctx", str(docs), "--model", "debug:llama", "--out", str(tmp_path / "o"),
                 flag, value, "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and not (tmp_path / "o").exists()
    assert flag in err and f"not {value}" in err  # the option and what was given


@pytest.mark.heavy
def test_word_level_documents(tmp_path, llama):
    p1, s1, c1 = _run(tmp_path / "a", llama, word_level=True, engine="maps")
    _, _, c2 = _run(tmp_path / "b", llama, word_level=True, engine="streaming", chunk=2)
    a = json.loads((c1.out_dir / "results" / "longctx.json").read_text())
    b = json.loads((c2.out_dir / "results" / "longctx.json").read_text())
    assert a["meta"]["level"] == b["meta"]["level"] == "word" and a["meta"]["induction_sequences"] == 0
    words = sum(len(set(d.word_ids)) for d in p1.data["documents"])  # -1 (<s>) counts as one unit
    assert a["meta"]["rows"] == words - len(p1.data["documents"])  # every unit but the first
    n = max(len(d.ids) for d in p1.data["documents"])  # a word row sums a token row of <= n keys
    for k in ("sink", "entropy", "previous", "dist_mass", "js"):
        np.testing.assert_allclose(np.asarray(b["arrays"][k]["data"], dtype=float),
                                   np.asarray(a["arrays"][k]["data"], dtype=float), atol=softmax_bound(n), rtol=0)
    assert any(f.startswith("Word level:") and "not run" in f for f in s1.findings)


def test_word_level_with_generate_is_refused(tmp_path, llama):
    with pytest.raises(AttnscopeError) as refused:
        _run(tmp_path, llama, word_level=True, generate=3)
    says(refused.value, "word_level", "generate")
    assert refused.value.params == ("word_level", "generate")
    assert not (tmp_path / "out").exists()


def _eager_document_stats(lm, ids):
    """Sink, previous, current, entropy and max weight per head, from the model's own eager
    maps (output_attentions), averaged over rows 1 .. n-1 (numpy, float64)."""
    from attnscope.models.forward import forward, pad_batch

    out = forward(lm, pad_batch(lm, [ids]), attentions=True)
    A = np.stack([a[0].double().numpy() for a in out.attentions])  # [L H n n]
    n = len(ids)
    rows = np.arange(1, n)
    P = A[:, :, 1:, :]  # rows 1 .. n-1; a causal row holds zeros past its own position
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(P > 0, P * np.log(P), 0.0).sum(-1)
    return {"sink": P[..., 0].mean(-1), "previous": A[:, :, rows, rows - 1].mean(-1),
            "current": A[:, :, rows, rows].mean(-1), "entropy": ent.mean(-1), "max": P.max(-1).mean(-1)}


@pytest.mark.heavy
def test_induction_sequences_leave_the_document_statistics_alone(tmp_path, llama):
    # issue 23 item 1: one 512-token document with and without --induction
    text = " ".join(f"the {w} sat on the mat , and {w} ran to the red house ." for w in
                    ("cat", "dog", "old man", "bird", "small dog", "girl") * 12) + "\n"
    ind = dict(induction_length=40, js_rows=3, engine="maps")
    prep, _, c0 = _run(tmp_path / "none", llama, text=text, max_seq_len=512, induction=0, **ind)
    _, sec, c2 = _run(tmp_path / "two", llama, text=text, max_seq_len=512, induction=2, **ind)
    a = json.loads((c0.out_dir / "results" / "longctx.json").read_text())
    b = json.loads((c2.out_dir / "results" / "longctx.json").read_text())
    ids = prep.data["documents"][0].ids
    assert len(ids) == 512
    for k, v in a["arrays"].items():  # every document statistic, identical
        np.testing.assert_array_equal(np.asarray(b["arrays"][k]["data"], dtype=float),
                                      np.asarray(v["data"], dtype=float), err_msg=k)
    for res in (a, b):
        assert (res["meta"]["documents"], res["meta"]["tokens"], res["meta"]["rows"]) == (1, 512, 511)
    assert (b["meta"]["target_sequences"], b["meta"]["target_tokens"]) == (2, 2 * 81)
    assert b["meta"]["target_rows"] == {"duplicate": 80, "induction": 80}
    assert set(b["arrays"]) - set(a["arrays"]) == {"target_induction", "target_duplicate"}
    eager = _eager_document_stats(llama, ids)
    for k, v in eager.items():  # float32 rows of 512 keys against float64: weights, or the entropy
        tol = dict(rtol=0, atol=softmax_bound(512)) if k == "entropy" else weights_tolerance(512)
        np.testing.assert_allclose(np.asarray(b["arrays"][k]["data"], dtype=float), v, err_msg=k, **tol)
    # the induction scores: the eager maps of the induction sequences alone
    from attnscope.engines.streaming import induction_sequences
    from attnscope.models.forward import forward, pad_batch

    seqs, targets = induction_sequences(llama, 2, 40, seed=c2.seed)
    for name in ("induction", "duplicate"):
        got, count = 0.0, 0
        for s, t in zip(seqs, targets):
            A = np.stack([x[0].double().numpy() for x in forward(llama, pad_batch(llama, [s]),
                                                                 attentions=True).attentions])
            rows = [i for i in range(1, len(s)) if t[name][i] >= 0]
            got = got + A[:, :, rows, [t[name][i] for i in rows]].sum(-1)
            count += len(rows)
        np.testing.assert_allclose(np.asarray(b["arrays"][f"target_{name}"]["data"], dtype=float),
                                   got / count, err_msg=name, **weights_tolerance(81))  # weights of rows of 81 keys
    note = next(f for f in sec.findings if f.startswith("Engine:"))
    says(note, "1 document", "512 tokens", "longest 512", "2 induction", "81 tokens")


@pytest.mark.heavy
def test_sink_metric_option(tmp_path, llama):
    _, sec, ctx = _run(tmp_path / "gu", llama, induction=0, sink_metric="gu2024")
    data = json.loads((ctx.out_dir / "results" / "longctx.json").read_text())
    rate = np.asarray(data["arrays"]["sink_rate"]["data"])
    assert data["params"]["sink_metric"] == "gu2024" and data["meta"]["sink_samples"] == 3
    assert data["meta"]["sink_heads"]["gu2024"] == pytest.approx(rate.sum())
    # the finding names the metric and its definition (first token, row 0, 30%) and the count
    says(sec.findings[0], "Gu et al. 2024", "first token", "row 0", "30%", f"{rate.sum():g} of 8", "sinks")
    sink_table = next(t for t in sec.tables if t.name == "longctx_sink_heads")
    assert "Gu et al. 2024's metric" in sink_table.caption and "sink_rate" in sink_table.columns
    assert len(sink_table.rows) == int((rate > 0.5).sum())
    _, pooled, _ = _run(tmp_path / "pooled", llama, induction=0)
    assert "pooled" in pooled.findings[0]
    says(pooled.findings[1], "Gu et al. 2024")
    enc = load_model("debug:bert")
    with pytest.raises(AttnscopeError) as refused:
        _run(tmp_path / "enc", enc, sink_metric="gu2024")
    says(refused.value, "sink_metric gu2024", "debug:bert", "encoder")
    assert refused.value.params == ("sink_metric",)
    assert not (tmp_path / "enc" / "out").exists()


def test_analyze_longctx_defaults_to_long_documents(tmp_path, capsys):
    # no --max-seq-len: the family's 4,096 tokens, cut to the model's positions (512 here)
    from attnscope.cli.main import main

    doc = tmp_path / "long.txt"
    doc.write_text(" ".join(["the cat sat on the mat , and the dog ran to the red house ."] * 60) + "\n")
    out = tmp_path / "o"
    assert main(["analyze", "longctx", str(doc), "--model", "debug:llama", "--longctx-induction", "0",
                 "--out", str(out), "-q"]) == 0
    meta = json.loads((out / "results" / "longctx.json").read_text())["meta"]
    assert meta["max_seq_len"] == 512 and meta["longest"] == 512 and meta["tokens"] == 512
    assert main(["analyze", "longctx", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    says(help_text, "Default: 4096", "positions")


def _cli(tmp_path, name, *flags):
    from attnscope.cli.main import main

    docs = tmp_path / "d.txt"
    docs.write_text(DOCS)
    out = tmp_path / name
    assert main(["analyze", "longctx", str(docs), "--model", "debug:llama", "--out", str(out), "-q",
                 "--max-seq-len", "64", "--longctx-induction", "0", "--longctx-js-rows", "2", *flags]) == 0
    return json.loads((out / "results" / "longctx.json").read_text())


@pytest.mark.heavy
def test_bfloat16_attention_reaches_the_engine_from_the_command_line(tmp_path, llama):
    # the command's arrays are those of the engine called on the same documents with the same
    # rounding (the producer), and the rounding changes them (the option is not lost on the way)
    import torch

    from attnscope.analyses.longctx import LongContextStats
    from attnscope.data.unlabeled import prepare_documents
    from attnscope.engines.streaming import stream_stats

    got = _cli(tmp_path, "rounded", "--longctx-dtype", "bfloat16", "--longctx-attention-dtype", "bfloat16")
    exact = _cli(tmp_path, "exact", "--longctx-dtype", "bfloat16", "--longctx-attention-dtype", "float32")
    auto = _cli(tmp_path, "auto", "--longctx-dtype", "bfloat16")  # the default follows the forward's dtype
    assert [r["meta"]["attention_dtype"] for r in (got, exact, auto)] == ["bfloat16", "float32", "bfloat16"]
    assert auto["arrays"]["entropy"]["data"] == got["arrays"]["entropy"]["data"]
    docs = prepare_documents(tmp_path / "d.txt", llama.tokenizer, max_seq_len=64)
    stats = LongContextStats(js_rows=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        stream_stats(llama, [d.ids for d in docs], stats, batch_size=len(docs), attention_dtype="bfloat16")
    want = stats.finalize().arrays
    for name in ("sink", "entropy", "max", "previous", "dist_mass", "js"):
        # the same bfloat16 products, float32 rows of <= 64 keys summed in other batches
        np.testing.assert_allclose(got["arrays"][name]["data"], want[name], atol=softmax_bound(64), rtol=0, err_msg=name)
    moved = np.abs(np.asarray(got["arrays"]["entropy"]["data"]) - exact["arrays"]["entropy"]["data"]).max()
    assert moved > 1e-4  # rounding q, k, v to bfloat16 does change the scores


@pytest.mark.heavy
def test_a_backend_named_on_the_command_line_runs_and_gives_the_same_statistics(tmp_path, monkeypatch, llama):
    import dataclasses

    from attnscope.data.unlabeled import prepare_documents
    from attnscope.engines import backends

    calls = []
    run_layer = backends.get("onepass").run
    monkeypatch.setattr(backends, "BACKENDS", tuple(
        dataclasses.replace(b, run=lambda *a: calls.append(a[1]) or run_layer(*a)) if b.name == "onepass" else b
        for b in backends.BACKENDS))
    got = _cli(tmp_path, "onepass", "--longctx-backend", "onepass")
    want = _cli(tmp_path, "auto")
    assert got["meta"]["backend"] == "onepass" and want["meta"]["backend"] == "auto"
    docs = prepare_documents(tmp_path / "d.txt", llama.tokenizer, max_seq_len=64)
    assert sorted(calls) == sorted(list(range(len(docs))) * llama.num_layers)  # each document, each layer
    for name, arr in want["arrays"].items():  # (null: no induction sequences, in both)
        np.testing.assert_allclose(np.array(got["arrays"][name]["data"], dtype=float),
                                   np.array(arr["data"], dtype=float), atol=softmax_bound(64), rtol=0, err_msg=name)  # rows of <= 64 keys


@pytest.mark.parametrize("flags, named", [
    (["--longctx-engine", "maps", "--longctx-backend", "tiles"], ["--longctx-engine maps", "--longctx-backend tiles"]),
    (["--longctx-engine", "maps", "--longctx-attention-dtype", "bfloat16"],
     ["--longctx-engine maps", "--longctx-attention-dtype bfloat16"]),
    (["--longctx-backend", "fast"], ["--longctx-backend", "'fast'", "onepass"]),
])
def test_a_backend_or_attention_dtype_the_engine_cannot_take_is_one_line(tmp_path, capsys, flags, named):
    from attnscope.cli.main import main

    docs = tmp_path / "d.txt"
    docs.write_text(DOCS)
    code = main(["analyze", "longctx", str(docs), "--model", "debug:llama", "--out", str(tmp_path / "o"),
                 "-q", *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and not (tmp_path / "o").exists()
    says(err, *named)
