"""The head atlas family: label every head of a decoder LLM, then prove what the labels are
worth by compressing its KV cache with them (``attnscope analyze atlas``, ``run --atlas``,
:func:`attnscope.atlas`).

Input: a text file, whose lines are the haystack of generated tasks (passkey, needle in a
haystack with one key, several keys or several values, variable tracking), or a JSON Lines
task file (``context``, ``question``, ``answer``, optional ``needle``). Head scores come from
calibration tasks kept apart from the evaluated ones; the sweep evaluates every ranking of the
KV heads on the evaluated tasks (:mod:`attnscope.analyses.atlas`; docs/atlas.md).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.analyses import atlas as A
from attnscope.analyses.atlas import COMBINED, REDUCTIONS, SCORES
from attnscope.analyses.duo import order as gate_order
from attnscope.analyses.duo import read_gates
from attnscope.analyses.family_result import FamilyResult
from attnscope.analyses.lm_objective import Objective
from attnscope.analyses.longctx import LongContextStats
from attnscope.data.io import read_text
from attnscope.data.tasks import (
    DEFAULT_KINDS,
    KINDS,
    generate_tasks,
    haystack_sentences,
    read_tasks,
)
from attnscope.engines import press
from attnscope.errors import AttnscopeError, ModelError
from attnscope.extract.tasks import encode_task
from attnscope.families.base import (
    CompareTable,
    Context,
    Family,
    Input,
    Prepared,
    hookable_decoder,
    option,
    register_family,
)
from attnscope.families.longctx import induction_probes
from attnscope.progress import duration
from attnscope.report.atlas import write_atlas
from attnscope.store.results import write_results
from attnscope.viz.results_views import head_scatter, relation_grids

TASK_SUFFIXES = (".jsonl", ".json")
ESTIMATE_FROM = 10  # evaluated tasks from which the sweep's time is estimated (one task's work) and said before it starts
QUESTION_ROOM = 128  # positions left after a generated context for its question and answer


@dataclass
class Options:
    atlas_tasks: int = option(60, "Evaluated tasks to generate (a task file: its tasks but the "
                                  "calibration ones).", minimum=1)
    atlas_kinds: str = option(",".join(DEFAULT_KINDS), "Task kinds to generate, in turn (comma-separated; "
                                                       f"known: {', '.join(KINDS)}).")
    atlas_haystack: str = option("text", "Haystack of the needle and variable-tracking tasks: the "
                                         "input's lines, or a fixed filler (passkey always uses the "
                                         "filler).", choices=("text", "filler"))
    atlas_depth: float = option(-1.0, "Needle depth, 0 (start of the context) to 1 (end); -1: "
                                      "spread evenly over the tasks.", minimum=-1.0)
    atlas_calibration: int = option(20, "Tasks the head scores come from, kept apart from the "
                                        "evaluated ones (generated with the next seed; from a task "
                                        "file, a seeded draw of its tasks); 0: the evaluated tasks "
                                        "themselves.", minimum=0)
    atlas_sink: int = option(4, "First context tokens a streaming KV head keeps.", minimum=0)
    atlas_window: int = option(64, "Last context tokens a streaming KV head keeps.", minimum=1)
    atlas_fractions: str = option("0,0.1,0.25,0.5,0.75,1", "Fractions of the KV heads that keep "
                                                           "their whole cache (comma-separated).")
    atlas_scores: str = option(",".join(SCORES), "Scores whose rankings the sweep follows "
                                                 "(comma-separated).")
    atlas_reversed: str = option("retrieval", "The score whose reversed ranking the sweep follows "
                                              "too ('none': no reversed ranking).")
    atlas_random: int = option(3, "Seeded random rankings of the KV heads.", minimum=0)
    atlas_reduce: str = option("max", "A KV head's score from its query heads' (grouped-query "
                                      "attention): max (RazorAttention) or mean.", choices=REDUCTIONS)
    atlas_probes: int = option(4, "Sequences of repeated random tokens for the echo and induction "
                                  "scores.", minimum=0)
    atlas_probe_length: int = option(256, "Random tokens per copy in those sequences.", minimum=1)
    atlas_bootstrap: int = option(1000, "Bootstrap resamples over tasks for the intervals.", minimum=100)
    atlas_batch: int = option(64, "Sweep rows answered together on one prefill.", minimum=1)
    atlas_combined: str = option(",".join(COMBINED), "Rankings combined from two scores or the labels "
                                                     "(comma-separated, or 'none').")
    atlas_gates: str = option("", "A DuoAttention pattern file (full_attention_heads.tsv, or its folder: "
                                  "'attnscope analyze duo' writes one, DuoAttention released others), "
                                  "swept as the ranking duo_gates.")
    atlas_greedy: int = option(0, "Build the greedy ranking on the calibration tasks, adding this many "
                                  "KV heads an iteration (1: exact greedy; 0: none). Costs one "
                                  "teacher-forced pass per remaining head and answered calibration "
                                  "task an iteration.", minimum=0)


def _names(value: str, known: tuple[str, ...], field: str, *, allow_none: bool = False) -> list[str]:
    names = [x.strip() for x in value.split(",") if x.strip()]
    if allow_none and names == ["none"]:
        return []
    bad = [x for x in names if x not in known]
    if bad or not names:
        raise AttnscopeError(f"{field} must list names from {', '.join(known)}; not "
                             f"{', '.join(bad) or 'nothing'}", params=(field,))
    return names


def _fractions(value: str) -> list[float]:
    try:
        fs = sorted({float(x) for x in value.split(",") if x.strip()})
    except ValueError:
        raise AttnscopeError(f"atlas_fractions must be comma-separated numbers, not {value!r}",
                             params=("atlas_fractions",)) from None
    if not fs or fs[0] != 0.0 or fs[-1] != 1.0 or len(fs) < 3:
        raise AttnscopeError("atlas_fractions must hold 0, 1 and at least one fraction between, "
                             f"not {value!r}", params=("atlas_fractions",))
    return fs


@register_family
class Atlas(Family):
    key = "atlas"
    title = "Head atlas: what each head is worth to the KV cache"
    help = "Retrieval, streaming, echo and induction heads of a decoder, proven by compressing its KV cache"
    inputs = (Input("atlas", "A text file whose lines are the haystack of generated tasks, or a "
                             "JSON Lines task file (context, question, answer[, needle]).",
                    sample="text.txt", argument="tasks_or_haystack"),)
    Options = Options
    default_model = "smollm2"
    default_max_seq_len = 2048  # context tokens of a generated task
    order = 75
    demo = False  # beyond the paper
    causal_only = True
    sample_options = {"atlas_tasks": 6, "atlas_calibration": 3, "atlas_bootstrap": 100}
    compare_tables = (
        CompareTable("atlas_areas", "areas", "ranking", ("area", "acc_25", "acc_50"),
                     "Area under accuracy vs KV heads kept, and accuracy at 25% and 50% kept, per ranking."),
        CompareTable("atlas_heads", "heads", "name", ("retrieval", "streaming", "snapkv", "echo", "induction"),
                     "Per query head scores of the two atlases."),
    )

    def view(self, result: FamilyResult, source: str, problems: list[str]) -> dict:
        """Every score per head (grids), and the heads placed by streaming share and SnapKV mass."""
        return {"grids": relation_grids(result, "scores", source, problems),
                "scatter": head_scatter(result, "heads", "streaming", "snapkv", "label", source)}

    def prepare(self, inputs: dict[str, Any], options: Options, ctx: Context) -> Prepared:
        path = inputs.get("atlas")
        if path is None:
            raise AttnscopeError("atlas: no file given", params=("atlas",))
        lm = ctx.model
        hookable_decoder(lm, "the atlas compresses a decoder's KV cache", press.COMPUTES, ctx.max_seq_len)
        _names(options.atlas_scores, SCORES, "atlas_scores")
        _names(options.atlas_reversed, SCORES, "atlas_reversed", allow_none=True)
        _fractions(options.atlas_fractions)
        _names(options.atlas_combined, COMBINED, "atlas_combined", allow_none=True)
        gates = read_gates(options.atlas_gates, (lm.num_layers, lm.num_kv_heads)) if options.atlas_gates else None
        if options.atlas_depth > 1:
            raise AttnscopeError(f"atlas_depth must be at most 1, not {options.atlas_depth}",
                                 params=("atlas_depth",))
        notes: list[str] = []
        path = Path(path)
        if path.suffix.lower() in TASK_SUFFIXES:
            pool = read_tasks(path)
            fits = [t for t in pool if len(lm.tokenizer(t.context)["input_ids"]) <= ctx.max_seq_len]
            if len(fits) < len(pool):
                notes.append(f"{len(pool) - len(fits)} of {len(pool)} tasks of {path.name} have a context "
                             f"over --max-seq-len {ctx.max_seq_len} tokens and were left out.")
            if not fits:
                raise AttnscopeError(f"{path}: no task's context fits in max_seq_len {ctx.max_seq_len}",
                                     params=("max_seq_len",))
            calib, tasks = self._split(fits, options.atlas_calibration, ctx.seed, path)
            source = f"task file {path.name} ({len(fits)} tasks)"
        else:
            kinds = _names(options.atlas_kinds, KINDS, "atlas_kinds")
            hay = haystack_sentences(read_text(path)) if options.atlas_haystack == "text" else None
            if hay is not None and not hay:
                raise AttnscopeError(f"{path}: no text for the haystack (the file has no non-blank line)",
                                     params=("atlas",))
            depth = None if options.atlas_depth < 0 else options.atlas_depth
            length = min(ctx.max_seq_len, lm.max_positions - QUESTION_ROOM)
            if length < ctx.max_seq_len:
                notes.append(f"Contexts of {length} tokens, not {ctx.max_seq_len}: {lm.name} has "
                             f"{lm.max_positions} positions and the question and answer need room.")
            make = lambda count, seed: generate_tasks(  # noqa: E731
                lm.tokenizer, count=count, length=length, kinds=kinds, haystack=hay,
                depth=depth, seed=seed)
            tasks = make(options.atlas_tasks, ctx.seed)
            calib = make(options.atlas_calibration, ctx.seed + 1) if options.atlas_calibration else []
            source = (f"{len(tasks)} generated tasks ({', '.join(kinds)}), haystack: "
                      + (f"lines of {path.name}" if hay is not None else "fixed filler"))
        encs = [encode_task(lm.tokenizer, t) for t in tasks]
        calib_encs = [encode_task(lm.tokenizer, t) for t in calib] if calib else encs
        longest = max(len(e.context) + len(e.question) + e.max_new for e in encs + calib_encs)
        if longest > lm.max_positions:
            raise AttnscopeError(f"a task needs {longest} positions, more than {lm.name} has "
                                 f"({lm.max_positions}); lower --max-seq-len", params=("max_seq_len",))
        if not calib:
            notes.append("No calibration tasks (--atlas-calibration 0): the head scores come from the "
                         "evaluated tasks themselves, so the rankings are tested in-sample.")
        tokens = sum(len(e.context) for e in encs)
        return Prepared({"tasks": encs, "calibration": calib_encs, "notes": notes, "source": source,
                         "gates": gates},
                        weight=(tokens + sum(len(e.context) for e in calib_encs)) // 128 + 1,
                        counts={"tasks": len(encs), "calibration_tasks": len(calib) if calib else 0,
                                "context_tokens": tokens})

    @staticmethod
    def _split(pool: list, calibration: int, seed: int, path: Path) -> tuple[list, list]:
        """``(calibration, evaluated)`` tasks of a task file: a seeded draw of ``calibration``."""
        if not calibration:
            return [], pool
        if calibration >= len(pool):
            raise AttnscopeError(f"{path}: {len(pool)} tasks leave none to evaluate after "
                                 f"{calibration} calibration tasks", params=("atlas_calibration",))
        pick = set(np.random.default_rng(seed).permutation(len(pool))[:calibration].tolist())
        return ([t for i, t in enumerate(pool) if i in pick], [t for i, t in enumerate(pool) if i not in pick])

    def run(self, prepared: Prepared, options: Options, ctx: Context) -> FamilyResult:
        lm = ctx.model
        encs, calib = prepared.data["tasks"], prepared.data["calibration"]
        notes = list(prepared.data["notes"])
        use = _names(options.atlas_scores, SCORES, "atlas_scores")
        importance = "importance" in use and self._importance_possible(lm, notes)
        sink, window = options.atlas_sink, options.atlas_window

        t0 = time.perf_counter()
        records = ctx.units.tasks(A.CalibrationStep(sink, window, importance, seed=ctx.seed), calib,
                            name="calibration", label="calibration")
        cal = A.calibration(records, (lm.num_layers, lm.num_heads), importance=importance)
        if {"echo", "induction"} & set(use) and options.atlas_probes:
            cal.scores.update(self._echo_induction(lm, options, ctx, notes))
        kv_heads = lm.num_kv_heads
        total = lm.num_layers * kv_heads
        reversed_of = (_names(options.atlas_reversed, SCORES, "atlas_reversed", allow_none=True) or [None])[0]
        rankings = A.rankings_for(cal.scores, kv_heads, use=use, reduce=options.atlas_reduce,
                                  reversed_of=reversed_of, random=options.atlas_random, seed=ctx.seed + 1000)
        missing = [s for s in use if s not in rankings]
        if missing:
            notes.append(f"No ranking by {', '.join(missing)}: "
                         + ("no calibration task was answered with the whole cache, so no retrieval "
                            "score was measured; " if "retrieval" in missing else "")
                         + "a score that was not measured ranks nothing.")
        combined = _names(options.atlas_combined, COMBINED, "atlas_combined", allow_none=True)
        made = A.combined_rankings(cal.scores, A.labels(cal.scores), kv_heads, reduce=options.atlas_reduce)
        rankings.update({k: v for k, v in made.items() if k in combined})
        if prepared.data["gates"] is not None:
            rankings["duo_gates"] = gate_order(*prepared.data["gates"])
        fractions = _fractions(options.atlas_fractions)
        timing = {"calibration_seconds": time.perf_counter() - t0}
        greedy = []
        if options.atlas_greedy:
            t1 = time.perf_counter()
            answered = [e for e, r in zip(calib, records) if e.task.correct(r["answer"])]
            if answered:
                until = int(round(max(f for f in fractions if f < 1) * total))
                order, greedy = A.greedy_order(
                    lambda base, cand, it: ctx.units.tasks(
                        A.GreedyStep(base, cand, sink, window, batch=options.atlas_batch, seed=ctx.seed),
                        answered, name=f"greedy-{it}", label=f"greedy ranking, {len(base)} of {until} heads"),
                    total, until, options.atlas_greedy)
                rankings["greedy"] = order
            else:
                notes.append("No greedy ranking: no calibration task was answered with the whole cache.")
            timing["greedy_seconds"] = time.perf_counter() - t1
        configs, masks = A.configs_for(rankings, fractions, (lm.num_layers, kv_heads))
        step = A.SweepStep(masks, configs, sink, window, batch=options.atlas_batch, seed=ctx.seed)
        label = "sweep"
        left = len(encs) - ctx.units.finished("sweep", encs)  # a resumed run: only what is left
        if left >= ESTIMATE_FROM:
            estimate = ctx.passes.call(A.sweep_seconds, step, encs[0], left)
            timing["sweep_estimate_seconds"] = estimate
            label = f"sweep (about {duration(estimate)})"
        t2 = time.perf_counter()
        sw = A.sweep(configs, ctx.units.tasks(step, encs, name="sweep", label=label))
        timing["sweep_seconds"] = time.perf_counter() - t2
        summary = A.summarise(cal, sw, rankings, fractions, kv_heads=kv_heads, reduce=options.atlas_reduce,
                              resamples=options.atlas_bootstrap, seed=ctx.seed, tasks=encs,
                              params=dataclasses.asdict(options), source=prepared.data["source"],
                              greedy=greedy, timing=timing)
        sec = write_atlas(ctx.out_dir, summary, model_name=lm.display_name, cal=cal, sweep=sw, options=options,
                          notes=notes, source=prepared.data["source"], tasks=encs, title=self.title, key=self.key,
                          eos=ctx.passes.call(step.eos))
        res = summary.result
        write_results(ctx.out_dir, self.key, res)
        return ctx.result(sec)

    @staticmethod
    def _importance_possible(lm, notes: list[str]) -> bool:
        try:
            Objective(lm)
        except ModelError as exc:
            notes.append(f"No gradient importance: {exc}.")
            return False
        return True

    @staticmethod
    def _echo_induction(lm, options: Options, ctx: Context, notes: list[str]) -> dict:
        """RazorAttention's echo (the previous copy of the current token) and induction (the
        token after it) scores on repeated random tokens, a pass of their own."""
        seqs, targets = induction_probes(lm, options.atlas_probes, options.atlas_probe_length, ctx.seed, notes)
        stats = LongContextStats(seed=ctx.seed, causal=True)
        ctx.passes.stream(seqs, stats, step="echo and induction", targets=targets)
        a = stats.finalize().arrays
        return {"echo": a["target_duplicate"], "induction": a["target_induction"]}

