"""The syntax family: Table 1 (every head against every relation) and Table 3 (probes).

:func:`run_syntax` does the whole job for ``attnscope analyze syntax`` and ``attnscope run``:
extracts word-level maps (or reads a word-level store), scores every head, writes Table 1
in two selection modes, per-relation heatmaps and Figure 5 style examples, and, when a train
split is given, trains the probes of section 5 and writes Table 3. It returns a
:class:`~attnscope.report.section.Section`.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from attnscope.analyses.base import Result
from attnscope.analyses.syntax import (
    ALL,
    DIRECTIONS,
    DependencyHeads,
    HeadCounts,
    binary_bootstrap_ci,
    score_map,
    table1_rows,
)
from attnscope.data.records import Example
from attnscope.errors import AttnscopeError, InputError
from attnscope.extract.batch import AttentionBatch, AttentionMap
from attnscope.report.section import FigureArtifact, Section, TableArtifact

Progress = Callable[[str, int, "int | None"], None] | None

TABLE1_COLUMNS = ["relation", "count", "head", "direction", "accuracy", "ci_low", "ci_high",
                  "offset", "offset_accuracy", "offset_ci_low", "offset_ci_high"]
TABLE3_COLUMNS = ["model", "uas", "ci_low", "ci_high", "dependents", "best_epoch", "epochs",
                  "seconds_per_epoch", "parameters"]

#: Table 1 of the paper (BERT-base, PTB Stanford Dependencies) and the EWT (UD) relation
#: closest to each; the paper's "pobj" has no UD counterpart (UD attaches the noun, not the
#: preposition).
PAPER_TABLE1 = [("det", "det", 94.3, 51.7), ("dobj", "obj", 86.8, 40.0),
                ("poss", "nmod:poss", 80.5, 47.7), ("all", ALL, 34.5, 26.3)]
PAPER_TABLE3 = {"right-branching": 26, "distance+glove": 58, "random-init attn+glove": 30,
                "attn": 61, "attn+glove": 77}


def _notify(progress: Progress, step: str, done: int, total: int | None) -> None:
    if progress is not None:
        progress(step, done, total)


# -- inputs ---------------------------------------------------------------------------------
def _is_store(x) -> bool:
    from attnscope.store import Store

    return isinstance(x, Store)


def _check_examples(examples: list[Example], what: str) -> None:
    if not examples:
        raise AttnscopeError(f"{what}: no examples")
    for i, ex in enumerate(examples):
        if ex.heads is None or ex.relns is None or ex.words is None:
            where = ex.fields.get("source_line")
            at = f" (line {where})" if where else ""
            raise InputError(None, f"{what}: example {i}{at} has no dependency tree (needs words, "
                                   "heads and relns)")


def _check_store(store, what: str) -> None:
    if store.level != "word":
        raise AttnscopeError(f"{store.path}: {what} store holds token-level maps; syntax needs a "
                             "word-level store (attnscope extract --word-level)")


def _extract_options(max_seq_len: int, batch_size: int, seed: int):
    from attnscope.extract.runner import ExtractOptions

    return ExtractOptions(max_seq_len=max_seq_len, batch_size=batch_size, word_level=True, seed=seed)


def _to_store(examples: list[Example], lm, path: Path, *, options, dtype: str, progress: Progress,
              step: str):
    from attnscope.store import extract_to_store, open_store

    total = len(examples)
    extract_to_store(examples, path, lm, options=options, dtype=dtype,
                     progress=lambda done, tokens: _notify(progress, step, done, total))
    return open_store(path)


def _stream(examples: list[Example], lm, options, progress: Progress, step: str
            ) -> Iterator[AttentionBatch]:
    from attnscope.extract.runner import extract

    done = 0
    for batch in extract(examples, lm, options=options):
        done += len(batch)
        _notify(progress, step, done, len(examples))
        yield batch


def _store_examples(store) -> list[Example]:
    return [m.example for m in store]


# -- Table 1 --------------------------------------------------------------------------------
def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", s)


def heatmap_figures(result_counts: HeadCounts, relations: list[str], fig_dir: Path) -> list[FigureArtifact]:
    """One figure per relation: accuracy of every head, layer x head, both directions."""
    from attnscope.report.figures import new_figure, save_figure

    acc = result_counts.accuracy()  # [R L H 2]
    figs = []
    for rel in relations:
        r = result_counts.get(rel)
        if r is None:
            continue
        L, H = acc.shape[1:3]
        fig, axes = new_figure(1, 2, figsize=(2 + 0.45 * H * 2, 1 + 0.4 * L), squeeze=False)
        for d, ax in enumerate(axes[0]):
            im = ax.imshow(100 * acc[r, :, :, d], vmin=0, vmax=100, cmap="viridis", aspect="auto")
            ax.set_title(f"{rel}: {DIRECTIONS[d]}", fontsize=9)
            ax.set_xlabel("head (1-indexed)")
            ax.set_ylabel("layer (1-indexed)")
            ax.set_xticks(range(H), [str(h + 1) for h in range(H)], fontsize=6)
            ax.set_yticks(range(L), [str(layer + 1) for layer in range(L)], fontsize=6)
        fig.colorbar(im, ax=axes[0].tolist(), label="accuracy (%)")
        stem = f"figure_syntax_heatmap_{_slug(rel)}"
        paths = save_figure(fig, fig_dir / stem)
        figs.append(FigureArtifact(stem, f"Accuracy (%) of every head for '{rel}' "
                                         "(layer x head, 1-indexed; left: dependent -> head, "
                                         "right: head -> dependent).", paths))
    return figs


def example_figure(m: AttentionMap, layer: int, head: int, direction: int, relation: str,
                   stem: Path, collapse_subtypes: bool = False) -> list[Path]:
    """Figure 5 style: one head's word-level attention as lines from words (left) to words
    (right); the gold arcs of ``relation`` in the head's direction are drawn in red."""
    from attnscope.analyses.syntax import relation_label
    from attnscope.report.figures import new_figure, save_figure

    pos = m.word_positions()
    words = m.example.all_words or []
    n = len(pos)
    a = m.attn[layer, head][pos[:, None], pos[None, :]]  # [n n] words only
    fig, ax = new_figure(figsize=(4.2, 0.3 * n + 1.0))
    for i in range(n):
        ax.text(0, -i, words[i], ha="right", va="center", fontsize=8)
        ax.text(1, -i, words[i], ha="left", va="center", fontsize=8)
        for j in range(n):
            if a[i, j] > 0.05:
                ax.plot([0.02, 0.98], [-i, -j], color="tab:blue", alpha=float(min(1.0, a[i, j])), lw=1.2)
    for dep in range(n):
        h = m.example.heads[dep] - 1
        if h < 0 or h >= n or relation_label(m.example.relns[dep], collapse_subtypes) != relation:
            continue
        src, dst = (dep, h) if direction == 0 else (h, dep)
        ax.plot([0.02, 0.98], [-src, -dst], color="tab:red", lw=2.0, ls="--")
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylim(-n + 0.5, 0.8)
    ax.axis("off")
    ax.set_title(f"head {layer + 1}-{head + 1}, {relation} ({DIRECTIONS[direction]})", fontsize=9)
    return save_figure(fig, stem)


def _pick_examples(rows: list[dict], dev_examples: list[tuple[int, Example]], get_maps,
                   fig_dir: Path, collapse_subtypes: bool, max_figures: int = 4):
    """Figure 5 examples: for the relations whose best head beats its offset baseline most,
    the first dev sentence of 6-25 words where that head gets every such arc right."""
    from attnscope.analyses.syntax import relation_label

    figs, best, maps = [], [], {}
    chosen = sorted((r for r in rows if r["relation"] != ALL and "/" not in r["head"]),
                    key=lambda r: -(r["accuracy"] - r["offset_accuracy"]))[:max_figures]
    for row in chosen:
        rel = row["relation"]
        d = DIRECTIONS.index(row["direction"])
        layer, head = row["layer"], row["head_index"]
        cands = [(i, ex) for i, ex in dev_examples
                 if 6 <= len(ex.words) <= 25 and rel in [relation_label(x, collapse_subtypes) for x in ex.relns]][:20]
        for m in get_maps([i for i, _ in cands]):
            s = score_map(m, collapse_subtypes=collapse_subtypes)
            if s is None:
                continue
            mask = np.array([r == rel for r in s.relations])
            if mask.any() and s.correct[layer, head, d][mask].all():
                stem = f"figure5_syntax_{_slug(rel)}"
                paths = example_figure(m, layer, head, d, rel, fig_dir / stem, collapse_subtypes)
                figs.append(FigureArtifact(stem, f"Head {row['head']} on a dev sentence: attention "
                                                 f"lines (blue) and the gold '{rel}' arcs (red, "
                                                 f"{row['direction']}).", paths))
                best.append((layer, head, m.index, f"{rel}: {row['head']} {row['direction']}"))
                maps[m.index] = m
                break
    return figs, best, maps


# -- Table 3 --------------------------------------------------------------------------------
def _table3_row(name: str, run, n_boot: int, seed: int) -> dict:
    lo, hi = binary_bootstrap_ci(run.correct, run.total, n_boot=n_boot, seed=seed)
    return {"model": name, "uas": 100.0 * run.uas, "ci_low": 100.0 * lo, "ci_high": 100.0 * hi,
            "dependents": run.total, "best_epoch": run.best_epoch, "epochs": run.epochs_run,
            "seconds_per_epoch": run.seconds_per_epoch if run.epochs_run else None,
            "parameters": run.parameters, "paper_bert_base": PAPER_TABLE3.get(name)}


def run_probes(train_store, dev_store, *, glove=None, random_train=None, random_dev=None,
               config=None, root: str = "special", n_boot: int = 1000,
               progress: Progress = None, cache_bytes: int = 1 << 30) -> tuple[list[dict], dict]:
    """Train every Table 3 probe; returns the table rows and details (histories, sources)."""
    import torch

    from attnscope.analyses.probes.features import SentenceSource
    from attnscope.analyses.probes.models import (
        AttentionGloveProbe,
        AttentionProbe,
        DistanceGloveMLP,
    )
    from attnscope.analyses.probes.training import TrainConfig, right_branching_uas, train_probes
    from attnscope.data.glove import load_glove

    config = config or TrainConfig()
    table = load_glove(glove)
    K = train_store.num_layers * train_store.num_heads
    train = SentenceSource(train_store.batches, table, root=root, cache_bytes=cache_bytes)
    dev = SentenceSource(dev_store.batches, table, root=root, cache_bytes=cache_bytes)
    torch.manual_seed(config.seed)
    modules = {"attn": AttentionProbe(K), "attn+glove": AttentionGloveProbe(K, table.vectors),
               "distance+glove": DistanceGloveMLP(table.vectors)}
    runs = train_probes(modules, train, dev, config, progress)
    runs["right-branching"] = right_branching_uas(dev)
    details = {"glove": table.source, "glove_dim": table.dim, "train_sentences": train.num_sentences,
               "dev_sentences": dev.num_sentences, "skipped_train": train.skipped,
               "skipped_dev": dev.skipped}
    if random_train is not None and random_dev is not None:
        rtrain = SentenceSource(random_train.batches, table, root=root, cache_bytes=cache_bytes)
        rdev = SentenceSource(random_dev.batches, table, root=root, cache_bytes=cache_bytes)
        torch.manual_seed(config.seed)
        rmod = {"random-init attn+glove": AttentionGloveProbe(K, table.vectors)}
        runs.update(train_probes(rmod, rtrain, rdev, config, progress))
    order = ["right-branching", "distance+glove", "random-init attn+glove", "attn", "attn+glove"]
    rows = [_table3_row(n, runs[n], n_boot, config.seed + i) for i, n in enumerate(order) if n in runs]
    details["history"] = {n: r.history for n, r in runs.items()}
    return rows, details


# -- the family entry point -----------------------------------------------------------------
def _checked_split(split, name: str, model):
    """A store checked for word level, or examples (as a list) checked for trees and a model."""
    if _is_store(split):
        _check_store(split, name)
        return split
    split = list(split)
    _check_examples(split, name)
    if model is None:
        raise AttnscopeError(f"{name} examples need a model to extract their attention")
    return split


def run_syntax(dev, model, out_dir: Path, *, train=None, glove: str | Path | None = None,
               max_seq_len: int = 128, batch_size: int = 16, seed: int = 0,
               progress: Progress = None, save_maps: Path | None = None, min_count: int = 100,
               collapse_subtypes: bool = False, n_boot: int = 1000, probe_config=None,
               root: str = "special", random_baseline: bool = True) -> Section:
    """Table 1 always; Table 3 (probes) when ``train`` is given.

    ``dev`` / ``train``: lists of :class:`Example` with trees, or word-level stores. ``model``
    (a :class:`LoadedModel`) is needed to extract lists and for the random-init baseline;
    with stores it may be None (the baseline is then skipped, with a note). ``save_maps``: a
    folder that keeps the extracted stores (``dev``, ``train``, ``dev-random-init``,
    ``train-random-init``); otherwise they live in a temporary folder that is removed.

    Table 1 has two selection modes: ``paper`` (heads and offsets chosen on the scored dev
    data itself) and ``held-out`` (chosen on ``train`` when given, else cross-fitted on the
    two halves of dev by example index parity).
    """
    from attnscope.analyses.probes.training import TrainConfig

    out_dir = Path(out_dir)
    tables_dir, fig_dir, res_dir = out_dir / "tables", out_dir / "figures", out_dir / "results"
    for d in (tables_dir, fig_dir, res_dir):
        d.mkdir(parents=True, exist_ok=True)
    options = _extract_options(max_seq_len, batch_size, seed)
    probes = train is not None
    dev = _checked_split(dev, "dev", model)
    if probes:
        train = _checked_split(train, "train", model)
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="attnscope-syntax-", dir=out_dir) as tmp:
        maps_root = Path(save_maps) if save_maps is not None else Path(tmp)
        # -- dev maps: a store when they are read more than once ------------------------------
        if _is_store(dev):
            dev_store = dev
        elif probes or save_maps is not None:
            dev_store = _to_store(dev, model, maps_root / "dev", options=options, dtype="float32",
                                  progress=progress, step="extract dev")
        else:
            dev_store = None
        heads_dev = DependencyHeads(collapse_subtypes=collapse_subtypes)
        batches: Iterable[AttentionBatch] = (dev_store.batches() if dev_store is not None
                                             else _stream(dev, model, options, progress, "extract dev"))
        done = 0
        for batch in batches:
            heads_dev.update(batch)
            done += len(batch)
            _notify(progress, "score heads (dev)", done, None)
        if _is_store(dev):
            skipped = len(dev.manifest.get("summary", {}).get("skipped", []))
        else:
            skipped = len(dev) - heads_dev.examples
        if skipped:
            notes.append(f"{skipped} dev sentences longer than {max_seq_len} tokens were skipped "
                         "(raise max_seq_len to keep them).")
        heads_train = None
        train_store = None
        if probes:
            train_store = train if _is_store(train) else _to_store(
                train, model, maps_root / "train", options=options, dtype="float16",
                progress=progress, step="extract train")
            heads_train = DependencyHeads(collapse_subtypes=collapse_subtypes)
            for batch in train_store.batches():
                heads_train.update(batch)
        # -- Table 1 ------------------------------------------------------------------------
        score = heads_dev.counts()
        rows_paper = table1_rows(score, None, min_count=min_count, n_boot=n_boot, seed=seed)
        if heads_train is not None:
            rows_held = table1_rows(score, heads_train.counts(), min_count=min_count, n_boot=n_boot,
                                    seed=seed)
            held_how = "heads and offsets chosen on the train split, scored on dev"
        else:
            folds = [(heads_dev.counts((1,)), heads_dev.counts((0,))),
                     (heads_dev.counts((0,)), heads_dev.counts((1,)))]
            rows_held = table1_rows(score, folds, min_count=min_count, n_boot=n_boot, seed=seed)
            held_how = ("cross-fitted on dev: chosen on the odd-indexed examples and scored on the "
                        "even ones, and vice versa, pooled")
        for r in rows_paper:
            r["selection"] = "paper"
        for r in rows_held:
            r["selection"] = "held-out"
        cap1 = ("Table 1: best attention head per dependency relation (1-indexed layer-head) and "
                "the best fixed-offset baseline, accuracy % with 95% bootstrap intervals; ")
        t1 = TableArtifact("table1_syntax", cap1 + "heads chosen on the scored data (as the paper).",
                           rows_paper, TABLE1_COLUMNS)
        t1.paths = _write(rows_paper, tables_dir / t1.name, t1.caption)
        t1h = TableArtifact("table1_syntax_heldout", cap1 + held_how + ".", rows_held, TABLE1_COLUMNS)
        t1h.paths = _write(rows_held, tables_dir / t1h.name, t1h.caption)
        # -- figures --------------------------------------------------------------------------
        rels = [r["relation"] for r in rows_paper]
        figures = heatmap_figures(score, rels, fig_dir)
        if dev_store is not None:
            dev_examples = [(m_index, ex) for m_index, ex in _indexed_store_examples(dev_store)]

            def get_maps(idx):
                return [dev_store.by_index(i) for i in idx]
        else:
            dev_examples = list(enumerate(dev))

            def get_maps(idx):
                if not idx:
                    return []
                from attnscope.extract.runner import extract

                maps = [m for b in extract([dev[i] for i in idx], model, options=options) for m in b]
                return [replace(m, index=idx[m.index]) for m in sorted(maps, key=lambda m: m.index)]
        ex_figs, best_heads, maps = _pick_examples(rows_paper, dev_examples, get_maps, fig_dir,
                                                   collapse_subtypes)
        figures = ex_figs + figures
        # -- Table 3 --------------------------------------------------------------------------
        tables = [t1, t1h]
        probe_details: dict = {}
        rows3: list[dict] = []
        if probes:
            config = probe_config or TrainConfig(seed=seed)
            rtrain = rdev = None
            if random_baseline and model is not None:
                from attnscope.analyses.probes.random_init import random_init_model

                rlm = random_init_model(model, seed)
                rtrain = _to_store(train if not _is_store(train) else _store_examples(train), rlm,
                                   maps_root / "train-random-init", options=options, dtype="float16",
                                   progress=progress, step="extract train (random init)")
                rdev = _to_store(dev if not _is_store(dev) else _store_examples(dev), rlm,
                                 maps_root / "dev-random-init", options=options, dtype="float16",
                                 progress=progress, step="extract dev (random init)")
            elif random_baseline:
                notes.append("random-init baseline skipped: it needs the model, and only stores were given")
            rows3, probe_details = run_probes(train_store, dev_store, glove=glove, random_train=rtrain,
                                              random_dev=rdev, config=config, root=root,
                                              n_boot=n_boot, progress=progress)
            probe_details["config"] = config.as_dict()
            probe_details["root"] = root
            cap3 = ("Table 3: UAS (%, punctuation excluded) of probing classifiers on the dev split "
                    "(early stopping on the same split), 95% bootstrap intervals over dependents.")
            t3 = TableArtifact("table3_probes", cap3, rows3, TABLE3_COLUMNS + ["paper_bert_base"])
            t3.paths = _write(rows3, tables_dir / t3.name, t3.caption, digits=1)
            tables.append(t3)
    # -- results and section ----------------------------------------------------------------
    res = heads_dev.finalize()
    result = Result(
        analysis="syntax",
        params={"min_count": min_count, "collapse_subtypes": collapse_subtypes, "n_boot": n_boot,
                "seed": seed, "max_seq_len": max_seq_len, "root": root, **res.params},
        tables={"table1": rows_paper, "table1_heldout": rows_held, "table3": rows3},
        arrays={"accuracy": res.arrays["accuracy"], "offset_accuracy": res.arrays["offset_accuracy"],
                "total": res.arrays["total"]},
        summary=[], meta={**res.meta, "probes": probe_details, "notes": notes,
                          "heldout_selection": held_how,
                          "heads": "layer-head names are 1-indexed; layer/head_index columns 0-indexed"})
    section = Section(key="syntax", title="Syntax: heads and dependency relations")
    section.tables = tables
    section.figures = figures
    section.best_heads = best_heads
    section.maps = maps
    section.findings = _findings(rows_paper, rows_held, rows3) + notes
    result.summary = list(section.findings)
    result.save(res_dir / "syntax.json")
    section.methods = METHODS
    section.paper = _paper_rows(rows_paper, rows3)
    return section


def _indexed_store_examples(store) -> list[tuple[int, Example]]:
    return [(m.index, m.example) for m in store]


def _write(rows, stem: Path, caption: str, digits: int = 1) -> list[Path]:
    from attnscope.report.tables import write_table

    cols = TABLE3_COLUMNS + ["paper_bert_base"] if "uas" in (rows[0] if rows else {}) else TABLE1_COLUMNS
    return write_table(rows, stem, columns=cols, caption=caption, digits=digits)


def _findings(rows_paper: list[dict], rows_held: list[dict], rows3: list[dict]) -> list[str]:
    out = []
    beat = [r for r in rows_paper if r["relation"] != ALL and r["ci_low"] > r["offset_ci_high"]]
    if rows_paper:
        out.append(f"{len(beat)} of {len([r for r in rows_paper if r['relation'] != ALL])} relations "
                   "have a head whose accuracy interval lies above the best offset's.")
    top = sorted((r for r in rows_paper if r["relation"] != ALL), key=lambda r: -r["accuracy"])[:3]
    for r in top:
        out.append(f"'{r['relation']}': head {r['head']} ({r['direction']}) {r['accuracy']:.1f}% vs "
                   f"offset {r['offset']} {r['offset_accuracy']:.1f}% (n={r['count']}).")
    held = {r["relation"]: r for r in rows_held}
    drops = [(r["accuracy"] - held[r["relation"]]["accuracy"], r["relation"]) for r in rows_paper
             if r["relation"] in held]
    if drops:
        worst = max(drops)
        out.append(f"Choosing heads on held-out data costs at most {worst[0]:.1f} points "
                   f"('{worst[1]}').")
    for r in rows3:
        out.append(f"Probe '{r['model']}': UAS {r['uas']:.1f}% [{r['ci_low']:.1f}, {r['ci_high']:.1f}].")
    return out


def _paper_rows(rows_paper: list[dict], rows3: list[dict]) -> list[dict]:
    by_rel = {r["relation"]: r for r in rows_paper}
    out = []
    for paper_rel, ours_rel, head_acc, off_acc in PAPER_TABLE1:
        r = by_rel.get(ours_rel)
        if r is None:
            continue
        label = paper_rel if paper_rel == ours_rel else f"{paper_rel} (ours: {ours_rel})"
        out.append({"what": f"Table 1 best head, {label}", "paper": head_acc,
                    "ours": round(r["accuracy"], 1)})
        out.append({"what": f"Table 1 best offset, {label}", "paper": off_acc,
                    "ours": round(r["offset_accuracy"], 1)})
    for r in rows3:
        out.append({"what": f"Table 3 UAS, {r['model']}", "paper": PAPER_TABLE3[r["model"]],
                    "ours": round(r["uas"], 1)})
    return out


METHODS = [
    "Per-head probing (paper 4.2): for dependent d with gold head g, head (l, h) predicts "
    "argmax_j A[l,h,d,j] (dependent -> head) or argmax_i A[l,h,i,d] (head -> dependent), over "
    "words only (special tokens and d itself excluded); ties go to the lowest word index. "
    "Accuracy = #correct / #dependents per relation; root words (head 0) are left out.",
    "Fixed-offset baseline: predict d + k for k in {-3..3} \\ {0}; the best k per relation.",
    "Word-level maps (paper 4.1): attention to a split word = sum over its pieces, from it = mean.",
    "Selection: 'paper' chooses the best head and offset on the scored data; 'held-out' chooses "
    "them on other data (train, or the other half of dev) and scores on dev.",
    "95% intervals: percentile bootstrap over dependents (1000 resamples, seeded), drawn as "
    "Binomial(n, k/n)/n, which is the bootstrap distribution of a mean of 0/1 values.",
    "Probes (paper 5): p(i|j) = softmax_i s(i,j), attention-only s = sum_k w_k a_k[i,j] + "
    "u_k a_k[j,i]; attention+GloVe: w_k, u_k = linear functions of (v_i ; v_j). ROOT = the "
    "special tokens (to ROOT: sum, from ROOT: mean). Trained with Adam, minibatches of "
    "sentences, early stopping on dev UAS; UAS excludes punctuation.",
]
