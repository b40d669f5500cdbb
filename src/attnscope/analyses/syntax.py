"""Every head against every dependency relation (paper section 4.2, Table 1).

For a dependent word ``d`` with gold head ``g`` and one attention head ``(layer, head)``:

- **dependent -> head**: the prediction is the word ``d`` attends to most,
  ``argmax_j attn[layer, head, d, j]``;
- **head -> dependent**: the prediction is the word that attends most to ``d``,
  ``argmax_i attn[layer, head, i, d]`` (the transposed map).

Both ignore the special tokens (only word units are candidates) and the word itself.
**No information, no prediction**: a row whose highest candidate weight is 0 (float16 stores
round the rows of heads that attend almost only to [CLS]/[SEP] to exactly 0 on every word)
or is shared by several candidates predicts nothing and counts as wrong
(:func:`attnscope.analyses.units.predict`; ``ties="lowest"`` gives the paper code's argmax,
which credits the lowest word). Words whose head is the root (head 0) are left out: no word
can be a correct prediction for them (the paper's notebook counts them, always wrong, in its
"all" row). A word without a unit (cut off, or turned into zero tokens) is neither a
candidate nor scored (:func:`attnscope.analyses.units.word_units`).

The **fixed-offset baseline** predicts ``d + k`` for ``k`` in ``offsets`` (default -3..+3
without 0); the best ``k`` per relation is chosen like the best head. A prediction outside
the sentence is no prediction (wrong); the paper's code clips it into the sentence.

Possessives (paper section 4.2): with ``possessive_rule`` (default on, as the paper's
evaluation does), a ``poss`` / ``nmod:poss`` dependent directly followed by ``'s`` (or ``'``)
is scored with the prediction of that ``'s`` word, because BERT attends from the clitic.

Counts are accumulated per relation and per fold (fold = example index mod 2, used by the
held-out selection), so the result never depends on batching, sharding or merge order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnscope.analyses.base import MapsAnalysis, Result, register
from attnscope.analyses.units import TIE_RULES, predict, word_units
from attnscope.data.records import HeadId
from attnscope.maps import AttentionBatch, AttentionMap

DEFAULT_OFFSETS = (-3, -2, -1, 1, 2, 3)
DIRECTIONS = ("dep->head", "head->dep")
POSSESSIVE_RELATIONS = ("poss", "nmod:poss")
POSSESSIVE_CLITICS = ("'s", "'", "s'", "\u2019s", "\u2019")
ALL = "all"
NUM_FOLDS = 2


def relation_label(reln: str, collapse_subtypes: bool) -> str:
    """The relation as counted: ``nmod:poss`` stays, or becomes ``nmod`` when collapsing.

    >>> relation_label("nmod:poss", True), relation_label("nmod:poss", False)
    ('nmod', 'nmod:poss')
    """
    return reln.split(":", 1)[0] if collapse_subtypes else reln


@dataclass
class MapScores:
    """One sentence scored for every head: what :meth:`DependencyHeads.update` accumulates."""

    relations: list[str]  # [k] relation of each scored dependent
    dependents: np.ndarray  # [k] word index of each scored dependent
    gold: np.ndarray  # [k] 0-based gold head word
    correct: np.ndarray  # [L H 2 k] bool: head (layer, head) right in direction 0/1
    offset_correct: np.ndarray  # [K k] bool
    predictions: np.ndarray  # [L H 2 w] predicted head word of every word (before the possessive rule)


def score_map(m: AttentionMap, *, offsets=DEFAULT_OFFSETS, collapse_subtypes: bool = False,
              possessive_rule: bool = True, ties: str = "none") -> MapScores | None:
    """Score every head of one word-level map against the example's tree (None if it has none).

    Vectorised over layers, heads and words: two predictions over a ``[L H w w]`` array. A
    word without a unit (:func:`~attnscope.analyses.units.word_units`: cut off by truncation,
    or turned into zero tokens) is neither a candidate nor scored, and neither is a
    dependent whose head has no unit. A row without information (all candidates 0, or a tie
    for the top) predicts nothing and is wrong (``ties="lowest"``: the paper code's argmax).
    """
    ex = m.example
    if ex.heads is None or ex.relns is None:
        return None
    units = word_units(m, len(ex.heads))
    idx = np.nonzero(units.present)[0]  # [w] word index of each present word
    w = len(idx)
    if w == 0:
        return None
    pos = units.positions[idx]  # [w] their units
    sub = m.attn[:, :, pos[:, None], pos[None, :]]  # [L H w w] a copy
    diag = np.arange(w)
    cand = diag[:, None] != diag[None, :]  # never predict the word itself
    # [L H 2 w] in present-word order; -1 = no prediction
    local = np.stack([predict(sub, cand, axis=-1, ties=ties),
                      predict(sub, cand, axis=-2, ties=ties)], axis=2)
    pred = np.where(local >= 0, idx[np.maximum(local, 0)], -1)  # [L H 2 w] word indices
    heads = np.asarray(ex.heads, dtype=np.int64)
    nw = len(heads)
    gold_all = heads - 1  # [nw] 0-based, -1 = root
    slot = np.full(nw, -1, np.int64)  # present-word slot of each word
    slot[idx] = diag
    source = idx.copy()  # whose prediction scores each present word (the possessive rule redirects)
    words = ex.all_words or []
    if possessive_rule:
        for k, d in enumerate(idx):
            if (d + 1 < nw and units.present[d + 1] and ex.relns[d] in POSSESSIVE_RELATIONS
                    and words[d + 1].lower() in POSSESSIVE_CLITICS):
                source[k] = d + 1
    g_all = gold_all[idx]
    head_ok = (g_all >= 0) & units.present[np.clip(g_all, 0, nw - 1)]
    keep_slots = np.nonzero(head_ok)[0]  # [k] slots: not root, head has a unit
    keep = idx[keep_slots]  # [k] word indices of the scored dependents
    g = g_all[keep_slots]
    correct = pred[..., slot[source[keep_slots]]] == g  # [L H 2 k]
    offs = np.asarray(offsets, dtype=np.int64)
    # an offset prediction outside the sentence is no prediction (wrong); no clipping
    offset_correct = (source[keep_slots][None, :] + offs[:, None]) == g[None, :]  # [K k]
    rels = [relation_label(ex.relns[d], collapse_subtypes) for d in keep]
    full = np.full(pred.shape[:-1] + (nw,), -1, np.int64)
    full[..., idx] = pred
    return MapScores(rels, keep, g, correct, offset_correct, full)


@register
class DependencyHeads(MapsAnalysis):
    """Accuracy of every head, both directions, for every relation, plus offset baselines.

    State (all integer counts, ``F`` = 2 folds by example index parity, ``R`` relations in
    order of first appearance, ``K`` offsets): ``correct [F R L H 2]``,
    ``offset_correct [F R K]``, ``total [F R]``. ``finalize`` divides.
    """

    name = "dependency-heads"
    requires = frozenset({"word_level", "dependencies"})

    def __init__(self, *, collapse_subtypes: bool = False, offsets=DEFAULT_OFFSETS,
                 possessive_rule: bool = True, ties: str = "none"):
        if ties not in TIE_RULES:
            raise ValueError(f"ties must be one of {TIE_RULES}, not {ties!r}")
        self.ties = ties
        self.collapse_subtypes = bool(collapse_subtypes)
        self.offsets = tuple(int(k) for k in offsets)
        if 0 in self.offsets:
            raise ValueError("offset 0 would predict the word itself")
        self.possessive_rule = bool(possessive_rule)
        self.relations: list[str] = []
        self._rel_index: dict[str, int] = {}
        self.shape: tuple[int, int] | None = None  # (L, H)
        self.correct = np.zeros((NUM_FOLDS, 0, 0, 0, 2), np.int64)
        self.offset_correct = np.zeros((NUM_FOLDS, 0, len(self.offsets)), np.int64)
        self.total = np.zeros((NUM_FOLDS, 0), np.int64)
        self.examples = 0
        self.skipped_examples = 0  # no tree
        self.skipped_words = 0  # without a unit: cut off by truncation, or zero tokens
        self.empty_words = 0  # of which: zero tokens inside the sentence

    def params(self) -> dict[str, Any]:
        return {"collapse_subtypes": self.collapse_subtypes, "offsets": list(self.offsets),
                "possessive_rule": self.possessive_rule, "ties": self.ties}

    # -- accumulation ---------------------------------------------------------------------
    def _init_shape(self, L: int, H: int) -> None:
        if self.shape is None:
            self.shape = (L, H)
            self.correct = np.zeros((NUM_FOLDS, len(self.relations), L, H, 2), np.int64)
        elif self.shape != (L, H):
            raise ValueError(f"maps with {L}x{H} heads after maps with {self.shape[0]}x{self.shape[1]}")

    def _rel_ids(self, rels: list[str]) -> np.ndarray:
        new = [r for r in dict.fromkeys(rels) if r not in self._rel_index]
        if new:
            for r in new:
                self._rel_index[r] = len(self.relations)
                self.relations.append(r)
            grow = len(new)
            L, H = self.shape or (0, 0)
            self.correct = np.concatenate(
                [self.correct, np.zeros((NUM_FOLDS, grow, L, H, 2), np.int64)], axis=1)
            self.offset_correct = np.concatenate(
                [self.offset_correct, np.zeros((NUM_FOLDS, grow, len(self.offsets)), np.int64)], axis=1)
            self.total = np.concatenate([self.total, np.zeros((NUM_FOLDS, grow), np.int64)], axis=1)
        return np.fromiter((self._rel_index[r] for r in rels), dtype=np.int64, count=len(rels))

    def update(self, batch: AttentionBatch) -> None:
        per_fold: dict[int, list[MapScores]] = {}
        for m in batch:
            if m.level != "word":
                raise ValueError("dependency-heads needs word-level maps (extract with word_level=True)")
            self.examples += 1
            s = score_map(m, offsets=self.offsets, collapse_subtypes=self.collapse_subtypes,
                          possessive_rule=self.possessive_rule, ties=self.ties)
            if s is None:
                self.skipped_examples += 1
                continue
            self._init_shape(m.attn.shape[0], m.attn.shape[1])
            units = word_units(m, len(m.example.heads))
            self.skipped_words += int(np.sum(~units.present))
            self.empty_words += int(np.sum(units.empty))
            per_fold.setdefault(m.index % NUM_FOLDS, []).append(s)
        for fold, scores in per_fold.items():
            rels = [r for s in scores for r in s.relations]
            if not rels:
                continue
            ids = self._rel_ids(rels)  # [N]
            R = len(self.relations)
            # group the dependents by relation and sum each group (no BLAS: exact integers)
            order = np.argsort(ids, kind="stable")
            uniq, starts = np.unique(ids[order], return_index=True)
            correct = np.concatenate([s.correct for s in scores], axis=-1)  # [L H 2 N]
            self.correct[fold][uniq] += np.moveaxis(
                np.add.reduceat(correct[..., order].astype(np.int64), starts, axis=-1), -1, 0)
            offc = np.concatenate([s.offset_correct for s in scores], axis=-1)  # [K N]
            self.offset_correct[fold][uniq] += np.add.reduceat(
                offc[:, order].astype(np.int64), starts, axis=-1).T
            self.total[fold] += np.bincount(ids, minlength=R)

    def merge(self, other: "DependencyHeads") -> "DependencyHeads":
        self._check_mergeable(other)
        if other.shape is None:
            self.examples += other.examples
            self.skipped_examples += other.skipped_examples
            return self
        self._init_shape(*other.shape)
        ids = self._rel_ids(other.relations) if other.relations else np.zeros(0, np.int64)
        self.correct[:, ids] += other.correct
        self.offset_correct[:, ids] += other.offset_correct
        self.total[:, ids] += other.total
        self.examples += other.examples
        self.skipped_examples += other.skipped_examples
        self.skipped_words += other.skipped_words
        self.empty_words += other.empty_words
        return self

    # -- results --------------------------------------------------------------------------
    def counts(self, folds: tuple[int, ...] = (0, 1)) -> "HeadCounts":
        """Counts over the given folds, relations in sorted order (so the result, and every
        seed derived from a relation's position, does not depend on the order the data came
        in), with an ``all`` relation appended."""
        f = list(folds)
        if self.shape is None:
            L = H = 0
        else:
            L, H = self.shape
        order = sorted(range(len(self.relations)), key=self.relations.__getitem__)
        correct = self.correct[f].sum(axis=0)[order]  # [R L H 2]
        offc = self.offset_correct[f].sum(axis=0)[order]  # [R K]
        total = self.total[f].sum(axis=0)[order]  # [R]
        correct = np.concatenate([correct.reshape(len(self.relations), L, H, 2),
                                  correct.sum(axis=0).reshape(1, L, H, 2)])
        offc = np.concatenate([offc, offc.sum(axis=0, keepdims=True)])
        total = np.concatenate([total, [total.sum()]])
        return HeadCounts([self.relations[i] for i in order] + [ALL], correct, offc, total, self.offsets)

    def finalize(self) -> Result:
        c = self.counts()
        acc = c.accuracy()  # [R L H 2]
        rows = [{"relation": r, "count": int(n)} for r, n in zip(c.relations, c.total)]
        return Result(
            analysis=self.name, params=self.params(),
            tables={"relations": rows},
            arrays={"accuracy": acc, "correct": c.correct, "total": c.total,
                    "offset_correct": c.offset_correct, "offset_accuracy": c.offset_accuracy()},
            summary=[f"{len(self.relations)} relations over {int(c.total[-1])} dependents "
                     f"in {self.examples - self.skipped_examples} sentences"] + (
                [f"{self.empty_words} words became zero tokens (e.g. a zero-width space) and were "
                 "skipped with the dependents that need them"] if self.empty_words else []),
            meta={"relations": c.relations, "offsets": list(self.offsets),
                  "directions": list(DIRECTIONS), "examples": self.examples,
                  "skipped_examples": self.skipped_examples, "skipped_words": self.skipped_words,
                  "empty_words": self.empty_words,
                  "heads": "arrays are [relation, layer, head, direction], 0-indexed",
                  "ties": ("a row whose top value is 0 or shared predicts nothing (wrong)"
                           if self.ties == "none" else "lowest word index (the paper code's argmax)")
                          + "; best head: lowest (layer, head, direction); best offset: lowest offset"},
        )


@dataclass
class HeadCounts:
    """Correct counts per relation (``all`` last): ``correct [R L H 2]``, ``offset_correct [R K]``."""

    relations: list[str]
    correct: np.ndarray
    offset_correct: np.ndarray
    total: np.ndarray  # [R]
    offsets: tuple[int, ...]

    def accuracy(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.correct / np.maximum(self.total, 1)[:, None, None, None]

    def offset_accuracy(self) -> np.ndarray:
        return self.offset_correct / np.maximum(self.total, 1)[:, None]

    def get(self, relation: str) -> int | None:
        return self.relations.index(relation) if relation in self.relations else None

    def best_head(self, r: int) -> tuple[int, int, int]:
        """``(layer, head, direction)`` with the most correct; ties: the lowest of that order."""
        flat = int(np.argmax(self.correct[r].reshape(-1)))
        L, H = self.correct.shape[1:3]
        return flat // (H * 2), (flat // 2) % H, flat % 2

    def best_offset(self, r: int) -> int:
        """Index into ``offsets`` of the best offset; ties: the lowest offset."""
        order = np.argsort(self.offsets, kind="stable")
        return int(order[np.argmax(self.offset_correct[r][order])])


def binary_bootstrap_ci(k: int, n: int, *, n_boot: int = 1000, level: float = 0.95,
                        seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval for the mean of ``n`` 0/1 values of which ``k`` are 1.

    Resampling ``n`` values with replacement from such data gives a number of ones that is
    ``Binomial(n, k / n)``, so drawing that directly is the same bootstrap distribution as
    :func:`attnscope.analyses.stats.bootstrap_ci` without an ``[n_boot, n]`` index array
    (which would be hundreds of MB for the "all" row of a treebank).

    >>> binary_bootstrap_ci(10, 10)
    (1.0, 1.0)
    """
    if n == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = rng.binomial(n, k / n, size=n_boot) / n
    alpha = (1.0 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(lo), float(hi)


def fmt_offset(k: int) -> str:
    return f"{k:+d}"


def table1_rows(score: HeadCounts, select: HeadCounts | list[tuple[HeadCounts, HeadCounts]] | None = None,
                *, min_count: int = 100, n_boot: int = 1000, seed: int = 0,
                level: float = 0.95) -> list[dict]:
    """Table 1: per relation the best head, its direction and accuracy, the best offset and its
    accuracy, each with a bootstrap interval. Accuracies are percentages.

    ``select=None``: heads and offsets chosen on ``score`` itself (as the paper). A
    :class:`HeadCounts`: chosen there (e.g. the train split) and scored on ``score``. A list
    of ``(select, score)`` fold pairs: chosen on each fold's ``select`` and scored on its
    ``score``, pooled (cross-fitting; ``score`` then only gives the relations and counts).
    Relations with fewer than ``min_count`` dependents in ``score`` are left out; ``all`` is
    always last.
    """
    rows = []
    for r, rel in enumerate(score.relations):
        n = int(score.total[r])
        if rel != ALL and n < min_count or n == 0:
            continue
        if select is None:
            pairs = [(score, score)]
        elif isinstance(select, HeadCounts):
            pairs = [(select, score)]
        else:
            pairs = list(select)
        k_head = k_off = n_tot = 0
        heads, offs = [], []
        for sel, sc in pairs:
            rs, rt = sel.get(rel), sc.get(rel)
            if rt is None or sc.total[rt] == 0:
                continue
            if rs is None or sel.total[rs] == 0:
                heads.append(None)
                continue
            layer, head, d = sel.best_head(rs)
            o = sel.best_offset(rs)
            k_head += int(sc.correct[rt, layer, head, d])
            k_off += int(sc.offset_correct[rt, o])
            n_tot += int(sc.total[rt])
            heads.append((layer, head, d))
            offs.append(sel.offsets[o])
        if not n_tot or None in heads:
            continue
        # seeds differ per row and column but are fixed: the table is reproducible
        lo, hi = binary_bootstrap_ci(k_head, n_tot, n_boot=n_boot, level=level, seed=seed + 2 * r)
        olo, ohi = binary_bootstrap_ci(k_off, n_tot, n_boot=n_boot, level=level, seed=seed + 2 * r + 1)
        layer, head, d = heads[0]
        same = all(h == heads[0] for h in heads) and all(o == offs[0] for o in offs)
        rows.append({
            "relation": rel, "count": n_tot,
            "head": f"{HeadId(layer, head)}" if same else "/".join(f"{HeadId(h[0], h[1])}" for h in heads),
            "layer": layer, "head_index": head, "direction": DIRECTIONS[d],
            "accuracy": 100.0 * k_head / n_tot, "ci_low": 100.0 * lo, "ci_high": 100.0 * hi,
            "offset": fmt_offset(offs[0]) if same else "/".join(fmt_offset(o) for o in offs),
            "offset_accuracy": 100.0 * k_off / n_tot, "offset_ci_low": 100.0 * olo,
            "offset_ci_high": 100.0 * ohi,
        })
    all_rows = [x for x in rows if x["relation"] == ALL]
    other = sorted((x for x in rows if x["relation"] != ALL), key=lambda x: (-x["count"], x["relation"]))
    return other + all_rows


# -- what the family hands its report ------------------------------------------------------------
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


@dataclass
class SyntaxTables:
    """Table 1 in both selection modes, from the heads scored on dev (and train): ``counts``, the
    dev counts (the heatmaps); ``paper`` / ``heldout``, the rows (heads chosen on the scored data
    itself, as the paper, or held out: ``heldout_how``); ``min_count`` and ``min_how``, the
    smallest relation shown and why; ``result``, the finalized dev heads; ``empty_words``, dev
    words that became zero tokens."""

    counts: HeadCounts
    paper: list[dict]
    heldout: list[dict]
    heldout_how: str
    min_count: int
    min_how: str
    result: Result
    empty_words: int


def syntax_tables(heads_dev: DependencyHeads, heads_train: DependencyHeads | None, *,
                  min_count: int | None, n_boot: int, seed: int) -> SyntaxTables:
    """Table 1 of the heads scored on dev: chosen on dev itself, and held out (chosen on
    ``heads_train`` when given, else cross-fitted on the two halves of dev by example index
    parity, pooled), each with seeded bootstrap intervals."""
    score = heads_dev.counts()
    min_count, min_how = table1_min_count(min_count, int(score.total[-1]))
    paper = table1_rows(score, None, min_count=min_count, n_boot=n_boot, seed=seed)
    if heads_train is not None:
        held = table1_rows(score, heads_train.counts(), min_count=min_count, n_boot=n_boot, seed=seed)
        how = "heads and offsets chosen on the train split, scored on dev"
    else:
        folds = [(heads_dev.counts((1,)), heads_dev.counts((0,))),
                 (heads_dev.counts((0,)), heads_dev.counts((1,)))]
        held = table1_rows(score, folds, min_count=min_count, n_boot=n_boot, seed=seed)
        how = ("cross-fitted on dev: chosen on the odd-indexed examples and scored on the "
               "even ones, and vice versa, pooled")
    for r in paper:
        r["selection"] = "paper"
    for r in held:
        r["selection"] = "held-out"
    return SyntaxTables(score, paper, held, how, min_count, min_how, heads_dev.finalize(),
                        heads_dev.empty_words)


def table3_row(name: str, run, n_boot: int, seed: int) -> dict:
    """Table 3's row of one probe run: UAS (%) with its seeded bootstrap interval over dependents."""
    lo, hi = binary_bootstrap_ci(run.correct, run.total, n_boot=n_boot, seed=seed)
    return {"model": name, "uas": 100.0 * run.uas, "ci_low": 100.0 * lo, "ci_high": 100.0 * hi,
            "dependents": run.total, "best_epoch": run.best_epoch, "epochs": run.epochs_run,
            "seconds_per_epoch": run.seconds_per_epoch if run.epochs_run else None,
            "parameters": run.parameters}


def figure5_picks(rows: list[dict], dev_examples: list, maps_of, *, collapse_subtypes: bool,
                  ties: str = "none", most: int = 4) -> list[tuple[dict, int, AttentionMap]]:
    """Figure 5's examples: for the (at most ``most``) relations whose best head beats its offset
    baseline most, the first dev sentence of 6-25 words (of its first 20 with the relation) where
    that head gets every such arc right: ``(row, direction, map)``. ``dev_examples``:
    ``(index, example)``; ``maps_of(indices)``: their word-level maps."""
    picks = []
    chosen = sorted((r for r in rows if r["relation"] != ALL and "/" not in r["head"]
                     and r["accuracy"] > r["offset_accuracy"]),
                    key=lambda r: -(r["accuracy"] - r["offset_accuracy"]))[:most]
    for row in chosen:
        rel = row["relation"]
        d = DIRECTIONS.index(row["direction"])
        layer, head = row["layer"], row["head_index"]
        cands = [(i, ex) for i, ex in dev_examples
                 if 6 <= len(ex.words) <= 25 and rel in [relation_label(x, collapse_subtypes) for x in ex.relns]][:20]
        for m in maps_of([i for i, _ in cands]):
            s = score_map(m, collapse_subtypes=collapse_subtypes, ties=ties)
            if s is None:
                continue
            mask = np.array([r == rel for r in s.relations])
            if mask.any() and s.correct[layer, head, d][mask].all():
                picks.append((row, d, m))
                break
    return picks
