"""A tour line alone and beside one CPU-bound process, in one run: does attnscope degrade to
about its fair share of a shared machine?

On a 2-core machine, a second CPU-bound job leaves attnscope one core: a fair share is about 2x
its idle wall time (less where its two threads did not scale). The README's lines measured 1.5-9x
with the CPU time itself growing, the mark of threads spinning against another process
(issue 49, item 7). attnscope fits torch's threads to the cores free when it loads a model and
lets OpenMP's idle threads sleep (``attnscope.models.threads``); ``ATTNSCOPE_FAIR_SHARE=0`` turns
that off, which is the "before" here.

    python benchmarks/shared_machine.py                    # extract, and the cut-down run
    python benchmarks/shared_machine.py --lines extract --repeats 2

Each line runs as a fresh ``attnscope`` process: idle, then beside ``python -c 'while 1: pass'``
(started a second before), with attnscope's fitting on and off. It prints wall and CPU seconds
and the ratio shared / idle; the last line is one JSON object. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


def lines(tmp: Path) -> dict[str, list[str]]:
    """The tour lines measured (README, step 1 and step 2), on inputs made once in ``tmp``."""
    dev = DATA / "ud-ewt" / "en_ewt-ud-dev.conllu"
    train = DATA / "ud-ewt" / "en_ewt-ud-train.conllu"
    coref = DATA / "ontogum" / "dev.conllu"
    head = lambda path, n: "\n\n".join(path.read_text(encoding="utf-8").split("\n\n")[:n]) + "\n\n"  # noqa: E731
    (tmp / "dev-200.conllu").write_text(head(dev, 200), encoding="utf-8")
    (tmp / "train-100.conllu").write_text(head(train, 100), encoding="utf-8")
    docs = coref.read_text(encoding="utf-8").split("# newdoc id")
    (tmp / "coref-2docs.conllu").write_text(docs[0] + "# newdoc id" + "# newdoc id".join(docs[1:3]), encoding="utf-8")
    subprocess.run([sys.executable, "-m", "attnscope", "prepare", "depparse", str(dev), "--out", str(tmp / "dev.json")],
                   check=True, capture_output=True)
    return {
        "extract": ["extract", str(tmp / "dev.json"), "--model", "default", "--word-level", "--out", "{out}", "-q"],
        "run-small": ["run", "--model", "default", "--out", "{out}",
                      "--text", str(DATA / "wikitext-2" / "valid.sentences.txt"), "--general-num-text-examples", "100",
                      "--deps", str(tmp / "dev-200.conllu"), "--deps-train", str(tmp / "train-100.conllu"),
                      "--coref", str(tmp / "coref-2docs.conllu"), "-q"],
    }


def timed(args: list[str], out: Path, env: dict) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, children) of one ``attnscope`` process."""
    shutil.rmtree(out, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "attnscope", *[a.replace("{out}", str(out)) for a in args]],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", default="extract,run-small")
    ap.add_argument("--repeats", type=int, default=1, help="best of this many per cell")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    env.update(PYTHONPATH=str(ROOT / "src"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    rows: dict = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        todo = lines(tmp)
        print(f"{os.cpu_count()} CPUs; one CPU-bound process beside attnscope in the shared runs")
        print(f"{'line':10} {'fitting':8} {'idle s':>7} {'cpu s':>6} {'shared s':>9} {'cpu s':>6} {'ratio':>6}")
        for name in args.lines.split(","):
            for fitting in ("on", "off"):
                cell = {}
                for where in ("idle", "shared"):
                    hog = None
                    if where == "shared":
                        hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
                        time.sleep(1.0)
                    try:
                        runs = [timed(todo[name], tmp / "out", {**env, "ATTNSCOPE_FAIR_SHARE": "1" if fitting == "on" else "0"})
                                for _ in range(args.repeats)]
                    finally:
                        if hog is not None:
                            hog.kill()
                            hog.wait()
                    cell[where] = min(runs)
                ratio = cell["shared"][0] / cell["idle"][0]
                rows[f"{name} fitting {fitting}"] = {"idle_s": round(cell["idle"][0], 2), "idle_cpu_s": round(cell["idle"][1], 2),
                                                     "shared_s": round(cell["shared"][0], 2),
                                                     "shared_cpu_s": round(cell["shared"][1], 2), "ratio": round(ratio, 2)}
                print(f"{name:10} {fitting:8} {cell['idle'][0]:7.1f} {cell['idle'][1]:6.1f} {cell['shared'][0]:9.1f} "
                      f"{cell['shared'][1]:6.1f} {ratio:5.2f}x", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
