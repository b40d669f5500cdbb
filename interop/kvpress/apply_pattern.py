"""Replay an attnscope atlas's sweep with kvpress: does kvpress's ``DuoAttentionPress``, given the
atlas's exported pattern, produce the answers the atlas measured?

Runs in kvpress's own environment (requirements.txt beside this file; kvpress 0.5.5 needs
transformers < 5.3, attnscope >= 5.24), never imports attnscope, and reads only what
``attnscope analyze atlas`` wrote under ``OUT/kvpress/``:

- ``full_attention_heads.tsv`` and ``config.json``: the pattern, given to ``DuoAttentionPress``
  the documented way (``load_attention_pattern`` returns ``(sink_size, recent_size, pattern)``),
  and, per fraction, the ``head_compression_ratio`` that keeps the sweep's number of KV heads;
- ``tasks.jsonl``: each task's context and question in token ids, its answer strings, its
  generation budget, and the atlas's outcome at each fraction.

Per task and fraction, as kvpress's pipeline does (``KVPressTextGenerationPipeline._forward``
and ``generate_answer``), but on the exact token ids (no chat template, no BOS added): the
context is prefilled by ``model.model`` under ``press(model)``, then the question is read with
positions continuing the context's and the answer generated greedily, one token at a time, on
that cache. The stopping rule is the atlas's: at most ``max_new`` tokens, stopping after an
end-of-sequence id of ``config.json`` (the pipeline does not test its first token for one).
Float32 on the CPU.

Writes ``<output>.json`` (versions, per-fraction summary, every row) and ``<output>.csv`` (the
rows): generated text, correct (every answer string in the text), whether the text and the
correct flag equal the atlas's, and kvpress's ``compression_ratio`` (the share of the context's
KV entries it removed) beside the atlas's ``kv_entries_kept``.

    python apply_pattern.py OUT --gguf SmolLM2-135M-Instruct.Q4_1.gguf --threads 2
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def pinned(name: str) -> str | None:
    """The version requirements.txt beside this script pins for ``name``."""
    for line in (HERE / "requirements.txt").read_text().splitlines():
        m = re.match(rf"^{re.escape(name)}==([^\s#]+)", line.strip(), re.IGNORECASE)
        if m:
            return m.group(1)
    return None


def check_versions() -> dict[str, str]:
    """The running versions of kvpress, transformers and torch; exits when kvpress or
    transformers is not the pinned one (the wrong environment)."""
    from importlib.metadata import version

    got = {name: version(name) for name in ("kvpress", "transformers", "torch")}
    for name in ("kvpress", "transformers"):
        want = pinned(name)
        if want is not None and got[name] != want:
            sys.exit(f"error: {name} {got[name]} is installed here, requirements.txt pins {want} "
                     f"(run this script with the python of the environment built from it)")
    got["python"] = platform.python_version()
    return got


def read_export(out: Path) -> tuple[dict, "object", list[dict]]:
    folder = out / "kvpress"
    import numpy as np

    for name in ("config.json", "full_attention_heads.tsv", "tasks.jsonl"):
        if not (folder / name).is_file():
            sys.exit(f"error: {folder / name} is missing (written by attnscope analyze atlas; an "
                     "atlas without a measured ranking exports nothing)")
    cfg = json.loads((folder / "config.json").read_text())
    pattern = np.loadtxt(folder / "full_attention_heads.tsv", delimiter="\t", ndmin=2)
    tasks = [json.loads(line) for line in (folder / "tasks.jsonl").read_text().splitlines() if line.strip()]
    return cfg, pattern, tasks


def exported_press(pattern, sink: int, recent: int, ratio: float):
    """A ``DuoAttentionPress`` whose ``load_attention_pattern`` returns the exported pattern (the
    way kvpress's documentation replaces DuoAttention's downloaded patterns)."""
    from kvpress import DuoAttentionPress

    class ExportedPattern(DuoAttentionPress):
        @staticmethod
        def load_attention_pattern(model):
            return sink, recent, pattern

    return ExportedPattern(head_compression_ratio=ratio)


def generate(model, press, context_ids: list[int], question_ids: list[int], max_new: int,
             eos: set[int]) -> list[int]:
    """kvpress's pipeline on exact ids: prefill under the press, then the question and greedy
    tokens on the compressed cache, positions continuing the context's."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache()
    ctx = torch.tensor([context_ids])
    n = ctx.shape[1]
    with torch.no_grad():
        with press(model):
            model.model(input_ids=ctx, past_key_values=cache)
        q = torch.tensor([question_ids])
        pos = torch.arange(n, n + q.shape[1]).unsqueeze(0)
        logits = model(input_ids=q, past_key_values=cache, position_ids=pos, logits_to_keep=1).logits
        out = [int(logits[0, -1].argmax())]
        at = n + q.shape[1]
        while len(out) < max_new and out[-1] not in eos:
            logits = model(input_ids=torch.tensor([[out[-1]]]), past_key_values=cache,
                           position_ids=torch.tensor([[at]])).logits
            out.append(int(logits[0, -1].argmax()))
            at += 1
    return out


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF reader draws a bar per load
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the atlas's output folder (holding kvpress/)")
    ap.add_argument("--gguf", type=Path, required=True, help="the model's GGUF file (SmolLM2: "
                    "python -c 'from attnscope.models.gguf import smollm2_path; print(smollm2_path())')")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--output", type=Path, default=None,
                    help="path prefix of the .json and .csv written (default OUT/kvpress/kvpress_replay)")
    ap.add_argument("--fractions", default=None,
                    help="comma-separated fractions of config.json to replay (default: all)")
    ap.add_argument("--limit", type=int, default=None, help="replay only the first N tasks")
    args = ap.parse_args(argv)

    versions = check_versions()
    cfg, pattern, tasks = read_export(args.out)
    fractions = list(cfg["fractions"])
    if args.fractions:
        fractions = [f.strip() for f in args.fractions.split(",") if f.strip()]
        bad = [f for f in fractions if f not in cfg["fractions"]]
        if bad:
            sys.exit(f"error: fractions {', '.join(bad)} are not in config.json ({', '.join(cfg['fractions'])})")
    tasks = tasks[:args.limit] if args.limit else tasks

    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    gguf = args.gguf.expanduser().resolve()
    if not gguf.is_file():
        sys.exit(f"error: {gguf}: no such GGUF file")
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.eval()
    load_s = time.perf_counter() - t0
    shape = (model.config.num_hidden_layers, model.config.num_key_value_heads)
    if pattern.shape != shape:
        sys.exit(f"error: the pattern is {pattern.shape[0]} x {pattern.shape[1]}, the model has {shape[0]} "
                 f"layers x {shape[1]} KV heads")
    eos = set(cfg["eos_token_ids"])
    total = pattern.size

    rows, streaming = [], {}
    t_run = time.perf_counter()
    for task in tasks:
        for f in fractions:
            want = cfg["fractions"][f]
            press = exported_press(pattern, cfg["sink_size"], cfg["recent_size"], want["head_compression_ratio"])
            t = time.perf_counter()
            ids = generate(model, press, task["context_ids"], task["question_ids"], task["max_new"], eos)
            seconds = time.perf_counter() - t
            mask = press.streaming_mask.cpu().numpy()
            streaming[f] = sorted(np.flatnonzero(mask.ravel()).tolist())
            text = tokenizer.decode(ids, skip_special_tokens=True)
            ours = task["outcomes"].get(f)
            correct = all(a in text for a in task["answer"])
            row = {"task": task["index"], "kind": task["kind"], "fraction": f,
                   "kv_heads_kept": total - int(mask.sum()),
                   "kvpress_compression_ratio": float(press.compression_ratio),
                   "kvpress_correct": correct, "kvpress_answer": text, "kvpress_tokens": len(ids),
                   "seconds": round(seconds, 3)}
            if ours is not None:
                row.update({"attnscope_kv_heads_kept": ours["kv_heads_kept"],
                            "attnscope_kv_entries_kept": ours["kv_entries_kept"],
                            "attnscope_correct": ours["correct"], "attnscope_answer": ours["answer"],
                            "same_correct": correct == ours["correct"], "same_answer": text == ours["answer"]})
            rows.append(row)
            print(f"task {task['index']} f={f}: {'same' if row.get('same_answer') else 'DIFFERENT'} "
                  f"{text!r}", file=sys.stderr, flush=True)
    run_s = time.perf_counter() - t_run

    summary = {}
    for f in fractions:
        sel = [r for r in rows if r["fraction"] == f]
        compared = [r for r in sel if "same_answer" in r]
        summary[f] = {
            "tasks": len(sel), "head_compression_ratio": cfg["fractions"][f]["head_compression_ratio"],
            "kv_heads_kept": cfg["fractions"][f]["kv_heads_kept"],
            "kvpress_streaming_heads": streaming.get(f),
            "kvpress_accuracy": float(np.mean([r["kvpress_correct"] for r in sel])) if sel else None,
            "attnscope_accuracy": (float(np.mean([r["attnscope_correct"] for r in compared]))
                                   if compared else None),
            "same_answer": sum(r["same_answer"] for r in compared),
            "same_correct": sum(r["same_correct"] for r in compared),
            "max_ratio_difference": (max(abs(r["kvpress_compression_ratio"] - (1 - r["attnscope_kv_entries_kept"]))
                                         for r in compared) if compared else None)}
    prefix = args.output or (args.out / "kvpress" / "kvpress_replay")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    doc = {"versions": versions, "gguf": str(gguf), "threads": args.threads, "ranking": cfg.get("ranking"),
           "sink_size": cfg["sink_size"], "recent_size": cfg["recent_size"], "eos_token_ids": sorted(eos),
           "model_load_seconds": round(load_s, 2), "replay_seconds": round(run_s, 2),
           "summary": summary, "rows": rows}
    Path(f"{prefix}.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with open(f"{prefix}.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    for f, s in summary.items():
        print(f"f={f}: kvpress {s['kvpress_accuracy']}, attnscope {s['attnscope_accuracy']}, same answers "
              f"{s['same_answer']}/{s['tasks']}, same correct {s['same_correct']}/{s['tasks']}", file=sys.stderr)
    print(f"wrote {prefix}.json and {prefix}.csv", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
