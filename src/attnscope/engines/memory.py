"""Running out of GPU memory, as one line: the input length to lower, what was needed, what the device has.

A long input's pass can ask the GPU for more than it has (the model's own activations grow with
``max_seq_len``, the engine's tiles too). torch then raises ``torch.OutOfMemoryError`` with several
lines of allocator advice; :func:`gpu_memory_errors` turns it into an
:class:`~attnscope.errors.AttnscopeError` that names ``max_seq_len`` (the command line shows
``--max-seq-len``), so the command prints one line and exits 2 before anything is written.

>>> str(out_of_memory("CUDA out of memory. Tried to allocate 12.00 GiB. GPU 0 ...", 131072, "cpu"))
'max_seq_len 131072: out of GPU memory on cpu: the pass needed 12.00 GiB more; lower max_seq_len'
"""

from __future__ import annotations

import re
from contextlib import contextmanager

from attnscope.errors import AttnscopeError

_TRIED = re.compile(r"[Tt]ried to allocate ([0-9.]+ ?[KMGT]?i?B)")


def _gib(n: int) -> str:
    return f"{n / 2 ** 30:.2f} GiB"


def _ask(query) -> int:
    """A CUDA memory query's answer in bytes, 0 where the device does not answer."""
    try:
        return int(query())
    except (RuntimeError, AssertionError, AttributeError, ValueError):
        return 0


def out_of_memory(message: str, max_seq_len: int | None, device) -> AttnscopeError:
    """The one-line error for an out-of-memory ``message`` on ``device``: the allocation that
    failed (from torch's message), what was in use at the peak and what the device has (from
    torch.cuda; each left out where the device does not say)."""
    import torch

    tried = _TRIED.search(message)
    peak = _ask(lambda: torch.cuda.max_memory_allocated(device))
    total = _ask(lambda: torch.cuda.get_device_properties(device).total_memory)
    free = _ask(lambda: torch.cuda.mem_get_info(device)[0])
    line = (f"max_seq_len {max_seq_len}: " if max_seq_len else "") + f"out of GPU memory on {device}: "
    line += f"the pass needed {tried.group(1)} more" if tried else "the pass needed more than was free"
    if peak:
        line += f" on top of the {_gib(peak)} it held"
    if total:
        line += f"; the device has {_gib(total)}" + (f" ({_gib(free)} free now)" if free else "")
    return AttnscopeError(f"{line}; lower max_seq_len", params=("max_seq_len",))


@contextmanager
def gpu_memory_errors(max_seq_len: int | None, device):
    """Within the block, ``torch.OutOfMemoryError`` becomes :func:`out_of_memory`'s error."""
    import torch

    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    try:
        yield
    except oom as exc:
        raise out_of_memory(str(exc), max_seq_len, device) from None
