"""Streaming, mergeable analyses, registered by name in :data:`ANALYSES`.

Every module of this package is imported here (:func:`load_analyses`, as the families are), so
:data:`ANALYSES` is complete as soon as this package is imported, and a new analysis is one new
module and nothing else. The modules import numpy only; torch is imported inside the functions
that run a model.
"""

import importlib
import pkgutil

from attnscope.analyses.base import (
    ANALYSES,
    Analysis,
    EncodedAnalysis,
    MapsAnalysis,
    Result,
    check_requirements,
    get_analysis,
    register,
)

__all__ = ["ANALYSES", "Analysis", "EncodedAnalysis", "MapsAnalysis", "Result", "check_requirements",
           "get_analysis", "load_analyses", "register"]


def load_analyses() -> dict[str, type[Analysis]]:
    """Every registered analysis by name (imports each module of this package once; the
    ``probes`` sub-package registers none and imports torch, so it is left to its users)."""
    for info in pkgutil.iter_modules(__path__, f"{__name__}."):
        if not info.ispkg:
            importlib.import_module(info.name)
    return ANALYSES


load_analyses()
