"""From annotated words to the units of a word-level map, and from a row to one prediction.

Used by every analysis that scores words against annotations (syntax, coreference, probes),
so that they agree on two edge cases:

**Words without a unit.** :func:`word_units` gives the unit position of each word of the
example, or -1 when the word has none, for one of two reasons:

- *empty*: the tokenizer turned the word into zero tokens (a zero-width space, a control
  character, a word made only of characters the normaliser strips);
- *cut*: the word lies after the last word that has a unit (extraction truncated the
  example at its maximum length; a zero-token word at the very end is indistinguishable and
  is counted here too).

An absent word is never mapped to another unit (the old ``pos[:w]`` slicing sent an empty
word to unit -1, i.e. the last ``[SEP]``'s row, and pushed the last real word out as
"truncated"). Each caller decides what to skip and counts it: Table 1 and coreference skip
only the absent word (and any dependent or mention that needs it); the probes skip the
whole sentence, because a probe's ROOT-plus-words layout needs every word.

**No information, no prediction.** :func:`predict` returns the index of the unique
maximum of each row over the candidates, or -1 (no prediction, scored as wrong) when the
row carries no information: every candidate weight is 0 (float16 stores underflow to 0 on
the rows of heads that attend almost only to ``[CLS]``/``[SEP]``) or the top value is
shared by several candidates (a tie). ``ties="lowest"`` gives ``np.argmax``'s first
maximum instead, which is what the paper's code does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnscope.maps import AttentionMap

TIE_RULES = ("none", "lowest")


@dataclass(frozen=True)
class WordUnits:
    """Unit position of every word of an example (``-1``: absent), and why words are absent.

    >>> u = WordUnits(np.array([1, -1, 2, -1]))
    >>> u.present.tolist(), u.empty.tolist(), u.cut.tolist()
    ([True, False, True, False], [False, True, False, False], [False, False, False, True])
    """

    positions: np.ndarray  # [num_words] int64

    @property
    def present(self) -> np.ndarray:  # [num_words] bool
        return self.positions >= 0

    @property
    def cut(self) -> np.ndarray:  # [num_words] bool: after the last present word
        idx = np.nonzero(self.present)[0]
        last = int(idx[-1]) if idx.size else -1
        return np.arange(len(self.positions)) > last

    @property
    def empty(self) -> np.ndarray:  # [num_words] bool: absent but before the last present word
        return ~self.present & ~self.cut

    @property
    def num_words(self) -> int:
        return len(self.positions)


def word_units(m: AttentionMap, num_words: int | None = None) -> WordUnits:
    """The :class:`WordUnits` of a word-level map.

    ``num_words`` defaults to the example's word count (``words + words_pair``), else to the
    highest word id in the map plus one.
    """
    if m.level != "word":
        raise ValueError("word positions need a word-level map (extract with word_level=True)")
    ids = np.asarray(m.word_ids)
    if num_words is None:
        num_words = m.example.num_words
    if num_words is None:
        num_words = int(ids.max()) + 1 if (ids >= 0).any() else 0
    pos = np.full(num_words, -1, dtype=np.int64)
    real = np.nonzero((ids >= 0) & (ids < num_words))[0]
    # several units of one word cannot happen at word level; the first one wins if they do
    pos[ids[real[::-1]]] = real[::-1]
    return WordUnits(pos)


def predict(values: np.ndarray, candidates: np.ndarray | None = None, *, axis: int = -1,
            ties: str = "none", floor: float | None = 0.0) -> np.ndarray:
    """Index of the highest candidate along ``axis``, or -1 where there is no prediction.

    ``candidates`` (broadcastable bool) marks the allowed entries; ``floor``: the top value
    must exceed it (0 for attention weights, None for unbounded scores such as a probe's).
    With ``ties="none"`` (default) a row whose top value is shared, or not above ``floor``,
    or that has no candidate, predicts -1; ``ties="lowest"`` keeps ``np.argmax``'s first
    maximum (still -1 for a row without any candidate).

    >>> predict(np.array([[0.1, 0.7, 0.2], [0.0, 0.0, 0.0], [0.4, 0.2, 0.4]])).tolist()
    [1, -1, -1]
    >>> predict(np.array([[0.0, 0.0, 0.0], [0.4, 0.2, 0.4]]), ties="lowest").tolist()
    [0, 0]
    """
    if ties not in TIE_RULES:
        raise ValueError(f"ties must be one of {TIE_RULES}, not {ties!r}")
    values = np.asarray(values)
    v = values.astype(np.float64 if values.dtype == np.float64 else np.float32, copy=False)
    if v.shape[axis] == 0:
        return np.full(np.delete(v.shape, axis % v.ndim), -1, dtype=np.int64)
    if candidates is not None:
        v = np.where(candidates, v, -np.inf)
    top = np.max(v, axis=axis, keepdims=True)
    idx = np.argmax(v, axis=axis)
    has = np.squeeze(np.isfinite(top), axis)
    if ties == "lowest":
        return np.where(has, idx, -1)
    unique = np.sum(v == top, axis=axis) == 1
    ok = has & unique
    if floor is not None:
        ok &= np.squeeze(top, axis) > floor
    return np.where(ok, idx, -1)
