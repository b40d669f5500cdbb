"""Which unit of a map is the first special token, a separator, a period or a comma.

The paper (section 3.2) measures attention to ``[CLS]``, ``[SEP]``, periods and commas. Those
are BERT's names; other families spell them differently (RoBERTa ``<s>`` / ``</s>``, MPNet the
same, GPT-2 adds none at all). A :class:`TokenClasser` decides the class of each unit from

- the map's own ``special`` flags (set by the tokenizer during extraction), and
- the tokenizer's named special tokens when they are known (``cls_token``/``bos_token`` are
  "first special", ``sep_token``/``eos_token`` are "separator"), else the position: the
  special unit at position 0 is the first special, every other special unit a separator;
- the unit's text with the tokenizer's word markers removed (``##``, ``Ġ``, ``▁``) for
  periods and commas, which are never special.

>>> c = TokenClasser(first=frozenset({"<s>"}), separators=frozenset({"</s>"}))
>>> import numpy as np

>>> k = c.classify(["<s>", "Hi", "Ġ.", "</s>", "</s>"], np.array([1, 0, 0, 1, 1], bool))
>>> k.first.tolist(), k.separator.tolist(), k.period.tolist()
([True, False, False, False, False], [False, False, False, True, True], [False, False, True, False, False])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope.extract.encode import WORD_MARKERS


@dataclass(frozen=True)
class UnitClasses:
    """Boolean masks ``[n]`` over the units of one map; every unit is in exactly one of the four
    classes. ``declared``: the masks of the declared key classes (:func:`attnscope.analyses.stat.key_class_stats`),
    by statistic, which may overlap anything."""

    first: np.ndarray
    separator: np.ndarray
    period: np.ndarray
    comma: np.ndarray
    declared: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def other(self) -> np.ndarray:
        return ~(self.first | self.separator | self.period | self.comma)

    @property
    def punct(self) -> np.ndarray:
        return self.period | self.comma

    def mask(self, name: str) -> np.ndarray:
        return self.declared[name] if name in self.declared else getattr(self, name)


#: What the report says when token classes come from positions.
POSITIONAL_NOTE = ("token classes from positions (store without a model): the special unit at "
                   "position 0 is the first special token, every other special unit a separator")


@dataclass(frozen=True)
class TokenClasser:
    """Decides the class of every unit (see the module docstring).

    ``first`` / ``separators``: the strings of the tokenizer's first-special (``[CLS]``,
    ``<s>``) and separator (``[SEP]``, ``</s>``) tokens; both None means "decide by
    position". ``period`` / ``comma``: the texts counted as such after removing word markers.
    """

    first: frozenset[str] | None = None
    separators: frozenset[str] | None = None
    period: frozenset[str] = field(default_factory=lambda: frozenset({"."}))
    comma: frozenset[str] = field(default_factory=lambda: frozenset({","}))

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "TokenClasser":
        """Named special tokens of a (fast) tokenizer; GPT-2's bos == eos is resolved by position."""
        def names(*attrs: str) -> frozenset[str]:
            out = set()
            for a in attrs:
                v = getattr(tokenizer, a, None)
                if isinstance(v, str) and v:
                    out.add(v)
            return frozenset(out)

        first, seps = names("cls_token", "bos_token"), names("sep_token", "eos_token")
        if not first and not seps:
            return cls()
        return cls(first=first, separators=seps)

    @classmethod
    def positional(cls) -> "TokenClasser":
        """For maps whose tokenizer is not at hand (a store): decide by position."""
        return cls()

    @classmethod
    def for_model(cls, model) -> tuple["TokenClasser", str | None]:
        """The classer of ``model``'s tokenizer; without a model (a store alone), the positional
        one and a note saying so for the report."""
        if model is not None:
            return cls.from_tokenizer(model.tokenizer), None
        return cls.positional(), POSITIONAL_NOTE

    def params(self) -> dict[str, Any]:
        return {
            "first": None if self.first is None else sorted(self.first),
            "separators": None if self.separators is None else sorted(self.separators),
            "period": sorted(self.period), "comma": sorted(self.comma),
        }

    @staticmethod
    def bare(token: str) -> str:
        """The unit's text without a tokenizer's word marker (``"Ġ."`` -> ``"."``)."""
        for m in WORD_MARKERS:
            if token.startswith(m) and len(token) > len(m):
                return token[len(m):]
        return token

    def classify(self, tokens: list[str], special: np.ndarray, declared: tuple = ()) -> UnitClasses:
        """Masks for one map's units. ``special`` is the map's ``[n]`` bool flags; ``declared``:
        key-class statistics (:class:`~attnscope.analyses.stat.Stat` with ``keys``) whose masks
        to add, from each unit's text without its word marker and its special flag."""
        special = np.asarray(special, dtype=bool)
        n = len(tokens)
        pos0 = np.zeros(n, dtype=bool)
        if n:
            pos0[0] = True
        if self.first is None and self.separators is None:
            first = special & pos0
            sep = special & ~pos0
        else:
            in_first = np.array([t in self.first for t in tokens], dtype=bool) if n else pos0
            in_sep = np.array([t in self.separators for t in tokens], dtype=bool) if n else pos0
            # a token named both (GPT-2's <|endoftext|>) is "first" only at position 0
            first = special & in_first & (~in_sep | pos0)
            sep = special & in_sep & ~first
        bare = [self.bare(t) for t in tokens]
        period = ~special & np.array([b in self.period for b in bare], dtype=bool) if n else pos0
        comma = ~special & np.array([b in self.comma for b in bare], dtype=bool) if n else pos0
        declared = {st.name: np.array([bool(st.keys(b, bool(sp))) for b, sp in zip(bare, special)], dtype=bool)
                    for st in declared}
        return UnitClasses(first=first, separator=sep, period=period, comma=comma, declared=declared)

    def classify_map(self, m) -> UnitClasses:
        """Masks for an :class:`~attnscope.maps.AttentionMap`."""
        return self.classify(m.tokens, m.special)
