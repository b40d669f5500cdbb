"""The one serialisation of results: strict JSON, read by the report, ``--resume`` and the viewer.

Every results file attnscope writes (``results/<family>.json``, ``results.json``, the run's
checkpoints) goes through :func:`write_json`: numpy values become plain numbers and lists, and
NaN or infinite values become ``null`` (strict JSON parsers refuse NaN); an array read back
with :meth:`attnscope.analyses.base.Result.from_json` turns ``null`` into NaN again. Files are
written atomically, so a killed run never leaves half a file.

>>> import math, tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "r.json"
>>> write_json(p, {"x": float("nan"), "y": 2})
>>> read_json(p)
{'x': None, 'y': 2}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnscope.data.io import atomic_write_text, to_plain


def dumps(obj: Any, compact: bool = False) -> str:
    """``obj`` as strict JSON text (NaN and infinities as null); ``compact``: on one line."""
    layout = {"separators": (",", ":")} if compact else {"indent": 1}
    return json.dumps(to_plain(obj), ensure_ascii=False, allow_nan=False, **layout) + "\n"


def write_json(path: str | Path, obj: Any, compact: bool = False) -> None:
    """Write ``obj`` as strict JSON, atomically (``compact``: on one line, for large files)."""
    atomic_write_text(Path(path), dumps(obj, compact))


def read_json(path: str | Path) -> dict | None:
    """A results file, or None when it is missing, unreadable or not JSON (a checkpoint that
    cannot be read is treated as absent, so ``--resume`` recomputes that family)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def family_results(key: str, section: Any, params: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A family's ``results/<key>.json`` payload: a Result's keys (``analysis``, ``params``, the
    section's ``tables`` by name, its findings as ``summary``), so the report, ``--resume`` and
    the viewer read it like every other results file, then anything else the family keeps."""
    return {"analysis": key, "params": params, "tables": {t.name: t.rows for t in section.tables},
            "summary": list(section.findings), **extra}


# ---------------------------------------------------------------------------------------------
# The results folder: results/<key>.json, one per family, the contract between a family and
# everything that reads what it wrote (the report, --resume, serve, view, compare)

#: Version of a family's results file; :func:`write_results` stamps it, readers check it.
SCHEMA_VERSION = 1
#: Key of the version stamp in a family's results file.
SCHEMA_KEY = "attnscope_result"
#: The folder (inside an output folder) that holds the families' results files.
RESULTS_DIR = "results"
#: Where a family keeps the top examples of every head (``heads/<family>.json``), for the head pages.
HEADS_DIR = "heads"


def results_path(out_dir: str | Path, key: str) -> Path:
    """Where family ``key`` writes its results in ``out_dir``."""
    return Path(out_dir) / RESULTS_DIR / f"{key}.json"


def write_results(out_dir: str | Path, key: str, payload: Any) -> Path:
    """Write family ``key``'s results under ``out_dir`` (a :class:`~attnscope.analyses.base.Result`
    or a dict with its keys: ``analysis``, ``params``, ``tables``, ``arrays``, ``summary``,
    ``meta``, and any more the family keeps), stamped with :data:`SCHEMA_VERSION` and the key."""
    body = payload.to_json() if hasattr(payload, "to_json") else dict(payload)
    path = results_path(out_dir, key)
    write_json(path, {SCHEMA_KEY: SCHEMA_VERSION, "family": key, **body})
    return path


class ResultsFolder:
    """The families' results in an output folder (``results/<key>.json``), read one way by
    every consumer.

    ``folder`` is the output folder of ``attnscope run`` or ``attnscope analyze``. Files are
    read once, on first use. A file that is not readable JSON, is not an object with an
    ``analysis`` name, or carries a newer schema version is named in :attr:`problems` and left
    out; a folder without results gives nothing (not an error). Files written before the
    schema stamp existed are read as version 1.
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.problems: list[str] = []
        self._items: dict[str, tuple[Path, dict]] | None = None

    def _load(self) -> dict[str, tuple[Path, dict]]:
        if self._items is not None:
            return self._items
        self._items = {}
        for path in sorted((self.folder / RESULTS_DIR).glob("*.json")):
            d = read_json(path)
            name = f"{path.parent.name}/{path.name}"
            if d is None:
                self.problems.append(f"{name}: not readable as JSON")
            elif not isinstance(d, dict) or not isinstance(d.get("analysis"), str):
                self.problems.append(f"{name}: not an analysis result")
            elif not isinstance(d.get(SCHEMA_KEY, 1), int) or d.get(SCHEMA_KEY, 1) > SCHEMA_VERSION:
                self.problems.append(f"{name}: written by a newer attnscope (results schema "
                                     f"{d.get(SCHEMA_KEY)!r}; this one reads {SCHEMA_VERSION})")
            else:
                self._items[d.get("family") or path.stem] = (path, d)
        return self._items

    def keys(self) -> list[str]:
        return list(self._load())

    def get(self, key: str) -> dict | None:
        """Family ``key``'s results, or None when it wrote none (or they are unreadable)."""
        item = self._load().get(key)
        return item[1] if item else None

    def path(self, key: str) -> Path | None:
        item = self._load().get(key)
        return item[0] if item else None

    def items(self):
        """``(key, path, results)`` of every readable results file, by file name."""
        return [(k, p, d) for k, (p, d) in self._load().items()]
