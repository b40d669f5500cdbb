"""User-facing errors.

Every problem caused by the user's input (a file, an argument, a model name) is raised as an
:class:`AttnscopeError`. The command line prints ``error: <message>`` on one line and exits
with status 2, with no traceback. Library users catch the exception as usual.

Messages name where the problem is: ``file:line: what is wrong`` for files, ``example N: ...``
for in-memory inputs. A message about an argument names the parameter as the library calls it
(``max_seq_len``) and lists it in ``params``; the command line shows it as its own flag
(``--max-seq-len``) with :meth:`AttnscopeError.for_flags`, so the message is right for every
caller.

>>> e = AttnscopeError("max_seq_len must be at least 8, not 4", params=("max_seq_len",))
>>> str(e), e.for_flags({"max_seq_len": "--max-seq-len"})
('max_seq_len must be at least 8, not 4', '--max-seq-len must be at least 8, not 4')

A parameter is named as a word of the sentence. Where it is part of a path (``runs/out``,
``out.json``), of a bracket (``attnscope[ray]``) or quoted, or where a ``:`` follows it (how a
message names its file: ``out: already holds other files``), it is left as it is. A message
recommends only what its caller can do: a parameter of the function the caller called, or a
whole command line (``'attnscope extract ... --resume'``), never another command's bare flag.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path


class AttnscopeError(Exception):
    """A problem with the user's input or arguments; the message is one line. ``params``: the
    parameters (library names) the message mentions, each as a whole word."""

    def __init__(self, message: str = "", *, params: tuple[str, ...] = ()):
        super().__init__(message)
        self.params = tuple(params)

    def for_flags(self, flags: Mapping[str, str]) -> str:
        """The message with each parameter in ``params`` shown as ``flags[name]`` (the caller's
        spelling, e.g. a command-line flag); a parameter without an entry becomes
        ``--name-in-kebab-case``."""
        message = str(self)
        for name in self.params:
            flag = flags.get(name) or "--" + name.replace("_", "-")
            message = re.sub(rf"(?<![\w\-/\\.\['\"]){re.escape(name)}(?![\w\-/\\\]'\":]|\.\w)", flag,
                             message)
        return message


class InputError(AttnscopeError):
    """Malformed input data: names the file and line, or the example index."""

    def __init__(self, where: str | Path | None, message: str, line: int | None = None, *,
                 params: tuple[str, ...] = ()):
        self.where = None if where is None else str(where)
        self.line = line
        loc = ""
        if self.where is not None:
            loc = self.where if line is None else f"{self.where}:{line}"
        super().__init__(f"{loc}: {message}" if loc else message, params=params)


class ModelError(AttnscopeError):
    """A model that cannot be found, loaded or used as asked."""


class NoAttentionError(AttnscopeError):
    """Attention weights that are empty or None: the model ran a fused kernel (sdpa, flash
    attention), which computes no probabilities, so ``output_attentions=True`` gave nothing."""

    def __init__(self, what: str = "attention"):
        super().__init__(
            f"{what} is empty: the model ran a fused attention kernel (sdpa or flash attention), "
            "which returns no attention weights. Load it with attn_implementation=\"eager\", or "
            "pass attnscope the model, its tokenizer and the text (head_view(model, text, "
            "tokenizer=tokenizer)) and it captures the attention itself")


class IndexRangeError(AttnscopeError):
    """A layer or head number that the model does not have. ``what`` is "layer" or "head",
    ``value`` the number asked for (0-indexed, as in code), ``count`` how many there are; the
    command line, whose flags are 1-indexed as the pages show heads, says it with
    :meth:`one_indexed`.

    >>> e = IndexRangeError("example 0", "layer", 6, 6)
    >>> str(e), e.one_indexed("--layer")
    ('example 0: layer 6 out of range (the model has 6 layers: 0 to 5 counted from 0, as code counts them; the pages show them as 1 to 6)', 'example 0: --layer 7 out of range (the model has 6 layers: 1 to 6)')
    """

    def __init__(self, where: str, what: str, value: int, count: int):
        self.where, self.what, self.value, self.count = where, what, value, count
        per = " per layer" if what == "head" else ""
        super().__init__(f"{where}: {what} {value} out of range (the model has {count} {what}s{per}: 0 to "
                         f"{count - 1} counted from 0, as code counts them; the pages show them as 1 to {count})")

    def one_indexed(self, flag: str) -> str:
        """The message for a 1-indexed ``flag`` (the number as the user typed it)."""
        per = " per layer" if self.what == "head" else ""
        return (f"{self.where}: {flag} {self.value + 1} out of range (the model has {self.count} "
                f"{self.what}s{per}: 1 to {self.count})")


class StoreError(AttnscopeError):
    """A store that is missing, corrupt, or in conflict with what was asked."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during a job, carrying the one line that says what the job kept and
    how to go on; the command line prints it and exits 130."""
