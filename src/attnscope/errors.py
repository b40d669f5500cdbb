"""User-facing errors.

Every problem caused by the user's input (a file, an argument, a model name) is raised as an
:class:`AttnscopeError`. The command line prints ``error: <message>`` on one line and exits
with status 2, with no traceback. Library users catch the exception as usual.

Messages name where the problem is: ``file:line: what is wrong`` for files, ``example N: ...``
for in-memory inputs.
"""

from __future__ import annotations

from pathlib import Path


class AttnscopeError(Exception):
    """A problem with the user's input or arguments; the message is one line."""


class InputError(AttnscopeError):
    """Malformed input data: names the file and line, or the example index."""

    def __init__(self, where: str | Path | None, message: str, line: int | None = None):
        self.where = None if where is None else str(where)
        self.line = line
        loc = ""
        if self.where is not None:
            loc = self.where if line is None else f"{self.where}:{line}"
        super().__init__(f"{loc}: {message}" if loc else message)


class ModelError(AttnscopeError):
    """A model that cannot be found, loaded or used as asked."""


class StoreError(AttnscopeError):
    """A store that is missing, corrupt, or in conflict with what was asked."""
