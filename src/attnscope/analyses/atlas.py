"""The head atlas's scores and proof: what each head of a decoder does, and what that is worth
to its KV cache (docs/atlas.md has every formula and its source). No ``[n n]`` maps.

The tasks are :mod:`attnscope.data.tasks` (encoded by :mod:`attnscope.extract.tasks`); the
attention with some KV heads cut to sink + window, its prefill and its greedy answers are the
press (:mod:`attnscope.engines.press`). Here:

- **Scores per query head**, from a task's prefill and its full-cache answer
  (:class:`CalibrationStep`, one task's sums; :func:`calibration`, folded over tasks): the
  retrieval score (Wu et al. 2024), the streaming share (DuoAttention's sink + recent window),
  SnapKV's observation-window mass outside that window, the first-token and previous-token
  mass; echo and induction (RazorAttention) come from repeated random tokens
  (:mod:`attnscope.analyses.longctx`), gradient importance (Michel et al. 2019) from the
  answer's loss (:func:`answer_importance`). A key/value head's score reduces its query heads'
  (:func:`kv_reduce`).
- **The proof** (:class:`SweepStep`, one task; :func:`sweep`, folded over tasks): kvpress's
  protocol. Each task's context is prefilled once with full attention; then, for a ranking of
  the KV heads and a fraction ``f`` kept, the top ``f`` keep their whole cache and every other
  KV head only the first ``sink`` and the last ``window`` context tokens; the question is read
  and the answer generated greedily with that cache.
- **The curve** (:func:`curve`, :func:`areas`): accuracy against the KV kept per ranking, with
  bootstrap intervals over tasks.

A step is a picklable callable ``step(lm, task) -> record`` (plain JSON), run task by task by
the executor (:meth:`attnscope.families.base.Units.tasks`: here or on Ray workers, each
finished task kept for a killed run to resume); the folds turn the records into arrays.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from attnscope.analyses.base import Result
from attnscope.analyses.importance import gate_gradients, normalise_per_layer
from attnscope.analyses.lm_objective import LossInput, Objective
from attnscope.analyses.stats import bootstrap_ci
from attnscope.data.records import HeadId
from attnscope.engines.press import Prefills, Recorder, answer, prefill, score
from attnscope.extract.tasks import Encoded
from attnscope.models.generation import DecoderStep, eos_ids

#: The scores a ranking can follow; each is a "need" (higher: keep the head's whole cache).
SCORES = ("retrieval", "streaming", "snapkv", "echo", "induction", "importance")
REDUCTIONS = ("max", "mean")

#: Label thresholds (docs/atlas.md): Wu et al. call a head with retrieval score >= 0.1 a
#: retrieval head; induction / echo / previous-token as :mod:`attnscope.report.longctx`.
THRESHOLDS = {"retrieval": 0.1, "induction": 0.3, "echo": 0.3, "sink": 0.5, "positional": 0.5,
              "streaming": 0.9}
LABELS = ("retrieval", "induction", "echo", "sink", "positional", "streaming", "other")


# -- scores -------------------------------------------------------------------------------------
def retrieval_counts(enc: Encoded, generated: Sequence[int], top: Sequence[np.ndarray]) -> np.ndarray | None:
    """Wu et al.'s retrieval score of one task: for each head, the generated steps whose token
    the head copies (its arg-max key is a needle token equal to the generated token) over the
    needle's tokens (at most 1). ``top[i]`` is the ``[L H]`` arg-max key of the call that
    produced ``generated[i]``. None without needle tokens."""
    needle = np.flatnonzero(enc.needle)
    if not len(needle):
        return None
    ctx = np.asarray(enc.context)
    score = np.zeros(top[0].shape)
    for tok, t in zip(generated, top):
        inside = (t < len(ctx))
        hit = inside & enc.needle[np.minimum(t, len(ctx) - 1)] & (ctx[np.minimum(t, len(ctx) - 1)] == tok)
        score += hit
    return np.minimum(score / len(needle), 1.0)


def kv_reduce(scores: np.ndarray, kv_heads: int, how: str = "max") -> np.ndarray:
    """``[L Hq]`` query-head scores -> ``[L Hkv]``: the max (RazorAttention) or mean over each
    KV head's ``Hq / Hkv`` query heads (query head ``h`` belongs to KV head ``h // (Hq / Hkv)``).

    >>> kv_reduce(np.array([[1., 3., 2., 0.]]), 2).tolist(), kv_reduce(np.array([[1., 3., 2., 0.]]), 2, "mean").tolist()
    ([[3.0, 2.0]], [[2.0, 1.0]])
    """
    L, H = scores.shape
    grouped = scores.reshape(L, kv_heads, H // kv_heads)
    if how not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS}")
    with np.errstate(all="ignore"):
        return grouped.max(-1) if how == "max" else grouped.mean(-1)


def need(name: str, scores: dict[str, np.ndarray]) -> np.ndarray:
    """How much each head needs its whole cache by score ``name``: the score itself, except
    the streaming share, whose need is ``1 - share``."""
    return 1.0 - scores["streaming"] if name == "streaming" else scores[name]


def rank(values: np.ndarray) -> np.ndarray:
    """KV heads (flat ``layer * Hkv + kv_head``) from most to least needed; ties by index."""
    return np.argsort(-np.nan_to_num(values.ravel(), nan=-np.inf), kind="stable")


def labels(scores: dict[str, np.ndarray]) -> np.ndarray:
    """One label per query head: the first of :data:`LABELS` whose threshold it meets."""
    L, H = scores["streaming"].shape
    out = np.full((L, H), "other", dtype=object)
    rules = [("retrieval", "retrieval"), ("induction", "induction"), ("echo", "echo"),
             ("sink", "sink"), ("positional", "previous"), ("streaming", "streaming")]
    for label, key in reversed(rules):  # the first rule wins: apply it last
        v = scores.get(key)
        if v is not None:
            out[np.nan_to_num(v, nan=-1.0) >= THRESHOLDS[label]] = label
    return out


def answer_importance(lm, enc: Encoded, answer_ids: Sequence[int]) -> np.ndarray:
    """``|dL / d gate|`` ``[L Hq]`` of the answer's loss (mean cross-entropy of ``answer_ids``
    after context + question) with respect to each head's output gate at 1 (Michel et al. 2019,
    on the task loss)."""
    ids = list(enc.context) + list(enc.question) + list(answer_ids)
    start = len(enc.context) + len(enc.question)
    item = LossInput(0, ids, None, np.arange(start - 1, len(ids) - 1), np.asarray(answer_ids),
                     [], np.zeros(len(ids), dtype=bool))
    return np.abs(gate_gradients(Objective(lm), [item])[0])


# -- the curve ----------------------------------------------------------------------------------
def kept_entries(n: int, kept_heads: int, total_heads: int, sink: int, window: int) -> float:
    """Fraction of the context's KV entries (tokens x KV heads x layers) kept when
    ``kept_heads`` of ``total_heads`` keep all ``n`` and the others ``min(n, sink + window)``."""
    small = min(n, sink + window)
    return (kept_heads * n + (total_heads - kept_heads) * small) / (total_heads * n)


def area(fractions: Sequence[float], accuracy: Sequence[float]) -> float:
    """Area under accuracy over the fraction of KV heads kept (trapezoid rule), divided by the
    fractions' range: the mean accuracy over the sweep.

    >>> area([0, 0.5, 1], [0, 1, 1])
    0.75
    """
    x = np.asarray(fractions, dtype=float)
    y = np.asarray(accuracy, dtype=float)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2) / (x[-1] - x[0]))


def bootstrap_areas(correct: dict[str, np.ndarray], fractions: Sequence[float], *, resamples: int,
                    seed: int) -> dict[str, tuple[float, float, np.ndarray]]:
    """Per ranking, the 95% percentile interval of its area over tasks resampled with
    replacement (the same resamples for every ranking: paired), and the resampled areas.
    ``correct[r]`` is bool ``[F tasks]``."""
    rng = np.random.default_rng(seed)
    first = next(iter(correct.values()))
    n = first.shape[1]
    idx = rng.integers(0, n, size=(resamples, n))
    x = np.asarray(fractions, dtype=float)
    out = {}
    for r, c in correct.items():
        acc = c[:, idx].mean(-1).T  # [resamples F]
        areas = np.sum((x[1:] - x[:-1]) * (acc[:, 1:] + acc[:, :-1]) / 2, axis=1) / (x[-1] - x[0])
        out[r] = (float(np.percentile(areas, 2.5)), float(np.percentile(areas, 97.5)), areas)
    return out


# -- calibration and the sweep ------------------------------------------------------------------
@dataclass
class Calibration:
    """The scores ``[L Hq]`` from calibration tasks, and how many tasks each rests on."""

    scores: dict[str, np.ndarray]
    tasks: int = 0
    correct: int = 0  # answered with the whole cache: the retrieval score's tasks
    rows: int = 0  # context rows behind the streaming, sink and previous-token scores
    answers: list[str] = field(default_factory=list)


@dataclass
class CalibrationStep(DecoderStep):
    """One calibration task: its prefill and full-cache answer, recorded (:class:`Recorder`),
    as the sums :func:`calibration` folds (plain lists)."""

    sink: int
    window: int
    importance: bool
    seed: int = 0

    def __call__(self, lm, enc: Encoded) -> dict:
        model = self.decoder(lm)
        tok = lm.tokenizer
        one = Recorder(lm.num_layers, lm.num_heads)
        ctx = prefill(lm, model, enc, one, sink=self.sink, window=self.window)
        gen = answer(lm, model, ctx, enc, None, sink=self.sink, window=self.window, recorder=one,
                     eos=eos_ids(model))[0]
        text = tok.decode(gen, skip_special_tokens=True)
        counts = retrieval_counts(enc, gen, one.top) if enc.task.correct(text) else None
        imp = None
        if self.importance:
            gold = tok(" " + ", ".join(enc.task.answer), add_special_tokens=False)["input_ids"]
            imp = answer_importance(lm, enc, gold).tolist()
        return {"streaming": one.streaming.tolist(), "sink": one.sink_mass.tolist(),
                "previous": one.previous.tolist(), "rows": one.rows, "snapkv": one.snapkv.tolist(),
                "retrieval": None if counts is None else counts.tolist(), "importance": imp,
                "answer": text}


def calibration(records: Sequence[dict], shape: tuple[int, int], *, importance: bool) -> Calibration:
    """Per-head scores ``[L Hq]`` from the :class:`CalibrationStep` records of the calibration
    tasks: streaming, sink and previous-token mass pooled over every task's context rows
    ``i >= sink + window``; SnapKV's mass averaged over tasks; the retrieval score averaged over
    the tasks answered correctly (NaN when none was); with ``importance``, Michel et al.'s
    ``E |dL/d gate|`` of the gold answer's loss, divided per layer by its L2 norm."""
    L, H = shape
    sums = {k: np.zeros((L, H)) for k in ("streaming", "sink", "previous", "snapkv", "retrieval", "importance")}
    rows = correct = 0
    for rec in records:
        for k in ("streaming", "sink", "previous", "snapkv"):
            sums[k] += np.asarray(rec[k])
        rows += rec["rows"]
        if rec["retrieval"] is not None:
            sums["retrieval"] += np.asarray(rec["retrieval"])
            correct += 1
        if importance:
            sums["importance"] += np.asarray(rec["importance"])
    n = max(len(records), 1)
    with np.errstate(all="ignore"):
        scores = {k: sums[k] / rows for k in ("streaming", "sink", "previous")}
        scores["snapkv"] = sums["snapkv"] / n
        scores["retrieval"] = sums["retrieval"] / correct if correct else np.full((L, H), np.nan)
    if importance:
        scores["importance"] = normalise_per_layer(sums["importance"] / n)
        scores["importance_raw"] = sums["importance"] / n
    return Calibration(scores, len(records), correct, rows, [rec["answer"] for rec in records])


def rankings_for(scores: dict[str, np.ndarray], kv_heads: int, *, use: Sequence[str], reduce: str,
                 reversed_of: str | None, random: int, seed: int) -> dict[str, np.ndarray]:
    """Orders of the KV heads (flat ``layer * Hkv + kv_head``, most needed first): one per score
    of ``use`` that was measured (not all NaN), the reverse of ``reversed_of``'s, and
    ``random`` seeded permutations (seeds ``seed``, ``seed + 1``, ...)."""
    out = {}
    for name in use:
        v = scores.get(name)
        if v is not None and not np.isnan(v).all():
            out[name] = rank(kv_reduce(need(name, scores), kv_heads, reduce))
    if reversed_of in out:
        out[f"reversed_{reversed_of}"] = out[reversed_of][::-1].copy()
    total = next(iter(scores.values())).shape[0] * kv_heads
    for i in range(random):
        out[f"random_{i + 1}"] = np.random.default_rng(seed + i).permutation(total)
    return out


def combined_rankings(scores: dict[str, np.ndarray], labels_: np.ndarray, kv_heads: int, *, reduce: str
                      ) -> dict[str, np.ndarray]:
    """Rankings from two scores or the labels (flat KV heads, most needed first), where their
    scores were measured:

    - ``retrieval_then_induction``: the KV heads with a retrieval head among their query heads
      (retrieval score >= :data:`THRESHOLDS`), by retrieval score; then the others by induction;
    - ``importance_by_label``: KV heads grouped by the neediest label among their query heads
      (:data:`LABEL_NEED`), by gradient importance within a group.
    """
    out = {}
    have = lambda k: k in scores and not np.isnan(scores[k]).all()  # noqa: E731
    if have("retrieval") and have("induction"):
        ret = np.nan_to_num(kv_reduce(scores["retrieval"], kv_heads, reduce).ravel(), nan=-1.0)
        ind = np.nan_to_num(kv_reduce(scores["induction"], kv_heads, reduce).ravel(), nan=-1.0)
        first = ret >= THRESHOLDS["retrieval"]
        out["retrieval_then_induction"] = np.lexsort((np.arange(len(ret)), -np.where(first, ret, ind), ~first))
    if have("importance"):
        L, H = labels_.shape
        need_rank = np.vectorize(LABEL_NEED.index)(labels_).reshape(L, kv_heads, H // kv_heads).min(-1).ravel()
        imp = np.nan_to_num(kv_reduce(scores["importance"], kv_heads, reduce).ravel(), nan=-1.0)
        out["importance_by_label"] = np.lexsort((np.arange(len(imp)), -imp, need_rank))
    return out


@dataclass
class GreedyStep(DecoderStep):
    """One calibration task of one greedy iteration: the task's prefill (kept in this process
    for the next iterations, :meth:`attnscope.engines.press.Prefills.of`), then, teacher-forced on
    its gold answer (:func:`attnscope.engines.press.score`), the KV heads ``base`` keeping their
    whole cache (row 0) and ``base`` plus each of ``candidates`` (rows 1..C)."""

    base: list
    candidates: list
    sink: int
    window: int
    batch: int = 64
    seed: int = 0

    def __call__(self, lm, enc: Encoded) -> dict:
        model = self.decoder(lm)
        L, K = lm.num_layers, lm.num_kv_heads
        gold = lm.tokenizer(" " + ", ".join(enc.task.answer), add_special_tokens=False)["input_ids"]
        ctx = Prefills.of(lm).get(lm, model, enc, sink=self.sink, window=self.window)
        masks = np.zeros((1 + len(self.candidates), L * K), dtype=bool)
        masks[:, self.base] = True
        masks[np.arange(1, len(masks)), self.candidates] = True
        masks = masks.reshape(-1, L, K)
        exact, logp = [], []
        for b0 in range(0, len(masks), self.batch):
            e, lp = score(lm, model, ctx, enc, masks[b0:b0 + self.batch], gold, sink=self.sink, window=self.window)
            exact += e.tolist()
            logp += lp.tolist()
        return {"exact": [bool(x) for x in exact], "logprob": logp}


def greedy_order(evaluate, total: int, until: int, step: int = 1) -> tuple[np.ndarray, list[dict]]:
    """The greedy ranking of ``total`` KV heads: from none, add the ``step`` heads whose whole
    cache most raises the calibration accuracy (teacher-forced, :class:`GreedyStep`), ties
    broken by the gold answers' mean log-probability, until ``until`` heads are in; the rest
    follow in the last iteration's order. ``evaluate(base, candidates, iteration)`` returns the
    :class:`GreedyStep` records of the calibration tasks. Also returns one trace row per
    iteration (heads in, their accuracy and log-probability, the heads added)."""
    order: list[int] = []
    trace: list[dict] = []
    rest = list(range(total))
    it = 0
    while rest:
        records = evaluate(list(order), list(rest), it)
        exact = np.array([r["exact"] for r in records], dtype=float)  # [tasks 1+C]
        logp = np.array([r["logprob"] for r in records], dtype=float)
        acc, lp = exact.mean(0), logp.mean(0)
        pick = np.lexsort((np.arange(len(rest)), -lp[1:], -acc[1:]))  # best first
        take = pick[:max(0, min(step, until - len(order)))]
        trace.append({"iteration": it, "heads": len(order), "accuracy": float(acc[0]), "logprob": float(lp[0]),
                      "added": " ".join(str(int(rest[i])) for i in take)})
        order += [rest[i] for i in take]
        if len(order) >= until:
            order += [rest[i] for i in pick[len(take):]]
            break
        taken = set(take.tolist())
        rest = [h for i, h in enumerate(rest) if i not in taken]
        it += 1
    return np.asarray(order), trace


@dataclass
class Sweep:
    """Outcomes of the proof: ``configs`` ``(ranking, fraction, KV heads kept)``, ``correct``
    and ``kept`` (fraction of context KV entries) ``[configs tasks]``; the full-cache
    answers, and whether each task's f = 1 row generated exactly those tokens."""

    configs: list[tuple[str, float, int]]
    correct: np.ndarray
    kept: np.ndarray
    full_answers: list[str]
    full_correct: np.ndarray
    f1_identical: np.ndarray
    answers: list[list[str]] = field(default_factory=list)  # [configs][tasks] generated text


def configs_for(rankings: dict[str, np.ndarray], fractions: Sequence[float], shape: tuple[int, int]
                ) -> tuple[list[tuple[str, float, int]], np.ndarray]:
    """The sweep's rows: whole cache (f = 1), all streaming (f = 0, StreamingLLM), then each
    ranking at each fraction strictly between; and their ``full`` masks ``[C L Hkv]``. A
    fraction ``f`` keeps the top ``round(f * L * Hkv)`` KV heads."""
    L, K = shape
    total = L * K
    configs = [("full_cache", 1.0, total), ("streaming_llm", 0.0, 0)]
    masks = [np.ones(total, dtype=bool), np.zeros(total, dtype=bool)]
    for name, order in rankings.items():
        for f in fractions:
            if 0 < f < 1:
                m = int(round(f * total))
                mask = np.zeros(total, dtype=bool)
                mask[order[:m]] = True
                configs.append((name, float(f), m))
                masks.append(mask)
    return configs, np.stack(masks).reshape(-1, L, K)


@dataclass
class SweepStep(DecoderStep):
    """One task of the proof: one prefill, the full-cache answer, then every row of ``masks``
    (``[C L Hkv]``, :func:`configs_for`) answered on that same prefill, ``batch`` rows at a
    time (plain lists, for :func:`sweep`)."""

    masks: np.ndarray
    configs: list
    sink: int
    window: int
    batch: int = 64
    seed: int = 0

    def __call__(self, lm, enc: Encoded) -> dict:
        model = self.decoder(lm)
        tok, eos = lm.tokenizer, eos_ids(model)
        sink, window = self.sink, self.window
        total = lm.num_layers * lm.num_kv_heads
        ctx = prefill(lm, model, enc, sink=sink, window=window)
        ref = answer(lm, model, ctx, enc, None, sink=sink, window=window, eos=eos)[0]
        full_answer = tok.decode(ref, skip_special_tokens=True)
        outs: list[list[int]] = []
        for b0 in range(0, len(self.masks), self.batch):
            outs += answer(lm, model, ctx, enc, self.masks[b0:b0 + self.batch], sink=sink,
                           window=window, eos=eos)
        texts = [tok.decode(o, skip_special_tokens=True) for o in outs]
        return {"correct": [enc.task.correct(t) for t in texts], "answers": texts,
                "kept": [kept_entries(len(enc.context), c[2], total, sink, window) for c in self.configs],
                "full_answer": full_answer, "full_correct": enc.task.correct(full_answer),
                "f1_identical": outs[0] == ref}


def sweep_seconds(lm, step: SweepStep, enc: Encoded, tasks: int) -> float:
    """An estimate of the sweep's time before it starts: one prefill, the whole cache's answer
    and one batch of rows timed on ``enc``, scaled to every batch of ``tasks`` tasks."""
    model = step.decoder(lm)
    eos = eos_ids(model)
    t0 = time.perf_counter()
    ctx = prefill(lm, model, enc, sink=step.sink, window=step.window)
    answer(lm, model, ctx, enc, None, sink=step.sink, window=step.window, eos=eos)
    t1 = time.perf_counter()
    first = step.masks[:step.batch]
    answer(lm, model, ctx, enc, first, sink=step.sink, window=step.window, eos=eos)
    t2 = time.perf_counter()
    batches = len(step.masks) / len(first)
    return tasks * ((t1 - t0) + batches * (t2 - t1))


def sweep(configs: list, records: Sequence[dict]) -> Sweep:
    """The :class:`SweepStep` records of the evaluated tasks, in task order, as arrays."""
    correct = np.array([r["correct"] for r in records], dtype=bool).T.reshape(len(configs), len(records))
    kept = np.array([r["kept"] for r in records], dtype=float).T.reshape(len(configs), len(records))
    return Sweep(configs, correct, kept, [r["full_answer"] for r in records],
                 np.array([r["full_correct"] for r in records], dtype=bool),
                 np.array([r["f1_identical"] for r in records], dtype=bool),
                 [[r["answers"][c] for r in records] for c in range(len(configs))])


# -- what the sweep and the scores come to ---------------------------------------------------------
#: The per-query-head scores of the heads table, in its column order.
HEAD_SCORES = ("retrieval", "streaming", "snapkv", "echo", "induction", "importance", "sink", "previous")


def _f(v) -> float | None:
    return None if v is None or not np.isfinite(v) else float(v)


#: Rankings built from two scores and the labels (:func:`combined_rankings`).
COMBINED = ("retrieval_then_induction", "importance_by_label")
#: KV-head labels from the most to the least in need of the whole cache (``importance_by_label``).
LABEL_NEED = ("retrieval", "induction", "echo", "other", "positional", "sink", "streaming")


def ranking_kind(name: str) -> str:
    """What kind of ranking ``name`` is: "random", "reversed", "greedy" (built by evaluating
    on the calibration tasks), "combined" (:data:`COMBINED`), "trained" (DuoAttention's gates)
    or "score".

    >>> [ranking_kind(x) for x in ("random_2", "reversed_retrieval", "greedy", "importance_by_label", "duo_gates", "snapkv")]
    ['random', 'reversed', 'greedy', 'combined', 'trained', 'score']
    """
    if name.startswith("random_"):
        return "random"
    if name.startswith("reversed_"):
        return "reversed"
    return {"greedy": "greedy", "duo_gates": "trained"}.get(name, "combined" if name in COMBINED else "score")


def curve(sweep: Sweep, rankings: dict, fractions: list[float], *, resamples: int, seed: int):
    """Rows of the curve table, and per ranking its bool ``[F tasks]`` outcomes (f = 0 and 1 are
    the shared all-streaming and whole-cache rows)."""
    index = {(r, f): i for i, (r, f, _) in enumerate(sweep.configs)}
    rows, outcome = [], {}
    for name in ["full_cache", "streaming_llm", *rankings]:
        fs = [1.0] if name == "full_cache" else [0.0] if name == "streaming_llm" else fractions
        picks = [index[("streaming_llm", 0.0)] if f == 0 else index[("full_cache", 1.0)] if f == 1
                 else index[(name, f)] for f in fs]
        for f, i in zip(fs, picks):
            c = sweep.correct[i]
            lo, hi = bootstrap_ci(c, n_boot=resamples, seed=seed)
            rows.append({"ranking": name, "kv_fraction": f, "kv_heads_kept": sweep.configs[i][2],
                         "kv_entries_kept": float(sweep.kept[i].mean()), "accuracy": float(c.mean()),
                         "n": int(len(c)), "ci_low": lo, "ci_high": hi})
        if name in rankings:
            outcome[name] = sweep.correct[picks]
    return rows, outcome


def areas(outcome: dict[str, np.ndarray], fractions: list[float], *, resamples: int, seed: int) -> list[dict]:
    """One row per ranking: its area with a paired bootstrap interval, accuracy at 25% / 50%."""
    boot = bootstrap_areas(outcome, fractions, resamples=resamples, seed=seed)
    rows = []
    for name, c in outcome.items():
        acc = c.mean(1)
        at = {f: float(a) for f, a in zip(fractions, acc)}
        rows.append({"ranking": name, "kind": ranking_kind(name), "area": area(fractions, acc),
                     "ci_low": boot[name][0], "ci_high": boot[name][1],
                     "acc_25": at.get(0.25), "acc_50": at.get(0.5)})
    return rows


def config_index(sweep: Sweep, name: str, f: float) -> int:
    """The sweep row of ranking ``name`` at fraction ``f`` (f = 0 and 1: the shared rows)."""
    target = ("streaming_llm", 0.0) if f == 0 else ("full_cache", 1.0) if f == 1 else (name, f)
    return next(i for i, (r, x, _) in enumerate(sweep.configs) if (r, x) == target)


def kind_rows(outcome: dict[str, np.ndarray], fractions: list[float], tasks: Sequence[Encoded],
              sweep: Sweep) -> list[dict]:
    """Per ranking and task kind: the tasks, the whole cache's accuracy, the area and the
    accuracy at 25%, 50% and 75% of the KV heads (None where not swept)."""
    kinds = np.array([e.task.kind for e in tasks])
    rows = []
    for name, c in outcome.items():
        for kind in sorted(set(kinds)):
            sel = kinds == kind
            acc = c[:, sel].mean(1)
            at = {f: float(a) for f, a in zip(fractions, acc)}
            rows.append({"ranking": name, "kind": kind, "n": int(sel.sum()),
                         "full_cache": float(sweep.full_correct[sel].mean()), "area": area(fractions, acc),
                         "acc_25": at.get(0.25), "acc_50": at.get(0.5), "acc_75": at.get(0.75)})
    return rows


def _what_came(answer: str, task) -> str:
    """What a wrong answer holds: a number copied from elsewhere in the context, a number that
    is not in the context, or no number."""
    numbers = [x for x in re.findall(r"\d{3,}", answer) if x not in task.answer]
    if not numbers:
        return "no_number"
    return "other_number" if any(x in task.context for x in numbers) else "unseen_number"


def drop_rows(outcome: dict[str, np.ndarray], fractions: list[float], tasks: Sequence[Encoded],
              sweep: Sweep) -> list[dict]:
    """Where a nested ranking's accuracy falls as heads are added: per ranking and pair of
    neighbouring fractions with more tasks lost than gained, the tasks lost and gained, the
    heads added, and what the lost tasks answered instead (another number of the context: a
    distractor copied; a number not in the context; no number), with one example."""
    rows = []
    for name, c in outcome.items():
        for a in range(len(fractions) - 1):
            lost, gained = c[a] & ~c[a + 1], ~c[a] & c[a + 1]
            if lost.sum() <= gained.sum():
                continue
            fa, fb = fractions[a], fractions[a + 1]
            ia, ib = config_index(sweep, name, fa), config_index(sweep, name, fb)
            came = [_what_came(sweep.answers[ib][t], tasks[t].task) for t in np.flatnonzero(lost)]
            t0 = int(np.flatnonzero(lost)[0])
            rows.append({"ranking": name, "from": fa, "to": fb, "accuracy_from": float(c[a].mean()),
                         "accuracy_to": float(c[a + 1].mean()), "lost": int(lost.sum()), "gained": int(gained.sum()),
                         "heads_added": sweep.configs[ib][2] - sweep.configs[ia][2],
                         "other_number": came.count("other_number"), "unseen_number": came.count("unseen_number"),
                         "no_number": came.count("no_number"),
                         "example": f"task {t0} ({tasks[t0].task.kind}, answer {' | '.join(tasks[t0].task.answer)}): "
                                    f"{sweep.answers[ia][t0].strip()!r} -> {sweep.answers[ib][t0].strip()!r}"})
    return rows


def head_rows(scores: dict[str, np.ndarray], labels: np.ndarray, kv: dict[str, np.ndarray],
              kv_heads: int) -> list[dict]:
    L, H = labels.shape
    g = H // kv_heads
    rows = []
    for layer in range(L):
        for head in range(H):
            row = {"name": str(HeadId(layer, head)), "layer": layer, "head": head, "kv_head": head // g}
            for k in HEAD_SCORES:
                if k in scores:
                    row[k] = _f(scores[k][layer, head])
            for k, v in kv.items():
                row[f"kv_{k}"] = _f(v[layer, head // g])
            row["label"] = str(labels[layer, head])
            rows.append(row)
    return rows


def task_rows(tasks: Sequence[Encoded], sweep: Sweep) -> list[dict]:
    """One row per evaluated task: its kind, length, depth, answer and the whole cache's answer."""
    return [{"index": i, "kind": e.task.kind, "context_tokens": len(e.context), "depth": e.task.depth,
             "line": e.task.line, "answer": " | ".join(e.task.answer), "full_cache": ans,
             "correct": bool(c), "f1_identical": bool(s)}
            for i, (e, ans, c, s) in enumerate(zip(tasks, sweep.full_answers, sweep.full_correct,
                                                   sweep.f1_identical))]


@dataclass
class Summary:
    """The atlas's outcome: the :class:`~attnscope.analyses.base.Result` to save (tables
    ``heads``, ``curve``, ``areas``, ``tasks``; the ``[S L Hq]`` ``scores``; which ranking is
    exported), each query head's label ``[L Hq]`` and each score's KV-head need ``[L Hkv]``."""

    result: Result
    labels: np.ndarray
    kv: dict[str, np.ndarray]


def summarise(cal: Calibration, sweep: Sweep, rankings: dict[str, np.ndarray], fractions: list[float], *,
              kv_heads: int, reduce: str, resamples: int, seed: int, tasks: Sequence[Encoded],
              params: dict, source: str, greedy: list[dict] | None = None, timing: dict | None = None) -> Summary:
    """Labels, KV-head needs, the per-head table, the curve and the areas with their bootstrap
    intervals (``resamples``, ``seed``), the tasks, per-kind and drops tables, the ``greedy``
    iterations, the ``timing`` of each step, and the ranking exported for kvpress (the best by
    area of every kind but random and reversed)."""
    scores = dict(cal.scores)
    lab = labels(scores)
    kv = {s: kv_reduce(need(s, scores), kv_heads, reduce) for s in SCORES if s in scores}
    heads = head_rows(scores, lab, kv, kv_heads)
    crow, outcome = curve(sweep, rankings, fractions, resamples=resamples, seed=seed)
    arow = areas(outcome, fractions, resamples=resamples, seed=seed) if outcome else []
    best = max((r for r in arow if r["kind"] not in ("random", "reversed")), key=lambda r: r["area"], default=None)
    grid = [k for k in HEAD_SCORES if k in scores]  # the viewer's per-head grids
    res = Result("atlas", params={**params, "seed": seed, "thresholds": THRESHOLDS, "head_index": "0-indexed",
                                  "kv_head_of_query_head": "head // (Hq / Hkv)"},
                 tables={"heads": heads, "curve": crow, "areas": arow, "tasks": task_rows(tasks, sweep),
                         "kinds": kind_rows(outcome, fractions, tasks, sweep) if outcome else [],
                         "drops": drop_rows(outcome, fractions, tasks, sweep) if outcome else [],
                         "greedy": greedy or []},
                 meta={"source": source, "calibration_tasks": cal.tasks, "calibration_correct": cal.correct,
                       "calibration_rows": cal.rows, "tasks": len(tasks), "kv_heads": kv_heads,
                       "relations": grid, "rankings": {k: v.tolist() for k, v in rankings.items()},
                       "exported": best["ranking"] if best else None, "timing": timing or {}})
    res.arrays["scores"] = np.stack([scores[s] for s in grid]).astype(np.float64)
    return Summary(res, lab, kv)
