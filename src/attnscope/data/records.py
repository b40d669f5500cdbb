"""Plain typed records that every reader produces and every later stage consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Keys of an input dict that attnscope interprets; every other key is carried through.
CONTENT_KEYS = ("text", "words", "tokens")
PAIR_KEYS = ("text_pair", "words_pair")
ANNOTATION_KEYS = ("heads", "relns", "pos", "upos", "xpos", "feats", "lemmas", "mentions", "clusters")


@dataclass
class Example:
    """One input to the model.

    Exactly one of ``text``, ``words`` or ``tokens`` is set. ``text_pair`` / ``words_pair``
    give an optional second segment. Annotations are optional and indexed by word
    (0-based positions into ``words + words_pair``):

    - ``heads``: 1-based head of each word, 0 = root (CoNLL convention)
    - ``relns``: dependency relation of each word
    - ``pos``: a part-of-speech tag per word (XPOS when present, else UPOS)
    - ``fields``: every other key of the input dict, untouched

    >>> Example(words=["The", "cat", "sat"], heads=[2, 3, 0], relns=["det", "nsubj", "root"]).num_words
    3
    """

    text: str | None = None
    words: list[str] | None = None
    tokens: list[str] | None = None
    text_pair: str | None = None
    words_pair: list[str] | None = None
    heads: list[int] | None = None
    relns: list[str] | None = None
    pos: list[str] | None = None
    upos: list[str] | None = None
    feats: list[dict[str, str]] | None = None
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def all_words(self) -> list[str] | None:
        if self.words is None:
            return None
        return list(self.words) + list(self.words_pair or [])

    @property
    def num_words(self) -> int | None:
        w = self.all_words
        return None if w is None else len(w)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Example":
        """Rebuild an example from :meth:`to_dict` output (trusted: no validation)."""
        known = {k: d[k] for k in ("text", "words", "tokens", "text_pair", "words_pair", "heads",
                                   "relns", "pos", "upos", "feats") if k in d}
        return cls(**known, fields={k: v for k, v in d.items() if k not in known})

    def to_dict(self) -> dict[str, Any]:
        """The example as a JSON-able dict (the input format), extra fields included."""
        out: dict[str, Any] = {}
        for key in ("text", "words", "tokens", "text_pair", "words_pair", "heads", "relns",
                    "pos", "upos", "feats"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        for key, value in self.fields.items():
            out.setdefault(key, value)
        return out


@dataclass(frozen=True, order=True)
class HeadId:
    """An attention head, 0-indexed in data and code.

    ``str(HeadId(7, 9))`` is the paper's 1-indexed display name ``"8-10"``.
    """

    layer: int
    head: int

    def __str__(self) -> str:
        return f"{self.layer + 1}-{self.head + 1}"

    @property
    def display(self) -> str:
        return str(self)

    @classmethod
    def parse(cls, name: str) -> "HeadId":
        """Parse the 1-indexed display form ``"8-10"`` back into ``HeadId(7, 9)``."""
        layer, head = name.split("-")
        return cls(int(layer) - 1, int(head) - 1)
