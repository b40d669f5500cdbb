"""Attribution analyses: hand-worked rollout and flow, importance vs finite differences, ablation,
the norm identity on tiny BERT / RoBERTa / GPT-2 / Llama (GQA), value zeroing vs a brute force."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import softmax_bound, sum_bound, weights_tolerance

from attnscope.analyses.ablation import (
    AblationEffect,
    HeadMeans,
    PruningCurve,
    importance_order,
    random_order,
)
from attnscope.analyses.agreement import AttributionAgreement, spearman
from attnscope.analyses.importance import HeadImportance, gate_gradients, normalise_per_layer
from attnscope.analyses.lm_objective import Objective, encode_examples, loss_inputs
from attnscope.analyses.norms import NormDecomposer, NormShares, example_norm_maps
from attnscope.analyses.rollout import attention_flow, attention_rollout, residual_attention
from attnscope.analyses.value_zeroing import value_zeroing
from attnscope.data.records import Example
from attnscope.errors import AttnscopeError
from attnscope.models.forward import forward, pad_batch

TEXTS = [Example(text="the cat sat on the mat"),
         Example(text="she saw a big red house", text_pair="the dog ran to the man"),
         Example(text="he said it was not there")]


@pytest.fixture(scope="module")
def bert_mlm():
    from attnscope.models import load_model

    lm = load_model("debug:bert", mlm_head=True)
    lm.model.double()
    return lm


@pytest.fixture(scope="module")
def gpt2_64():
    from attnscope.models import load_model

    lm = load_model("debug:gpt2")
    lm.model.double()
    return lm


@pytest.fixture(scope="module")
def tiny_llama(debug_gpt2):
    """A 2-layer Llama with grouped-query attention (4 query heads, 2 key/value heads) and biases."""
    import transformers

    from attnscope.models.families import ModelFamily
    from attnscope.models.forward import install
    from attnscope.models.loading import LoadedModel

    tok = debug_gpt2.tokenizer
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                   max_position_embeddings=128, attention_bias=True,
                                   tie_word_embeddings=True)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # random biases, so that the bias bookkeeping is exercised
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    assert install(model)
    return LoadedModel(model=model, tokenizer=tok, family=ModelFamily("llama", None, False),
                       name="tiny-llama", source="test", weights_hash="-")


# -- rollout and flow -----------------------------------------------------------------------
# Layer 1 swaps tokens 0 and 1, layer 2 swaps tokens 0 and 2 (one head each). With the residual
# (0.5 A + 0.5 I): A~1 = [[.5 .5 0] [.5 .5 0] [0 0 1]], A~2 = [[.5 0 .5] [0 1 0] [.5 0 .5]].
HAND = np.array([[[[0, 1, 0], [1, 0, 0], [0, 0, 1]]],
                 [[[0, 0, 1], [0, 1, 0], [1, 0, 0]]]], dtype=float)  # [L=2 H=1 3 3]


def test_rollout_by_hand():
    # R = A~2 A~1: row 0 = .5 [.5 .5 0] + .5 [0 0 1]; row 1 = [.5 .5 0]; row 2 = row 0
    expected = [[0.25, 0.25, 0.5], [0.5, 0.5, 0.0], [0.25, 0.25, 0.5]]
    np.testing.assert_allclose(attention_rollout(HAND), expected, atol=1e-12)


def test_flow_by_hand():
    # From (2,0): .5 to (1,0), which passes .5 to each of inputs 0 and 1; .5 to (1,2) -> input 2
    # (capacity 1). From (2,1): 1 to (1,1), which passes .5 to inputs 0 and 1, none to 2.
    expected = [[0.5, 0.5, 0.5], [0.5, 0.5, 0.0], [0.5, 0.5, 0.5]]
    np.testing.assert_allclose(attention_flow(HAND), expected, atol=1e-12)
    np.testing.assert_allclose(attention_flow(HAND, rows=[2, 1]), [expected[2], expected[1]], atol=1e-12)


def test_residual_forms_agree_and_heads_are_averaged():
    rng = np.random.default_rng(0)
    a = rng.random((3, 2, 4, 4))
    a /= a.sum(-1, keepdims=True)
    mixed = residual_attention(a)
    np.testing.assert_allclose(mixed, 0.5 * a.mean(1) + 0.5 * np.eye(4), atol=1e-12)
    np.testing.assert_allclose(attention_rollout(a).sum(-1), 1.0, atol=1e-12)


def test_flow_refuses_long_inputs():
    a = np.full((1, 1, 5, 5), 0.2)
    with pytest.raises(AttnscopeError, match="limited to 4 tokens"):
        attention_flow(a, max_tokens=4)


def test_spearman_hand_and_constant():
    assert spearman(np.array([1.0, 2, 3]), np.array([10.0, 20, 30])) == pytest.approx(1.0)
    assert spearman(np.array([1.0, 2, 3]), np.array([3.0, 2, 1])) == pytest.approx(-1.0)
    assert np.isnan(spearman(np.array([1.0, 1, 1]), np.array([1.0, 2, 3])))


# -- importance -----------------------------------------------------------------------------
def test_per_example_gates_match_single_runs(debug_bert):
    lm = debug_bert
    seqs = [lm.tokenizer("the cat sat on the mat")["input_ids"], lm.tokenizer("a dog")["input_ids"]]
    g = torch.rand(2, lm.num_layers, lm.num_heads, generator=torch.Generator().manual_seed(0))
    both = forward(lm, pad_batch(lm, seqs), gates=g).output.last_hidden_state
    for b, s in enumerate(seqs):
        alone = forward(lm, pad_batch(lm, [s]), gates=g[b]).output.last_hidden_state[0]
        # padded or alone, each layer's attention output (a weighted mean over the n keys) is summed
        # in another order: eps n of the hidden states' size, a layer
        bound = lm.num_layers * sum_bound(len(s), float(alone.abs().max()))
        torch.testing.assert_close(both[b, :len(s)], alone, atol=bound, rtol=0)


@pytest.mark.parametrize("fixture", ["bert_mlm", "gpt2_64"])
def test_importance_equals_finite_differences(fixture, request):
    lm = request.getfixturevalue(fixture)
    obj = Objective(lm, seed=3)
    enc, _ = encode_examples(lm, TEXTS[:2])
    xs = loss_inputs(obj, enc)
    grads = gate_gradients(obj, xs)  # [B L H]
    eps = 1e-6
    for b in range(2):
        for layer in range(lm.num_layers):
            for head in range(lm.num_heads):
                up = torch.ones(lm.num_layers, lm.num_heads, dtype=torch.float64)
                down = up.clone()
                up[layer, head] += eps
                down[layer, head] -= eps
                fd = (obj.run([xs[b]], gates=up).loss[0] - obj.run([xs[b]], gates=down).loss[0]) / (2 * eps)
                assert float(fd) == pytest.approx(grads[b, layer, head], rel=1e-5, abs=1e-9)


def test_importance_is_mean_abs_gradient_normalised_and_batching_invariant(bert_mlm):
    obj = Objective(bert_mlm, seed=1)
    enc, _ = encode_examples(bert_mlm, TEXTS)
    grads = gate_gradients(obj, loss_inputs(obj, enc))
    whole = HeadImportance(obj, batch_size=3)
    whole.update(enc)
    parts = [HeadImportance(obj, batch_size=1) for _ in enc]
    for p, e in zip(parts, enc):
        p.update([e])
    merged = parts[0].merge(parts[1]).merge(parts[2])
    a, b = whole.finalize(), merged.finalize()
    raw = np.abs(grads).mean(0)
    np.testing.assert_allclose(a.arrays["importance_raw"], raw, rtol=1e-9)
    np.testing.assert_allclose(b.arrays["importance_raw"], raw, rtol=1e-9)
    np.testing.assert_allclose(np.linalg.norm(a.arrays["importance"], axis=1), 1.0)
    assert normalise_per_layer(np.array([[3.0, 4.0]])).tolist() == [[0.6, 0.8]]
    assert {r["rank"] for r in a.tables["head_importance"]} == set(range(1, 5))


def _context_dots(lm, examples) -> list[np.ndarray]:
    """Michel et al.'s quantity, by torch autograd on the plain model: per example ``[n L H]``,
    ``<dL/d ctx_t, ctx_t>`` for each head's slice of the input of GPT-2's ``c_proj`` (the heads'
    outputs), with ``L`` the mean next-token cross-entropy, logits from the tied embeddings."""
    H = lm.num_heads
    out = []
    for e in examples:
        ctx = []
        hooks = [blk.attn.c_proj.register_forward_pre_hook(lambda m, a, ctx=ctx: ctx.append(a[0]))
                 for blk in lm.model.h]
        try:
            with torch.enable_grad():
                ids = torch.tensor([e.input_ids])
                hidden = lm.model(input_ids=ids).last_hidden_state[0]  # [n D]
                logits = hidden @ lm.model.wte.weight.T
                loss = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:])
                grads = torch.autograd.grad(loss, ctx)
        finally:
            for h in hooks:
                h.remove()
        n = len(e.input_ids)
        dots = [(g[0] * c[0]).reshape(n, H, -1).sum(-1).detach().numpy() for g, c in zip(grads, ctx)]
        out.append(np.stack(dots, axis=1))  # [n L H]
    return out


def test_importance_released_norm_is_abs_per_token_over_tokens(gpt2_64):
    obj = Objective(gpt2_64)
    enc, _ = encode_examples(gpt2_64, TEXTS)
    dots = _context_dots(gpt2_64, enc)
    released = sum(np.abs(d).sum(0) for d in dots) / sum(len(d) for d in dots)  # abs per token
    paper = sum(np.abs(d.sum(0)) for d in dots) / len(dots)  # abs per example
    got = {}
    for norm in ("paper", "released"):
        imp = HeadImportance(obj, batch_size=2, norm=norm)  # padded batches of 2 and 1
        imp.update(enc)
        got[norm] = imp.finalize()
        assert got[norm].params["norm"] == norm
        assert got[norm].meta["tokens"] == sum(len(e) for e in enc)
    np.testing.assert_allclose(got["released"].arrays["importance_raw"], released, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got["paper"].arrays["importance_raw"], paper, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got["released"].arrays["importance"], normalise_per_layer(released), rtol=1e-9)
    # the option matters here: the per-layer normalised scores differ by more than rounding
    diff = np.abs(got["released"].arrays["importance"] - got["paper"].arrays["importance"]).max()
    assert diff > 1e-2, diff
    merged = HeadImportance(obj, norm="released")
    merged.update(enc[:1])
    rest = HeadImportance(obj, norm="released")
    rest.update(enc[1:])
    np.testing.assert_allclose(merged.merge(rest).finalize().arrays["importance_raw"], released, rtol=1e-9)
    with pytest.raises(ValueError, match="cannot merge"):
        HeadImportance(obj, norm="paper").merge(HeadImportance(obj, norm="released"))
    with pytest.raises(ValueError, match="norm must be one of paper, released"):
        HeadImportance(obj, norm="code")


def test_objective_refuses_encoder_without_head(debug_bert):
    from attnscope.errors import ModelError

    with pytest.raises(ModelError, match="no masked-LM head"):
        Objective(debug_bert)


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_objective_run_scores_each_example_alone(kind, gpt2_64, bert_mlm):
    # One padded batch, the scored rows of all its examples through the vocabulary in one
    # product: each example's loss and hit count must be those of that example run alone through
    # the plain model, position by position. GPT-2 (tied embeddings, gathered rows, float64) and
    # BERT with its own masked-LM head (logits of every position); a 1-token GPT-2 example has
    # nothing to predict: loss 0, no positions.
    lm = gpt2_64 if kind == "gpt2" else bert_mlm
    obj = Objective(lm, seed=0)
    examples = TEXTS + ([Example(text="a")] if kind == "gpt2" else [])
    enc, _ = encode_examples(lm, examples)
    inputs = loss_inputs(obj, enc)
    out = obj.run(inputs)
    assert out.loss.shape == (len(inputs),)
    for b, x in enumerate(inputs):
        ids = torch.tensor([x.input_ids])
        with torch.no_grad():
            logits = (lm.model(input_ids=ids).last_hidden_state[0] @ lm.model.wte.weight.T if kind == "gpt2" else
                      lm.model(input_ids=ids, token_type_ids=torch.tensor([x.token_type_ids])).logits[0])
        if x.positions.size == 0:
            assert float(out.loss[b]) == 0.0 and out.scored[b] == 0 and out.correct[b] == 0
            continue
        rows, tgt = logits[x.positions], torch.as_tensor(x.targets)
        want = torch.nn.functional.cross_entropy(rows.double(), tgt)
        assert float(out.loss[b]) == pytest.approx(float(want), rel=1e-5 if kind == "bert" else 1e-10)
        assert out.scored[b] == x.positions.size
        assert out.correct[b] == int((rows.argmax(-1) == tgt).sum())
    assert any(x.positions.size == 0 for x in inputs) == (kind == "gpt2")


# -- ablation -------------------------------------------------------------------------------
def test_zero_ablation_equals_removing_the_heads_value_weights(bert_mlm):
    import copy

    obj = Objective(bert_mlm, seed=0)
    enc, _ = encode_examples(bert_mlm, TEXTS)
    abl = AblationEffect(obj, mode="zero", batch_size=2)
    abl.update(enc)
    res = abl.finalize()
    xs = loss_inputs(obj, enc)
    base = obj.run(xs).loss.mean().item()
    assert res.meta["base_loss"] == pytest.approx(base, rel=1e-10)
    d = bert_mlm.model.config.hidden_size // bert_mlm.num_heads
    for layer, head in [(0, 1), (1, 0)]:
        lm2 = copy.copy(bert_mlm)
        lm2.model = copy.deepcopy(bert_mlm.model)
        value = lm2.model.bert.encoder.layer[layer].attention.self.value
        with torch.no_grad():
            value.weight[head * d:(head + 1) * d] = 0
            value.bias[head * d:(head + 1) * d] = 0
        removed = Objective(lm2, seed=0).run(xs).loss.mean().item()
        assert res.arrays["loss_change"][layer, head] == pytest.approx(removed - base, rel=1e-8, abs=1e-12)


def test_mean_ablation_with_zero_means_is_zero_ablation(bert_mlm):
    obj = Objective(bert_mlm, seed=0)
    enc, _ = encode_examples(bert_mlm, TEXTS)
    zero = AblationEffect(obj, mode="zero")
    zero.update(enc)
    mean0 = AblationEffect(obj, mode="mean", means=np.zeros((2, 2, 16)))
    mean0.update(enc)
    np.testing.assert_allclose(mean0.finalize().arrays["loss_change"],
                               zero.finalize().arrays["loss_change"], atol=1e-12)


def test_head_means_ignore_padding_and_merge(bert_mlm):
    enc, _ = encode_examples(bert_mlm, TEXTS)
    together = HeadMeans(bert_mlm, batch_size=3)
    together.update(enc)
    apart = [HeadMeans(bert_mlm, batch_size=1) for _ in enc]
    for a, e in zip(apart, enc):
        a.update([e])
    merged = apart[0].merge(apart[1]).merge(apart[2]).finalize()
    np.testing.assert_allclose(together.finalize().arrays["mean"], merged.arrays["mean"], atol=1e-12)
    assert merged.meta["tokens"] == sum(len(e) for e in enc)


def test_pruning_curve_endpoints(gpt2_64):
    obj = Objective(gpt2_64)
    enc, _ = encode_examples(gpt2_64, TEXTS)
    imp = np.array([[0.2, 0.9], [0.5, 0.1]])
    order = importance_order(imp)
    assert order == [(1, 1), (0, 0), (1, 0), (0, 1)]
    curve = PruningCurve(obj, {"importance": order, "random": random_order(2, 2, 0)},
                         fractions=(0.0, 0.5, 1.0), batch_size=2)
    curve.update(enc)
    res = curve.finalize()
    base = obj.run(loss_inputs(obj, enc)).loss.mean().item()
    np.testing.assert_allclose(res.arrays["loss"][:, 0], base, rtol=1e-10)
    assert res.arrays["loss"][0, 2] == pytest.approx(res.arrays["loss"][1, 2])  # all heads gone
    gates = torch.ones(2, 2, dtype=torch.float64)
    gates[1, 1] = gates[0, 0] = 0
    half = obj.run(loss_inputs(obj, enc), gates=gates).loss.mean().item()
    assert res.arrays["loss"][0, 1] == pytest.approx(half, rel=1e-10)
    assert ((res.arrays["accuracy"] >= 0) & (res.arrays["accuracy"] <= 1)).all()
    assert sorted(random_order(3, 4, 7)) == [(i, j) for i in range(3) for j in range(4)]


@pytest.mark.parametrize("model", ["bert", "gpt2"])
def test_pruning_curve_points_equal_their_own_whole_model_passes(model):
    # every point of the curve (one pass per distinct set of removed heads, from its first pruned
    # layer's cached input) against the whole model run with that point's gates; orders whose
    # first heads sit in layer 1 (the cached start) and in layer 0, padded chunks of 2. float32,
    # one thread: measured max |difference| 0.0 (losses 5.084-5.085 for BERT, 6.14-6.15 for GPT-2).
    from attnscope.models import load_model

    lm = load_model(f"debug:{model}", mlm_head=model == "bert")
    enc, _ = encode_examples(lm, PADDED)
    obj = Objective(lm, seed=0)
    heads = [(layer, head) for layer in range(2) for head in range(2)]
    orders = {"late first": heads[::-1], "early first": heads, "mixed": [(1, 0), (0, 1), (1, 1), (0, 0)]}
    fractions = (0.0, 0.25, 0.5, 0.75, 1.0)
    curve = PruningCurve(obj, orders, fractions=fractions, batch_size=2)
    curve.update(enc)
    res = curve.finalize()
    inputs = loss_inputs(obj, enc)
    for o, order in enumerate(orders.values()):
        for f, frac in enumerate(fractions):
            gates = torch.ones(2, 2)
            for layer, head in order[:round(frac * 4)]:
                gates[layer, head] = 0
            outs = [obj.run(inputs[i:i + 2], gates=gates) for i in range(0, len(inputs), 2)]
            want = sum(float(out.loss.double().sum()) for out in outs) / len(inputs)
            assert res.arrays["loss"][o, f] == pytest.approx(want, rel=0, abs=1e-7)
            hits = sum(int(out.correct.sum()) for out in outs) / sum(int(out.scored.sum()) for out in outs)
            assert res.arrays["accuracy"][o, f] == pytest.approx(hits, abs=1e-12)
    # 3 orders x 5 fractions, but none removed and all removed are one set each, and "mixed"
    # removes at 0.75 the heads "late first" does: 10 passes for 15 points
    assert len(curve.plan()) == 10


def _count_work(lm, analysis, encoded) -> tuple[float, float]:
    """(forward passes, loss passes) that ``analysis.update(encoded)`` did, counted: each
    layer's run over a batch of B sequences is B / (L N) forward passes, each loss over B
    sequences B / N loss passes."""
    from attnscope.models.forward import layer_modules

    layers, losses = [0], [0]
    handles = []
    for module in layer_modules(lm):  # the first module with weights runs once per run of its layer
        first = next(m for m in module.modules() if any(True for _ in m.parameters(recurse=False)))
        handles.append(first.register_forward_pre_hook(lambda m, args: layers.__setitem__(
            0, layers[0] + args[0].shape[0])))
    objective, run = analysis.objective, analysis.objective.run

    def counted(inputs, **kwargs):
        losses[0] += len(inputs)
        return run(inputs, **kwargs)

    objective.run = counted
    try:
        analysis.update(encoded)
    finally:
        del objective.run
        for h in handles:
            h.remove()
    n = len(encoded)
    return layers[0] / (lm.num_layers * n), losses[0] / n


@pytest.mark.parametrize("make", ["zero", "one head per pass", "pruning"])
def test_cost_is_the_work_update_does(make, bert_mlm):
    """The cost each long method announces before it starts (:meth:`cost`) is the work its update
    does: layer runs and loss passes counted on the 2-layer, 2-head BERT."""
    enc, _ = encode_examples(bert_mlm, PADDED)
    obj = Objective(bert_mlm, seed=0)
    if make == "pruning":
        heads = [(0, 0), (0, 1), (1, 0), (1, 1)]
        # the full pass; reversed: 1 and 2 heads removed start in layer 1 (half a pass each), 3 in
        # layer 0; in order: 1, 2, 3 in layer 0; all 4 removed is one set for both orders
        analysis = PruningCurve(obj, {"reversed": heads[::-1], "in order": heads},
                                fractions=(0.0, 0.25, 0.5, 0.75, 1.0), batch_size=2)
        want = (1 + 0.5 + 0.5 + 1 + 3 + 1, 1 + 7)
    else:
        analysis = AblationEffect(obj, batch_size=2, pass_sequences=5, batched=make == "zero")
        # 1 + H (L + 1) / 2 and 1 + L H with L = H = 2; one head per whole-model pass: 1 + L H
        want = (4, 5) if make == "zero" else (5, 5)
    assert analysis.cost() == pytest.approx(want)
    assert _count_work(bert_mlm, analysis, enc) == pytest.approx(want)


# -- norms ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fixture", ["debug_bert", "debug_roberta", "debug_gpt2", "tiny_llama"])
def test_norm_identity(fixture, request):
    """sum_h sum_j alpha_ij f(x_j) + b_O = the output projection's output, to 1e-5."""
    lm = request.getfixturevalue(fixture)
    seqs = [lm.tokenizer("the cat sat on the mat")["input_ids"], lm.tokenizer("a big dog")["input_ids"]]
    batch = pad_batch(lm, seqs)
    real = batch.attention_mask.bool()
    layers = NormDecomposer(lm).run(batch, keep_vectors=True, keep_outputs=True)
    assert len(layers) == lm.num_layers
    for ln in layers:
        assert ln.attn.shape[1] == lm.num_heads
        total = torch.einsum("bhij,bhjd->bid", ln.attn, ln.f) + ln.bias
        assert (total - ln.proj_out)[real].abs().max().item() < 1e-5
        torch.testing.assert_close(ln.norms(), ln.attn * ln.f.norm(dim=-1)[:, :, None, :])


def test_norm_shares_first_is_position_zero_on_a_causal_model_without_bos(debug_gpt2):
    """GPT-2 adds no BOS: "first" is the sink at position 0, its weight share the mean over
    heads and rows of the eager maps' column 0 (worked out here from the maps)."""
    enc, _ = encode_examples(debug_gpt2, TEXTS)
    assert not any(e.special[0] for e in enc)
    ns = NormShares(debug_gpt2)
    ns.update(enc)
    got = ns.finalize().arrays["weight_share"][:, 0]
    num, rows = np.zeros(debug_gpt2.num_layers), 0
    for e in enc:
        out = forward(debug_gpt2, pad_batch(debug_gpt2, [e.input_ids], [e.token_type_ids]), attentions=True)
        num += np.array([a[0, :, :, 0].double().sum().item() for a in out.attentions])
        rows += debug_gpt2.num_heads * len(e.input_ids)
    # the mean of a weight of float32 softmax rows, against float64 of the maps'
    np.testing.assert_allclose(got, num / rows, **weights_tolerance(max(len(e.input_ids) for e in enc)))
    assert (got > 0).all()


def test_norm_shares_are_shares(debug_bert):
    enc, _ = encode_examples(debug_bert, TEXTS)
    ns = NormShares(debug_bert)
    ns.update(enc)
    res = ns.finalize()
    # shares of a row (its weights, or its norms over their sum) add up to 1: float32 sums of n terms
    bound = softmax_bound(max(len(e) for e in enc))
    np.testing.assert_allclose(res.arrays["weight_share"].sum(-1), 1.0, atol=bound, rtol=0)
    np.testing.assert_allclose(res.arrays["norm_share"].sum(-1), 1.0, atol=bound, rtol=0)
    maps = example_norm_maps(NormDecomposer(debug_bert), enc[0])
    n = len(enc[0])
    assert maps["weights"].shape == maps["norms"].shape == (2, 2, n, n)
    assert maps["layer_norms"].shape == (2, n, n)
    # ||sum_h v_h|| <= sum_h ||v_h|| (triangle inequality)
    assert (maps["layer_norms"] <= maps["norms"].sum(1) + 1e-9).all()


def test_norm_shares_pool_rows_where_kobayashi_averages_examples(debug_bert):
    """attnscope pools rows over examples; Kobayashi et al.'s re-examine.py averages each example's
    mean over rows. So attnscope = the length-weighted mean of the per-example means: equal to
    theirs when every example has the same length, different otherwise."""
    same = [Example(text="the cat sat on the mat."), Example(text="the dog ran to the house.")]
    other = Example(text="she said, it was not there because he was big and old.")
    lm = debug_bert
    dec = NormDecomposer(lm)

    def per_example(enc):  # [L C] per example: class sums of weights and of norm shares, mean over heads, rows
        w, s, n = [], [], []
        for e in enc:
            t = np.asarray(e.tokens)
            first = t == "[CLS]"
            sep = t == "[SEP]"
            punct = np.isin(t, [".", ","])
            cols = np.stack([first, sep, punct, ~(first | sep | punct)]).astype(float).T  # [n C]
            with torch.inference_mode():
                out = lm.model(input_ids=torch.tensor([e.input_ids]),
                               token_type_ids=torch.tensor([e.token_type_ids]), output_attentions=True)
            attn = np.stack([a[0].double().numpy() for a in out.attentions])  # [L H n n]
            norms = example_norm_maps(dec, e)["norms"]
            share = norms / norms.sum(-1, keepdims=True)
            w.append((attn @ cols).mean((1, 2)))
            s.append((share @ cols).mean((1, 2)))
            n.append(len(e))
        return np.array(w), np.array(s), np.array(n, dtype=float)

    for examples, equal_lengths in ((same, True), (same + [other], False)):
        enc, _ = encode_examples(lm, examples)
        ns = NormShares(lm)
        ns.update(enc)
        res = ns.finalize()
        w, s, n = per_example(enc)
        assert (len(set(n)) == 1) == equal_lengths
        pooled_w = (n[:, None, None] * w).sum(0) / n.sum()
        pooled_s = (n[:, None, None] * s).sum(0) / n.sum()
        # sums of weights of float32 softmax rows (weights_tolerance); a norm share also divides
        # norms |f_j| that are float32 sums of d components, in another pass (eps d, twice)
        wt = weights_tolerance(int(n.max()))
        d = lm.model.config.hidden_size
        np.testing.assert_allclose(res.arrays["weight_share"], pooled_w, **wt)
        np.testing.assert_allclose(res.arrays["norm_share"], pooled_s, **weights_tolerance(int(n.max()), score_error=2 * sum_bound(d)))
        kobayashi = w.mean(0)  # mean over examples of per-example means
        gap = np.abs(res.arrays["weight_share"] - kobayashi).max()
        if equal_lengths:
            assert gap <= wt["rtol"] + wt["atol"]  # the same mean, but for float32 rounding (shares <= 1)
        else:
            assert gap > 1e-3, gap


# -- value zeroing --------------------------------------------------------------------------
def test_value_zeroing_matches_zeroing_the_value_projection(debug_bert):
    lm = debug_bert
    enc, _ = encode_examples(lm, TEXTS[:1])
    e = enc[0]
    n = len(e)
    vz = value_zeroing(lm, e)
    batch = pad_batch(lm, [e.input_ids], [e.token_type_ids])
    for layer in range(lm.num_layers):
        ref = forward(lm, batch, output_hidden_states=True).output.hidden_states[layer + 1][0].double()
        dist = np.zeros((n, n))
        value = lm.model.encoder.layer[layer].attention.self.value
        for j in range(n):
            def zero_j(m, args, out, j=j):
                out = out.clone()
                out[:, j] = 0
                return out
            h = value.register_forward_hook(zero_j)
            try:
                x = forward(lm, batch, output_hidden_states=True).output.hidden_states[layer + 1][0].double()
            finally:
                h.remove()
            dist[:, j] = (1 - torch.nn.functional.cosine_similarity(x, ref, dim=-1)).clamp_min(0).numpy()
        expected = dist / dist.sum(-1, keepdims=True)
        np.testing.assert_allclose(vz[layer], expected, atol=1e-4)


def test_value_zeroing_is_causal_for_decoders_and_refuses_long_inputs(tiny_llama):
    enc, _ = encode_examples(tiny_llama, TEXTS[:1])
    vz = value_zeroing(tiny_llama, enc[0])
    n = len(enc[0])
    assert vz.shape == (2, n, n)
    assert np.abs(np.triu(vz, 1)).max() < 1e-6  # token i never mixes tokens after it
    np.testing.assert_allclose(vz.sum(-1), 1.0, atol=1e-9)
    with pytest.raises(AttnscopeError, match="limited to 3 tokens"):
        value_zeroing(tiny_llama, enc[0], max_tokens=3)


# -- agreement ------------------------------------------------------------------------------
def test_agreement_merges_and_skips_flow_above_limit(bert_mlm):
    obj = Objective(bert_mlm, seed=0)
    enc, _ = encode_examples(bert_mlm, TEXTS)
    whole = AttributionAgreement(obj, rows=2, max_flow_tokens=10)
    whole.update(enc)
    parts = [AttributionAgreement(obj, rows=2, max_flow_tokens=10) for _ in enc]
    for p, e in zip(parts, enc):
        p.update([e])
    merged = parts[0].merge(parts[1]).merge(parts[2])
    a, b = whole.finalize(), merged.finalize()
    np.testing.assert_allclose(a.arrays["spearman"], b.arrays["spearman"], atol=1e-12)
    assert a.meta["flow_skipped"] == sum(len(e) > 10 for e in enc) > 0
    assert all(-1 <= r["spearman"] <= 1 for r in a.tables["agreement"])


# -- contract -------------------------------------------------------------------------------
def _instances(lm):
    obj = Objective(lm, seed=0)
    return {
        "head-importance": lambda: HeadImportance(obj),
        "ablation": lambda: AblationEffect(obj, mode="zero"),
        "head-means": lambda: HeadMeans(lm),
        "pruning-curve": lambda: PruningCurve(obj, {"random": random_order(2, 2, 0)}, fractions=(0.0, 0.5)),
        "norm-shares": lambda: NormShares(lm),
        "attribution-agreement": lambda: AttributionAgreement(obj, rows=1),
    }


@pytest.mark.parametrize("name", ["head-importance", "ablation", "head-means", "pruning-curve",
                                  "norm-shares", "attribution-agreement"])
def test_contract_empty_one_and_json(name, bert_mlm):
    from attnscope.analyses import ANALYSES
    from attnscope.analyses.base import Result
    from attnscope.store.results import dumps

    make = _instances(bert_mlm)[name]
    assert isinstance(make(), ANALYSES[name])
    empty = make().finalize()
    assert empty.summary == ["no examples"] and not empty.arrays
    enc, _ = encode_examples(bert_mlm, TEXTS[:1])
    ids = list(enc[0].input_ids)
    a = make()
    a.update(enc)
    assert enc[0].input_ids == ids  # never mutates its input
    r = a.finalize()
    assert r.arrays
    back = Result.from_json(r.to_json())
    for k in r.arrays:
        np.testing.assert_array_equal(back.arrays[k], r.arrays[k])
    assert a.finalize().to_json() == r.to_json()  # finalize does not change the state
    dumps(r.to_json())  # strict JSON
    with pytest.raises(ValueError):
        a.merge(HeadMeans(bert_mlm) if name != "head-means" else NormShares(bert_mlm))


@pytest.mark.slow
def test_norm_identity_and_cls_finding_on_the_packaged_model(default_model, shared_data):
    """MiniLM: the identity holds, and [CLS] gets far more weight than norm in the middle layers
    (Kobayashi et al.'s finding, measured on 8 WikiText-2 segments)."""
    from attnscope.data.unlabeled import prepare_unlabeled

    lm = default_model
    exs = prepare_unlabeled(shared_data / "wikitext-2" / "valid.sentences.txt", lm.tokenizer,
                            max_seq_len=128, seed=0, num_examples=8)
    enc, _ = encode_examples(lm, exs)
    batch = pad_batch(lm, [e.input_ids for e in enc[:2]], [e.token_type_ids for e in enc[:2]])
    real = batch.attention_mask.bool()
    for ln in NormDecomposer(lm).run(batch, keep_vectors=True, keep_outputs=True):
        total = torch.einsum("bhij,bhjd->bid", ln.attn, ln.f) + ln.bias
        assert (total - ln.proj_out)[real].abs().max().item() < 1e-5
    ns = NormShares(lm)
    ns.update(enc)
    res = ns.finalize()
    w, n = res.arrays["weight_share"][:, 0], res.arrays["norm_share"][:, 0]
    assert (w[1:5] > 3 * n[1:5]).all()


# -- batched value zeroing and ablation (from each layer's cached input) ---------------------
PADDED = TEXTS + [Example(text="a b"), Example(text="one two three four five six seven eight nine")]


@pytest.mark.parametrize("model,dtype,tol", [("bert", "float", 1e-5), ("gpt2", "float", 1e-5),
                                             ("bert", "double", 1e-9), ("gpt2", "double", 1e-9)])
def test_batched_value_zeroing_equals_one_token_at_a_time(model, dtype, tol):
    # each zeroed token alone through the whole model vs 3 zeroed copies per single-layer pass
    # from the cached layer input (3 does not divide n: a short last pass). Measured max
    # |difference|: float32 4.0e-6 (BERT), 5.3e-7 (GPT-2); float64 6e-11, 2e-13. 1 - cos of two
    # nearly equal outputs cancels, so the batch's last-bit rounding shows at 1e-6 in float32.
    from attnscope.models import load_model

    lm = load_model(f"debug:{model}")
    getattr(lm.model, dtype)()
    enc, _ = encode_examples(lm, TEXTS[1:2])
    one = value_zeroing(lm, enc[0], batched=False)
    both = value_zeroing(lm, enc[0], pass_copies=3)
    assert one.shape == (lm.num_layers, len(enc[0]), len(enc[0]))
    np.testing.assert_allclose(both, one, rtol=0, atol=tol)
    assert np.abs(one).max() > 0.05  # not a trivial all-zero map


@pytest.mark.parametrize("model", ["bert", "gpt2"])
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_batched_ablation_equals_one_head_at_a_time(model, mode):
    # examples of different lengths (padding) in chunks of 3; 5 (head, example) variants per
    # batched pass, so passes mix heads and cut chunks. float32 models, one thread; measured max
    # |difference| of the loss changes: 0.0 for both models and modes (loss changes up to
    # 3.4e-4 for BERT, 1.1e-2 for GPT-2). Zero ablation is given means too: it must ignore them.
    from attnscope.models import load_model

    lm = load_model(f"debug:{model}", mlm_head=model == "bert")
    enc, _ = encode_examples(lm, PADDED)
    obj = Objective(lm, seed=0)
    hm = HeadMeans(lm)
    hm.update(enc)
    means = hm.finalize().arrays["mean"]
    got = {}
    for batched in (False, True):
        ab = AblationEffect(obj, mode=mode, means=means, batch_size=3, batched=batched, pass_sequences=5)
        ab.update(enc)
        got[batched] = ab.finalize()
    one, both = got[False].arrays["loss_change"], got[True].arrays["loss_change"]
    assert np.abs(one).max() > 5e-5  # heads matter
    np.testing.assert_allclose(both, one, rtol=0, atol=1e-7)
    assert got[True].meta["base_loss"] == got[False].meta["base_loss"]
