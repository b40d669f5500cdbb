"""Word-level conversion (paper section 4.1): hand-computed case and properties."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnscope.extract.encode import token_units
from attnscope.extract.wordlevel import to_word_level

# tokens: [CLS] the un ##able cat [SEP]  ->  units: [CLS] the unable cat [SEP]
A = np.array([
    [0.5, 0.1, 0.1, 0.1, 0.1, 0.1],
    [0.2, 0.2, 0.2, 0.2, 0.1, 0.1],
    [0.1, 0.3, 0.0, 0.4, 0.1, 0.1],
    [0.0, 0.1, 0.5, 0.1, 0.2, 0.1],
    [0.1, 0.1, 0.1, 0.1, 0.5, 0.1],
    [0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
])[None, None]
UNITS = np.array([0, 1, 2, 2, 3, 4])


def test_hand_computed_mean():
    # TO "unable" = column 2 + column 3; FROM "unable" = mean of rows 2 and 3.
    expected = np.array([
        [0.5, 0.1, 0.2, 0.1, 0.1],
        [0.2, 0.2, 0.4, 0.1, 0.1],
        [0.05, 0.2, 0.5, 0.15, 0.1],
        [0.1, 0.1, 0.2, 0.5, 0.1],
        [0.0, 0.0, 0.0, 0.0, 1.0],
    ])
    np.testing.assert_allclose(to_word_level(A, UNITS)[0, 0], expected, atol=1e-12)


def test_hand_computed_first_piece():
    out = to_word_level(A, UNITS, from_word="first")[0, 0]
    np.testing.assert_allclose(out[2], [0.1, 0.3, 0.4, 0.1, 0.1], atol=1e-12)


def test_rejects_unknown_mode():
    with pytest.raises(ValueError):
        to_word_level(A, UNITS, from_word="max")


def test_token_units_keeps_specials_apart():
    ids = np.array([-1, 0, 1, 1, 2, -1, 3, 3, -1])
    special = ids < 0
    assert token_units(ids, special).tolist() == [0, 1, 2, 2, 3, 4, 5, 5, 6]


@st.composite
def attention_and_units(draw):
    n_units = draw(st.integers(1, 6))
    sizes = draw(st.lists(st.integers(1, 3), min_size=n_units, max_size=n_units))
    units = np.repeat(np.arange(n_units), sizes)
    n = len(units)
    layers, heads = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    raw = np.array(draw(st.lists(st.floats(0.01, 10), min_size=layers * heads * n * n,
                                 max_size=layers * heads * n * n))).reshape(layers, heads, n, n)
    return raw / raw.sum(-1, keepdims=True), units


@settings(max_examples=60, deadline=None)
@given(attention_and_units())
def test_rows_sum_to_one_and_mass_is_conserved(case):
    attn, units = case
    for mode in ("mean", "first"):
        w = to_word_level(attn, units, mode)
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-9)
    # total attention received by a word = mean over its pieces' rows, summed over rows, is the
    # same as the token-level mass received by its pieces, weighted by 1/(pieces of the sender)
    counts = np.bincount(units)
    w = to_word_level(attn, units)
    received_tokens = np.zeros(attn.shape[:2] + (len(counts),))
    for t in range(len(units)):
        received_tokens += np.stack([attn[:, :, t, units == u].sum(-1) for u in range(len(counts))], -1) / counts[units[t]]
    np.testing.assert_allclose(w.sum(-2), received_tokens, atol=1e-9)
    # one piece per word: conversion is the identity
    ident = np.arange(attn.shape[-1])
    np.testing.assert_allclose(to_word_level(attn, ident), attn, atol=1e-12)


def test_dtype_kept_empty_input_and_bad_option():
    # found by mutation testing: float32 stays float32, an empty map stays empty
    out = to_word_level(A.astype(np.float32), UNITS)
    assert out.dtype == np.float32 and out.shape == (1, 1, 5, 5)
    assert to_word_level(np.zeros((2, 3, 0, 0), np.float32), np.zeros(0, np.int64)).shape == (2, 3, 0, 0)
    with pytest.raises(ValueError, match="from_word must be"):
        to_word_level(A, UNITS, from_word="last")
