"""One pass over the data feeds every enabled analysis."""

from __future__ import annotations

from collections.abc import Iterable

from attnscope.analyses.base import REQUIREMENTS, Analysis, Result
from attnscope.errors import AttnscopeError
from attnscope.maps import AttentionBatch


def check_requirements(analyses: Iterable[Analysis], available: set[str]) -> None:
    """Refuse, naming what is missing, when an analysis needs what the data lacks."""
    for a in analyses:
        missing = set(a.requires) - available
        if missing:
            need = "; ".join(REQUIREMENTS.get(m, m) for m in sorted(missing))
            raise AttnscopeError(f"analysis '{a.name}' needs {need}")


def run_analyses(analyses: list[Analysis], batches: Iterable[AttentionBatch]) -> dict[str, Result]:
    """Feed every batch to every analysis once, then finalize each."""
    for batch in batches:
        for a in analyses:
            a.update(batch)
    return {a.name: a.finalize() for a in analyses}
