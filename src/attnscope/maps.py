"""AttentionMap and AttentionBatch: the type every layer shares, from extraction (or a store) into
analyses, the report and the views."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from attnscope.data.records import Example, numbers_of


def token_word_ids(special: np.ndarray) -> np.ndarray:
    """``word_ids`` when every non-special token is its own word (no word alignment known):
    0, 1, 2, ... over the non-special tokens, -1 for special ones.

    >>> token_word_ids(np.array([True, False, False, True])).tolist()
    [-1, 0, 1, -1]
    """
    special = np.asarray(special, bool)
    return np.where(special, -1, np.cumsum(~special) - 1)


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
    #: Encoder-decoder models: "encoder", "decoder" or "cross" (None for one-stack models).
    #: A cross-attention map is ``[L H t s]``: rows are the decoder's ``tokens``, columns the
    #: encoder's ``key_tokens`` (with ``key_special``); every other map is square.
    kind: str | None = None
    key_tokens: list[str] | None = None
    key_special: np.ndarray | None = None
    #: Maps over a model's own continuation: the position of the first generated unit (the
    #: units from there on were generated, not read), else None.
    generated: int | None = None
    #: An encoder-decoder example's other kinds, ``{"decoder": map, "cross": map}``, carried
    #: with its encoder map from extraction to the store (not part of :meth:`record`).
    others: dict | None = None
    #: Each unit (key unit) as the tokenizer's text, where the tokens are pieces that are not
    #: their own text (byte-level BPE: ``ĠParis`` is " Paris"; SentencePiece ``▁Paris``), see
    #: :func:`attnscope.models.pieces.piece_texts`; None otherwise (WordPiece, words).
    token_text: list[str] | None = None
    key_token_text: list[str] | None = None
    #: The model's own index of each of ``attn``'s layers, where it has attention in only some
    #: (a hybrid: Jamba's layer 1 is Mamba, so ``attn[1]`` is its layer 2); None: layer ``i`` is
    #: the model's layer ``i``. Not part of :meth:`record`: a store keeps it with its model.
    layers: tuple[int, ...] | None = None

    @property
    def layer_numbers(self) -> list[int]:
        """The 1-based number pages show for each of ``attn``'s layers (the model's own)."""
        return numbers_of(self.layers if self.layers is not None else range(self.attn.shape[0]))

    @property
    def num_units(self) -> int:
        return len(self.tokens)

    @property
    def keys(self) -> tuple[list[str], np.ndarray]:
        """The key units (columns) and which are special: the map's own units unless it is a
        cross-attention map."""
        if self.key_tokens is None:
            return self.tokens, np.asarray(self.special, bool)
        return self.key_tokens, np.asarray(self.key_special, bool)

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
            **({"kind": self.kind} if self.kind else {}),
            **({"generated": self.generated} if self.generated is not None else {}),
            **({"key_tokens": self.key_tokens, "key_special": [bool(x) for x in self.key_special]}
               if self.key_tokens is not None else {}),
            **({"token_text": self.token_text} if self.token_text is not None else {}),
            **({"key_token_text": self.key_token_text} if self.key_token_text is not None else {}),
        }

    @classmethod
    def from_record(cls, rec: dict, attn: np.ndarray) -> "AttentionMap":
        return cls(index=rec["index"], attn=attn, tokens=list(rec["tokens"]),
                   special=np.asarray(rec["special"], dtype=bool),
                   segment=np.asarray(rec["segment"], dtype=np.int64),
                   word_ids=np.asarray(rec["word_ids"], dtype=np.int64), level=rec["level"],
                   example=Example.from_dict(rec["example"]), kind=rec.get("kind"),
                   generated=rec.get("generated"),
                   key_tokens=rec.get("key_tokens"),
                   key_special=(np.asarray(rec["key_special"], dtype=bool)
                                if "key_special" in rec else None),
                   token_text=rec.get("token_text"), key_token_text=rec.get("key_token_text"))


@dataclass
class AttentionBatch:
    """A group of examples extracted together; analyses iterate over ``items``."""

    items: list[AttentionMap] = field(default_factory=list)

    def __iter__(self) -> Iterator[AttentionMap]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)
