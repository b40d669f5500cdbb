"""Encoder-decoder models (T5, BART): extraction, the store and the views of their three kinds
of attention, checked against the model's own ``output_attentions`` and against generation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import EPS32, says, softmax_bound

from attnscope.cli.main import main
from attnscope.extract.seq2seq import KINDS, extract_seq2seq, kind_shapes
from attnscope.models import load_model
from attnscope.notebook import head_view, model_view
from attnscope.store import open_store
from attnscope.viz.payload import head_payload, kinds_payload, page_payload, pool

FAMILIES = ("t5", "bart")


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request):
    return load_model(f"debug:{request.param}")


def own_attentions(lm, source: str, dec: list[int]):
    """The model's own output_attentions, called directly."""
    src = lm.tokenizer(source, return_tensors="pt").input_ids
    with torch.no_grad():
        out = lm.model(input_ids=src, decoder_input_ids=torch.tensor([dec]), output_attentions=True)
    return {k: np.stack([a[0].numpy() for a in getattr(out, f"{k}_attentions")]) for k in KINDS}


def test_maps_equal_the_models_own_output_attentions(lm):
    maps = extract_seq2seq(lm, "the cat sat on the mat", target="a dog ran to the house")
    start = lm.model.config.decoder_start_token_id
    dec = [start] + lm.tokenizer(text_target="a dog ran to the house").input_ids
    own = own_attentions(lm, "the cat sat on the mat", dec)
    s, t = len(maps.encoder.tokens), len(dec)
    for kind, shape in (("encoder", (s, s)), ("decoder", (t, t)), ("cross", (t, s))):
        amap = maps[kind]
        assert amap.kind == kind and amap.attn.shape[-2:] == shape
        np.testing.assert_array_equal(amap.attn, own[kind])
        np.testing.assert_allclose(amap.attn.sum(-1), 1.0, atol=softmax_bound(shape[1]), rtol=0)  # a row's weights
    # the decoder is causal; the cross-attention's columns are the encoder's tokens
    assert np.triu(maps.decoder.attn, 1).max() == 0.0
    assert maps.cross.key_tokens == maps.encoder.tokens
    assert maps.decoder.tokens[0] == lm.tokenizer.convert_ids_to_tokens([start])[0]
    assert maps.decoder.special[0] and maps.decoder.special[-1]  # start token, EOS


def test_generated_rows_are_the_attention_of_each_generation_step(lm):
    """generate=N: the decoder reads transformers' own greedy continuation, and each row of the
    one-pass maps equals the attention of that generation step (computed with the cache)."""
    source = "the man saw a big red house"
    maps = extract_seq2seq(lm, source, generate=5)
    src = lm.tokenizer(source, return_tensors="pt").input_ids
    with torch.no_grad():
        g = lm.model.generate(input_ids=src, max_new_tokens=5, do_sample=False, num_beams=1,
                              output_attentions=True, return_dict_in_generate=True)
    ids = g.sequences[0].tolist()
    assert lm.tokenizer.convert_ids_to_tokens(ids) == maps.decoder.tokens
    assert maps.decoder.generated == 1 and maps.cross.generated == 1
    # float32 rows, cached steps vs one pass: a step's scores come from keys and queries projected
    # again (sums of hidden-size products in another order), and every layer passes its rounding
    # on to the next layer's input: a softmax row of n keys whose scores sum n + hidden terms, a layer
    n = max(len(ids), maps.cross.attn.shape[-1])
    bound = len(g.decoder_attentions[0]) * softmax_bound(n + lm.model.config.hidden_size)
    for step, (dec_layers, cross_layers) in enumerate(zip(g.decoder_attentions, g.cross_attentions)):
        for layer in range(len(dec_layers)):
            row_dec = dec_layers[layer][0, :, -1].numpy()  # [H k]: the step's own query row
            row_cross = cross_layers[layer][0, :, -1].numpy()
            # measured: at most 3.4e-6
            np.testing.assert_allclose(maps.decoder.attn[layer, :, step, :step + 1], row_dec, atol=bound, rtol=0)
            np.testing.assert_allclose(maps.cross.attn[layer, :, step], row_cross, atol=bound, rtol=0)


def test_one_input_only(lm):
    from attnscope.errors import AttnscopeError

    for kwargs in ({}, {"target": "a dog", "generate": 3}):  # neither, or both
        with pytest.raises(AttnscopeError) as e:
            extract_seq2seq(lm, "the cat", **kwargs)
        says(e.value, "target", "generate")
    with pytest.raises(AttnscopeError) as e:
        extract_seq2seq(load_model("debug:bert"), "the cat", target="a dog")
    says(e.value, "debug:bert", "encoder-decoder")


def test_cross_payload_has_the_encoder_tokens_as_columns_and_renormalises_over_them(lm):
    maps = extract_seq2seq(lm, "the cat sat", target="a dog")
    cross = maps.cross
    p = head_payload(cross, 1, [0, 1])
    assert p["key_tokens"] == maps.encoder.tokens and p["kind"] == "cross"
    assert p["rows"] == list(range(len(cross.tokens))) and p["cols"] == list(range(len(cross.key_tokens)))
    np.testing.assert_allclose(p["attn"], cross.attn[1][[0, 1]], atol=EPS32, rtol=0)  # float32 weights <= 1, copied
    hidden = head_payload(cross, 1, [0], hide_special=True)
    keep_r = np.flatnonzero(~cross.special)
    keep_c = np.flatnonzero(~cross.key_special)
    a = cross.attn[1, 0].astype(np.float64)[keep_r][:, keep_c]
    np.testing.assert_allclose(hidden["attn"][0], a / a.sum(-1, keepdims=True), atol=1e-9)


def test_pool_of_a_rectangle_by_hand():
    a = np.arange(12, dtype=np.float64).reshape(1, 1, 3, 4)  # [q=3 k=4] pooled to 2 x 2
    got = pool(a, 2)[0, 0]
    # query bins {0} {1,2} (edges 0,2,3 -> rint(linspace(0,3,3)) = 0,2,3: {0,1} {2}); key bins {0,1} {2,3}
    rows = np.rint(np.linspace(0, 3, 3)).astype(int)
    want = np.array([[a[0, 0, rows[i]:rows[i + 1], 0:2].sum() / (rows[i + 1] - rows[i]),
                      a[0, 0, rows[i]:rows[i + 1], 2:4].sum() / (rows[i + 1] - rows[i])] for i in range(2)])
    np.testing.assert_allclose(got, want)
    assert got.shape == (2, 2)


def test_kinds_page_opens_each_kind_with_its_own_shape(lm):
    maps = dict(extract_seq2seq(lm, "the cat sat", target="a dog ran").items())
    p = kinds_payload(maps, "cross", layer=1, heads=[1])
    assert list(p["kinds"]) == list(KINDS) and p["kind"] == "cross"
    assert p["kinds"]["cross"]["state"]["heads"] == [1]
    assert p["kinds"]["encoder"]["state"]["heads"] == [0, 1]  # the other kinds open on all heads
    assert p["kinds"]["cross"]["profile"] is None and p["kinds"]["decoder"]["profile"]["buckets"]
    # the profile view: the kinds that have one open on it, the cross-attention on its head view
    p = kinds_payload(maps, "decoder", view="profile")
    assert [p["kinds"][k]["state"]["view"] for k in KINDS] == ["profile", "profile", "head"]
    from attnscope.errors import AttnscopeError

    with pytest.raises(AttnscopeError) as e:
        kinds_payload(maps, "cross", view="profile")
    says(e.value, "profile", "cross-attention")


def test_bertviz_style_encoder_decoder_call(lm):
    """head_view(encoder_attention=..., decoder_attention=..., cross_attention=..., encoder_tokens=...,
    decoder_tokens=...) with the model's outputs, as BertViz is called."""
    tok = lm.tokenizer
    src = tok("the cat sat", return_tensors="pt").input_ids
    dec = tok("a dog ran", return_tensors="pt").input_ids
    with torch.no_grad():
        out = lm.model(input_ids=src, decoder_input_ids=dec, output_attentions=True)
    et, dt = tok.convert_ids_to_tokens(src[0]), tok.convert_ids_to_tokens(dec[0])
    v = head_view(encoder_attention=out.encoder_attentions, decoder_attention=out.decoder_attentions,
                  cross_attention=out.cross_attentions, encoder_tokens=et, decoder_tokens=dt)
    assert "AttnScope.mountKinds" in v.html and v.kind == "head"
    from attnscope.notebook import _maps

    maps = _maps(None, None, encoder_attention=out.encoder_attentions, decoder_attention=out.decoder_attentions,
                 cross_attention=out.cross_attentions, encoder_tokens=et, decoder_tokens=dt)
    np.testing.assert_array_equal(maps["cross"].attn, np.stack([a[0].numpy() for a in out.cross_attentions]))
    assert maps["cross"].key_tokens == et and maps["cross"].tokens == dt
    with pytest.raises(TypeError, match="encoder_tokens"):
        head_view(cross_attention=out.cross_attentions, decoder_tokens=dt)
    mv = model_view(lm, "the cat sat", target="a dog", kind="cross")
    assert "mountKinds" in mv.html
    t = len(lm.tokenizer(text_target="a dog").input_ids) + 1  # the decoder start token first
    assert mv.caption == (f"attnscope model view \u00b7 cross-attention (decoder \u2192 encoder) \u00b7 "
                          f"2 layers x 2 heads \u00b7 {t} tokens")


def write_inputs(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_store_records_each_kind_and_reads_it_back(tmp_path, lm):
    rows = [{"text": "the cat sat on the mat", "target": "a dog ran"},
            {"text": "the dog ran", "target": "the man saw a big house"}]
    inp = write_inputs(tmp_path / "in.jsonl", rows)
    out = tmp_path / "maps"
    assert main(["extract", str(inp), "--model", lm.name, "--out", str(out), "--dtype", "float32"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["attention_kinds"] == kind_shapes(lm)
    for i, r in enumerate(rows):
        want = extract_seq2seq(lm, r["text"], target=r["target"], index=i)
        for kind in KINDS:
            store = open_store(out, kind if kind != "encoder" else None)
            got = store.by_index(i)
            assert store.kind == kind and got.kind == kind and got.tokens == want[kind].tokens
            assert got.key_tokens == want[kind].key_tokens
            np.testing.assert_array_equal(got.attn, want[kind].attn)
    dec = open_store(out, "decoder")
    assert dec.manifest["model"]["causal"] is True and open_store(out).manifest["model"]["causal"] is False
    from attnscope.errors import StoreError

    with pytest.raises(StoreError) as e:
        open_store(out, "other")
    says(e.value, str(out), "kind 'other'", "encoder, decoder, cross")



def test_info_names_the_kinds(tmp_path, capsys):
    inp = write_inputs(tmp_path / "in.jsonl", [{"text": "the cat sat", "target": "a dog"}])
    assert main(["extract", str(inp), "--model", "debug:t5", "--out", str(tmp_path / "m")]) == 0
    capsys.readouterr()
    assert main(["info", str(tmp_path / "m")]) == 0
    assert "attention_kinds: encoder, decoder, cross" in capsys.readouterr().out


def test_store_view_switches_kinds_and_bad_input_is_one_line(tmp_path, capsys):
    inp = write_inputs(tmp_path / "in.jsonl", [{"text": "the cat sat", "target": "a dog"},
                                                {"text": "the dog ran"}])
    out = tmp_path / "maps"
    assert main(["extract", str(inp), "--model", "debug:bart", "--out", str(out)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and "example 1" in err[0] and "'target'" in err[0]
    assert not out.exists()  # refused before anything was written
    inp = write_inputs(tmp_path / "in.jsonl", [{"text": "the cat sat", "target": "a dog"}])
    assert main(["extract", str(inp), "--model", "debug:bart", "--out", str(out), "--overwrite"]) == 0
    capsys.readouterr()
    assert main(["extract", str(inp), "--model", "debug:bart", "--word-level", "--out",
                 str(tmp_path / "w")]) == 2
    says(capsys.readouterr().err, "--word-level", "not available")
    page = tmp_path / "v.html"
    assert main(["view", str(out), "--kind", "cross", "--view", "heatmap", "--out", str(page)]) == 0
    html = page.read_text()
    assert "AttnScope.mountKinds" in html and '"kind":"cross"' in html
    bert = tmp_path / "bert"
    assert main(["extract", str(write_inputs(tmp_path / "b.jsonl", [{"text": "the cat"}])),
                 "--model", "debug", "--out", str(bert)]) == 0
    capsys.readouterr()
    assert main(["view", str(bert), "--kind", "decoder", "--out", str(tmp_path / "x.html")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1
    says(err[0], "--kind decoder", str(bert), "encoder-decoder")
    assert not (tmp_path / "x.html").exists()


@pytest.mark.browser
def test_page_switches_between_the_three_kinds(browser, tmp_path):
    """In Chromium: the switch shows each kind's tokens on each side; the view and layer carry
    over; the cross-attention heatmap is decoder rows x encoder columns."""
    lm = load_model("debug:t5")
    maps = extract_seq2seq(lm, "the cat sat on the mat", target="a dog ran")
    v = head_view(lm, "the cat sat on the mat", target="a dog ran", layer=1)
    path = v.save(tmp_path / "s2s.html")
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_selector("#attnscope-root[data-ready=true][data-kind=encoder]")

    def side(s, what="t.firstChild.textContent"):
        return page.eval_on_selector_all(f".as-head-view .as-{s} text", f"ts => ts.map(t => {what})")

    def shown(m, key="token_text"):  # the tokens as text (their raw pieces on hover)
        return page_payload(m)[key]

    raw = "t.querySelector('title').textContent"
    assert side("q") == shown(maps.encoder) and side("k") == shown(maps.encoder)
    assert side("q", raw) == maps.encoder.tokens
    page.select_option(".as-kind", "cross")
    page.wait_for_selector("#attnscope-root[data-ready=true][data-kind=cross]")
    assert side("q") == shown(maps.cross) and side("k") == shown(maps.cross, "key_token_text")
    assert side("q", raw) == maps.cross.tokens and side("k", raw) == maps.encoder.tokens
    assert page.eval_on_selector(".as-layer", "e => e.value") == "1"
    # the page's own matrix (u8 weights) agrees with head_payload, special tokens hidden or not
    for hide in (False, True):
        got = page.evaluate(f"() => window.attnscope.currentMatrix({{layer: 1, heads: [0, 1], "
                            f"hide_special: {str(hide).lower()}}})")
        want = head_payload(maps.cross, 1, [0, 1], hide_special=hide)
        assert got["rows"] == want["rows"] and got["cols"] == want["cols"]
        # 1/255 quantisation; renormalised rows are compared where they kept at least 0.1 of
        # their mass (a row with almost nothing left divides its rounding error by that little)
        kept = maps.cross.attn[1][[0, 1]][:, want["rows"]][..., ~maps.cross.key_special].sum(-1)
        ok = kept >= 0.1 if hide else np.ones_like(kept, bool)
        assert ok.sum() >= ok.size // 2
        np.testing.assert_allclose(np.asarray(got["attn"])[ok], np.asarray(want["attn"])[ok], atol=0.01)
    page.click("button[data-view=heatmap]")
    assert page.get_attribute("#attnscope-root > div:nth-child(2)", "data-status") == \
        f"{len(maps.cross.tokens)} x {len(maps.encoder.tokens)}"
    page.select_option(".as-kind", "decoder")
    page.wait_for_selector("#attnscope-root[data-ready=true][data-kind=decoder]")
    assert page.get_attribute("#attnscope-root > div:nth-child(2)", "data-rendered-view") == "heatmap"
    assert page.get_attribute("#attnscope-root > div:nth-child(2)", "data-status") == \
        f"{len(maps.decoder.tokens)} x {len(maps.decoder.tokens)}"
    # the model view of the cross-attention: every head a (decoder x encoder) thumbnail
    page.select_option(".as-kind", "cross")
    page.wait_for_selector("#attnscope-root[data-ready=true][data-kind=cross]")
    page.click("button[data-view=model]")
    assert page.locator(".as-thumb").count() == 2 * 2
    page.locator(".as-thumb[data-layer='1'][data-head='0']").click()
    assert page.get_attribute("#attnscope-root > div:nth-child(2)", "data-rendered-view") == "head"
    assert errors == []
    page.close()


ROWS = [{"text": "the cat sat on the mat", "target": "a dog ran to the house"},
        {"text": "the dog ran", "target": "the man saw a big house"},
        {"text": "a man said that the woman was here", "target": "the old man ran"}]


@pytest.mark.heavy
def test_general_analyses_read_the_decoder_kind(tmp_path, capsys):
    """analyze general STORE --attention decoder: the decoder's maps, read as causal. Entropy by
    hand from the stored decoder maps (mean over examples of each head's mean row entropy); no
    attention to the next token; the uniform reference is the causal one, mean log(1..n)."""
    import csv

    inp = write_inputs(tmp_path / "in.jsonl", ROWS)
    store = tmp_path / "maps"
    assert main(["extract", str(inp), "--model", "debug:t5", "--out", str(store), "--dtype", "float32"]) == 0
    out = tmp_path / "dec"
    assert main(["analyze", "general", str(store), "--attention", "decoder", "--out", str(out), "-q"]) == 0
    rows = list(csv.DictReader((out / "tables" / "general_heads.csv").open()))
    maps = list(open_store(store, "decoder"))
    for r in rows:
        layer, head = int(r["layer"]), int(r["head"])
        ent = [np.mean([-(p[p > 0] * np.log(p[p > 0])).sum() for p in m.attn[layer, head]]) for m in maps]
        # the family's float32 entropy of rows of at most n keys, against float64 of the same weights
        n = max(m.attn.shape[-1] for m in maps)
        assert float(r["entropy"]) == pytest.approx(np.mean(ent), abs=softmax_bound(n))
        assert float(r["next"]) == 0.0
    res = json.loads((out / "results" / "general.json").read_text())
    text = json.dumps(res)
    uniform = np.mean([np.log(np.arange(1, m.num_units + 1)).mean() for m in maps])
    assert f"(uniform attention: {uniform:.2f})" in text
    # the encoder (the default) is another set of maps
    enc = tmp_path / "enc"
    assert main(["analyze", "general", str(store), "--out", str(enc), "-q"]) == 0
    enc_rows = list(csv.DictReader((enc / "tables" / "general_heads.csv").open()))
    assert [r["entropy"] for r in enc_rows] != [r["entropy"] for r in rows]
    capsys.readouterr()
    # cross-attention, families that do not read kinds, inputs that are not stores: one line, exit 2
    for argv, msg in ((["analyze", "general", str(store), "--attention", "cross"], "--attention cross: cross-attention maps"),
                      (["analyze", "syntax", str(store), "--attention", "decoder"], "the syntax family does not read"),
                      (["analyze", "general", str(inp), "--attention", "decoder", "--model", "debug:t5"], "this input is not a store")):
        assert main([*argv, "--out", str(tmp_path / "bad")]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and msg in err[0], err
        assert not (tmp_path / "bad").exists()


def test_a_killed_extraction_resumes_with_every_kind(tmp_path):
    """What kill -9 leaves (an incomplete manifest, the whole shards written so far, no index)
    resumes into the same store, decoder and cross-attention arrays included."""
    import shutil

    inp = write_inputs(tmp_path / "in.jsonl", ROWS)
    full, killed = tmp_path / "full", tmp_path / "killed"
    args = ["--model", "debug:bart", "--shard-size", "1", "--batch-size", "1"]
    assert main(["extract", str(inp), *args, "--out", str(full)]) == 0
    shutil.copytree(full, killed)
    (killed / "index.json").unlink()
    last = sorted((killed / "shards").glob("*.safetensors"))[-1]
    last.unlink()
    manifest = json.loads((killed / "manifest.json").read_text())
    manifest["status"] = "incomplete"
    manifest.pop("summary", None)
    (killed / "manifest.json").write_text(json.dumps(manifest))
    assert len(open_store(killed, "cross")) == len(ROWS) - 1  # still readable, every kind
    assert main(["extract", str(inp), *args, "--out", str(killed), "--resume"]) == 0
    assert (killed / "shards" / last.name).read_bytes() == (full / "shards" / last.name).read_bytes()
    for kind in KINDS:
        a, b = open_store(full, kind), open_store(killed, kind)
        assert b.complete and len(a) == len(b) == len(ROWS)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x.attn, y.attn)
            assert x.tokens == y.tokens and x.key_tokens == y.key_tokens


def test_a_store_missing_a_kind_is_refused_in_one_line(tmp_path, capsys):
    """A shard whose records lost the cross-attention units, or whose cross array has the wrong
    width: one line naming the shard, exit 2, no page written."""
    from safetensors.numpy import load_file, save_file

    inp = write_inputs(tmp_path / "in.jsonl", ROWS[:1])
    store = tmp_path / "maps"
    assert main(["extract", str(inp), "--model", "debug:t5", "--out", str(store)]) == 0
    shard = next((store / "shards").glob("*.safetensors"))
    arrays = load_file(str(shard))
    from safetensors import safe_open

    with safe_open(str(shard), framework="np") as sf:
        records = json.loads(sf.metadata()["records"])
    broken = [{**r, "others": {"decoder": r["others"]["decoder"]}} for r in records]
    save_file(arrays, str(shard), metadata={"records": json.dumps(broken)})
    page = tmp_path / "v.html"
    capsys.readouterr()
    assert main(["view", str(store), "--kind", "cross", "--out", str(page)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and shard.name in err[0] and "no cross record" in err[0]
    assert not page.exists()
    narrow = dict(arrays, **{"cross/0": arrays["cross/0"][..., :-1]})
    save_file(narrow, str(shard), metadata={"records": json.dumps(records)})
    assert main(["view", str(store), "--kind", "cross", "--out", str(page)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and shard.name in err[0] and "does not match" in err[0]
    assert not page.exists()
