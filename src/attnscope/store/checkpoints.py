"""The resumable log of a step made of many units (tasks, documents): one JSON line per
finished unit after a fingerprint line, so that a killed run picks up where it stopped.

The pipeline owns resuming (:mod:`attnscope.pipeline`): it checkpoints each finished family,
and a family's long step runs through :meth:`attnscope.families.base.Units.tasks`, whose
executor keeps each finished unit's record here (``run/<family>-<step>.jsonl`` in the output
folder) and reads back what an earlier run of the same job finished. The pipeline removes the
logs once the family's results are written.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "step.jsonl"
>>> log = UnitLog(path, "job-1")
>>> log.add(0, {"answer": "42"})
{'unit': 0, 'answer': '42'}
>>> sorted(UnitLog(path, "job-1").done), sorted(UnitLog(path, "job-2").done)   # another job reads nothing
([0], [])
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

#: The folder (inside an output folder) that holds a run's state, each finished family's
#: checkpoint (``<family>.json``) and the unit logs of the family in progress.
STATE_DIR = "run"


class UnitLog:
    """Finished units of a step, keyed by their index. :attr:`done` holds the records of an
    earlier run with the same ``fingerprint``; a file of another job is replaced. Lines are
    appended and flushed one at a time; a torn last line (the kill came mid-write) is dropped.
    ``path`` None: nothing is kept."""

    def __init__(self, path: Path | None, fingerprint: str):
        self.path, self.done = path, {}
        if path is None:
            return
        head = json.dumps({"fingerprint": fingerprint})
        lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
        if lines and lines[0] == head:
            for line in lines[1:]:
                try:
                    d = json.loads(line)
                except json.JSONDecodeError:
                    break
                self.done[int(d["unit"])] = d
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:  # the fingerprint and the good lines only
            f.write("\n".join([head] + [json.dumps(d) for d in self.done.values()]) + "\n")

    def add(self, unit: int, record: dict) -> dict:
        """Keep ``record`` as unit ``unit``'s (written and synced before this returns)."""
        record = {"unit": unit, **record}
        self.done[unit] = record
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
                f.flush()
                os.fsync(f.fileno())
        return record


class StateFile:
    """The latest state of a step that runs in rounds (a training run, epoch by epoch): a JSON
    record and named arrays in one safetensors file (no pickle), replaced atomically after each
    round, under the job's ``fingerprint`` so that a killed run goes on from its last finished
    round. ``path`` None: nothing is kept.

    >>> import tempfile, pathlib, numpy as np
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "train.safetensors"
    >>> StateFile(path, "job-1").save({"epoch": 2}, {"w": np.arange(3, dtype=np.float32)})
    >>> record, arrays = StateFile(path, "job-1").load()
    >>> record, arrays["w"].tolist(), StateFile(path, "job-2").load()   # another job reads nothing
    ({'epoch': 2}, [0.0, 1.0, 2.0], None)
    """

    KEY = "attnscope_state"

    def __init__(self, path: Path | None, fingerprint: str):
        self.path, self.fingerprint = path, fingerprint

    def load(self) -> tuple[dict, dict[str, np.ndarray]] | None:
        """The record and arrays of the last round kept under this fingerprint, or None."""
        from safetensors import SafetensorError, safe_open

        if self.path is None or not self.path.is_file():
            return None
        try:
            with safe_open(str(self.path), "np") as f:
                head = json.loads((f.metadata() or {}).get(self.KEY, "null"))
                if not isinstance(head, dict) or head.get("fingerprint") != self.fingerprint:
                    return None
                return head["record"], {k: f.get_tensor(k) for k in f.keys()}
        except (SafetensorError, OSError, ValueError, KeyError):
            return None  # torn or foreign: start the step again

    def save(self, record: dict, arrays: dict[str, np.ndarray]) -> None:
        """Keep ``record`` and ``arrays`` as the step's state (synced, then renamed over the old)."""
        from safetensors.numpy import save_file

        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        head = json.dumps({"fingerprint": self.fingerprint, "record": record})
        save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(tmp), metadata={self.KEY: head})
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def unit_log_path(out_dir: Path, family: str, step: str) -> Path:
    """Where ``family``'s step ``step`` keeps its finished units in ``out_dir``."""
    return unit_path(out_dir, family, f"{step}.jsonl")


def unit_path(out_dir: Path, family: str, name: str) -> Path:
    """Where ``family`` keeps the work in progress called ``name`` (a state file, a store being
    extracted) in ``out_dir``, until its results are written."""
    return Path(out_dir) / STATE_DIR / f"{family}-{name}"


def kept_units(out_dir: Path, family: str) -> list[str]:
    """What ``family``'s unfinished work in ``out_dir`` holds, for the line an interrupted run
    prints: finished units per log, rounds per state file, whole shards per store."""
    out: list[str] = []
    folder = Path(out_dir) / STATE_DIR
    for path in sorted(folder.glob(f"{family}-*")):
        step = path.name[len(family) + 1:]
        if path.suffix == ".jsonl":
            n = max(len(path.read_text(encoding="utf-8").splitlines()) - 1, 0)
            if n:
                out.append(f"{n} finished {Path(step).stem} unit{'s' if n != 1 else ''}")
        elif path.suffix == ".safetensors" and not path.name.startswith("."):
            out.append(f"the last finished round of {Path(step).stem}")
        elif path.is_dir():
            shards = [p for p in path.rglob("*") if p.is_file() and p.parent.name == "shards"
                      and not p.name.startswith(".")]
            if shards:
                out.append(f"{len(shards)} extracted shard{'s' if len(shards) != 1 else ''} of {step}")
    return out


def drop_unit_logs(out_dir: Path, family: str) -> None:
    """Remove ``family``'s work in progress (unit logs, state files, stores being extracted; its
    results are written), and the state folder if that leaves it empty."""
    folder = Path(out_dir) / STATE_DIR
    for path in folder.glob(f"{family}-*"):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    for path in folder.glob(f".{family}-*.tmp"):
        path.unlink(missing_ok=True)
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
