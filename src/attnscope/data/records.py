"""Plain typed records that every reader produces and every later stage consumes."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The keys of an input dict that give its content (one of them, exactly); every other key is
#: read by name or carried through.
CONTENT_KEYS = ("text", "words", "tokens")


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


#: the model's own index of each layer with attention, while a model's heads are named (a hybrid
#: such as Qwen3-Next has attention in only some layers); None: layer i is the model's layer i
_ATTENTION_LAYERS: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar(
    "attnscope_attention_layers", default=None)


@contextlib.contextmanager
def layer_numbering(attention_layers: Sequence[int] | None) -> Iterator[None]:
    """Within the block, heads are named by the model's own layer index: array layer ``i`` (the
    ``i``-th layer with attention) is shown as ``attention_layers[i] + 1``. Every command that
    names heads of one model runs inside this (the model's ``facts.attention_layers``, or a
    store's or results file's record of them)."""
    token = _ATTENTION_LAYERS.set(tuple(attention_layers) if attention_layers is not None else None)
    try:
        yield
    finally:
        _ATTENTION_LAYERS.reset(token)


def recorded_layers(model: Any) -> tuple[int, ...] | None:
    """The attention layers a model record holds (a :meth:`LoadedModel.describe` dict, as stores
    and results files carry it), for :func:`layer_numbering`; None where it holds none."""
    attention = (model or {}).get("attention") if isinstance(model, dict) else None
    layers = attention.get("attention_layers") if isinstance(attention, dict) else None
    return tuple(int(i) for i in layers) if isinstance(layers, list) else None


def numbers_of(layers: Sequence[int] | None) -> list[int] | None:
    """The 1-based numbers pages show for the model's layers ``layers`` (its own indices of the
    layers an array holds, a hybrid's layers with attention); None stays None."""
    return None if layers is None else [int(i) + 1 for i in layers]


def layer_number(layer: int) -> int:
    """The 1-based number pages show for array layer ``layer`` (see :func:`layer_numbering`)."""
    own = _ATTENTION_LAYERS.get()
    return (own[layer] if own is not None and 0 <= layer < len(own) else layer) + 1


def layer_of_number(number: int) -> int:
    """The array layer shown as ``number`` (the inverse of :func:`layer_number`); ValueError
    for a number that is no layer with attention."""
    own = _ATTENTION_LAYERS.get()
    if not own or number - 1 in own:
        return number - 1 if not own else own.index(number - 1)
    if not 0 <= number - 1 < own[-1]:  # past the last layer with attention: the caller names the range
        return -1 if number < 1 else len(own)
    raise ValueError(f"layer {number} has no attention (the layers with attention are "
                     f"{', '.join(str(i + 1) for i in own)})")


@dataclass(frozen=True, order=True)
class HeadId:
    """An attention head, 0-indexed in data and code (``layer`` counts the layers with attention).

    ``str(HeadId(7, 9))`` is the paper's 1-indexed display name ``"8-10"``; in a hybrid the layer
    is the model's own (:func:`layer_numbering`).

    >>> with layer_numbering([3, 7]):
    ...     str(HeadId(1, 0)), HeadId.parse("8-1")
    ('8-1', HeadId(layer=1, head=0))
    """

    layer: int
    head: int

    def __str__(self) -> str:
        return f"{layer_number(self.layer)}-{self.head + 1}"

    @property
    def display(self) -> str:
        return str(self)

    @classmethod
    def parse(cls, name: str) -> "HeadId":
        """Parse the 1-indexed display form ``"8-10"`` back into ``HeadId(7, 9)``."""
        layer, head = name.split("-")
        return cls(layer_of_number(int(layer)), int(head) - 1)
