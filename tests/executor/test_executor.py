"""The pipeline's one loop (``attnscope.executor.run_pass``): an encoded analysis that reads the
forward pass through hook points gives the same result riding on the maps pass, alone (its own
pass, no maps made), and fed encoded examples directly; an empty pass is one error."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import one_line, says

from attnscope.analyses.patterns import KeyConcentration
from attnscope.analyses.relative_position import RelativePosition
from attnscope.data.records import Example
from attnscope.errors import AttnscopeError
from attnscope.executor import run_pass
from attnscope.extract.runner import ExtractOptions

TEXTS = ["the cat sat on the mat .", "a dog , a bird and a fish swam far away .", "it rained ."]


def test_a_hook_rider_gives_the_same_keys_riding_alone_and_fed_directly(debug_bert):
    from attnscope.extract.encode import Encoder

    examples = [Example(text=t) for t in TEXTS]
    opts = ExtractOptions(batch_size=2)
    riding = KeyConcentration.for_model(debug_bert)
    both = run_pass(examples, [RelativePosition(), riding], model=debug_bert, options=opts)
    alone = run_pass(examples, [KeyConcentration.for_model(debug_bert)], model=debug_bert, options=opts)
    direct = KeyConcentration.for_model(debug_bert)
    direct.update([Encoder(debug_bert).encode(e, i) for i, e in enumerate(examples)])
    want = direct.finalize().arrays
    # every real token of every example, in each of the debug model's key/value heads, once
    tokens = sum(len(Encoder(debug_bert).encode(e, i)) for i, e in enumerate(examples))
    assert want["count"].sum() == tokens * debug_bert.num_layers * debug_bert.num_heads
    for got in (both.results["key-concentration"].arrays, alone.results["key-concentration"].arrays):
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, equal_nan=True)
    assert both.analysed == alone.analysed == len(TEXTS) and "relative-position" in both.results


def test_a_pass_that_analyses_nothing_is_one_error_naming_the_parameter(debug_bert):
    with pytest.raises(AttnscopeError) as e:
        run_pass([Example(text=TEXTS[1])], [RelativePosition()], model=debug_bert,
                 options=ExtractOptions(max_seq_len=8), note="why")
    says(one_line(e.value), "no examples", "max_seq_len 8", "why")  # the note the caller gave
    assert e.value.params == ("max_seq_len",)


def test_the_ray_executor_streams_a_named_backend_or_attention_dtype_here():
    # the workers run the default engine only; where the plan says here (a backend or attention
    # dtype asked for), the pass runs in this process (what LocalExecutor does), never silently
    # dropped on the way to the workers
    from attnscope.analyses.longctx import LongContextStats
    from attnscope.engines.plan import plan
    from attnscope.engines.streaming import stream_stats
    from attnscope.executor import RayExecutor
    from attnscope.models import load_model

    class Runner:
        workers, calls = 2, []

        def stream(self, *args, **kwargs):
            self.calls.append(kwargs)

    lm = load_model("debug:llama")
    ids = [lm.tokenizer(t)["input_ids"] for t in TEXTS]
    ray = RayExecutor(Runner())
    longest = max(map(len, ids))
    assert ray.stream(lm, ids, LongContextStats(js_rows=0)) == 2 and len(Runner.calls) == 1
    default = plan(lm, longest=longest, engine="streaming")
    assert not default.here and ray.stream(lm, ids, LongContextStats(js_rows=0), plan=default) == 2
    for asked in ({"backend": "tiles"}, {"attention_dtype": "bfloat16"}):
        got, want = LongContextStats(js_rows=0), LongContextStats(js_rows=0)
        p = plan(lm, longest=longest, **asked)
        assert p.here and p.here_reason in ("backend tiles", "bfloat16 scores")
        assert ray.stream(lm, ids, got, plan=p) == 0 and len(Runner.calls) == 2
        stream_stats(lm, ids, want, **asked)
        for k, v in want.means().items():
            np.testing.assert_array_equal(got.means()[k], v, err_msg=f"{asked} {k}")


def test_a_pass_refuses_an_analysis_whose_requires_it_lacks_before_any_forward(debug_bert, debug_gpt2,
                                                                                tmp_path):
    """``requires`` is checked against what the source and model give (:func:`available`), in one
    line naming the family, before the model runs once; a store gives its level and its examples'
    annotations from the shard headers."""
    from attnscope.analyses.syntax import DependencyHeads
    from attnscope.executor import available
    from attnscope.jobs import extract_to_store
    from attnscope.store import open_store

    plain = [Example(text=t) for t in TEXTS]
    parsed = [Example(words=["the", "cat", "sat"], heads=[2, 3, 0], relns=["det", "nsubj", "root"])]
    word = ExtractOptions(word_level=True)
    calls = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(debug_bert.model, "forward", lambda *a, **k: calls.append(1))
        with pytest.raises(AttnscopeError) as e:
            run_pass(plain, [RelativePosition(), DependencyHeads()], model=debug_bert, family="syntax")
    says(one_line(e.value), "syntax: analysis 'dependency-heads' needs",
         "examples with heads and relns", "word-level maps")
    assert calls == []  # refused before the first forward
    assert available(plain, debug_bert) == {"model"}
    assert available(plain, debug_gpt2, word) == {"model", "causal", "word_level"}
    assert available(plain + parsed, None, word) == {"word_level", "dependencies"}
    coref = [Example(words=["it"], fields={"coref": {"clusters": []}})]
    assert available(coref + parsed, debug_bert) == {"model", "dependencies", "coreference"}

    got = run_pass(parsed, [DependencyHeads()], model=debug_bert, options=word, family="syntax")
    assert got.analysed == 1
    extract_to_store(parsed + plain, tmp_path / "words", debug_bert, options=word)
    extract_to_store(plain, tmp_path / "tokens", debug_bert)
    assert available(open_store(tmp_path / "words")) == {"word_level", "dependencies"}
    assert available(open_store(tmp_path / "tokens"), debug_bert) == {"model"}
    with pytest.raises(AttnscopeError, match="needs examples with heads and relns .*; word-level maps"):
        run_pass(open_store(tmp_path / "tokens"), [DependencyHeads()])
