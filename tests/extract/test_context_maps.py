"""``Context.maps``: the few maps a family's figure draws, made on the job's executor."""

from __future__ import annotations

import numpy as np

from attnscope.data.records import Example


def test_maps_of_chosen_examples_in_the_asked_order_with_their_own_indices(tmp_path, debug_bert):
    """The maps of examples 3, 0 and 2 (2 is too long for 12 tokens, so it has none), in that
    order, each indexed by its position in the list: those that ``extract`` makes of the three
    with the same options (whose indices are 0, 1, 2 in the order given)."""
    from attnscope.extract.runner import ExtractOptions, extract
    from attnscope.families.base import Context

    examples = [Example(words=["the", "cat", "sat"]), Example(words=["a", "dog"]),
                Example(words=["the", "big", "red", "house", "on", "the", "hill", "was", "old", "and",
                               "it", "was", "sold"]),
                Example(words=["she", "saw", "him", "there"])]
    ctx = Context(model=debug_bert, out_dir=tmp_path, max_seq_len=12, batch_size=2)
    maps = ctx.passes.maps(examples, [3, 0, 2], word_level=True)
    assert [m.index for m in maps] == [3, 0]
    made = {a.index: a for b in extract([examples[i] for i in (3, 0, 2)], debug_bert,
                                        options=ExtractOptions(max_seq_len=12, batch_size=2,
                                                               word_level=True)) for a in b}
    assert sorted(made) == [0, 1]
    for m, expected in zip(maps, (made[0], made[1])):
        assert m.level == "word" and m.tokens == expected.tokens and m.example is expected.example
        np.testing.assert_array_equal(m.attn, expected.attn)
    assert ctx.passes.maps(examples, []) == []
