"""The general family's engine choice: the streaming engine against the maps path, the budget,
the CLI options (``analyze general`` and ``run``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import line_saying, says, softmax_bound

from attnscope.analyses.distances import HeadDistances
from attnscope.analyses.entropy import Entropy
from attnscope.analyses.relative_position import RelativePosition
from attnscope.analyses.special_tokens import SpecialTokens
from attnscope.analyses.streamed_general import StreamedGeneral
from attnscope.analyses.token_classes import TokenClasser
from attnscope.cli.main import main
from attnscope.data.records import Example
from attnscope.extract.encode import Encoder
from attnscope.extract.runner import Extractor
from attnscope.models import load_model
from attnscope.pipeline import run_family

pytest.importorskip("torch")

TEXTS = ["the cat sat on the mat . a dog ran , she said",
         "when the old man saw the red house , he ran .",
         "it is big", "a"]


@pytest.fixture(scope="module")
def llama():
    return load_model("debug:llama")


def _maps_results(lm, encoded, classer):
    batch = Extractor(lm).run_batch(encoded)
    out = {}
    for a in (RelativePosition(), SpecialTokens(classer), Entropy(causal=True), HeadDistances()):
        a.update(batch)
        out[a.name] = a.finalize()
    return out


def test_streaming_equals_maps_on_a_decoder(llama):
    enc = Encoder(llama)
    encoded = [enc.encode(Example(text=t), i) for i, t in enumerate(TEXTS)]
    # one example gets a separator in the middle (a special unit that is not at position 0), so
    # separator-to-separator and other-to-separator are defined and checked too
    encoded[1].special[5] = True
    classer = TokenClasser.positional()
    maps = _maps_results(llama, encoded, classer)
    # js_rows above every example's length: every row is sampled, so the distances are exact too
    streamed = StreamedGeneral(llama, classer, seed=3, js_rows=64)
    streamed.update(encoded)
    got = streamed.parts()
    bound = softmax_bound(max(len(e) for e in encoded))  # float32 rows of the maps and of the tiles
    checked = 0
    for name, res in maps.items():
        for key, want in res.arrays.items():
            have = got[name].arrays[key]
            assert have.shape == want.shape, (name, key)
            np.testing.assert_allclose(have, want, atol=bound, rtol=0, err_msg=f"{name}/{key}")
            checked += 1
    assert checked >= 15
    assert np.isfinite(maps["special-tokens"].arrays["sep_to_sep"]).all()
    assert got["entropy"].meta["uniform_entropy"] == pytest.approx(maps["entropy"].meta["uniform_entropy"])
    # the statistics are not trivial: entropies strictly between 0 and uniform
    e = got["entropy"].arrays["entropy"]
    assert (e > 0.05).all() and (e < got["entropy"].meta["uniform_entropy"]).all()


def _general(tmp_path, lm, **kw):
    sec = run_family("general", {"text": [Example(text=t) for t in TEXTS]}, tmp_path, model=lm, max_seq_len=64,
                     batch_size=2, **kw)
    return sec, json.loads((tmp_path / "results" / "general.json").read_text())


def _array(payload, analysis, key):
    return np.asarray(payload["analyses"][analysis]["arrays"][key]["data"], dtype=float)


@pytest.mark.heavy
def test_run_general_forced_streaming_matches_maps(tmp_path, llama):
    sec_m, maps = _general(tmp_path / "m", llama, general_engine="maps")
    sec_s, stream = _general(tmp_path / "s", llama, general_engine="streaming")
    for analysis, key in (("entropy", "entropy"), ("entropy", "max_weight"), ("special-tokens", "first"),
                          ("special-tokens", "punct"), ("relative-position", "previous"),
                          ("relative-position", "current")):
        # float32 rows of at most max_seq_len = 64 keys, by the maps and by the tiles
        np.testing.assert_allclose(_array(stream, analysis, key), _array(maps, analysis, key), atol=softmax_bound(64), rtol=0)
    assert maps["run"]["engine"] == "maps" and stream["run"]["engine"] == "streaming"
    line_saying(sec_s.findings, "Engine: streaming", "forced")
    assert any("Figure 1" in f and "not computed" in f for f in sec_s.findings)
    assert "figure1_examples" not in {f.name for f in sec_s.figures}
    assert "figure1_examples" in {f.name for f in sec_m.figures}
    assert {"figure2_special_tokens", "figure4_entropy", "figure6_clusters"} <= {f.name for f in sec_s.figures}


@pytest.mark.heavy
def test_auto_picks_streaming_under_a_tiny_budget(tmp_path, llama, capsys):
    # 2 layers x 4 heads x 15^2 tokens x 4 bytes x 2 examples = 14,400 bytes of maps
    sec, data = _general(tmp_path / "a", llama, general_engine="auto", general_maps_budget_gb=1e-6,
                         progress=lambda *a: None)
    assert data["run"]["engine"] == "streaming"
    line = next(f for f in sec.findings if f.startswith("Engine:"))
    says(line, "Engine: streaming", "chosen", "0.00 GB")
    assert line in capsys.readouterr().err  # said on the console too
    sec, data = _general(tmp_path / "b", llama, general_engine="auto", general_maps_budget_gb=1e-4)
    assert data["run"]["engine"] == "maps"
    line_saying(sec.findings, "Engine: maps", "chosen")


def test_streaming_refused_for_encoders_and_stores(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat.\nthe dog ran.\n\na bird flew.\nit sang.\n")
    code = main(["analyze", "general", str(text), "--model", "debug:bert", "--out", str(tmp_path / "o"),
                 "--general-engine", "streaming", "--general-num-text-examples", "2", "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "not causal" in err and "Traceback" not in err
    assert not (tmp_path / "o" / "results").exists()


def test_cli_analyze_general_streaming_and_run_help(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat.\nthe dog ran.\n\na bird flew.\nit sang.\n")
    code = main(["analyze", "general", str(text), "--model", "debug:llama", "--out", str(tmp_path / "o"),
                 "--general-engine", "auto", "--general-maps-budget-gb", "0", "--general-num-text-examples", "2"])
    out = capsys.readouterr()
    assert code == 0, out.err
    for text in (out.out, out.err):
        line_saying(text.splitlines(), "Engine: streaming", "chosen")
    data = json.loads((tmp_path / "o" / "results" / "general.json").read_text())
    assert data["run"]["engine"] == "streaming"
    assert main(["run", "--help"]) == 0  # no option name collides across families
    help_text = capsys.readouterr().out
    assert "--general-engine" in help_text and "--longctx-engine" in help_text and "--longctx-generate" in help_text


@pytest.mark.heavy
def test_attnscope_run_picks_streaming_for_general_and_longctx(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat.\nthe dog ran.\n\na bird flew.\nit sang.\n")
    out = tmp_path / "run"
    code = main(["run", "--out", str(out), "--model", "debug:llama", "--text", str(text),
                 "--documents", str(text), "--general-num-text-examples", "2", "--general-maps-budget-gb", "0",
                 "--longctx-maps-budget-gb", "0", "--longctx-induction", "0"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    line_saying(cap.err.splitlines(), "Engine: streaming", "chosen")  # the general family says so on the console
    general = json.loads((out / "results" / "general.json").read_text())
    longctx = json.loads((out / "results" / "longctx.json").read_text())
    assert general["run"]["engine"] == "streaming" and longctx["meta"]["engine"] == "streaming"
    e = np.asarray(general["analyses"]["entropy"]["arrays"]["entropy"]["data"], dtype=float)
    assert e.shape == (2, 4) and (e > 0).all()
    summary = json.loads((out / "results.json").read_text())
    findings = summary["families"]["general"]["section"]["findings"]
    line_saying(findings, "Engine: streaming", "chosen")


@pytest.mark.parametrize("engine", ["auto", "streaming"])
def test_too_long_examples_are_counted_once(tmp_path, llama, engine):
    long_text = " ".join(["the cat sat on the mat ."] * 20)  # well over 64 tokens
    examples = [Example(text=t) for t in TEXTS] + [Example(text=long_text)]
    run_family("general", {"text": examples}, tmp_path, model=llama, max_seq_len=64, batch_size=2,
               general_engine=engine)
    data = json.loads((tmp_path / "results" / "general.json").read_text())
    assert data["run"]["skipped"] == 1 and data["run"]["examples"] == len(TEXTS)
    assert data["run"]["engine"] == ("maps" if engine == "auto" else "streaming")


def test_save_maps_needs_the_maps_engine(tmp_path, llama):
    from attnscope.errors import AttnscopeError

    examples = [Example(text=t) for t in TEXTS]
    with pytest.raises(AttnscopeError) as refused:
        run_family("general", {"text": examples}, tmp_path / "o", model=llama, max_seq_len=64,
                   general_engine="streaming", save_maps=tmp_path / "m")
    says(refused.value, "save_maps", "maps engine", "general_engine streaming")
    assert refused.value.params == ("save_maps", "general_engine")
    with pytest.raises(AttnscopeError) as refused:
        run_family("general", {"text": examples}, tmp_path / "o", model=llama, max_seq_len=64,
                   general_maps_budget_gb=0, save_maps=tmp_path / "m")
    says(refused.value, "save_maps", "maps engine", "general_maps_budget_gb")
    assert refused.value.params == ("save_maps", "general_maps_budget_gb")
    assert "--general-maps-budget-gb" in refused.value.for_flags({})
    assert not (tmp_path / "m").exists() and not (tmp_path / "o").exists()


def test_streaming_runs_a_decoder_past_its_configured_positions(tmp_path, debug_llama):
    """Rotary positions extrapolate: a decoder runs past max_position_embeddings (512 for the
    debug Llama), and the findings say so; an encoder is refused at its limit."""
    from attnscope.errors import AttnscopeError

    text = " ".join(f"word{i % 50}" for i in range(150))  # 721 tokens of the debug tokenizer
    sec = run_family("general", {"text": [Example(text=text)]}, tmp_path / "d", model=debug_llama,
                     max_seq_len=1024, general_engine="streaming", gradients="off")
    line_saying(sec.findings, "past", "512 positions")
    with pytest.raises(AttnscopeError) as refused:
        from attnscope.models import load_model

        run_family("general", {"text": [Example(text="a b c")]}, tmp_path / "e", model=load_model("debug:bert"),
                   max_seq_len=4096, gradients="off")
    says(refused.value, "max_seq_len 4096", "debug:bert", "512")
    assert refused.value.params == ("max_seq_len",)
