"""Models whose outputs padding changes (``ModelFacts.pads``): the facts probe finds them, and
their sequences are batched one length at a time, so a batch's maps are each sequence's own.

ConvBERT's span-based convolution and CPM-Ant read the padded positions; Nystromformer's
landmarks average over them. A right-padded ConvBERT batch moved the maps of its shorter
sequence by 0.76 (layer 1) before its extraction was planned by length.
"""

import warnings

import numpy as np
import pytest
import torch
from conftest import softmax_bound

from attnscope.data.records import Example
from attnscope.errors import AttnscopeError
from attnscope.extract import ExtractOptions, Extractor
from attnscope.models import load_model
from attnscope.models.forward import batches, pad_batch
from attnscope.pipeline.check import check_loaded

WORDS = [["the", "cat", "sat"], ["the", "cat", "sat", "on", "the", "mat", "and", "then", "it", "ran"],
         ["a", "dog"], ["the", "red", "house", "on", "the", "hill"], ["the", "dog", "sat"]]


def _load(model_type):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_model(f"debug:{model_type}", seed=0)


def _alone(lm, ids):
    """The model's own maps of ``ids`` run alone (no padding at all), float64 ``[L H n n]``."""
    with torch.inference_mode():
        out = lm.model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                       output_attentions=True)
    return np.stack([a[0].double().numpy() for a in out.attentions])


def _padded(lm, ids, longer):
    """The maps of ``ids`` right-padded in a batch beside ``longer``, cut to its ``n`` tokens."""
    n = len(ids)
    pad = lm.tokenizer.pad_token_id or 0
    batch = torch.tensor([longer, list(ids) + [pad] * (len(longer) - n)])
    mask = torch.tensor([[1] * len(longer), [1] * n + [0] * (len(longer) - n)])
    with torch.inference_mode():
        out = lm.model(input_ids=batch, attention_mask=mask, output_attentions=True)
    return np.stack([a[1, :, :n, :n].double().numpy() for a in out.attentions])


@pytest.mark.parametrize("model_type, pads", [("convbert", False), ("nystromformer", False), ("bert", True)])
def test_the_probe_says_what_padding_does_to_the_models_own_maps(model_type, pads):
    lm = _load(model_type)
    assert lm.facts.pads is pads and lm.facts.describe()["pads"] is pads
    ids = lm.tokenizer("the cat sat on the mat")["input_ids"]
    longer = lm.tokenizer("the cat sat on the mat and then it went out of the house")["input_ids"]
    moved = float(np.abs(_alone(lm, ids) - _padded(lm, ids, longer)).max())
    n = len(ids)
    # what float32 rounding of a softmax row can do, carried through every layer
    bound = softmax_bound(n) * lm.num_layers
    assert (moved <= bound) is pads, (moved, bound)
    said = dict(check_loaded(lm).summary())["padding"]  # attnscope check's table
    assert said == ("changes no map" if pads else "changes the maps: one length a batch")


def test_a_model_that_padding_changes_is_extracted_one_length_at_a_time():
    lm = _load("convbert")
    extractor = Extractor(lm, ExtractOptions(batch_size=4))
    planned = list(extractor.plan(Example(words=w) for w in WORDS))
    assert all(len({len(e) for e in batch}) == 1 for batch in planned)
    assert sorted(len(batch) for batch in planned) == [1, 1, 1, 2]  # "the cat sat", "the dog sat"
    for batch in planned:
        for e, m in zip(batch, extractor.run_batch(batch).items):
            np.testing.assert_allclose(m.attn, _alone(lm, e.input_ids), atol=softmax_bound(len(e)) * lm.num_layers,
                                       rtol=0)


def test_a_padded_batch_of_such_a_model_is_refused_in_one_line():
    lm = _load("convbert")
    with pytest.raises(AttnscopeError, match=r"padding changes its outputs.*lengths \[2, 3\]"):
        pad_batch(lm, [[5, 6, 7], [5, 6]])
    assert pad_batch(lm, [[5, 6], [7, 8]]).lengths == [2, 2]  # one length: nothing padded


def test_batches_keep_order_and_size_and_split_at_a_length_only_where_padding_matters():
    items = ["ab", "cd", "efg", "hij", "k", "lm", "no"]
    lm = type("LM", (), {"facts": type("F", (), {"pads": True})()})()
    assert list(batches(lm, items, 3)) == [["ab", "cd", "efg"], ["hij", "k", "lm"], ["no"]]
    lm.facts.pads = False
    assert list(batches(lm, items, 3)) == [["ab", "cd"], ["efg", "hij"], ["k"], ["lm", "no"]]
    assert [x for b in batches(lm, items, 1) for x in b] == items
