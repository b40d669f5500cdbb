"""Compare two ``results.json`` files leaf by leaf, e.g. the same ``attnscope run`` before and
after a change: numbers to 1e-9 relative, NaN equal to null. Times, paths and the command
line are skipped; the syntax family's ``[relation, ...]`` arrays are compared by relation name
(their order is not part of the result).

    python benchmarks/compare_results.py BEFORE/results.json AFTER/results.json [ROWS]
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter

import numpy as np

SKIP = {"elapsed_s", "analysis_time_s", "family_times_s", "started", "finished", "command",
        "seconds", "seconds_per_epoch", "analysis_seconds", "versions", "path", "paths", "source"}


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.loads(f.read(), parse_constant=lambda c: float("nan"))


def missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def walk(a, b, path: str, out: list) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in SKIP:
                continue
            if k not in a or k not in b:
                out.append((f"{path}.{k}", "only in after" if k not in a else "only in before"))
            else:
                walk(a[k], b[k], f"{path}.{k}", out)
        return
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append((path, f"length {len(a)} vs {len(b)}"))
            return
        for i, (x, y) in enumerate(zip(a, b)):
            walk(x, y, f"{path}[{i}]", out)
        return
    if missing(a) and missing(b):
        return
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    if (numbers and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)) or (not numbers and a == b):
        return
    out.append((path, f"{str(a)[:60]} vs {str(b)[:60]}"))


def syntax_by_relation(before: dict, after: dict) -> list[str]:
    """The syntax arrays compared by relation name, and which Table 1/3 columns differ."""
    lines = []

    def by_rel(res):
        s = res["results"]["syntax"]
        return {k: dict(zip(s["meta"]["relations"], np.asarray(v["data"], dtype=float)))
                for k, v in s["arrays"].items()}

    a, b = by_rel(before), by_rel(after)
    bad = [(k, r) for k in a for r in a[k] if r not in b.get(k, {})
           or not np.allclose(a[k][r], b[k][r], rtol=1e-9, equal_nan=True)]
    lines.append("syntax arrays by relation name: " + ("identical" if not bad else f"{len(bad)} differ"))
    ta, tb = before["results"]["syntax"]["tables"], after["results"]["syntax"]["tables"]
    for name in ta:
        diff: Counter = Counter()
        for ra, rb in zip(ta[name], tb.get(name, [])):
            for k, v in ra.items():
                w = rb.get(k)
                same = (isinstance(v, float) and isinstance(w, float) and math.isclose(v, w, rel_tol=1e-9)) or v == w
                if not same:
                    diff[k] += 1
        lines.append(f"syntax table {name}: {len(ta[name])} vs {len(tb.get(name, []))} rows; "
                     f"columns that differ: {dict(diff)}")
    return lines


def main(argv: list[str]) -> int:
    before, after = load(argv[1]), load(argv[2])
    rows = int(argv[3]) if len(argv) > 3 else 40
    out: list = []
    walk(before, after, "", out)
    print(f"{len(out)} differing leaves")
    for group, n in Counter(".".join(p.split(".")[:4]).split("[")[0] for p, _ in out).most_common():
        print(f"{n:6d}  {group}")
    for p, d in out[:rows]:
        print(p, "::", d)
    if "syntax" in before.get("results", {}) and "syntax" in after.get("results", {}):
        print("\n".join(syntax_by_relation(before, after)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
