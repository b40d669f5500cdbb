"""One JSON line per measurement, on disk the moment it is measured, so that a run killed by its
time limit keeps every row it had (benchmarks/longctx.py and benchmarks/press.py with ``--rows``;
benchmarks/gpu_session.sh collects them in ``$OUT/rows.jsonl``)."""

from __future__ import annotations

import json
import os
import sys
import time


class RowFile:
    """Appends each row to ``path`` (flushed and fsynced) and prints it to stdout.

    Every row gets ``at``: the wall-clock time it was written (seconds since the epoch).
    """

    def __init__(self, path):
        self.file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (open for the run)

    def __call__(self, row: dict) -> None:
        line = json.dumps({**row, "at": round(time.time(), 3)})
        self.file.write(line + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())
        print(line, flush=True)


def usage_error(prog: str, message: str) -> None:
    """Bad usage: one line on stderr and exit status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)
