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
