"""The guard in conftest.py: a deprecation warning raised under attnscope's own call into a
library fails the test (issue 36), one raised under anyone else's call stays a warning; and
attnscope's generation uses transformers' current cache API."""

from __future__ import annotations

import logging
import warnings

import pytest
from conftest import DeprecatedCall
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.utils.deprecation import deprecate_kwarg


@deprecate_kwarg("old", "99.0.0", new_name="new")
def _renamed(new=None):
    return new


def _call_as(module: str, source: str, **names):
    """Run ``source`` in a frame whose module is ``module`` (as if that module's code ran it)."""
    scope = {"__name__": module, **names}
    exec(compile(source, f"<{module}>", "exec"), scope)
    return scope.get("result")


def test_a_deprecated_argument_in_attnscopes_call_fails():
    with pytest.raises(DeprecatedCall, match="`old` is deprecated"):
        _call_as("attnscope.models.probe", "result = f(old=1)", f=_renamed)


def test_a_deprecated_argument_in_a_users_call_only_warns():
    with pytest.warns(FutureWarning, match="`old` is deprecated"):
        assert _call_as("user_code", "result = f(old=1)", f=_renamed) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _call_as("attnscope.models.probe", "result = f(new=2)", f=_renamed) == 2


def test_a_deprecated_output_attribute_in_attnscopes_call_fails():
    # transformers says this one through its logger, once per process: start afresh
    logging.Logger.warning_once.cache_clear()
    out = CausalLMOutputWithPast(cache=None)
    with pytest.raises(DeprecatedCall, match="past_key_values"):
        _call_as("attnscope.models.probe", "result = out.past_key_values", out=out)
    logging.Logger.warning_once.cache_clear()
    assert _call_as("user_code", "result = out.past_key_values", out=out) is None


def test_greedy_continuation_uses_the_current_cache_api(debug_llama):
    import torch

    from attnscope.models.generation import causal_lm_for, greedy_continue

    logging.Logger.warning_once.cache_clear()
    model = causal_lm_for(debug_llama, seed=0)
    ids = debug_llama.tokenizer("the cat sat on the")["input_ids"]
    new = greedy_continue(model, ids, 4)  # the guard raises on a deprecated name
    # the same tokens as recomputing the whole sequence at every step (no cache at all)
    seq = list(ids)
    with torch.no_grad():
        for _ in range(len(new)):
            seq.append(int(model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].argmax()))
    assert new == seq[len(ids):]
