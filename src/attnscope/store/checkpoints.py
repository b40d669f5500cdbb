"""The resumable log of a step made of many units (tasks, documents): one JSON line per
finished unit after a fingerprint line, so that a killed run picks up where it stopped.

The pipeline owns resuming (:mod:`attnscope.pipeline`): it checkpoints each finished family,
and a family's long step runs through :meth:`attnscope.families.base.Context.tasks`, whose
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
from pathlib import Path

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


def unit_log_path(out_dir: Path, family: str, step: str) -> Path:
    """Where ``family``'s step ``step`` keeps its finished units in ``out_dir``."""
    return Path(out_dir) / STATE_DIR / f"{family}-{step}.jsonl"


def drop_unit_logs(out_dir: Path, family: str) -> None:
    """Remove ``family``'s unit logs (its results are written), and the state folder if that
    leaves it empty."""
    folder = Path(out_dir) / STATE_DIR
    for path in folder.glob(f"{family}-*.jsonl"):
        path.unlink(missing_ok=True)
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
