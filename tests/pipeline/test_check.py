"""``attnscope check`` / ``attnscope.check`` (issue 56): every engine and backend that can take a
model against transformers' own eager attention, one table, exit 2 when one disagrees."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from conftest import one_line, says

import attnscope
from attnscope.models import load_model
from tests.cli.test_cli import run

pytest.importorskip("torch")


def test_check_of_a_model_with_sinks_and_a_window_reads_the_model_and_refuses_what_lacks_them(capsys):
    code, out, err = run(capsys, "check", "debug:gpt_oss", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["ok"] and report["attention"]["kind"] == "causal"
    assert report["attention"]["mechanisms"] == ["sinks", "window"]
    rows = {r["what"]: r for r in report["rows"]}
    assert rows["eager maps"]["difference"] == 0.0 and rows["eager maps"]["verdict"] == "exact"
    n = report["tokens"] + 0  # the longest sequence checked: the text, or the repeated sequence (2 x 12 + 1)
    bound = np.finfo(np.float32).eps * max(n, 25) * (1 + math.log(max(n, 25)))
    for name in ("maps", "tiles", "flex"):  # they compute sinks
        assert rows[name]["verdict"] in ("exact", "rounding") and rows[name]["difference"] <= bound
        assert rows[name]["bound"] == pytest.approx(bound)
    assert rows["compiled"]["verdict"] == "refused" and "sinks" in rows["compiled"]["reason"]


def test_check_table_names_what_the_model_is(capsys):
    code, out, _ = run(capsys, "check", "debug:granitemoehybrid")
    assert code == 0
    says(out, "causal", "1 of 2 (2)", "scale, hybrid", "eager maps", "tiles", "rounding")


def test_a_backend_that_misreads_the_scale_disagrees_and_the_command_exits_2(capsys, monkeypatch):
    """A real disagreement: every backend is handed a score scale 5% off the model's (the eager
    reference uses the model's own), as a backend that ignored a model's scale would compute."""
    from attnscope.models import forward as fw

    @dataclasses.dataclass
    class Skewed(fw.Site):
        def __post_init__(self):
            self.scaling *= 1.05

    monkeypatch.setattr(fw, "Site", Skewed)
    code, out, err = run(capsys, "check", "debug:llama")
    assert code == 2 and "Traceback" not in err
    says(one_line(err.strip()), "debug:llama", "maps disagrees with transformers' eager attention")
    assert "DISAGREES" in out  # the table is printed before the line


def test_check_of_the_callers_own_sdpa_model_object_and_of_a_model_outside_attention_interface():
    import transformers

    lm = load_model("debug:llama")
    own = transformers.LlamaModel(lm.model.config.__class__(**{**lm.model.config.to_dict(),
                                                                "_attn_implementation": "sdpa"}))
    own.config._attn_implementation = "sdpa"
    report = attnscope.check(own, lm.tokenizer)
    assert report.ok and own.config._attn_implementation == "sdpa"  # given back as it came
    assert [r.verdict for r in report.rows][:2] == ["exact", "exact"]
    luke = attnscope.check("debug:luke")  # maps only: every backend refused with the reason
    assert luke.ok and luke.rows[0].verdict == "exact"
    assert {r.verdict for r in luke.rows[1:]} == {"refused"}
    assert all("AttentionInterface" in r.reason for r in luke.rows[1:])
    t5 = attnscope.check("debug:t5")  # encoder, decoder and cross attention against transformers'
    assert t5.ok and t5.rows[0].verdict == "exact" and t5.facts.kind == "encoder-decoder"


def test_report_rows_are_frozen_records():
    report = attnscope.check("debug:bert")
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.rows[0].verdict = "exact"
    assert report.facts.kind == "bidirectional" and report.ok


@pytest.mark.slow
@pytest.mark.parametrize("name", ["default", "smollm2"])
def test_the_real_models_here_pass_check(name, request):
    if name == "smollm2":
        request.getfixturevalue("smollm2_file")  # skips, naming what is missing
    report = attnscope.check(name)
    assert report.ok, report.describe()
    assert report.rows[0].verdict == "exact"
    ran = [r for r in report.rows[1:] if r.verdict in ("exact", "rounding")]
    assert {r.what for r in ran} >= {"maps", "tiles"}
    assert report.facts.kind == ("bidirectional" if name == "default" else "causal")


@pytest.mark.slow
def test_a_default_loaded_sdpa_model_object_passes_check():
    """The packaged MiniLM loaded with transformers' defaults (sdpa: no weights returned), as a
    user's own object with its tokenizer."""
    import transformers

    from attnscope.models.loading import packaged_model_dir

    folder = packaged_model_dir()
    model = transformers.AutoModel.from_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert model.config._attn_implementation == "sdpa"
    report = attnscope.check(model, tokenizer)
    assert report.ok and report.rows[0].verdict == "exact", report.describe()
    assert model.config._attn_implementation == "sdpa"


def test_scores_too_large_for_float32_log_sum_exps_run_on_the_tiles_not_into_wrong_numbers():
    # a random MobileBERT's scores reach 2.5e11: a float32 log-sum-exp of that size is rounded by
    # 16,384, so flex's and the one-pass kernel's weights exp(s - L) and masses exp(L_band - L)
    # came out inf and their entropies thousands off (flex: inf, an entropy 1437 off; the one-pass
    # kernel under the interpreter: 3665); those layers now run on the tiles, which shift each
    # row by its largest score first, and say so
    lm = load_model("debug:mobilebert", seed=0)
    with pytest.warns(RuntimeWarning, match=r"flex: some layers' scores are too large .* ran on the tiles"):
        report = attnscope.check(lm)
    rows = {r.what: r for r in report.rows}
    assert report.ok, report.describe()
    assert rows["flex"].verdict in ("exact", "rounding") and rows["flex"].difference <= rows["flex"].bound
    if rows["onepass"].verdict != "unavailable":  # Triton's interpreter (conftest) where Triton is installed
        assert rows["onepass"].difference <= rows["onepass"].bound


def test_what_float32_log_sum_exps_resolve_follows_the_rows_own_rounding():
    import torch

    from attnscope.engines.flex import resolves
    from attnscope.engines.rows import row_rounding

    for n in (1, 8, 4096):
        edge = row_rounding(n) / np.finfo(np.float32).eps  # n (1 + ln n): L's rounding, eps |L|, is the row's
        assert resolves(torch.tensor([[edge * 0.999, -edge * 0.999]]), n)
        assert not resolves(torch.tensor([[1.0, -edge * 1.001]]), n)
    assert resolves(torch.tensor([[float("-inf"), 2.0]]), 8)  # a row with no key: no size
