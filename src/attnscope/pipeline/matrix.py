"""The architecture matrix: every model type in transformers' causal-LM, masked-LM, seq-to-seq and
base-model mappings, built as a tiny seeded model from its own config class
(:func:`attnscope.models.tiny.build_tiny`) and put through :func:`attnscope.pipeline.check.check`
and a head view.

One row per model type: its kind and mechanisms, whether the maps equal transformers' eager maps,
each streaming backend's verdict, whether a head view renders, or why the type could not be built
or run (a type without softmax attention -- Mamba, RWKV -- returns no attention maps and is named
so). ``docs/models.md`` is written from it::

    python -m attnscope.pipeline.matrix --out docs/models.md   # or --part 1/2 and 2/2 side by side, then --doc-only

and ``tests/pipeline/test_matrix.py`` (slow tier) runs every row.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Collection
from typing import Any

from attnscope.errors import AttnscopeError

#: what the test and the page say for each outcome
VERIFIED, REFUSED, NOT_BUILT, NO_ATTENTION = "verified", "refused", "not built", "no attention maps"


def model_types() -> list[str]:
    """Every model type the four auto mappings of :data:`attnscope.models.tiny.MAPPINGS` name, sorted."""
    from transformers.models.auto import modeling_auto

    from attnscope.models.tiny import MAPPINGS

    return sorted({t for name in MAPPINGS for t in getattr(modeling_auto, name)})


def _reason(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    return text[:240]


def verify(model_type: str, seed: int = 0, skip: Collection[str] = ()) -> dict[str, Any]:
    """The matrix row of ``model_type`` (module docstring), without the backends in ``skip``."""
    from attnscope.models import load_model
    from attnscope.notebook import head_view
    from attnscope.pipeline.check import check_loaded

    row: dict[str, Any] = {"type": model_type, "status": NOT_BUILT, "kind": "", "mechanisms": [],
                           "maps": "", "backends": {}, "view": "", "why": ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lm = None
        for lm_class in (False, True):  # the base model, else the causal-LM / masked-LM class
            try:
                lm = load_model(f"debug:{model_type}", seed=seed, mlm_head=lm_class)
                break
            except AttnscopeError as err:
                no_maps = "returned no attention maps" in str(err)
                row.update(status=NO_ATTENTION if no_maps else NOT_BUILT, why=_reason(err))
            except Exception as err:  # a tiny config transformers' own code cannot run
                row.update(status=NOT_BUILT, why=f"{type(err).__name__}: {_reason(err)}")
        if lm is None:
            return row
        row["why"] = ""
        row.update(kind=lm.facts.kind, mechanisms=list(lm.facts.mechanisms))
        try:
            report = check_loaded(lm, seed=seed, skip=skip)
        except Exception as err:
            row.update(status=NOT_BUILT, why=f"check: {type(err).__name__}: {_reason(err)}")
            return row
        row["maps"] = report.rows[0].verdict
        row["backends"] = {r.what: {"verdict": r.verdict, "difference": r.difference, "reason": r.reason}
                           for r in report.rows[1:]}
        try:
            # (an encoder-decoder's decoder reads a target: its three kinds of attention on one page)
            page = head_view(lm, "the cat sat on the mat",
                             **({"target": "the cat"} if lm.facts.encoder_decoder else {})).html
            row["view"] = "renders" if "the" in page and len(page) > 1000 else "empty"
        except Exception as err:
            row["view"] = f"fails ({type(err).__name__}: {_reason(err)})"
    bad = [r for r in report.rows if not r.ok]
    if bad:
        row.update(status="DISAGREES", why=f"{bad[0].what}: {bad[0].difference}")
    elif all(r.verdict in ("refused", "unavailable") for r in report.rows[1:]):
        row.update(status=REFUSED, why="; ".join(sorted({r.reason for r in report.rows[1:] if r.verdict == "refused"})))
    else:
        row["status"] = VERIFIED
    return row


def verify_isolated(model_type: str, timeout: float = 120.0, seed: int = 0,
                    skip: Collection[str] = ()) -> dict[str, Any]:
    """:func:`verify` in a process of its own, stopped after ``timeout`` seconds (a config that
    shrinking leaves large would hold the machine): that row is ``not built`` and says so."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    queue = ctx.Queue()

    def work():
        import torch

        # (one thread in the forked copy: a parent that had run torch on more threads left an
        # OpenMP pool behind that the copy's first parallel region can wait on for ever; every
        # row then hung past the limit, or, in a test worker, LayoutLM's now and then)
        torch.set_num_threads(1)
        queue.put(verify(model_type, seed, skip))

    worker = ctx.Process(target=work, daemon=True)
    worker.start()
    try:
        return queue.get(timeout=timeout)
    except Exception:  # queue.Empty: the worker ran past the limit (or died)
        code = worker.exitcode
        return {"type": model_type, "status": NOT_BUILT, "kind": "", "mechanisms": [], "maps": "",
                "backends": {}, "view": "",
                "why": f"building and checking it took over {timeout:.0f} s" if code is None
                else f"its process died (exit code {code})"}
    finally:
        if worker.is_alive():
            worker.kill()
        worker.join()


def _streaming(row: dict) -> str:
    shown = []
    for name, b in row["backends"].items():
        if b["verdict"] in ("exact", "rounding"):
            shown.append(f"{name} ({'0' if b['difference'] == 0 else format(b['difference'], '.0e')})")
        elif b["verdict"] == "refused" and "AttentionInterface" not in b["reason"] \
                and "encoder-decoder" not in b["reason"]:
            shown.append(f"~~{name}~~")
    return ", ".join(shown) or "maps only"


def models_doc(rows: list[dict], versions: dict[str, str]) -> str:
    """``docs/models.md`` from the matrix rows."""
    counts = {s: sum(r["status"] == s for r in rows) for s in (VERIFIED, REFUSED, NO_ATTENTION, NOT_BUILT, "DISAGREES")}
    lines = [
        "# Models: every architecture transformers ships, verified",
        "",
        "Generated by `python -m attnscope.pipeline.matrix --out docs/models.md` "
        f"({', '.join(f'{k} {v}' for k, v in versions.items())}); `tests/pipeline/test_matrix.py` "
        "(slow tier) runs the same rows for the language-model types, with the one-pass Triton kernel "
        "under Triton's interpreter on the first of each kind and set of mechanisms. Each model type of transformers' causal-LM, masked-LM, "
        "seq-to-seq and base-model mappings is built as a tiny seeded model from its own config class "
        "(2 layers, 4 query heads on 2 key/value heads, head size 8: `attnscope.models.tiny`) and put "
        "through `attnscope check` on its built-in text: attnscope's maps against transformers' own "
        "eager `output_attentions` (equal exactly, or the row says otherwise), and every streaming "
        "backend's long-context statistics against the eager maps' of the same pass (held to float32 "
        "rounding of one softmax row, eps32 x n x (1 + ln n)), and a head view.",
        "",
        f"**{len(rows)} model types: {counts[VERIFIED]} verified (maps exact, streaming backends within "
        f"float32 rounding), {counts[REFUSED]} maps only (the streaming engine refuses them, reason "
        f"named), {counts[NO_ATTENTION]} without softmax attention maps, {counts[NOT_BUILT]} not built or "
        f"not run here (reason named), {counts['DISAGREES']} disagreeing.**",
        "",
        "Streaming: the backends that ran, with their largest difference from the maps' statistics; "
        "~~struck~~ ones do not compute a mechanism the model has and are refused for it (`auto` "
        "never picks them). `onepass` needs CUDA (or Triton's interpreter) and is not in these rows. "
        "Models outside transformers' AttentionInterface (their own attention code) get the maps "
        "only: hook points and the streaming engine need attnscope's attention function. Sixteen "
        "reach it through an adapter of their own code (`attnscope.models.adapters`: the maps stay "
        "the model's own exactly) and are verified like the others: Bloom and MPT, whose ALiBi is a "
        "bias on the scores (the compiled CPU kernel and the one-pass Triton kernel do not add it and "
        "are struck for them), GPT-Neo (unscaled scores, local layers) and Falcon with rotary "
        "positions (Falcon with ALiBi keeps its own attention: transformers' eager and sdpa Falcon-RW "
        "differ), the first BERT's attention as MegatronBERT, RemBERT, RoFormer (rotary), TAPAS and "
        "VisualBERT keep it (not where a model adds cross-attention, which is the same class), XLM "
        "and FlauBERT, the first GPT (`openai-gpt`), XGLM, "
        "MPNet and DeBERTa (v1, v2 and v3; not v1 with talking heads), whose bias per query and key (`position-bias`) the tiles and "
"maps backends add and the others are struck for. A wrapper or a composite whose language model routes attention through "
        "AttentionInterface (DPR's BERT, DeepSeek-VL's Llama, GOT-OCR2, Granite Speech) is hooked "
        "through that model.",
        "",
        "**Local attention in a layout of its own.** Longformer and LED's encoder report sliding-window "
        "attention as a column per offset (`[B H n 2r+1]`), LongT5 its local attention in blocks "
        "(`[B blocks H b 3b]`). attnscope lays each out as maps over the tokens "
        "(`attnscope.models.local_maps`: every weight moved unchanged to the key it was read for, 0 "
        "outside the window), so stores, analyses and views read them like any other model's; the "
        "test multiplies the maps by the values and gets the heads' own outputs. LongT5's "
        "transient-global attention, whose keys include summaries of blocks, is refused.",
        "",
        "**Hybrids** (Qwen3-Next, Jamba, Bamba, Nemotron-H, Granite-MoE-hybrid, Kimi-Linear, "
        "OLMo-hybrid, ...) have attention in only some layers. attnscope reads which from the "
        "attention modules' own `layer_idx`; every array holds the layers with attention only, "
        "and every page, table, head page and compare names a head by the model's own layer "
        "(a tiny Jamba's heads are 2-1 .. 2-4: its layer 1 is Mamba). The results file records "
        "the layers in `model.attention.attention_layers`; `attnscope check` prints them. Their "
        "classes turn custom attention functions down (for their linear-attention kernels), but "
        "their attention modules look the function up by the config's name, so attnscope names its "
        "own there, and the facts' probe checks that every attention layer then calls it: they get "
        "hook points, the streaming engine and layer-by-layer runs (value zeroing, ablation) like "
        "any other model.",
        "",
        "| model type | kind | mechanisms | maps | streaming | head view | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        status = r["status"] if not r["why"] else f"{r['status']}: {r['why']}"
        status = status.replace("|", "\\|")
        lines.append(f"| `{r['type']}` | {r['kind']} | {', '.join(r['mechanisms'])} | {r['maps']} | "
                     f"{_streaming(r) if r['maps'] else ''} | {r['view']} | {status} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the rows (all, or ``--part i/k`` of them: the k parts run side by side) into a JSON
    lines file, then write the page from every row there (``--doc-only``: from the file alone)."""
    import json
    from pathlib import Path

    import torch
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/models.md")
    parser.add_argument("--rows", default="models-matrix.jsonl", help="JSON lines, one row per model type "
                        "(appended to; a type already there is not run again)")
    parser.add_argument("--types", nargs="*", default=None, help="only these model types")
    parser.add_argument("--part", default="1/1", help="i/k: run the i-th of k equal parts")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per model type")
    parser.add_argument("--doc-only", action="store_true", help="write the page from --rows, run nothing")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    path = Path(args.rows)
    done = {json.loads(line)["type"]: json.loads(line) for line in path.read_text().splitlines()} \
        if path.exists() else {}
    if not args.doc_only:
        i, k = (int(x) for x in args.part.split("/"))
        todo = [t for t in (args.types or model_types())[i - 1::k] if t not in done]
        verify("llama")  # imports and builds everything a row needs once, before the rows fork
        for t in todo:
            row = verify_isolated(t, args.timeout)
            with path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{t}: {row['status']} {row['why'][:100]}", file=sys.stderr, flush=True)
        if k > 1:
            return 0
        done = {json.loads(line)["type"]: json.loads(line) for line in path.read_text().splitlines()}
    types = args.types or model_types()
    missing = [t for t in types if t not in done]
    if missing:
        raise SystemExit(f"{path}: no row for {len(missing)} model types ({', '.join(missing[:5])} ...)")
    versions = {"transformers": transformers.__version__, "torch": torch.__version__}
    Path(args.out).write_text(models_doc([done[t] for t in types], versions), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
