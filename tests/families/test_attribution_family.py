"""The attribution family through its registered class (prepare/run with a Context) and the CLI
generated from the registry; behaviour labels read from the general family's real output."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import line_saying, says

from attnscope.families import FAMILIES, Context, load_families

DEMO = Path(__file__).resolve().parents[2] / "src" / "attnscope" / "demo_data" / "text.txt"


@pytest.fixture(scope="module")
def bert_mlm():
    from attnscope.models import load_model

    return load_model("debug:bert", mlm_head=True)


def _run(key, lm, out, inputs, results=None, **opts):
    load_families()
    fam = FAMILIES[key]()
    options = fam.Options(**opts)
    ctx = Context(model=lm, out_dir=out, seed=0, max_seq_len=64, batch_size=4, results=results or {})
    return fam.run(fam.prepare(inputs, options, ctx), options, ctx).section


def _strict(path: Path):
    return json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))


@pytest.mark.heavy
def test_family_writes_everything_and_labels_heads_from_general(bert_mlm, tmp_path):
    _run("general", bert_mlm, tmp_path, {"text": DEMO}, num_text_examples=8)
    general = _strict(tmp_path / "results" / "general.json")
    labels = {(r["layer"], r["head"]): r["behaviour"] for r in general["clustering"]["rows"]}
    sec = _run("attribution", bert_mlm, tmp_path, {"attribution": DEMO}, {"general": general},
               attribution_examples=6, attribution_map_examples=3, attribution_methods="all")
    data = _strict(tmp_path / "results" / "attribution.json")
    assert data["examples"] == 6
    assert data["methods"] == ["importance", "ablation", "pruning", "rollout", "norms", "value-zeroing"]
    assert set(data["analyses"]) == {"head-importance", "ablation-zero", "ablation-mean",
                                     "pruning-curve", "attribution-agreement", "norm-shares"}
    heads = json.loads((tmp_path / "tables" / "attribution_heads.json").read_text())
    assert len(heads) == bert_mlm.num_layers * bert_mlm.num_heads
    assert {(r["layer"], r["head"]): r["behaviour"] for r in heads} == labels
    assert sorted(r["rank"] for r in heads) == [1, 2, 3, 4]
    for name in ("attribution_importance", "attribution_pruning", "attribution_weight_vs_norm",
                 "attribution_example"):
        assert (tmp_path / "figures" / f"{name}.png").stat().st_size > 0
    ex = data["example"]
    n = len(ex["tokens"])
    assert np.allclose(np.asarray(ex["rollout"]).sum(-1), 1.0)
    assert np.asarray(ex["value_zeroing"]).shape == (bert_mlm.num_layers, n, n)
    assert any(f.startswith("most important heads") for f in sec.findings)
    curve = data["analyses"]["pruning-curve"]["tables"]["pruning_curve"]
    assert {r["order"] for r in curve} == {"importance", "random"}
    assert all(r["accuracy"] is None or 0 <= r["accuracy"] <= 1 for r in curve)


@pytest.mark.heavy
def test_encoder_without_head_skips_loss_methods_with_a_note(debug_bert, tmp_path):
    sec = _run("attribution", debug_bert, tmp_path, {"attribution": DEMO}, attribution_examples=3)
    data = _strict(tmp_path / "results" / "attribution.json")
    assert set(data["analyses"]) == {"norm-shares"}
    assert any("no masked-LM head" in n for n in data["notes"])
    assert not math.isnan(data["analyses"]["norm-shares"]["arrays"]["weight_share"]["data"][0][0])
    assert sec.figures


def test_causal_model_uses_next_token_loss(debug_gpt2, tmp_path):
    _run("attribution", debug_gpt2, tmp_path, {"attribution": DEMO}, attribution_examples=3,
         attribution_methods="importance,norms")
    data = _strict(tmp_path / "results" / "attribution.json")
    assert data["methods"] == ["importance", "norms"]
    assert data["analyses"]["head-importance"]["params"]["objective"]["loss"] == "next-token cross-entropy"


def test_importance_norm_option_reaches_the_analysis_and_the_caption(debug_gpt2, tmp_path):
    sec = _run("attribution", debug_gpt2, tmp_path, {"attribution": DEMO}, attribution_examples=3,
               attribution_methods="importance", importance_norm="released")
    imp = _strict(tmp_path / "results" / "attribution.json")["analyses"]["head-importance"]
    assert imp["params"]["norm"] == "released"
    assert imp["meta"]["tokens"] > imp["meta"]["examples"] == 3
    caption = {f.name: f.caption for f in sec.figures}["attribution_importance"]
    says(caption, "released")


@pytest.mark.parametrize("args,message", [
    (["--attribution-methods", "importance,nope"], "--attribution-methods names nope; choose from"),
    # an ablation choice without the ablation method (not in the defaults) would do nothing
    (["--attribution-ablation", "zero"], "error: --attribution-ablation zero needs the 'ablation' method in "
                                         "--attribution-methods (add 'ablation', or all)\n"),
])
@pytest.mark.heavy
def test_cli_bad_methods_is_one_line_exit_2_and_no_output(tmp_path, args, message):
    import subprocess
    import sys

    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "attnscope", "analyze", "attribution", str(DEMO),
                           "--model", "debug:bert", "--out", str(out), *args], capture_output=True, text=True)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
    assert not out.exists() or not any(out.rglob("*.json"))


@pytest.mark.heavy
def test_run_switch_runs_after_general_and_reaches_the_report(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "attnscope", "run", "--model", "debug:bert", "--text",
                           str(DEMO), "--general-num-text-examples", "4", "--attribution", str(DEMO),
                           "--attribution-examples", "3", "--attribution-map-examples", "1",
                           "--attribution-methods", "all", "--attribution-ablation", "zero", "--out", str(out), "-q"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = _strict(out / "results" / "attribution.json")
    general = _strict(out / "results" / "general.json")
    labels = {(r["layer"], r["head"]): r["behaviour"] for r in general["clustering"]["rows"]}
    heads = json.loads((out / "tables" / "attribution_heads.json").read_text())
    assert {(r["layer"], r["head"]): r["behaviour"] for r in heads} == labels
    assert "ablation-zero" in data["analyses"] and "ablation-mean" not in data["analyses"]
    assert "attribution_importance.png" in (out / "report.html").read_text()


@pytest.mark.heavy
def test_default_methods_leave_out_ablation_and_say_how_to_run_it(bert_mlm, tmp_path):
    sec = _run("attribution", bert_mlm, tmp_path, {"attribution": DEMO}, attribution_examples=3,
               attribution_map_examples=1)
    data = _strict(tmp_path / "results" / "attribution.json")
    assert data["methods"] == ["importance", "pruning", "rollout", "norms", "value-zeroing"]
    assert not any(k.startswith("ablation") for k in data["analyses"])
    assert not (tmp_path / "tables" / "attribution_ablation.csv").exists()
    note = [n for n in sec.findings if n.startswith("per-head ablation did not run")]
    assert len(note) == 1 and "--attribution-methods all" in note[0]
    # naming the methods is a choice: no note
    sec = _run("attribution", bert_mlm, tmp_path, {"attribution": DEMO}, attribution_examples=3,
               attribution_methods="importance")
    assert not any("ablation" in n for n in sec.findings)


def test_long_methods_announce_their_estimated_time_and_the_option_that_skips_them(
        bert_mlm, tmp_path, monkeypatch, capsys):
    import re

    from attnscope.analyses import example_maps
    from attnscope.families import attribution

    monkeypatch.setattr(attribution, "ANNOUNCE_S", 0.0)  # announce every method, however short
    # the measured rates, fixed: 1 ms per token of a forward pass, 3 ms more with the loss
    def rates(lm, enc, bs, objective=None):
        return 1e-3, 3e-3 if objective is not None else 0.0

    for module in (attribution, example_maps):  # the family's passes, and the example's
        monkeypatch.setattr(module, "seconds_per_token", rates)
    _run("attribution", bert_mlm, tmp_path, {"attribution": DEMO}, attribution_examples=3,
         attribution_methods="ablation,pruning,value-zeroing", ablation="zero")
    lines = capsys.readouterr().err.strip().splitlines()
    data = _strict(tmp_path / "results" / "attribution.json")
    n = len(data["example"]["tokens"])
    got = [re.fullmatch(r"attribution: (.+) takes about (\d+) s \((\d+) forward passes(?: and (\d+) loss "
                        r"passes)? over (\d+) tokens\); --attribution-methods without (\S+) skips it", ln)
           for ln in lines]
    assert all(got), lines
    # 2 layers x 2 heads: zero ablation 1 reference pass + H (L + 1) / 2 = 4 forward passes and
    # 1 + L H = 5 losses; pruning (importance order vs random, 11 fractions of 4 heads: 0 to 4
    # removed) the full pass and 1, 2, 3 heads of each order (the same set in both at most)
    # and all 4: 5 to 8 losses, each pass at most a whole one; value zeroing n + 1 passes, no loss
    names = [(m[1], m[6]) for m in got]
    assert names == [("zero ablation", "ablation"), ("pruning", "pruning"), ("value zeroing", "value-zeroing")]
    (abl, prune, vz), tokens = got, int(got[0][5])
    assert (int(abl[3]), int(abl[4])) == (4, 5)
    assert int(abl[2]) == round(tokens * (4 * 1e-3 + 5 * 3e-3))
    assert 5 <= int(prune[4]) <= 8 and int(prune[3]) <= int(prune[4]) and int(prune[5]) == tokens
    assert (int(vz[3]), vz[4], int(vz[5]), int(vz[2])) == (n + 1, None, n, round(n * (n + 1) * 1e-3))


def test_a_stale_general_results_file_is_not_read(bert_mlm, tmp_path):
    """Labels come from the general family of the same job (Context.results), never from a
    results/general.json that happens to be in the output folder."""
    _run("general", bert_mlm, tmp_path, {"text": DEMO}, num_text_examples=8)
    assert (tmp_path / "results" / "general.json").exists()
    sec = _run("attribution", bert_mlm, tmp_path, {"attribution": DEMO}, attribution_examples=3,
               attribution_map_examples=1, attribution_methods="importance")
    heads = json.loads((tmp_path / "tables" / "attribution_heads.json").read_text())
    assert all("behaviour" not in r for r in heads)
    assert not any("(" in f for f in sec.findings if f.startswith("most important heads"))


def test_analyze_attribution_alone_has_no_labels_despite_a_stale_file(tmp_path):
    from attnscope.pipeline import run_family

    stale = {"attnscope_result": 1, "family": "general", "analysis": "general",
             "clustering": {"rows": [{"layer": 0, "head": 0, "behaviour": "stale"}]}}
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "general.json").write_text(json.dumps(stale))
    run_family("attribution", {"attribution": DEMO}, tmp_path, model="debug:gpt2", max_seq_len=64,
               batch_size=4, attribution_examples=3, attribution_methods="importance")
    heads = json.loads((tmp_path / "tables" / "attribution_heads.json").read_text())
    assert len(heads) == 4 and all("behaviour" not in r for r in heads)


def test_run_order_puts_used_families_first_and_keeps_the_rest():
    from attnscope.pipeline import run_order

    load_families()
    general, attribution, patterns = (FAMILIES[k]() for k in ("general", "attribution", "patterns"))
    assert FAMILIES["attribution"].uses == ("general",)
    # report order would run attribution before general: the pipeline runs general first
    got = run_order([attribution, patterns, general])
    assert [f.key for f in got] == ["general", "attribution", "patterns"]
    assert [f.key for f in run_order([patterns, attribution])] == ["patterns", "attribution"]
    assert [f.key for f in run_order([general, patterns, attribution])] == ["general", "patterns", "attribution"]


def test_agreement_runs_on_the_first_map_examples_that_fit(debug_gpt2, tmp_path):
    """A too-long example among the first ones is skipped (and counted) by every pass; the
    agreement pass still gets attribution_map_examples examples, with their own indices."""
    long = " ".join(["word"] * 200)
    path = tmp_path / "ex.json"
    path.write_text(json.dumps([{"text": long}] + [{"text": f"the cat number {i} sat down"} for i in range(4)]))
    _run("attribution", debug_gpt2, tmp_path / "out", {"attribution": path}, attribution_examples=5,
         attribution_map_examples=2, attribution_methods="rollout")
    data = _strict(tmp_path / "out" / "results" / "attribution.json")
    assert data["examples"] == 4
    line_saying(data["notes"], "1 examples", "64 tokens", "skipped")
    assert data["analyses"]["attribution-agreement"]["meta"]["examples"] == 2
