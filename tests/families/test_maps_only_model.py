"""A model whose attention does not go through transformers' AttentionInterface (DeBERTa v1, whose
disentangled attention no adapter repeats; MPNet was this model until its adapter): the
patterns and attribution families run what its attention maps allow and say in one line what
they skipped. Checked against the same computations on the model's own ``output_attentions``."""

from __future__ import annotations

import html
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import make_map, one_line, says, softmax_bound

from attnscope.errors import AttnscopeError
from attnscope.families import FAMILIES, Context, load_families
from tests.families.test_attribution_family import _run  # a family's prepare + run with a Context

EXAMPLES = [
    {"text": "the cat sat on the mat because it was big"},
    {"text": "the dog ran to the house.", "text_pair": "she saw the dog, then the cat."},
    {"text": "who said that the old man was here?"},
]
#: the maps-only model of these tests
MAPS_ONLY = "debug:luke"
SKIPPED = ("importance", "pruning", "norms", "value-zeroing")  # the default methods that need hooks


@pytest.fixture(scope="module")
def maps_only():
    from attnscope.models import load_model

    lm = load_model(MAPS_ONLY, mlm_head=True)  # the family loads encoders with their head
    from attnscope.models.forward import supports_hooks

    assert not supports_hooks(lm)
    return lm


@pytest.fixture
def examples_file(tmp_path):
    path = tmp_path / "ex.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in EXAMPLES) + "\n", encoding="utf-8")
    return path


def _own_maps(lm) -> list:
    """Each example's maps from the model's own forward (``output_attentions``), one at a time."""
    import torch

    from attnscope.data.records import Example
    from attnscope.extract.encode import Encoder

    enc = Encoder(lm)
    maps = []
    for i, row in enumerate(EXAMPLES):
        e = enc.encode(Example(**row), i)
        with torch.inference_mode():
            out = lm.model(input_ids=torch.tensor([e.input_ids]), output_attentions=True)
        attn = np.stack([a[0].double().numpy() for a in out.attentions])  # [L H n n]
        maps.append(make_map(attn, e.tokens, special=e.special, segment=e.segment, word_ids=e.word_ids,
                             level="token", index=i, example=e.example))
    return maps


def test_patterns_run_on_the_maps_and_skip_key_concentration(maps_only, examples_file, tmp_path):
    from attnscope.analyses.entropy import Entropy
    from attnscope.analyses.patterns import VigPatterns
    from attnscope.analyses.relative_position import RelativePosition
    from attnscope.analyses.special_tokens import SpecialTokens
    from attnscope.analyses.token_classes import TokenClasser
    from attnscope.extract import AttentionBatch

    sec = _run("patterns", maps_only, tmp_path, {"patterns": examples_file})
    data = json.loads((tmp_path / "results" / "patterns.json").read_text())
    assert data["run"]["examples"] == len(EXAMPLES)
    assert data["keys"] is None
    skipped = [n for n in data["notes"] if "skipped" in n]
    assert len(skipped) == 1 and skipped[0] in sec.findings
    # what was skipped, the model, and why (its attention bypasses AttentionInterface)
    says(one_line(skipped[0]), "key concentration", MAPS_ONLY, "AttentionInterface")

    maps = _own_maps(maps_only)
    bound = softmax_bound(max(m.attn.shape[-1] for m in maps))  # float32 rows, the run's and these
    classer, _ = TokenClasser.for_model(maps_only)
    for a in (VigPatterns(classer, causal=False), SpecialTokens(classer), RelativePosition(),
              Entropy(causal=False)):
        a.update(AttentionBatch(maps))
        got = data["analyses"][a.name]["arrays"]
        for k, v in a.finalize().arrays.items():
            np.testing.assert_allclose(np.array(got[k]["data"], dtype=float), v, atol=bound, rtol=0,
                                       equal_nan=True, err_msg=f"{a.name} {k}")
    # one statistic by hand: mean over examples of the mean row entropy (nats)
    by_hand = np.mean([(-(m.attn * np.log(m.attn)).sum(-1)).mean(-1) for m in maps], axis=0)
    np.testing.assert_allclose(np.array(data["analyses"]["entropy"]["arrays"]["entropy"]["data"]),
                               by_hand, atol=bound, rtol=0)


def test_attribution_runs_rollout_and_flow_on_the_maps(maps_only, examples_file, tmp_path):
    sec = _run("attribution", maps_only, tmp_path, {"attribution": examples_file}, attribution_example=0,
               flow_max_tokens=64)
    data = json.loads((tmp_path / "results" / "attribution.json").read_text())
    assert data["methods"] == ["rollout"]
    assert set(data["analyses"]) == {"attribution-agreement"}
    agreement = data["analyses"]["attribution-agreement"]["tables"]["agreement"]
    assert all(r["rows"] > 0 for r in agreement)  # rollout, flow, raw and saliency all ran
    skipped = [n for n in data["notes"] if "skipped" in n]
    assert len(skipped) == 1 and skipped[0] in sec.findings
    says(one_line(skipped[0]), ", ".join(SKIPPED), MAPS_ONLY, "AttentionInterface", "rollout")

    attn = _own_maps(maps_only)[0].attn.astype(np.float64)  # [L H n n]
    ex = data["example"]
    assert ex["index"] == 0 and ex["norms"] is None and "value_zeroing" not in ex
    bound = softmax_bound(attn.shape[-1])  # weights of float32 rows (the run's pass and this one)
    np.testing.assert_allclose(np.array(ex["weights"]), attn.mean(1), atol=bound, rtol=0)
    # rollout by hand: rownorm(mean_h A_l + I), multiplied last layer first
    n = attn.shape[-1]
    roll = np.eye(n)
    for layer in attn:
        mixed = layer.mean(0) + np.eye(n)
        roll = (mixed / mixed.sum(-1, keepdims=True)) @ roll
    # each layer's rows mix such weights, and the product of row-stochastic matrices adds their errors
    np.testing.assert_allclose(np.array(ex["rollout"]), roll, atol=len(attn) * bound, rtol=0)
    from attnscope.analyses.rollout import attention_flow

    np.testing.assert_allclose(np.array(ex["flow"]), attention_flow(attn, max_tokens=64), atol=len(attn) * bound, rtol=0)


def test_attribution_with_only_hooked_methods_is_refused(maps_only, examples_file, tmp_path):
    load_families()
    fam = FAMILIES["attribution"]()
    opts = fam.Options(attribution_methods="importance,norms")
    with pytest.raises(AttnscopeError) as e:
        fam.prepare({"attribution": examples_file}, opts, Context(model=maps_only, out_dir=tmp_path / "o"))
    # the model, why, the methods chosen, and what does run on it
    says(one_line(e.value), MAPS_ONLY, "AttentionInterface", "attribution_methods importance,norms", "rollout")
    assert e.value.params == ("attribution_methods",)
    assert not (tmp_path / "o").exists()


@pytest.mark.heavy
def test_run_with_both_families_on_a_maps_only_model(examples_file, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "attnscope", "run", "--model", MAPS_ONLY,
                           "--patterns", str(examples_file), "--attribution", str(examples_file),
                           "--attribution-map-examples", "1", "--out", str(out), "-q"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    patterns = json.loads((out / "results" / "patterns.json").read_text())
    attribution = json.loads((out / "results" / "attribution.json").read_text())
    assert patterns["keys"] is None and patterns["run"]["examples"] == len(EXAMPLES)
    assert set(attribution["analyses"]) == {"attribution-agreement"}
    report = html.unescape((out / "report.html").read_text())
    # the notes saying what was skipped are shown in the report
    notes = [n for res in (patterns, attribution) for n in res["notes"] if "skipped" in n]
    assert len(notes) == 2 and all(n in report for n in notes), notes


@pytest.mark.heavy
def test_cli_attribution_with_only_hooked_methods_is_one_line_exit_2(examples_file, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "attnscope", "analyze", "attribution", str(examples_file),
                           "--model", MAPS_ONLY, "--attribution-methods", "norms", "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    says(lines[0], "error: ", "--attribution-methods norms", MAPS_ONLY, "AttentionInterface", "rollout")
    assert not out.exists() or not any(out.rglob("*.json"))


def test_debug_mpnet_is_mpnet_with_its_tokenizer():
    from attnscope.models import load_model

    lm = load_model("debug:mpnet")
    assert type(lm.model).__name__ == "MPNetModel" and lm.family.name == "mpnet"
    ids = lm.tokenizer("the cat", "a dog")["input_ids"]
    assert lm.tokenizer.convert_ids_to_tokens(ids) == ["<s>", "the", "cat", "</s>", "</s>", "a", "dog", "</s>"]
