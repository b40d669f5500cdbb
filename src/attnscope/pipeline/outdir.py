"""The output folder: refused writes as one line, the run's state file, taking over (or
refusing) a folder that holds an earlier run, and replacing stores a family keeps."""

from __future__ import annotations

import errno
import shutil
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from attnscope.errors import AttnscopeError, Interrupted
from attnscope.store.checkpoints import STATE_DIR, kept_units
from attnscope.store.format import MANIFEST
from attnscope.store.results import read_json, write_json

STATE_FILE = "state.json"  # in STATE_DIR (attnscope.store.checkpoints)


DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


@contextmanager
def refused_writes(out_dir: Path, *, resumable: bool = True):
    """Turn a write the disk refuses (full, read-only, no permission) into one line naming the
    folder; ``resumable`` (a run): the finished families are kept as checkpoints, so ``resume``
    continues."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in DISK_ERRORS:
            raise
        reason = (exc.strerror or type(exc).__name__).lower()
        if not resumable:
            raise AttnscopeError(f"{out_dir}: cannot write ({reason}); make room (or fix the "
                                 "folder) and run it again") from None
        raise AttnscopeError(f"{out_dir}: cannot write ({reason}); the finished families are kept: "
                             "make room (or fix the folder) and run the same command with resume",
                             params=("resume",)) from None


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_out_dir(out_dir: Path, *, resume: bool, overwrite: bool) -> dict | None:
    """Refuse an output folder that cannot be used, before any work; return its run state.

    A missing or empty folder is fine; a folder holding a run needs ``resume`` or
    ``overwrite``; a folder holding anything else is refused (and never deleted).
    """
    if not out_dir.exists() or not any(out_dir.iterdir()):
        return None
    state_path = out_dir / STATE_DIR / STATE_FILE
    old = read_json(state_path) if state_path.exists() else None
    if old is None:
        what = "is not an attnscope run; refusing to delete it" if overwrite else "already holds other files"
        raise AttnscopeError(f"{out_dir}: {what} (choose another out_dir)", params=("out_dir",))
    if not resume and not overwrite:
        raise AttnscopeError(f"{out_dir}: already holds a run (use resume to continue it or "
                             "overwrite to replace it)", params=("resume", "overwrite"))
    return old


def take_out_dir(out_dir: Path, old: dict | None, run_fp: str, *, overwrite: bool) -> dict | None:
    """After the inputs are read: clear the folder for ``overwrite``, or check that the run
    to resume is the same job. Returns the state of the run being resumed, if any."""
    if old is None:
        return None
    if overwrite:
        shutil.rmtree(out_dir)
        return None
    if old.get("fingerprint") != run_fp:
        raise AttnscopeError(f"{out_dir}: cannot resume: that run was made with other arguments, "
                             "inputs or weights (use overwrite to start again)", params=("overwrite",))
    return old


def replace_stores(folder: Path) -> None:
    """Clear ``folder`` of the stores an earlier ``analyze --save-maps`` kept there: they are
    replaced, as its tables and results are. A folder holding anything but attnscope stores is
    refused, and nothing in it is deleted."""
    if not folder.exists():
        return
    stores = [m.parent for m in folder.rglob(MANIFEST)]
    others = [p for p in folder.rglob("*") if p.is_file() and not any(s in p.parents for s in stores)]
    if not folder.is_dir() or others:
        raise AttnscopeError(f"{folder}: holds files that are not attnscope stores; refusing to "
                             "replace them (choose another save_maps)", params=("save_maps",))
    shutil.rmtree(folder)


def interrupted(out_dir: Path, *, finished: list[str], current: str | None, then: str,
                state: dict | None = None) -> Interrupted:
    """The :class:`~attnscope.errors.Interrupted` of a job stopped by Ctrl-C or SIGTERM while
    ``current`` (a family's key, or None) ran: one line naming the ``finished`` families, what
    ``current`` kept of its work (finished units, epochs, whole shards), and ``then``, how to go
    on. ``state`` (a run's): marked ``interrupted`` in its state file."""
    kept = [f"{', '.join(finished)} (finished)"] if finished else []
    units = kept_units(out_dir, current) if current else []
    if units:
        kept.append(f"{current}'s {', '.join(units)}")
    if state is not None:
        state.update(status="interrupted", interrupted=now(), finished=finished, running=current)
        write_json(out_dir / STATE_DIR / STATE_FILE, state)
    if not kept:
        return Interrupted(f"interrupted: nothing finished was kept in {out_dir}; {then} to start again")
    return Interrupted(f"interrupted: {out_dir} keeps {'; '.join(kept)}; {then} to go on from there")
