"""AttentionMap and AttentionBatch: the type every layer shares, from extraction (or a store) into
analyses, the report and the views."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from attnscope.data.records import Example


@dataclass
class AttentionMap:
    """One example's attention, every layer and head.

    ``attn`` is ``[layer, head, query, key]`` over the example's units: tokens at token level,
    words (plus special tokens as their own units) at word level. Each row sums to 1 (up to
    float16 rounding when read from a float16 store).

    Per unit: ``tokens`` the text, ``special`` whether it is a special token, ``segment`` the
    segment id (0 for A, 1 for B), ``word_ids`` the 0-based index of its word in
    ``example.words + example.words_pair`` (or in the tokenizer's own words for ``text``
    inputs), -1 for special tokens.
    """

    index: int  # position of the example in the input
    attn: np.ndarray  # [L H q k]
    tokens: list[str]
    special: np.ndarray  # [n] bool
    segment: np.ndarray  # [n] int
    word_ids: np.ndarray  # [n] int, -1 for special tokens
    level: str  # "token" or "word"
    example: Example

    @property
    def num_units(self) -> int:
        return len(self.tokens)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.attn.shape)

    def word_positions(self) -> np.ndarray:
        """For a word-level map: the unit position of each word, ``[num_words]``.

        Word ``w`` sits at ``word_positions()[w]``; this is what syntax and coreference use to
        go from annotations (indexed by word) to rows and columns of ``attn``.
        """
        if self.level != "word":
            raise ValueError("word_positions() needs a word-level map (extract with word_level=True)")
        ids = self.word_ids
        nw = int(ids.max()) + 1 if (ids >= 0).any() else 0
        pos = np.full(nw, -1, dtype=np.int64)
        real = np.nonzero(ids >= 0)[0]
        pos[ids[real]] = real
        return pos

    def record(self) -> dict:
        """The JSON-able description of this map, without the array."""
        return {
            "index": self.index,
            "tokens": self.tokens,
            "special": [bool(x) for x in self.special],
            "segment": [int(x) for x in self.segment],
            "word_ids": [int(x) for x in self.word_ids],
            "level": self.level,
            "example": self.example.to_dict(),
        }

    @classmethod
    def from_record(cls, rec: dict, attn: np.ndarray) -> "AttentionMap":
        return cls(index=rec["index"], attn=attn, tokens=list(rec["tokens"]),
                   special=np.asarray(rec["special"], dtype=bool),
                   segment=np.asarray(rec["segment"], dtype=np.int64),
                   word_ids=np.asarray(rec["word_ids"], dtype=np.int64), level=rec["level"],
                   example=Example.from_dict(rec["example"]))


@dataclass
class AttentionBatch:
    """A group of examples extracted together; analyses iterate over ``items``."""

    items: list[AttentionMap] = field(default_factory=list)

    def __iter__(self) -> Iterator[AttentionMap]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)
