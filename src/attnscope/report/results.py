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


def dumps(obj: Any) -> str:
    """``obj`` as strict JSON text (NaN and infinities as null)."""
    return json.dumps(to_plain(obj), indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as strict JSON, atomically."""
    atomic_write_text(Path(path), dumps(obj))


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
