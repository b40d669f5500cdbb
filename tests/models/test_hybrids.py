"""Hybrid models (issue 56): attention in only some layers, the others Mamba or linear attention.

Their heads are named by the model's own layer index, the layers without attention are left out
of every array, and each hybrid transformers ships loads with its cache off.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnscope.data.records import HeadId, layer_numbering
from attnscope.errors import AttnscopeError
from attnscope.models import load_model
from attnscope.models.forward import forward, pad_batch
from attnscope.models.tiny import ATTENTION_TYPES

torch = pytest.importorskip("torch")


# model type -> the model's own index of its one attention layer once shrunk to two layers (the
# first kind of layer it has, then attention), and whether its code runs through AttentionInterface
# (all hooked: their classes turn custom attention functions down, but their attention modules
# look the function up by the config's name, so attnscope names its own there; maps only before)
HYBRIDS = {
    "qwen3_next": (1, True),  # gated DeltaNet, then full attention
    "jamba": (1, True),  # Mamba, then attention: "returned no attention" before (no attention layer kept)
    "bamba": (1, True),  # Mamba 2: a shape error before (its Mamba heads were not shrunk)
    "nemotron_h": (1, True),
    "kimi_linear": (1, True),
    "olmo_hybrid": (1, True),
    "granitemoehybrid": (1, True),  # "attention ran 1 times for 2 layers" before
}


@pytest.fixture(scope="module", params=sorted(HYBRIDS))
def hybrid(request):
    return request.param, load_model(f"debug:{request.param}")


def test_a_hybrid_has_attention_where_its_modules_say_and_its_maps_are_transformers_own(hybrid):
    name, lm = hybrid
    own, hooks = HYBRIDS[name]
    facts = lm.facts
    assert (facts.kind, facts.layers, facts.attention_layers, facts.hooks) == ("causal", 2, (own,), hooks)
    assert "hybrid" in facts.mechanisms and lm.num_layers == 1 and lm.layer_name(0) == own + 1
    # the layer the config calls attention (the other is Mamba / linear attention) is that one
    types = lm.model.config.layer_types
    assert [i for i, t in enumerate(types) if t in ATTENTION_TYPES] == [own] and len(types) == 2
    ids = lm.tokenizer("the cat sat on the mat")["input_ids"]
    out = forward(lm, pad_batch(lm, [ids]), attentions=True)
    with torch.inference_mode():  # transformers' own eager attention, without attnscope's function
        lm.model.config._attn_implementation = "eager"
        try:
            eager = lm.model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False).attentions
        finally:
            lm.model.config._attn_implementation = "attnscope" if hooks else "eager"
    eager = [a for a in eager if a is not None]
    assert len(out.attentions) == len(eager) == 1
    assert torch.equal(out.attentions[0], eager[0])  # exactly: the same eager code


def test_a_hooked_hybrids_sites_count_attention_layers_and_know_the_models_own_index():
    lm = load_model("debug:granitemoehybrid")
    seen = []
    forward(lm, pad_batch(lm, [[1, 5, 6, 7]]), hooks={"q": lambda site, q: seen.append((site.layer, site.model_layer))})
    assert seen == [(0, 1)]


def test_heads_are_named_by_the_models_own_layer_everywhere_a_run_names_them(tmp_path):
    from attnscope.pipeline.run import run_family
    from attnscope.views import head_page

    lm = load_model("debug:granitemoehybrid")
    text = tmp_path / "doc.txt"
    text.write_text("the cat sat on the mat. the dog ran to the old house, and she said it was red.\n")
    run_family("general", {"text": text}, tmp_path / "out", model=lm)
    results = json.loads((tmp_path / "out" / "results" / "general.json").read_text())
    assert results["model"]["attention"]["attention_layers"] == [1]  # what a reader names heads by
    heads = results["tables"]["general_heads"]
    assert {r["name"] for r in heads} == {f"2-{h + 1}" for h in range(4)}  # layer 2 of the model: 0 is Mamba
    assert [r["name"] for r in results["tables"]["general_layers"]] == ["2"]
    payload, _ = head_page(tmp_path / "out", "2-3", example_pages=False)
    assert "2-3" in json.dumps(payload)
    from attnscope.views import results_payload

    assert results_payload(tmp_path / "out")["layer_numbers"] == [2]  # the results pages' menus and grids
    with pytest.raises(AttnscopeError, match=r"layer 1 has no attention \(the layers with attention are 2\)"):
        head_page(tmp_path / "out", "1-1", example_pages=False)


def test_layer_numbering_by_hand():
    assert str(HeadId(0, 0)) == "1-1"  # no model: layer i is the model's layer i
    with layer_numbering([3, 7, 11]):
        assert [str(HeadId(i, 1)) for i in range(3)] == ["4-2", "8-2", "12-2"]
        assert HeadId.parse("12-2") == HeadId(2, 1)
        with pytest.raises(ValueError, match="layer 5 has no attention"):
            HeadId.parse("5-1")
    assert HeadId.parse("12-2") == HeadId(11, 1)  # outside the block: as before


def test_a_local_folder_loads_without_transformers_load_report(tmp_path, capfd):
    """A Qwen3 causal-LM checkpoint read as the base model: its lm_head is unexpected, which
    transformers prints as a multi-line LOAD REPORT table; attnscope says nothing, and names in
    one warning the weights that start random when the checkpoint lacks some."""
    import transformers

    from attnscope.models.tiny import tiny_config

    tok = load_model("debug:llama").tokenizer
    torch.manual_seed(0)
    full = transformers.Qwen3ForCausalLM(tiny_config("qwen3", len(tok)))
    full.save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    capfd.readouterr()
    lm = load_model(str(tmp_path / "lm"))
    assert lm.facts.kind == "causal"
    err = capfd.readouterr().err
    assert "LOAD REPORT" not in err and "UNEXPECTED" not in err, err
    state = full.model.state_dict()
    del state["norm.weight"]  # a checkpoint without the final norm
    transformers.Qwen3Model(full.config).save_pretrained(tmp_path / "part", state_dict=state)
    tok.save_pretrained(tmp_path / "part")
    with pytest.warns(UserWarning, match=r"1 weights of the model are not in the checkpoint and start random \(norm.weight\)"):
        load_model(str(tmp_path / "part"))
    assert "LOAD REPORT" not in capfd.readouterr().err


@pytest.mark.parametrize("model_type", ["phi", "glm", "qwen3", "olmo2", "stablelm"])
def test_partial_rotary_and_qk_norm_happen_before_the_hook(model_type):
    """Phi, GLM and StableLM rotate part of each head (partial rotary), Qwen3 normalises q and k per
    head, OLMo 2 normalises the whole projections: the hook's q and k are what the softmax reads,
    so softmax(q k^T scale + mask) from them is the model's own eager map, and they are not the
    raw projections. A model outside AttentionInterface has no hook point and is said so."""
    from attnscope.models.forward import supports_hooks

    lm = load_model(f"debug:{model_type}")
    rope = getattr(lm.model.config, "rope_parameters", None) or {}
    assert model_type in ("qwen3", "olmo2") or rope.get("partial_rotary_factor", 1) < 1  # what is tested
    if not supports_hooks(lm):
        with pytest.raises(AttnscopeError, match="AttentionInterface"):
            forward(lm, pad_batch(lm, [[1, 5, 6]]), hooks={"q": lambda site, q: None})
        return
    ids = lm.tokenizer("the cat sat on the mat and the dog ran")["input_ids"]
    got, raw = [], []
    attention = [m for m in lm.model.modules() if hasattr(m, "q_proj") and getattr(m, "layer_idx", None) == 0]
    handle = attention[0].q_proj.register_forward_hook(lambda m, i, o: raw.append(o.detach()))
    try:
        out = forward(lm, pad_batch(lm, [ids]), attentions=True,
                      hooks={"q": lambda site, q: got.append((site.query, site.key, site.scaling, site.mask))})
    finally:
        handle.remove()
    q, k, scaling, mask = got[0]
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = (q.double() @ k.double().transpose(-1, -2)) * scaling + mask.double()
    mine = torch.softmax(s, -1)[0]
    theirs = out.attentions[0][0].double()
    n = len(ids)
    # float32 q, k of size d: each score carries rounding up to eps32 d |q||k| scale, and a softmax
    # weight moves by at most twice its row's largest score change (dp_i = p_i (ds_i - sum_j p_j ds_j))
    bound = 2 * np.finfo(np.float32).eps * q.shape[-1] * float((q.abs().max() * k.abs().max()) * scaling)
    assert float((mine - theirs).abs().max()) <= bound
    heads = q.shape[1]
    projected = raw[0][0].view(n, heads, -1).transpose(0, 1)  # the raw projection, per head
    assert not torch.allclose(projected.float(), q[0].float())  # rotary / norm changed it before the hook


@pytest.mark.parametrize("name", ["granitemoehybrid", "jamba"])
def test_a_hybrids_layer_runs_from_its_cached_input_are_the_whole_models_exactly(name):
    # value zeroing and ablation run one attention layer (and what follows) from its input in an
    # earlier pass: a hybrid's input of attention layer 0 is the model's hidden_states[1] (layer
    # 1 of the model: 0 is Mamba). A batch of one each way: the same operations, so equal exactly
    # (refused before: "found 2 transformer layers for 1")
    from attnscope.analyses.ablation import AblationEffect
    from attnscope.analyses.lm_objective import Objective, encode_examples
    from attnscope.analyses.value_zeroing import value_zeroing
    from attnscope.data.records import Example

    lm = load_model(f"debug:{name}", mlm_head=True)
    texts = [Example(text="the cat sat on the mat and the dog ran"), Example(text="one two three four five")]
    enc, _ = encode_examples(lm, texts)
    one = value_zeroing(lm, enc[0], batched=False)
    assert np.array_equal(value_zeroing(lm, enc[0], pass_copies=1), one) and one.max() > 0.05
    got = {}
    for batched in (False, True):
        ab = AblationEffect(Objective(lm, seed=0), mode="zero", batch_size=1, batched=batched, pass_sequences=1)
        ab.update(enc)
        got[batched] = ab.finalize().arrays["loss_change"]
    assert np.array_equal(got[True], got[False]) and np.abs(got[False]).max() > 1e-3


@pytest.mark.parametrize("name", ["qwen3_next", "jamba"])
def test_a_hybrids_streaming_statistics_equal_its_maps(name):
    # the streaming engine inside the one attention layer (refused before: "does not route
    # attention through AttentionInterface")
    from attnscope.analyses.longctx import LongContextStats
    from attnscope.engines.streaming import stream_stats
    from tests.engines.test_longctx import _docs, assert_close, reference, stats_bound

    lm = load_model(f"debug:{name}")
    seqs, targets = _docs(lm)
    st = LongContextStats(js_rows=3)
    stream_stats(lm, seqs, st, chunk=4, batch_size=2, targets=targets, backend="tiles")
    assert_close(st.means(), reference(lm, seqs, targets, js_rows=3), stats_bound(seqs))


def test_view_layer_is_the_models_own_layer_on_a_hybrids_store(tmp_path, capsys):
    # the store holds the one attention layer, the model's layer 2: --layer 2 drew it (before:
    # "out of range", --layer 1 drew it), --layer 1 is Mamba, --layer 3 past the model's layers
    from attnscope.cli.main import main

    data = tmp_path / "one.jsonl"
    data.write_text('{"text": "the cat sat on the mat"}\n')
    assert main(["extract", str(data), "--model", "debug:granitemoehybrid", "--out", str(tmp_path / "s")]) == 0
    assert main(["view", str(tmp_path / "s"), "--layer", "2", "--out", str(tmp_path / "v.html")]) == 0
    assert '"layer_numbers":[2]' in (tmp_path / "v.html").read_text()  # (compact JSON)
    capsys.readouterr()
    for layer, why in (("1", "--layer 1: has no attention (the layers with attention are 2)"),
                       ("3", "--layer 3: out of range (the model's layers with attention are 2)")):
        assert main(["view", str(tmp_path / "s"), "--layer", layer, "--out", str(tmp_path / "w.html")]) == 2
        assert capsys.readouterr().err.strip() == f"error: {why}"
        assert not (tmp_path / "w.html").exists()


def test_a_model_routed_by_its_configs_name_with_a_one_row_mask_streams_as_its_maps():
    # LayoutLM: its class turns custom attention functions down, its modules look them up by
    # name (so attnscope's is named there, after a probe shows the maps stay exact), and it hands
    # a [B 1 1 T] padding mask: the tiles sliced its row dimension to nothing and flex indexed
    # past it (both "not built" in the matrix before); the one-pass kernel (under Triton's
    # interpreter here) stepped the mask's rows by the stride of its size-1 axis: 0.35 off
    from attnscope.analyses.longctx import LongContextStats
    from attnscope.engines import backends
    from attnscope.engines.streaming import maps_update, stream_stats
    from attnscope.models.forward import supports_hooks
    from tests.engines.test_longctx import TEXTS, assert_close, stats_bound

    lm = load_model("debug:layoutlm")
    assert supports_hooks(lm) and not type(lm.model)._supports_attention_backend
    ids = [lm.tokenizer(t)["input_ids"] for t in TEXTS]
    assert len({len(i) for i in ids}) > 1  # a padded batch
    want = LongContextStats(js_rows=2, causal=False)
    maps_update(lm, ids, want, batch_size=3)
    for backend in ("tiles", "flex", *(["onepass"] if backends.usable("onepass", "cpu") else [])):
        got = LongContextStats(js_rows=2, causal=False)
        stream_stats(lm, ids, got, batch_size=2, backend=backend)
        assert_close(got.means(), want.means(), stats_bound(ids))


def test_an_encoder_decoder_is_not_routed_by_its_configs_name():
    # T5's modules look the function up by name too, but its encoder, decoder and cross calls
    # are no one stack of layers: it keeps eager attention (hooks refused in one line)
    lm = load_model("debug:t5")
    assert lm.model.config._attn_implementation == "eager" and not lm.facts.hooks


def test_a_callers_hybrid_in_training_mode_is_hooked_and_given_back_in_training_mode():
    """``borrowed`` puts the model in eval mode before the routing probe: with dropout on, the
    probe's two passes would differ and a caller's hybrid fresh from training would get maps only."""
    from attnscope.models.forward import supports_hooks
    from attnscope.models.loading import borrowed
    from attnscope.models.tiny import build_tiny

    tokenizer = load_model("debug:jamba").tokenizer
    model = build_tiny("jamba", tokenizer)
    model.config.attention_dropout = 0.5
    for module in model.modules():  # (the dropout rate each attention module read at build)
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.5
    model.train()
    with borrowed(model, tokenizer) as lm:
        assert supports_hooks(lm) and not model.training
    assert model.training
