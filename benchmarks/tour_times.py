"""The README tour's lines, each timed on this machine idle and beside one CPU-bound process, in
one run: the numbers docs/timings.md prints.

    python benchmarks/tour_times.py            # every line below but the long ones, idle then shared
    python benchmarks/tour_times.py --long     # and the long ones (the atlas, the full run)
    python benchmarks/tour_times.py --only extract,general

Run it from the root of the checkout, alone on the machine; the tour writes under ``tour/``
(ignored by git), as the README's lines do. Each line runs as pasted (``bash -c``, with ``-q``
where the README's line shows progress), in the README's order, since later lines read what
earlier ones wrote; a line's output folder is removed before it runs, so neither run resumes
the other's work. The atlas's line also gives the sweep's estimate said before it started and
the sweep's time, from its results. The last line is one JSON object:
``{name: {"idle_s", "shared_s", "ratio", "idle_estimate_s", ...}}``.
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

#: (name, the README's line, the folder it writes, long), in the README's order
LINES = [
    ("make the cut-down inputs",
     f"mkdir -p tour && awk -v RS= -v ORS='\\n\\n' 'NR <= 200' {D}/ud-ewt/en_ewt-ud-dev.conllu > tour/dev-200.conllu"
     f" && awk -v RS= -v ORS='\\n\\n' 'NR <= 100' {D}/ud-ewt/en_ewt-ud-train.conllu > tour/train-100.conllu"
     f" && awk -v RS= -v ORS='\\n\\n' '/# newdoc id/ {{d++}} d <= 2' {D}/ontogum/dev.conllu > tour/coref-2docs.conllu",
     None, False),
    ("run (cut-down)",
     f"attnscope run --model default --out tour/run-small --text {D}/wikitext-2/valid.sentences.txt "
     "--general-num-text-examples 100 --deps tour/dev-200.conllu --deps-train tour/train-100.conllu "
     "--coref tour/coref-2docs.conllu -q", "tour/run-small", False),
    ("run (full)",
     f"attnscope run --model default --out tour/run --text {D}/wikitext-2/valid.sentences.txt "
     f"--deps {D}/ud-ewt/en_ewt-ud-dev.conllu --deps-train {D}/ud-ewt/en_ewt-ud-train.conllu "
     f"--coref {D}/ontogum/dev.conllu -q", "tour/run", True),
    ("prepare depparse", f"attnscope prepare depparse {D}/ud-ewt/en_ewt-ud-dev.conllu --out tour/dev.json",
     "tour/dev.json", False),
    ("extract", "attnscope extract tour/dev.json --model default --word-level --out tour/maps -q", "tour/maps", False),
    ("info", "attnscope info tour/maps > /dev/null", None, False),
    ("analyze syntax", "attnscope analyze syntax tour/maps --out tour/syntax -q", "tour/syntax", False),
    ("prepare unlabeled", f"attnscope prepare unlabeled {D}/wikitext-2/valid.sentences.txt --num-examples 1000 "
                          "--out tour/wiki.json", "tour/wiki.json", False),
    ("analyze general", "attnscope analyze general tour/wiki.json --model default --out tour/general -q",
     "tour/general", False),
    ("analyze coref", "attnscope analyze coref tour/coref-2docs.conllu --model default --coref-window sliding "
                      "--out tour/coref -q", "tour/coref", False),
    ("analyze patterns", "attnscope analyze patterns tour/wiki.json --model default --out tour/patterns -q",
     "tour/patterns", False),
    ("analyze attribution", f"attnscope analyze attribution {D}/wikitext-2/valid.sentences.txt --model default "
                            "--attribution-examples 20 --attribution-methods importance,norms,rollout "
                            "--attribution-fit-head --out tour/attribution -q", "tour/attribution", False),
    ("compare", "attnscope compare tour/maps tour/maps --out tour/compare -q", "tour/compare", False),
    ("analyze longctx", f"attnscope analyze longctx {D}/wikitext-2/valid.sentences.txt --model smollm2 "
                        "--longctx-num-docs 4 --out tour/longctx -q", "tour/longctx", False),
    ("analyze atlas", f"attnscope analyze atlas {D}/wikitext-2/valid.sentences.txt --model smollm2 --max-seq-len 1024 "
                      "--atlas-tasks 12 --atlas-calibration 8 --out tour/atlas -q", "tour/atlas", True),
    ("view", "attnscope view tour/maps --example 7 --view head --layer 3 --out tour/head.html --png tour/head.png",
     "tour/head.html", False),
    ("view --head-page", "attnscope view tour/run-small --head-page 3-9 --out tour/head-3-9.html",
     "tour/head-3-9.html", False),
    ("view --long", f"attnscope view --long {D}/wikitext-2/valid.sentences.txt --model smollm2 --max-seq-len 8192 "
                    "--layer 15 --head 5 --queries 1000,4000,8191 --out tour/long.html", "tour/long.html", False),
    ("view --generate", "attnscope view --generate 20 --model smollm2 --prompt \"The capital of France is\" "
                        "--layer 30 --out tour/generated.html", "tour/generated.html", False),
    ("demo", "attnscope demo --out tour/demo -q", "tour/demo", False),
]


def timed(line: str) -> tuple[float, float]:
    """Seconds and peak memory (GB, the largest process) of ``line`` run as pasted."""
    t0 = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-f", "%M", "bash", "-c", line], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"failed: {line}\n{r.stderr[-2000:]}")
    return time.perf_counter() - t0, int(r.stderr.split()[-1]) / 1e6


def atlas_timing() -> dict:
    timing = json.loads((ROOT / "tour/atlas/results/atlas.json").read_text())["meta"]["timing"]
    return {"estimate_s": round(timing.get("sweep_estimate_seconds", float("nan")), 1),
            "sweep_s": round(timing["sweep_seconds"], 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated names (substrings) of the lines to time")
    ap.add_argument("--long", action="store_true", help="time the long lines too (the atlas, the full run)")
    ap.add_argument("--where", default="idle,shared", help="idle, shared or both (default)")
    args = ap.parse_args()
    todo = [(n, line, out) for n, line, out, long in LINES
            if (args.long or not long) and (not args.only or any(w in n for w in args.only.split(",")))]
    rows: dict = {}
    for where in args.where.split(","):
        hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"]) if where == "shared" else None
        try:
            if hog is not None:
                time.sleep(1.0)
            for name, line, out in todo:
                if out is not None:
                    path = ROOT / out
                    shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
                row = rows.setdefault(name, {})
                row[f"{where}_s"], row[f"{where}_gb"] = (round(v, 1) for v in timed(line))
                if name == "analyze atlas":
                    row.update({f"{where}_{k}": v for k, v in atlas_timing().items()})
                print(f"{where:6} {name:24} {row[f'{where}_s']:7.1f} s {row[f'{where}_gb']:5.1f} GB", flush=True)
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
