"""Families: the units of a job (see :mod:`attnscope.families.base`).

Every module of this package registers its families when imported; :func:`load_families`
imports them all, so a new family is one new module here and nothing else.
"""

from __future__ import annotations

import importlib
import pkgutil

from attnscope.families.base import (
    FAMILIES,
    CompareTable,
    Context,
    Family,
    Input,
    NoOptions,
    Prepared,
    check_options,
    option,
    register_family,
)

__all__ = ["FAMILIES", "CompareTable", "Context", "Family", "Input", "NoOptions", "Prepared", "check_options",
           "load_families", "option", "register_family"]


def load_families() -> list[type[Family]]:
    """Every registered family, in report order (imports each module of this package once)."""
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")
    return sorted(FAMILIES.values(), key=lambda f: (f.order, f.key))
