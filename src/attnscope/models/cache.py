"""attnscope's cache folder, the one place it is decided.

``$ATTNSCOPE_CACHE``, else ``$XDG_CACHE_HOME/attnscope``, else ``~/.cache/attnscope``. What lives
under it: the dequantized GGUF models (``gguf/<sha256>/``, :mod:`attnscope.models.gguf`) and the
streaming engine's compiled kernels (:mod:`attnscope.engines.native`).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """attnscope's cache folder (see the module docstring): read at each call, so a test or a
    job may point it elsewhere through the environment."""
    if os.environ.get("ATTNSCOPE_CACHE"):
        return Path(os.environ["ATTNSCOPE_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "attnscope"
