"""The contract every analysis follows, and the registry that finds them by name.

An analysis accumulates sums and counts in ``update(batch)``, combines with another instance
of itself in ``merge(other)`` (so shards can be processed on different machines), and divides
only in ``finalize()``. Its result must not depend on how the data was batched or sharded.
It never modifies the batch it is given.

>>> a = ANALYSES["relative-position"](); a.update(batch); a.finalize()   # doctest: +SKIP
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from attnscope.errors import AttnscopeError
from attnscope.maps import AttentionBatch
from attnscope.store.results import write_json

#: What an analysis may declare in ``requires``.
REQUIREMENTS = {
    "word_level": "word-level maps ('attnscope extract ... --word-level')",
    "dependencies": "examples with heads and relns (attnscope prepare depparse)",
    "coreference": "examples with coreference mentions and clusters",
    "model": "the model itself (gradients), not only stored maps",
    "causal": "a causal (decoder) model",
}


def check_requirements(analyses: Iterable["Analysis"], available: set[str], who: str = "") -> None:
    """Refuse, in one line naming ``who`` (a family) and the analysis, when an analysis
    ``requires`` what the pass does not have (``available``, in the words of :data:`REQUIREMENTS`)."""
    for a in analyses:
        missing = set(a.requires) - available
        if missing:
            need = "; ".join(REQUIREMENTS[m] for m in sorted(missing))
            raise AttnscopeError(f"{who + ': ' if who else ''}analysis '{a.name}' needs {need}")


#: what a malformed array of a results file raises on reading
MALFORMED = (KeyError, TypeError, ValueError, AttributeError)


def arrays_from_json(arrays: dict[str, Any] | None, malformed: list[str] | None = None) -> dict[str, np.ndarray]:
    """A results file's ``arrays`` (name -> ``{shape, dtype, data}``, what :meth:`Result.to_json`
    writes) as numpy arrays; null (NaN in strict JSON) reads back as NaN in float arrays. A
    malformed array raises one of :data:`MALFORMED`, or, given ``malformed``, is named there and
    left out."""
    out = {}
    for name, spec in (arrays or {}).items():
        try:
            out[name] = np.asarray(spec["data"], dtype=spec["dtype"]).reshape(spec["shape"])
        except MALFORMED:
            if malformed is None:
                raise
            malformed.append(name)
    return out


@dataclass
class Result:
    """What an analysis returns.

    ``tables``: name -> list of row dicts (JSON-able), e.g. one row per head with ``layer``,
    ``head`` (0-indexed) and ``name`` (the paper's 1-indexed ``"8-10"``).
    ``arrays``: name -> numpy array, e.g. a ``[L H]`` statistic.
    ``summary``: findings in plain words. ``params``: the analysis's parameters and seeds.
    ``examples``: the top and typical examples of each head (analyses that keep them).
    """

    analysis: str
    params: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, list[dict]] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    summary: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    #: Where each head does its thing (:meth:`TopExamples.to_json
    #: <attnscope.analyses.top_examples.TopExamples.to_json>` per statistic), with ``examples``
    #: (the units of the examples named); written beside the results, not inside them.
    examples: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "analysis": self.analysis, "params": self.params, "tables": self.tables,
            "arrays": {k: {"shape": list(v.shape), "dtype": str(v.dtype), "data": v.tolist()}
                       for k, v in self.arrays.items()},
            "summary": self.summary, "meta": self.meta,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Result":
        return cls(analysis=d["analysis"], params=d.get("params", {}), tables=d.get("tables", {}),
                   arrays=arrays_from_json(d.get("arrays")), summary=d.get("summary", []), meta=d.get("meta", {}))

    def save(self, path: str | Path) -> None:
        """Write as strict JSON (NaN as null) with :func:`attnscope.store.results.write_json`."""
        write_json(path, self.to_json())


def add(mine: Any, theirs: Any) -> Any:
    """``mine`` and ``theirs`` (one attribute of two accumulators of the same analysis) summed:
    numbers and arrays add (None, nothing accumulated yet, takes a copy of the other), a dict
    adds per key, lists concatenate, and an accumulator with a ``merge`` of its own merges.

    >>> add(None, np.array([1.0, 2.0])).tolist(), add({"a": 1}, {"a": 2, "b": 3}), add([1], [2])
    ([1.0, 2.0], {'a': 3, 'b': 3}, [1, 2])
    """
    if theirs is None:
        return mine
    if mine is None:
        return theirs.copy() if hasattr(theirs, "copy") else theirs
    if hasattr(mine, "merge"):
        mine.merge(theirs)
        return mine
    if isinstance(mine, dict):
        for key, value in theirs.items():
            mine[key] = add(mine.get(key), value)
        return mine
    if isinstance(mine, np.ndarray) and mine.shape != np.shape(theirs):
        raise ValueError(f"cannot merge accumulators of different shapes ({mine.shape} and "
                         f"{np.shape(theirs)}): different models")
    return mine + theirs


class Analysis(ABC):
    """What every analysis shares: ``name``, ``requires``, ``merge`` and ``finalize``.

    Subclass one of the two bases, which say what ``update`` is fed:
    :class:`MapsAnalysis` (an :class:`AttentionBatch` of maps) or :class:`EncodedAnalysis`
    (the encoded inputs, for analyses that run the model themselves).
    """

    name: ClassVar[str]
    requires: ClassVar[frozenset[str]] = frozenset()
    #: What ``update`` is fed, ``"maps"`` or ``"encoded"``; set by the two bases.
    consumes: ClassVar[str]

    @abstractmethod
    def update(self, batch: Any) -> None:
        """Accumulate one batch (never modify it)."""

    #: Attributes that merge by adding (:func:`add`): counts, sums, accumulators with a
    #: ``merge`` of their own. An analysis whose merge is only that lists them and writes no
    #: ``merge``; one that needs more calls ``super().merge(other)`` for these.
    summed: ClassVar[tuple[str, ...]] = ()

    def merge(self, other: "Analysis") -> "Analysis":
        """Fold ``other`` (same class, same parameters) into ``self`` and return ``self``: each
        attribute of :attr:`summed` becomes the sum of the two."""
        self._check_mergeable(other)
        for name in self.summed:
            setattr(self, name, add(getattr(self, name), getattr(other, name)))
        return self

    @abstractmethod
    def finalize(self) -> Result:
        """Divide the sums and return the result; does not change the accumulated state."""

    def params(self) -> dict[str, Any]:
        """The analysis's explicit parameters (recorded in its result)."""
        return {}

    @classmethod
    def for_model(cls, model, *, seed: int = 0) -> "Analysis":
        """An instance with default parameters for ``model`` (a loaded model, or None for maps
        alone). The contract test builds every registered analysis this way, so an analysis
        whose constructor needs more than defaults overrides it."""
        return cls()

    def _check_mergeable(self, other: "Analysis") -> None:
        if type(other) is not type(self) or other.params() != self.params():
            raise ValueError(f"cannot merge {type(other).__name__}{other.params()} into "
                             f"{type(self).__name__}{self.params()}")


class MapsAnalysis(Analysis):
    """An analysis fed attention maps: ``update(batch)`` takes an :class:`AttentionBatch` (from
    the model, or read back from a store)."""

    consumes = "maps"

    @abstractmethod
    def update(self, batch: AttentionBatch) -> None:
        """Accumulate one batch of maps (never modify it)."""


class EncodedAnalysis(Analysis):
    """An analysis that runs the model itself (gradients, ablated heads, hooked keys):
    ``update(batch)`` takes a list of :class:`~attnscope.extract.encode.Encoded` examples."""

    consumes = "encoded"

    @abstractmethod
    def update(self, batch: list) -> None:
        """Accumulate one batch of encoded examples."""


ANALYSES: dict[str, type[Analysis]] = {}


def register(cls: type[Analysis]) -> type[Analysis]:
    """Class decorator: make an analysis available by its stable ``name``."""
    if not (issubclass(cls, MapsAnalysis) or issubclass(cls, EncodedAnalysis)):
        raise TypeError(f"{cls.__name__}: an analysis subclasses MapsAnalysis or EncodedAnalysis")
    if cls.name in ANALYSES and ANALYSES[cls.name] is not cls:
        raise ValueError(f"analysis name {cls.name!r} registered twice")
    ANALYSES[cls.name] = cls
    return cls


def get_analysis(name: str) -> type[Analysis]:
    try:
        return ANALYSES[name]
    except KeyError:
        raise KeyError(f"unknown analysis {name!r}; known: {', '.join(sorted(ANALYSES))}") from None
