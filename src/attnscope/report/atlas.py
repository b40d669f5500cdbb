"""The head atlas's report: per-head scores and labels, the accuracy-vs-KV curve of every
ranking with bootstrap intervals, figures, findings, and the best ranking in DuoAttention's
pattern format (what kvpress's ``DuoAttentionPress`` loads) with the tasks and the sweep's
answers, for ``interop/kvpress/`` to replay with kvpress.

Heads are named 1-indexed ``layer-head`` (``kv_head`` 0-indexed, like ``layer`` and ``head``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.analyses import atlas as A
from attnscope.data.io import atomic_write_text
from attnscope.data.records import HeadId
from attnscope.report.duo import write_pattern
from attnscope.report.figures import new_figure, save_figure
from attnscope.report.section import FigureArtifact, Section, TableArtifact
from attnscope.report.tables import write_table

CURVE_COLUMNS = ["ranking", "kv_fraction", "kv_heads_kept", "kv_entries_kept", "accuracy", "n",
                 "ci_low", "ci_high"]
AREA_COLUMNS = ["ranking", "kind", "area", "ci_low", "ci_high", "acc_25", "acc_50"]
COLOURS = {"retrieval": "#d62728", "induction": "#9467bd", "echo": "#e377c2", "sink": "#7f7f7f",
           "positional": "#2ca02c", "streaming": "#1f77b4", "other": "#dddddd"}


def pattern_values(order: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """DuoAttention pattern values ``[L Hkv]`` of a ranking ``order`` (flat KV heads, most
    needed first): rank-based, distinct, most needed 1 and least needed 0, so kvpress's rule
    (prune the ``round(N ratio)`` smallest values) prunes exactly the ranking's bottom heads.

    >>> pattern_values(np.array([3, 0, 2, 1]), (2, 2)).tolist()
    [[0.6666666666666666, 0.0], [0.3333333333333333, 1.0]]
    """
    total = int(np.prod(shape))
    v = np.empty(total)
    v[np.asarray(order)] = (total - 1 - np.arange(total)) / max(total - 1, 1)
    return v.reshape(shape)


def compression_ratio_for(kept: int, total: int) -> float:
    """kvpress's ``head_compression_ratio`` that keeps ``kept`` of ``total`` KV heads whole:
    ``(total - kept) / total``, which kvpress's count of pruned heads ``round(total * ratio)``
    turns back into ``total - kept``. ``1 - f`` is not always it: with ``total`` odd and
    ``f total`` a half, Python's round-half-to-even prunes one head more or one fewer than
    ``total - round(f total)``:

    >>> total, f = 15, 0.5
    >>> kept = round(f * total)
    >>> kept, total - round(total * (1 - f)), total - round(total * compression_ratio_for(kept, total))
    (8, 7, 8)
    """
    return (total - kept) / total


def _key(f: float) -> str:
    return f"{f:g}"


def duo_attention_export(out_dir: Path, order: np.ndarray, shape: tuple[int, int], *, ranking: str,
                         sink: int, window: int, sweep: A.Sweep, tasks: list, eos) -> list[Path]:
    """The exported ranking as kvpress input, to check that kvpress's ``DuoAttentionPress``
    with it gets the sweep's answers (``interop/kvpress/``):

    - ``kvpress/full_attention_heads.tsv``: DuoAttention's pattern file, one line per layer and
      one tab-separated value per KV head, higher = keep the whole cache; the values are
      :func:`pattern_values` of ``order`` (rank-based, so that kvpress prunes exactly the heads
      the sweep cut at every fraction; the scores themselves have ties).
    - ``kvpress/config.json``: ``sink_size``, ``recent_size`` (what
      ``DuoAttentionPress.load_attention_pattern`` returns with the pattern), ``ranking``,
      ``layers``, ``kv_heads`` (per layer), ``kv_heads_total``, ``eos_token_ids`` (the sweep's
      stopping tokens) and, per fraction of the sweep, ``kv_heads_kept`` and the
      ``head_compression_ratio`` that makes kvpress keep exactly that many
      (:func:`compression_ratio_for`).
    - ``kvpress/tasks.jsonl``: one line per evaluated task: ``index``, ``kind``, ``context_ids``,
      ``question_ids``, ``max_new``, ``answer`` (strings, all required) and ``outcomes``, per
      fraction (``"0"``, ``"0.25"``, ..., ``"1"``; 0 and 1 are the all-streaming and whole-cache
      rows every ranking shares) the sweep's ``correct``, ``answer`` (the generated text),
      ``kv_heads_kept`` and ``kv_entries_kept`` (1 minus kvpress's ``compression_ratio``).
    """
    folder = out_dir / "kvpress"
    total = int(np.prod(shape))
    swept = sorted({0.0, 1.0} | {f for r, f, _ in sweep.configs if r == ranking})
    rows = {f: A.config_index(sweep, ranking, f) for f in swept}
    fractions = {_key(f): {"kv_heads_kept": sweep.configs[i][2],
                           "head_compression_ratio": compression_ratio_for(sweep.configs[i][2], total)}
                 for f, i in rows.items()}
    tsv, cfg = write_pattern(folder, pattern_values(order, shape), sink=sink, window=window, digits=8, extra={
        "ranking": ranking, "score": ranking, "values": "rank-based: most needed KV head 1, least needed 0",
        "layers": int(shape[0]), "kv_heads": int(shape[1]), "kv_heads_total": total,
        "eos_token_ids": sorted(int(e) for e in eos), "fractions": fractions})
    lines = []
    for t, enc in enumerate(tasks):
        outcomes = {_key(f): {"correct": bool(sweep.correct[i, t]), "answer": sweep.answers[i][t],
                              "kv_heads_kept": sweep.configs[i][2], "kv_entries_kept": float(sweep.kept[i, t])}
                    for f, i in rows.items()}
        lines.append(json.dumps({"index": t, "kind": enc.task.kind, "context_ids": list(map(int, enc.context)),
                                 "question_ids": list(map(int, enc.question)), "max_new": enc.max_new,
                                 "answer": list(enc.task.answer), "outcomes": outcomes}, ensure_ascii=False))
    jsonl = folder / "tasks.jsonl"
    atomic_write_text(jsonl, "".join(x + "\n" for x in lines))
    return [tsv, cfg, jsonl]


def label_figure(labels: np.ndarray, path: Path, title: str) -> list[Path]:
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    L, H = labels.shape
    codes = np.vectorize(A.LABELS.index)(labels)
    fig, ax = new_figure(figsize=(max(4.0, 0.45 * H + 2.5), max(3.0, 0.22 * L + 1)))
    ax.imshow(codes, cmap=ListedColormap([COLOURS[x] for x in A.LABELS]), vmin=-0.5,
              vmax=len(A.LABELS) - 0.5, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(H), [str(h + 1) for h in range(H)])
    ax.set_yticks(range(0, L, max(1, L // 15)), [str(x + 1) for x in range(0, L, max(1, L // 15))])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    ax.legend(handles=[Patch(color=COLOURS[x], label=x) for x in A.LABELS], fontsize=9,
              bbox_to_anchor=(1.02, 1), loc="upper left")
    return save_figure(fig, path)


def curve_figure(rows: list[dict], path: Path, title: str) -> list[Path]:
    fig, ax = new_figure(figsize=(6.5, 4.2))
    names = list(dict.fromkeys(r["ranking"] for r in rows if r["ranking"] not in ("full_cache", "streaming_llm")))
    for name in names:
        pts = [r for r in rows if r["ranking"] == name]
        x, y = [r["kv_entries_kept"] for r in pts], [r["accuracy"] for r in pts]
        kind = A.ranking_kind(name)
        style = ({"color": "#999999", "lw": 1, "ls": ":"} if kind == "random" else
                 {"color": "black", "lw": 1, "ls": "--"} if kind == "reversed" else {"lw": 1.8, "marker": "o", "ms": 3})
        ax.plot(x, y, label=name, **style)
    full = next(r for r in rows if r["ranking"] == "full_cache")
    ax.axhline(full["accuracy"], color="#2ca02c", lw=0.8, label="whole cache")
    ax.set_xlabel("fraction of the context's KV entries kept")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.03, 1.03)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=9, bbox_to_anchor=(1.02, 1), loc="upper left")
    return save_figure(fig, path)


def _pct(x: float | None) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{100 * x:.1f}%"


def findings(cal: A.Calibration, sweep: A.Sweep, area_rows: list[dict], curve_rows: list[dict],
             labels: np.ndarray, scores: dict, tasks: list, drops: list[dict] = ()) -> list[str]:
    out = []
    n = len(tasks)
    full = float(sweep.full_correct.mean())
    kinds = sorted({e.task.kind for e in tasks})
    by_kind = ", ".join(f"{k} {_pct(np.mean([c for c, e in zip(sweep.full_correct, tasks) if e.task.kind == k]))}"
                        for k in kinds)
    out.append(f"With the whole cache the model answers {int(sweep.full_correct.sum())} of {n} tasks "
               f"({_pct(full)}; {by_kind}); with every KV head cut to sink + window (StreamingLLM) "
               f"{_pct(next(r['accuracy'] for r in curve_rows if r['ranking'] == 'streaming_llm'))}.")
    if not sweep.full_correct.any():
        out.append("No task was answered even with the whole cache, so the sweep cannot tell the "
                   "rankings apart: every area below is 0.")
    out.append(f"The f = 1 row generated exactly the full-cache tokens on {int(sweep.f1_identical.sum())} "
               f"of {n} tasks.")
    rnd = [r for r in area_rows if r["kind"] == "random"]
    scored = sorted((r for r in area_rows if r["kind"] not in ("random", "reversed")), key=lambda r: -r["area"])
    if scored:
        best = scored[0]
        line = (f"Best ranking by area: {best['ranking']} ({best['area']:.3f}, 95% interval "
                f"{best['ci_low']:.3f}-{best['ci_high']:.3f}; accuracy {_pct(best['acc_25'])} at 25% and "
                f"{_pct(best['acc_50'])} at 50% of KV heads kept)")
        if rnd:
            ra = [r["area"] for r in rnd]
            # "beats" only where its interval lies above every random ranking's interval
            if best["ci_low"] > max(r["ci_high"] for r in rnd):
                verdict = "it beats every one (its interval lies above each one's)"
            elif best["area"] > max(ra):
                verdict = "its area is above every one's, but the intervals overlap"
            else:
                verdict = "it does not beat every one"
            line += (f"; random rankings {np.mean(ra):.3f} on average (from {min(ra):.3f} to {max(ra):.3f}, "
                     f"{len(ra)} seeds): {verdict}")
        out.append(line + ".")
        if best["acc_50"] is not None:
            top_random = max((r["area"] for r in rnd), default=-1.0)
            close = [r for r in scored if r["acc_50"] is not None and 100 * (full - r["acc_50"]) <= 5]
            out.append("At half of the KV heads kept, within 5 points of the whole cache: "
                       + (", ".join(f"{r['ranking']} ({_pct(r['acc_50'])}, area "
                                    f"{'above' if r['area'] > top_random else 'not above'} every random "
                                    "ranking's)" for r in close) if close else "no ranking")
                       + f"; {best['ranking']} is {100 * (full - best['acc_50']):.1f} points below.")
        half = {r["ranking"]: r for r in curve_rows if r["kv_fraction"] == 0.5}
        if best["ranking"] in half and rnd:
            b, rs = half[best["ranking"]], [half[r["ranking"]] for r in rnd if r["ranking"] in half]
            top = max(r["ci_high"] for r in rs)
            out.append(f"At half of the KV heads, {best['ranking']}'s 95% interval ({_pct(b['ci_low'])}-"
                       f"{_pct(b['ci_high'])}) " + ("excludes" if b["ci_low"] > top else "overlaps")
                       + f" every random ranking's (highest upper end {_pct(top)}).")
        greedy = next((r for r in area_rows if r["kind"] == "greedy"), None)
        floor = max((r["area"] for r in rnd), default=None)
        for r in scored[1:]:
            where = ""
            if greedy is not None and floor is not None and greedy["area"] > floor and r is not greedy:
                where = (f"; {100 * (r['area'] - floor) / (greedy['area'] - floor):.0f}% of the way from the "
                         "best random ranking to the greedy one")
            out.append(f"{r['ranking']} ({r['kind']}): area {r['area']:.3f} ({r['ci_low']:.3f}-{r['ci_high']:.3f}), "
                       f"{_pct(r['acc_25'])} at 25%, {_pct(r['acc_50'])} at 50%{where}.")
    for r in area_rows:
        if r["kind"] == "reversed":
            out.append(f"{r['ranking']}: area {r['area']:.3f}, {_pct(r['acc_50'])} at 50%.")
    counts = {x: int((labels == x).sum()) for x in A.LABELS}
    out.append("Labels (query heads): " + ", ".join(f"{v} {k}" for k, v in counts.items() if v) + ".")
    if "retrieval" in scores and np.isfinite(scores["retrieval"]).any():
        r = np.nan_to_num(scores["retrieval"], nan=-1)
        top = np.dstack(np.unravel_index(np.argsort(-r, axis=None)[:8], r.shape))[0]
        out.append(f"Retrieval scores (Wu et al.) from {cal.correct} of {cal.tasks} calibration tasks "
                   "answered with the whole cache; highest: "
                   + ", ".join(f"{HeadId(a, b)} ({r[a, b]:.2f})" for a, b in top) + ".")
    if drops:
        lost = sum(d["lost"] for d in drops)
        out.append(f"Accuracy falls as heads are added at {len(drops)} steps of the nested rankings "
                   f"(atlas_drops): of the {lost} answers lost there, {sum(d['other_number'] for d in drops)} "
                   f"copied another number of the context, {sum(d['unseen_number'] for d in drops)} gave a "
                   f"number not in the context, {sum(d['no_number'] for d in drops)} no number.")
    if n < 30:
        out.append(f"Caution: {n} tasks are too few for these accuracies to be compared (fewer than 30).")
    return out


def write_atlas(out_dir: Path, summary: A.Summary, *, model_name: str, cal: A.Calibration, sweep: A.Sweep,
                options: Any, notes: list[str], source: str, tasks: list, title: str, key: str,
                eos: frozenset[int] = frozenset()) -> Section:
    """Tables, figures, the kvpress export and the Section of the atlas's ``summary``
    (:func:`attnscope.analyses.atlas.summarise`); its result's ``summary`` gets the findings.
    ``eos``: the sweep's end-of-sequence ids (:func:`attnscope.models.generation.eos_ids`), for the
    export."""
    out_dir = Path(out_dir)
    tables_dir, fig_dir = out_dir / "tables", out_dir / "figures"
    tables_dir.mkdir(parents=True, exist_ok=True)
    fig_dir.mkdir(parents=True, exist_ok=True)
    res, lab, kv = summary.result, summary.labels, summary.kv
    heads, crow, arow, task_rows = (res.tables[t] for t in ("heads", "curve", "areas", "tasks"))
    scores = cal.scores
    resamples, seed = options.atlas_bootstrap, res.params["seed"]
    sec = Section(key=key, title=title)
    sec.findings = findings(cal, sweep, arow, crow, lab, scores, tasks, res.tables["drops"]) + notes
    hcols = ["name", "layer", "head", "kv_head", *[k for k in A.HEAD_SCORES if k in scores],
             *[f"kv_{k}" for k in kv], "label"]
    cap = ("Per query head: scores from the calibration tasks (streaming, sink, previous: mass over context "
           f"rows i >= {options.atlas_sink + options.atlas_window}; snapkv: the question rows' mass outside "
           "sink + window; retrieval: Wu et al.; echo, induction: repeated random tokens; importance: "
           "|dL/d gate| of the answer, per-layer normalised), kv_<score>: the KV head's need "
           f"({options.atlas_reduce} over its query heads; streaming: 1 - share), and the label.")
    sec.tables.append(TableArtifact("atlas_heads", cap, heads, hcols,
                                    write_table(heads, tables_dir / "atlas_heads", columns=hcols, caption=cap)))
    ccap = ("Accuracy vs KV kept: kv_fraction of KV heads keep their whole context (top of the ranking), "
            f"the others the first {options.atlas_sink} and last {options.atlas_window} tokens; "
            "kv_entries_kept: fraction of the context's KV entries (tokens x KV heads x layers), mean over "
            f"tasks; 95% bootstrap interval over tasks ({resamples} resamples, seed {seed}).")
    sec.tables.append(TableArtifact("atlas_curve", ccap, crow, CURVE_COLUMNS,
                                    write_table(crow, tables_dir / "atlas_curve", columns=CURVE_COLUMNS,
                                                caption=ccap)))
    acap = ("Area under accuracy over the fraction of KV heads kept (0 to 1, trapezoid; the mean accuracy "
            "of the sweep) per ranking, with a paired 95% bootstrap interval over tasks.")
    sec.tables.append(TableArtifact("atlas_areas", acap, arow, AREA_COLUMNS,
                                    write_table(arow, tables_dir / "atlas_areas", columns=AREA_COLUMNS,
                                                caption=acap)))
    kcols = ["ranking", "kind", "n", "full_cache", "area", "acc_25", "acc_50", "acc_75"]
    sec.tables.append(TableArtifact("atlas_kinds", "Per ranking and task kind: tasks, the whole cache's accuracy, "
                                                   "the area and the accuracy at 25%, 50% and 75% of KV heads kept.",
                                    res.tables["kinds"], kcols,
                                    write_table(res.tables["kinds"], tables_dir / "atlas_kinds", columns=kcols)))
    dcols = ["ranking", "from", "to", "accuracy_from", "accuracy_to", "lost", "gained", "heads_added",
             "other_number", "unseen_number", "no_number", "example"]
    sec.tables.append(TableArtifact("atlas_drops", "Where a nested ranking's accuracy falls as KV heads are added: "
                                                   "tasks lost and gained, and what the lost ones answered instead "
                                                   "(another number of the context, a number not in it, none).",
                                    res.tables["drops"], dcols,
                                    write_table(res.tables["drops"], tables_dir / "atlas_drops", columns=dcols)))
    if res.tables["greedy"]:
        gcols = ["iteration", "heads", "accuracy", "logprob", "added"]
        sec.tables.append(TableArtifact("atlas_greedy", "The greedy ranking's iterations on the calibration tasks "
                                                        "answered with the whole cache: heads in, their teacher-forced "
                                                        "accuracy and mean gold log-probability, the heads added "
                                                        "(flat layer * Hkv + kv_head).",
                                        res.tables["greedy"], gcols,
                                        write_table(res.tables["greedy"], tables_dir / "atlas_greedy", columns=gcols)))
    tcols = ["index", "kind", "context_tokens", "depth", "line", "answer", "full_cache", "correct", "f1_identical"]
    sec.tables.append(TableArtifact("atlas_tasks", "Evaluated tasks and the whole cache's answers.", task_rows,
                                    tcols, write_table(task_rows, tables_dir / "atlas_tasks", columns=tcols)))
    sec.figures.append(FigureArtifact("atlas_labels", "Each query head's label (layer x head, 1-indexed).",
                                      label_figure(lab, fig_dir / "atlas_labels", f"{model_name}: head atlas")))
    sec.figures.append(FigureArtifact("atlas_curve", "Accuracy vs the fraction of KV entries kept, per ranking "
                                                     "(random: dotted; reversed: dashed).",
                                      curve_figure(crow, fig_dir / "atlas_curve", f"{model_name}: {source}")))
    export_score = res.meta["exported"]
    if export_score:
        duo_attention_export(out_dir, np.asarray(res.meta["rankings"][export_score]), (lab.shape[0], res.meta["kv_heads"]),
                             ranking=export_score, sink=options.atlas_sink, window=options.atlas_window,
                             sweep=sweep, tasks=tasks, eos=eos)
        sec.methods.append(f"kvpress/: the {export_score} ranking (the best by area) in DuoAttention's pattern "
                           "format, rank-based so that kvpress's DuoAttentionPress prunes the heads the sweep "
                           "cut, with each fraction's head_compression_ratio, the tasks in token ids and the "
                           "sweep's answers (docs/atlas.md; interop/kvpress/ runs kvpress on it).")
    sec.methods += [
        "Protocol (kvpress): each task's context is prefilled once with full attention; for a ranking and a "
        "fraction f, the top f of the KV heads keep their whole context and the others only the sink and "
        "window tokens; the question is then read and the answer generated greedily. Evicted entries are "
        "masked out of the softmax, which equals eviction (positions stay those of the full context).",
        f"Labels, first match wins: {', '.join(f'{k} >= {v}' for k, v in A.THRESHOLDS.items())} "
        "(positional: previous-token mass; sink: first-token mass; streaming: sink + window share).",
    ]
    res.summary = list(sec.findings)
    if res.meta.get("timing"):
        sec.methods.append("Time on this machine: " + ", ".join(
            f"{k.replace('_seconds', '').replace('_', ' ')} {v / 60:.1f} min" for k, v in res.meta["timing"].items())
            + " (results meta: timing).")
    return sec
