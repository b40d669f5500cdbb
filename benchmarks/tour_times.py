"""The README tour's lines, each timed on this machine idle and beside one CPU-bound process, in
one run: the numbers the README prints.

    python benchmarks/tour_times.py            # every line below, idle then shared
    python benchmarks/tour_times.py --only extract,general

Run it from the root of the checkout, alone on the machine; the tour writes under ``tour/``
(ignored by git), as the README's lines do. Each line runs as pasted (``bash -c``), in the
README's order, since later lines read what earlier ones wrote. The last line is one JSON object:
``{name: {"idle_s", "shared_s", "ratio"}}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
D = "../shared/data"

#: (name, the README's line), in the README's order
LINES = [
    ("make the cut-down inputs",
     f"mkdir -p tour && awk -v RS= -v ORS='\\n\\n' 'NR <= 200' {D}/ud-ewt/en_ewt-ud-dev.conllu > tour/dev-200.conllu"
     f" && awk -v RS= -v ORS='\\n\\n' 'NR <= 100' {D}/ud-ewt/en_ewt-ud-train.conllu > tour/train-100.conllu"
     f" && awk -v RS= -v ORS='\\n\\n' '/# newdoc id/ {{d++}} d <= 2' {D}/ontogum/dev.conllu > tour/coref-2docs.conllu"),
    ("run (cut-down)",
     f"attnscope run --model default --out tour/run-small --overwrite --text {D}/wikitext-2/valid.sentences.txt "
     "--general-num-text-examples 100 --deps tour/dev-200.conllu --deps-train tour/train-100.conllu "
     "--coref tour/coref-2docs.conllu -q"),
    ("prepare depparse", f"attnscope prepare depparse {D}/ud-ewt/en_ewt-ud-dev.conllu --out tour/dev.json"),
    ("extract", "attnscope extract tour/dev.json --model default --word-level --out tour/maps --overwrite -q"),
    ("info", "attnscope info tour/maps > /dev/null"),
    ("analyze syntax", "attnscope analyze syntax tour/maps --out tour/syntax -q"),
    ("prepare unlabeled", f"attnscope prepare unlabeled {D}/wikitext-2/valid.sentences.txt --num-examples 1000 "
                          "--out tour/wiki.json --overwrite"),
    ("analyze general", "attnscope analyze general tour/wiki.json --model default --out tour/general -q"),
    ("analyze coref", "attnscope analyze coref tour/coref-2docs.conllu --model default --coref-window sliding "
                      "--out tour/coref -q"),
    ("analyze patterns", "attnscope analyze patterns tour/wiki.json --model default --out tour/patterns -q"),
    ("analyze attribution", f"attnscope analyze attribution {D}/wikitext-2/valid.sentences.txt --model default "
                            "--attribution-examples 20 --attribution-methods importance,norms,rollout "
                            "--attribution-fit-head --out tour/attribution -q"),
    ("compare", "attnscope compare tour/maps tour/maps --out tour/compare -q"),
    ("analyze longctx", f"attnscope analyze longctx {D}/wikitext-2/valid.sentences.txt --model smollm2 "
                        "--longctx-num-docs 4 --out tour/longctx -q"),
    ("view", "attnscope view tour/maps --example 7 --view head --layer 3 --out tour/head.html --png tour/head.png"),
    ("demo", "attnscope demo --out tour/demo -q"),
]


def timed(line: str) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(["bash", "-c", line], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"failed: {line}\n{r.stderr[-2000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated names (substrings) of the lines to time")
    ap.add_argument("--where", default="idle,shared", help="idle, shared or both (default)")
    args = ap.parse_args()
    todo = [(n, line) for n, line in LINES
            if not args.only or any(w in n for w in args.only.split(","))]
    for out in ("tour/demo",):
        shutil.rmtree(ROOT / out, ignore_errors=True)
    rows: dict = {}
    for where in args.where.split(","):
        hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"]) if where == "shared" else None
        try:
            if hog is not None:
                time.sleep(1.0)
            for name, line in todo:
                if name == "demo":
                    shutil.rmtree(ROOT / "tour/demo", ignore_errors=True)
                rows.setdefault(name, {})[f"{where}_s"] = round(timed(line), 1)
                print(f"{where:6} {name:24} {rows[name][f'{where}_s']:7.1f} s", flush=True)
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
    for r in rows.values():
        if r.get("idle_s") and r.get("shared_s"):
            r["ratio"] = round(r["shared_s"] / r["idle_s"], 2)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
