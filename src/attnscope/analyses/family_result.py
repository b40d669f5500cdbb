"""What a family made, typed (:class:`FamilyResult`): its results file (``results/<key>.json``,
the contract between a family and everything that reads it) as arrays, tables, findings,
provenance, the model record and the records of the
:class:`~attnscope.analyses.stat.Stat` statistics it declares, and, right after the family ran, the report's section.

Every family's ``run`` returns one (:meth:`attnscope.families.base.Context.result` reads back
the file the family wrote: the consumer's side of the seam, on what the producer wrote), and a
reader of an output folder gets the same type from :meth:`FamilyResult.read`.

>>> r = FamilyResult.from_json({"analysis": "general", "family": "general", "params": {"seed": 0},
...     "arrays": {"sink": {"shape": [1, 2], "dtype": "float64", "data": [[0.5, None]]}},
...     "model": {"name": "m", "attention": {"attention_layers": [3]}}, "seed": 0})
>>> r.family, r.array("sink").tolist(), r.layers, r.provenance["seed"]
('general', [[0.5, nan]], (3,), 0)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.analyses.base import MALFORMED, Result, arrays_from_json
from attnscope.data.records import recorded_layers
from attnscope.errors import AttnscopeError
from attnscope.store.results import SCHEMA_KEY, ResultsFolder

#: what says how the numbers were made: the run's settings, seeds, notes and versions
PROVENANCE = ("run", "seed", "notes", "versions", "command", "plan")


@dataclass(frozen=True)
class FamilyResult:
    """One family's results (module docstring). ``arrays`` are numpy arrays (``null`` in the file,
    NaN); ``summary`` the findings in plain words; ``model`` the model record
    (:meth:`~attnscope.models.loaded.LoadedModel.describe`); ``provenance`` the run's settings
    and seeds; ``stats`` the records of the statistics the file declares
    (:func:`attnscope.analyses.stat.records`); ``body`` the whole file; ``path``
    where it was read from; ``section``: the report's section, when the family has just run."""

    family: str
    params: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, list[dict]] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    summary: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    model: dict | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    stats: tuple[dict, ...] = ()
    #: the results of the analyses the family ran, where its file keeps them (``analyses``: the
    #: general family's relative position, special tokens, entropy, ...)
    analyses: dict[str, Result] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    section: Any = None

    @classmethod
    def from_json(cls, d: dict[str, Any], path: Path | None = None, section: Any = None,
                  problems: list[str] | None = None) -> "FamilyResult":
        """A results file's object as a :class:`FamilyResult`; a malformed array or record is one
        line naming the file, or, given ``problems`` (a viewer, which shows what it can), named
        there and left out."""
        where = str(path) if path is not None else "results"
        try:  # (null, NaN in strict JSON, reads back as NaN in float arrays)
            if problems is None:
                arrays = arrays_from_json(d.get("arrays"))
                analyses = {k: Result.from_json(v) for k, v in (d.get("analyses") or {}).items()}
            else:  # (named as the pages name a file: results/<file>)
                where = f"{path.parent.name}/{path.name}" if path is not None else where
                malformed: list[str] = []
                arrays, analyses = arrays_from_json(d.get("arrays"), malformed), {}
                problems.extend(f"{where}: array {name!r} is malformed" for name in malformed)
                for name, spec in (d.get("analyses") or {}).items():
                    try:
                        analyses[name] = Result.from_json(spec)
                    except MALFORMED:
                        problems.append(f"{where}: the results of analysis {name!r} are malformed")
        except MALFORMED as err:
            raise AttnscopeError(f"{where}: a malformed array ({type(err).__name__}: {err})") from None
        model = d.get("model") if isinstance(d.get("model"), dict) else (d.get("meta") or {}).get("model")
        return cls(family=str(d.get("family") or d.get("analysis")), params=dict(d.get("params") or {}),
                   tables=dict(d.get("tables") or {}), arrays=arrays, summary=list(d.get("summary") or []),
                   meta=dict(d.get("meta") or {}), model=model if isinstance(model, dict) else None,
                   provenance={k: d[k] for k in PROVENANCE if k in d}, stats=tuple(d.get("stats") or ()),
                   analyses=analyses,
                   body={k: v for k, v in d.items() if k != SCHEMA_KEY}, path=path, section=section)

    @classmethod
    def read(cls, folder: str | Path, key: str, section: Any = None) -> "FamilyResult | None":
        """Family ``key``'s results in the output folder ``folder`` (None where it wrote none)."""
        found = ResultsFolder(folder)
        d = found.get(key)
        return None if d is None else cls.from_json(d, found.path(key), section)

    @classmethod
    def read_all(cls, found: ResultsFolder) -> list["FamilyResult"]:
        """Every readable results file of ``found`` (a :class:`~attnscope.store.results.ResultsFolder`),
        by file name, as a viewer reads them: each malformed part named in ``found.problems`` (as
        ``results/<file>``) and left out."""
        return [cls.from_json(d, path, problems=found.problems) for _, path, d in found.items()]

    @property
    def source(self) -> str:
        """The file it was read from as the pages name it (``results/general.json``)."""
        return f"{self.path.parent.name}/{self.path.name}" if self.path is not None else self.family

    @property
    def analysis(self) -> str:
        """The ``analysis`` name the file gives (the family's key for a family's file)."""
        return str(self.body.get("analysis") or self.family)

    @property
    def layers(self) -> tuple[int, ...] | None:
        """The model's own index of each layer the arrays hold (a hybrid's layers with
        attention), from the model record; None: layer ``i`` is the model's layer ``i``."""
        return recorded_layers(self.model)

    def array(self, name: str, analysis: str | None = None) -> np.ndarray:
        """The array ``name`` (of ``analysis``, where the file keeps its analyses' results); a
        missing one is one line naming the file and what it has."""
        arrays = self.arrays if analysis is None else \
            (self.analyses[analysis].arrays if analysis in self.analyses else {})
        if name not in arrays:
            where = f"{self.path or self.family}" + (f" ({analysis})" if analysis else "")
            raise AttnscopeError(f"{where}: no array {name!r} (it has {', '.join(sorted(arrays)) or 'none'})")
        return arrays[name]
