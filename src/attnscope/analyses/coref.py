"""Which heads find antecedents: per-head antecedent selection and three baselines.

Paper section 4.3 and Table 2. Documents are cut into windows that fit the model
(:func:`coref_windows`); each window becomes an ``Example(words=...)`` whose
``fields["coref"]`` lists the mentions with their head word in the window. The analysis
reads word-level maps of those examples.

For a scored mention with head word ``q`` (the query) and candidate positions ``C``, head
``(l, h)`` predicts::

    pred(l, h) = argmax_{c in C} attn[l, h, q, c]

and is correct when ``pred`` is the head word of a mention of the query's cluster that
precedes the query (an antecedent). Candidate sets (``candidates``):

- ``"mentions"`` (default): the head words of all mentions whose head word precedes ``q``
  in the window, the set the baselines choose from;
- ``"words"``: every word before ``q``;
- ``"all-words"``: every other word of the window, before or after ``q`` -- the paper's
  definition (section 4.1, "whichever other word receives the most attention"). It is always
  computed beside the configured set (result keys ending in ``_all_words``), because the
  choice changes the conclusion: a head that beats the baselines among mention heads can
  fall behind them among all words.

The query word itself is never a candidate. A row without information on the candidates
(every candidate weight 0, as float16 stores give for heads that attend only to the special
tokens, or a tie for the top weight) makes no prediction and counts as wrong; ``ties="lowest"``
takes the lowest candidate instead, as the paper code's argmax would. A word the tokenizer
turns into zero tokens has no unit (:func:`attnscope.analyses.units.word_units`): it is never
a candidate, a query headed by it predicts nothing (:func:`coref_windows` does not score such
mentions), and ``meta["empty_words"]`` counts such words summed over windows (overlapping
sliding windows count a word once per window).
The baselines predict a position from the same candidate set:

- ``nearest``: the nearest preceding mention;
- ``head-match``: the nearest preceding mention with the same head word (case-folded); none
  is counted wrong;
- ``rule-based``: four sieves in order (exact string match, head-word match, agreement in
  number, gender and person, any mention); the nearest mention that passes the earliest
  sieve that any mention passes.

A mention is scored when it has an antecedent in its window: a mention of its cluster whose
head word lies in the window before its own head word. Accuracy is ``correct / scored``,
overall and per mention type (pronoun, proper, nominal).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope.analyses.base import Analysis, MapsAnalysis, Result, register
from attnscope.analyses.stats import bootstrap_ci
from attnscope.analyses.units import TIE_RULES, predict, word_units
from attnscope.data.coref import MENTION_TYPES, Document, mention_attributes
from attnscope.data.records import Example, HeadId
from attnscope.errors import AttnscopeError
from attnscope.extract.encode import Encoder
from attnscope.maps import AttentionBatch, AttentionMap

BASELINES = ("nearest", "head-match", "rule-based")
BASELINE_LABELS = {"nearest": "Nearest mention", "head-match": "Nearest with same head word",
                   "rule-based": "Rule-based (4 sieves)"}
WINDOW_MODES = ("truncate", "sliding")
CANDIDATE_SETS = ("mentions", "words", "all-words")
#: The paper's definition (section 4.1): "whichever other word receives the most attention".
PAPER_CANDIDATES = "all-words"
#: Suffix of the result keys computed with :data:`PAPER_CANDIDATES` (``accuracy_all_words``, ...).
PAPER_SUFFIX = "_all_words"
#: How the summary and the report name results computed with :data:`PAPER_CANDIDATES`.
PAPER_DEFINITION = "with the paper's definition (every other word a candidate)"


# ---------------------------------------------------------------------------------------------
# windows


@dataclass
class WindowStats:
    """How the documents were cut, and how many mentions each window mode can score.

    ``anaphoric``: mentions with a same-cluster mention whose head word precedes theirs
    anywhere in the document; ``scored``: those scored (antecedent inside their window).
    """

    mode: str
    max_seq_len: int
    documents: int = 0
    windows: int = 0
    mentions: int = 0
    anaphoric: int = 0
    scored: int = 0
    scored_by_type: dict[str, int] = field(default_factory=lambda: {t: 0 for t in MENTION_TYPES})
    unmapped_heads: int = 0  # head words the tokenizer turns into no token

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _piece_counts(encoder, words: list[str]) -> tuple[np.ndarray, int]:
    """Tokens per word ``[n]`` and the number of special tokens the model adds."""
    enc = encoder.encode(Example(words=list(words)), 0)
    ids = np.asarray(enc.word_ids)  # [T]
    counts = np.bincount(ids[ids >= 0], minlength=len(words))
    return counts, int(np.sum(enc.special))


def _window_bounds(counts: np.ndarray, n_special: int, sentence_starts: Sequence[int], mode: str,
                   max_seq_len: int) -> list[tuple[int, int]]:
    """Word ranges ``[s, e)`` whose tokens (plus specials) fit in ``max_seq_len``.

    ``truncate``: the first window only (the paper). ``sliding``: windows that overlap by
    about half; each later window starts at the last sentence start in the first half of the
    previous one (or at its middle word when no sentence starts there).
    """
    n = len(counts)
    budget = max_seq_len - n_special
    cum = np.concatenate([[0], np.cumsum(counts)])  # [n+1]
    bounds: list[tuple[int, int]] = []
    s = 0
    starts = np.asarray(sorted(sentence_starts), dtype=np.int64)
    while s < n:
        e = int(np.searchsorted(cum, cum[s] + budget, side="right")) - 1  # last e with cum[e]-cum[s] <= budget
        e = max(min(e, n), s + 1)
        bounds.append((s, e))
        if mode == "truncate" or e >= n:
            break
        half = s + max(1, (e - s) // 2)
        inside = starts[(starts > s) & (starts <= half)]
        s = int(inside[-1]) if inside.size else half
    return bounds


def coref_windows(docs: Sequence[Document], model, *, mode: str = "truncate", max_seq_len: int = 128,
                  split: str | None = None, first_doc_index: int = 0,
                  ) -> tuple[list[Example], WindowStats]:
    """Cut documents into model windows; one :class:`Example` per window.

    ``model`` is a :class:`~attnscope.models.LoadedModel` (its tokenizer decides how many
    words fit). In ``sliding`` mode each mention is scored in the earliest window that holds
    its head word, i.e. the one giving it the most preceding context, and every mention with
    an antecedent within that context is scored; ``truncate`` keeps the first window of each
    document, as the paper did (128 tokens).

    ``fields["coref"]`` of each example holds, per mention with its head word in the window
    (column lists): ``id`` (index in the document), ``head`` (word index in the window),
    ``cluster``, ``type``, ``text`` and ``head_word`` (case-folded), ``number``, ``gender``,
    ``person`` (None when unknown), ``score`` (whether this window scores it). ``split``
    (e.g. ``"train"``, ``"dev"``) is recorded as ``fields["coref"]["split"]``; the analysis
    uses it for held-out head selection; when several splits are windowed separately, give
    each call a ``first_doc_index`` past the previous call's documents, so that
    ``fields["coref"]["doc_index"]`` stays unique.
    """
    if mode not in WINDOW_MODES:
        raise AttnscopeError(f"mode must be one of {', '.join(WINDOW_MODES)}, not {mode!r}", params=("mode",))
    encoder = Encoder(model)
    stats = WindowStats(mode=mode, max_seq_len=max_seq_len)
    examples: list[Example] = []
    for di, doc in enumerate(docs, start=first_doc_index):
        stats.documents += 1
        counts, n_special = _piece_counts(encoder, doc.words)
        bounds = _window_bounds(counts, n_special, doc.sentence_starts, mode, max_seq_len)
        bounds = [_fit(encoder, doc.words, s, e, max_seq_len) for s, e in bounds]
        ends = np.asarray([e for _, e in bounds])
        mentions = doc.mentions
        heads = np.asarray([m.head for m in mentions], dtype=np.int64)
        clusters = [m.cluster for m in mentions]
        attrs = [mention_attributes(doc, m) for m in mentions]
        stats.mentions += len(mentions)
        # the window that scores each mention: the earliest one holding its head word
        home = np.searchsorted(ends, heads, side="right") if len(mentions) else heads
        first: dict[str, int] = {}
        for c, h in zip(clusters, heads):
            first[c] = min(first.get(c, h), h)
        stats.anaphoric += sum(int(h > first[c]) for c, h in zip(clusters, heads))
        stats.unmapped_heads += int(np.sum(counts[heads] == 0)) if len(mentions) else 0
        for k, (s, e) in enumerate(bounds):
            inside = [int(i) for i in np.nonzero((heads >= s) & (heads < e))[0] if counts[heads[i]] > 0]
            col: dict[str, list] = {key: [] for key in ("id", "head", "cluster", "type", "text",
                                                        "head_word", "number", "gender", "person",
                                                        "score")}
            first_in: dict[str, int] = {}
            for i in inside:
                first_in[clusters[i]] = min(first_in.get(clusters[i], heads[i]), heads[i])
            for i in inside:
                m = mentions[i]
                has_ante = first_in[clusters[i]] < heads[i]
                score = bool(has_ante and home[i] == k)
                stats.scored += score
                if score:
                    stats.scored_by_type[m.type] += 1
                col["id"].append(i)
                col["head"].append(int(heads[i] - s))
                col["cluster"].append(m.cluster)
                col["type"].append(m.type)
                col["text"].append(doc.mention_text(m).casefold())
                col["head_word"].append(doc.words[m.head].casefold())
                col["number"].append(attrs[i][0])
                col["gender"].append(attrs[i][1])
                col["person"].append(attrs[i][2])
                col["score"].append(score)
            info = {"doc": doc.id, "doc_index": di, "window": k, "offset": s, "mode": mode,
                    "mentions": col}
            if split is not None:
                info["split"] = split
            examples.append(Example(words=list(doc.words[s:e]), fields={"coref": info}))
            stats.windows += 1
    return examples, stats


def _fit(encoder, words: list[str], s: int, e: int, max_seq_len: int) -> tuple[int, int]:
    """Shrink ``[s, e)`` until the window, encoded on its own, fits (BPE may count differently)."""
    while e - s > 1 and len(encoder.encode(Example(words=list(words[s:e])), 0)) > max_seq_len:
        e -= 1
    return s, e


# ---------------------------------------------------------------------------------------------
# baselines (no attention needed)


def _agree(a: Sequence[str | None], b: Sequence[str | None]) -> bool:
    return all(x is None or y is None or x == y for x, y in zip(a, b))


def baseline_predictions(info: dict, q: int) -> dict[str, int]:
    """Window head position predicted by each baseline for mention ``q`` (-1: no prediction).

    ``info`` is ``fields["coref"]["mentions"]`` (column lists); ``q`` indexes it.
    """
    heads = info["head"]
    hq = heads[q]
    cands = [j for j in range(len(heads)) if heads[j] < hq]

    def nearest(js: list[int]) -> int:
        return max((heads[j] for j in js), default=-1)

    out = {"nearest": nearest(cands)}
    same_head = [j for j in cands if info["head_word"][j] == info["head_word"][q]]
    out["head-match"] = nearest(same_head)
    attrs = lambda j: (info["number"][j], info["gender"][j], info["person"][j])  # noqa: E731
    sieves = [
        lambda j: info["text"][j] == info["text"][q],
        lambda j: info["head_word"][j] == info["head_word"][q],
        lambda j: _agree(attrs(j), attrs(q)),
        lambda j: True,
    ]
    out["rule-based"] = -1
    for sieve in sieves:
        passing = [j for j in cands if sieve(j)]
        if passing:
            out["rule-based"] = nearest(passing)
            break
    return out


# ---------------------------------------------------------------------------------------------
# the analysis


@register
class CorefAntecedents(MapsAnalysis):
    """Antecedent-selection accuracy of every head and of the three baselines (Table 2).

    Every scored mention is scored twice: with the configured candidate set (``candidates``,
    default the preceding mentions' head words) and with the paper's definition (section
    4.1: "whichever other word receives the most attention", i.e. every other word of the
    window, :data:`PAPER_CANDIDATES`). Keeps one record per scored mention (its key, type,
    split, the ``[L H]`` correctness of every head under both definitions and the baselines'
    correctness), so that confidence intervals can be bootstrapped over mentions at the end
    and the result does not depend on batching (records are sorted by ``(document, mention)``
    before anything is computed).

    Held-out head selection (``table2_heldout``): the best head is chosen on one part of the
    mentions and scored on another. With mentions from two or more splits
    (``fields["coref"]["split"]``, see :func:`coref_windows`) it is chosen on
    ``select_split`` and scored on each other split; with one split, on the documents of
    even index and scored on the odd ones, and the other way round (two folds).
    ``score_split`` restricts Table 2 and the per-head arrays to one split (e.g. ``"dev"``
    when train and dev windows are fed together for the held-out selection).
    """

    name = "coref-antecedents"
    summed = ("_keys", "_types", "_splits", "_heads", "_paper", "_base", "empty_words")
    requires = frozenset({"word_level", "coreference"})

    @classmethod
    def for_model(cls, model, *, seed: int = 0) -> "CorefAntecedents":
        return cls(seed=seed)

    def __init__(self, candidates: str = "mentions", *, seed: int = 0, n_boot: int = 1000,
                 level: float = 0.95, top_k: int = 3, ties: str = "none", select_split: str = "train",
                 score_split: str | None = None):
        if candidates not in CANDIDATE_SETS:
            raise ValueError(f"candidates must be one of {CANDIDATE_SETS}, not {candidates!r}")
        if ties not in TIE_RULES:
            raise ValueError(f"ties must be one of {TIE_RULES}, not {ties!r}")
        self.candidates = candidates
        self.seed = seed
        self.n_boot = n_boot
        self.level = level
        self.top_k = top_k
        self.ties = ties
        self.select_split = select_split
        self.score_split = score_split  # Table 2 and the per-head arrays on this split only (None: all)
        self._keys: list[np.ndarray] = []  # each [m 2] (doc_index, mention id)
        self._types: list[np.ndarray] = []  # each [m] index into MENTION_TYPES
        self._splits: list[list[str]] = []  # each [m] split name ("" when not given)
        self._heads: list[np.ndarray] = []  # each [m L H] bool, the configured candidates
        self._paper: list[np.ndarray] = []  # each [m L H] bool, all other words (the paper)
        self._base: list[np.ndarray] = []  # each [m 3] bool, BASELINES order
        self._shape: tuple[int, int] | None = None
        self.empty_words = 0  # words without a unit inside a window (zero tokens), summed over windows

    def params(self) -> dict[str, Any]:
        return {"candidates": self.candidates, "seed": self.seed, "n_boot": self.n_boot,
                "level": self.level, "top_k": self.top_k, "ties": self.ties,
                "select_split": self.select_split, "score_split": self.score_split}

    # -- accumulation -------------------------------------------------------------------------
    def update(self, batch: AttentionBatch) -> None:
        for amap in batch:
            self._update_map(amap)

    def _update_map(self, amap: AttentionMap) -> None:
        info = amap.example.fields.get("coref")
        if info is None:
            return
        L, H = amap.attn.shape[:2]
        if self._shape is None:
            self._shape = (L, H)
        elif self._shape != (L, H):
            raise ValueError(f"maps with {L}x{H} heads after maps with {self._shape[0]}x{self._shape[1]}")
        self.empty_words += int(np.sum(word_units(amap, len(amap.example.all_words or []) or None).empty))
        keys, types, correct, base = score_window(amap, info, self.candidates, ties=self.ties)
        if len(keys):
            _, _, paper, _ = score_window(amap, info, PAPER_CANDIDATES, ties=self.ties)
            self._keys.append(keys)
            self._types.append(types)
            self._splits.append([str(info.get("split") or "")] * len(keys))
            self._heads.append(correct)
            self._paper.append(paper)
            self._base.append(base)

    def merge(self, other: "Analysis") -> "Analysis":
        self._check_mergeable(other)
        assert isinstance(other, CorefAntecedents)
        if self._shape is None:
            self._shape = other._shape
        elif other._shape is not None and other._shape != self._shape:
            raise ValueError("cannot merge results of models with different head counts")
        return super().merge(other)

    # -- results ------------------------------------------------------------------------------
    def records(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """All mention records sorted by key: keys [m 2], types [m], heads [m L H], base [m 3]."""
        r = self._sorted()
        return r["keys"], r["types"], r["heads"], r["base"]

    def _sorted(self) -> dict[str, np.ndarray]:
        L, H = self._shape or (0, 0)
        if not self._keys:
            return {"keys": np.zeros((0, 2), np.int64), "types": np.zeros(0, np.int64),
                    "splits": np.zeros(0, object), "heads": np.zeros((0, L, H), bool),
                    "paper": np.zeros((0, L, H), bool), "base": np.zeros((0, len(BASELINES)), bool)}
        keys = np.concatenate(self._keys)
        order = np.lexsort((keys[:, 1], keys[:, 0]))
        splits = np.asarray([x for part in self._splits for x in part], dtype=object)
        return {"keys": keys[order], "types": np.concatenate(self._types)[order], "splits": splits[order],
                "heads": np.concatenate(self._heads)[order], "paper": np.concatenate(self._paper)[order],
                "base": np.concatenate(self._base)[order]}

    def finalize(self) -> Result:
        everything = self._sorted()
        r = everything
        if self.score_split is not None:
            keep = everything["splits"] == self.score_split
            r = {k: v[keep] for k, v in everything.items()}
        keys, types, base = r["keys"], r["types"], r["base"]
        m = len(keys)
        L, H = self._shape or (0, 0)
        counts = {t: int(np.sum(types == i)) for i, t in enumerate(MENTION_TYPES)}
        result = Result(self.name, params=self.params(),
                        meta={"mentions": m, "mentions_by_type": counts, "num_layers": L,
                              "num_heads": H, "head_convention": "layer and head 0-indexed; name is "
                              "the paper's 1-indexed layer-head",
                              "candidates": self.candidates, "paper_candidates": PAPER_CANDIDATES,
                              "empty_words": self.empty_words,
                              "ties": "a row whose top candidate weight is 0 or shared predicts nothing "
                                      "(wrong)" if self.ties == "none" else "lowest candidate index"})
        summaries = []
        for suffix, correct in (("", r["heads"]), (PAPER_SUFFIX, r["paper"])):
            acc, by_type = _accuracies(correct, types, counts, L, H)
            result.arrays["accuracy" + suffix] = acc
            result.arrays["accuracy_by_type" + suffix] = by_type
            result.tables["heads" + suffix] = [
                {"layer": ly, "head": h, "name": str(HeadId(ly, h)), "all": _f(acc[ly, h]),
                 **{t: _f(by_type[i, ly, h]) for i, t in enumerate(MENTION_TYPES)}}
                for ly in range(L) for h in range(H)]
            if m == 0:
                result.tables["table2" + suffix] = []
                continue
            flat = acc.reshape(-1)
            order = sorted(range(flat.size), key=lambda k: (-flat[k], k))[: self.top_k]
            rows = [self._row(BASELINE_LABELS[name], "baseline", None, base[:, b], types)
                    for b, name in enumerate(BASELINES)]
            for k in order:
                ly, h = divmod(k, H)
                rows.append(self._row(f"Head {HeadId(ly, h)}", "head", (ly, h), correct[:, ly, h], types))
            result.tables["table2" + suffix] = rows
            best = rows[len(BASELINES)]
            result.meta["best_head" + suffix] = [best["layer"], best["head"]]
            summaries.append((best, rows))
        if self.empty_words:
            result.summary.append(
                f"{self.empty_words} words became zero tokens (e.g. a zero-width space) and have no "
                "unit: never a candidate, and a mention headed by one is not scored")
        if m == 0:
            result.summary.append("no mention with an antecedent in its window was scored")
            result.tables["table2_heldout"] = self._heldout(everything) if len(everything["keys"]) else []
            return result
        (best, rows), (best_p, _) = summaries
        result.summary.append(
            f"best head {best['name']} selects the antecedent of {100 * best['all']:.1f}% of {m} "
            f"mentions ({self.candidates} as candidates); nearest mention {100 * rows[0]['all']:.1f}%, "
            f"same head word {100 * rows[1]['all']:.1f}%, rule-based {100 * rows[2]['all']:.1f}%")
        result.summary.append(
            f"{PAPER_DEFINITION} the best head is {best_p['name']} at {100 * best_p['all']:.1f}%")
        result.tables["table2_heldout"] = self._heldout(everything)
        return result

    def _heldout(self, r: dict[str, np.ndarray]) -> list[dict[str, Any]]:
        """Best head chosen on one part of the mentions and scored on another (see the class)."""
        splits = r["splits"]
        names = sorted(set(splits.tolist()))
        if len(names) >= 2:
            sel = self.select_split if self.select_split in names else names[0]
            parts = [(sel, splits == sel, name, splits == name) for name in names if name != sel]
        else:
            even = r["keys"][:, 0] % 2 == 0
            parts = [("even documents", even, "odd documents", ~even),
                     ("odd documents", ~even, "even documents", even)]
        rows = []
        for cands, correct in ((self.candidates, r["heads"]), (PAPER_CANDIDATES, r["paper"])):
            L, H = correct.shape[1:] if correct.ndim == 3 else (0, 0)
            for sel_name, sel, score_name, score in parts:
                if not sel.any() or not score.any() or not L:
                    continue
                sel_acc = correct[sel].mean(axis=0).reshape(-1)  # [L*H]
                k = int(np.argmax(sel_acc))  # ties: the lowest (layer, head)
                ly, h = divmod(k, H)
                vals = correct[score][:, ly, h].astype(np.float64)
                lo, hi = bootstrap_ci(vals, n_boot=self.n_boot, level=self.level, seed=self.seed)
                row = {"candidates": cands, "selected_on": sel_name, "scored_on": score_name,
                       "layer": ly, "head": h, "name": str(HeadId(ly, h)),
                       "select_accuracy": _f(sel_acc[k]), "select_n": int(sel.sum()),
                       "accuracy": _f(vals.mean()), "accuracy_lo": _f(lo), "accuracy_hi": _f(hi),
                       "n": int(vals.size),
                       "same_data_best": _f(correct[score].mean(axis=0).max())}
                for b, name in enumerate(BASELINES):
                    row[name] = _f(r["base"][score][:, b].mean())
                rows.append(row)
        return rows

    def _row(self, label: str, kind: str, head: tuple[int, int] | None, correct: np.ndarray,
             types: np.ndarray) -> dict[str, Any]:
        row: dict[str, Any] = {"model": label, "kind": kind,
                               "layer": None if head is None else head[0],
                               "head": None if head is None else head[1],
                               "name": label if head is None else str(HeadId(*head))}
        for col, mask in [("all", np.ones(len(types), bool))] + [
                (t, types == i) for i, t in enumerate(MENTION_TYPES)]:
            vals = correct[mask].astype(np.float64)
            lo, hi = bootstrap_ci(vals, n_boot=self.n_boot, level=self.level, seed=self.seed)
            row[col] = _f(vals.mean()) if vals.size else None
            row[f"{col}_lo"] = _f(lo) if vals.size else None
            row[f"{col}_hi"] = _f(hi) if vals.size else None
            row[f"{col}_n"] = int(vals.size)
        return row


def _accuracies(correct: np.ndarray, types: np.ndarray, counts: dict[str, int], L: int, H: int):
    """Accuracy ``[L H]`` and by mention type ``[3 L H]`` (NaN where nothing is scored)."""
    m = len(correct)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = correct.sum(axis=0) / m if m else np.full((L, H), np.nan)  # [L H]
        by_type = np.stack([correct[types == i].sum(axis=0) / counts[t] if counts[t] else
                            np.full((L, H), np.nan) for i, t in enumerate(MENTION_TYPES)]) \
            if L else np.zeros((len(MENTION_TYPES), 0, 0))  # [3 L H]
    return acc.astype(np.float64), by_type.astype(np.float64)


def _f(x) -> float | None:
    x = float(x)
    return None if np.isnan(x) else x


def _candidate_mask(nw: int, q_heads: np.ndarray, present: np.ndarray, is_head: np.ndarray,
                    candidates: str) -> np.ndarray:
    """``[m nw]`` bool: the words each query may pick; never the query word itself."""
    idx = np.arange(nw)[None, :]
    if candidates == PAPER_CANDIDATES:
        cand = idx != q_heads[:, None]
    else:
        cand = idx < q_heads[:, None]
        if candidates == "mentions":
            cand = cand & is_head[None, :]
    return cand & present[None, :]


def score_window(amap: AttentionMap, info: dict, candidates: str = "mentions", *, ties: str = "none",
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Score the mentions a window marks ``score``: keys [m 2], types [m], heads [m L H], base [m 3].

    ``heads[i, l, h]`` says whether head ``(l, h)`` picks an antecedent of mention ``i``: the
    candidate with the highest attention from the query's head word is the head word of a
    mention of the query's cluster that precedes the query. A row with no information on
    the candidates (all 0, or a tie for the top) picks nothing (:func:`~attnscope.analyses.units.predict`).
    """
    col = info["mentions"]
    L, H = amap.attn.shape[:2]
    q_idx = [i for i, s in enumerate(col["score"]) if s]
    if not q_idx:
        return (np.zeros((0, 2), np.int64), np.zeros(0, np.int64), np.zeros((0, L, H), bool),
                np.zeros((0, len(BASELINES)), bool))
    units = word_units(amap, len(amap.example.all_words or []) or None)
    pos = units.positions  # [nw] unit of each word of the window, -1 without one
    nw = len(pos)
    heads = np.asarray(col["head"], dtype=np.int64)  # [M] word index in window
    clusters = np.asarray(col["cluster"], dtype=object)
    is_head = np.zeros(nw, bool)
    is_head[heads] = True
    q_heads = heads[q_idx]  # [m]
    before = np.arange(nw)[None, :] < q_heads[:, None]  # [m nw]
    # [m nw]; a query word without a unit has no row: it predicts nothing
    cand = _candidate_mask(nw, q_heads, units.present, is_head, candidates) & units.present[q_heads][:, None]
    # gold[i, w]: some mention of i's cluster has head word w (before i's head)
    gold = np.zeros((len(q_idx), nw), bool)
    for r, i in enumerate(q_idx):
        same = heads[clusters == clusters[i]]
        gold[r, same] = True
    gold &= before
    rows = amap.attn[:, :, pos[q_heads], :][:, :, :, np.maximum(pos, 0)]  # [L H m nw]
    pred = predict(rows, cand[None, None], ties=ties)  # [L H m], -1 = no prediction
    correct = (pred >= 0) & np.take_along_axis(gold[None, None], np.maximum(pred, 0)[..., None],
                                                axis=-1)[..., 0]  # [L H m]
    base = np.zeros((len(q_idx), len(BASELINES)), bool)
    for r, i in enumerate(q_idx):
        preds = baseline_predictions(col, i)
        for b, name in enumerate(BASELINES):
            p = preds[name]
            base[r, b] = p >= 0 and bool(gold[r, p])
    keys = np.asarray([[info["doc_index"], col["id"][i]] for i in q_idx], dtype=np.int64)
    types = np.asarray([MENTION_TYPES.index(col["type"][i]) for i in q_idx], dtype=np.int64)
    return keys, types, np.transpose(correct, (2, 0, 1)).copy(), base


def head_choices(amap: AttentionMap, info: dict, layer: int, head: int,
                 candidates: str = "mentions", ties: str = "none") -> list[dict[str, Any]]:
    """For one head, each scored mention's query word, predicted word, gold words and weights.

    Used for the Figure 5 style examples: ``{"query", "pred", "gold", "correct", "weights"}``
    with word indices in the window (``pred`` -1: no prediction) and ``weights`` the head's
    attention from the query word to every word of the window ``[nw]`` (0 for a word without
    a unit).
    """
    col = info["mentions"]
    units = word_units(amap, len(amap.example.all_words or []) or None)
    pos = units.positions
    nw = len(pos)
    heads = np.asarray(col["head"], dtype=np.int64)
    clusters = np.asarray(col["cluster"], dtype=object)
    is_head = np.zeros(nw, bool)
    is_head[heads] = True
    out = []
    for i, s in enumerate(col["score"]):
        if not s:
            continue
        q = int(heads[i])
        weights = amap.attn[layer, head, pos[q], :][np.maximum(pos, 0)] * units.present  # [nw]
        cand = _candidate_mask(nw, np.array([q]), units.present, is_head, candidates)[0] & units.present[q]
        pred = int(predict(weights[None, :], cand[None, :], ties=ties)[0])
        gold = sorted({int(w) for w in heads[(clusters == clusters[i]) & (heads < q)]})
        out.append({"mention": int(col["id"][i]), "query": q, "pred": pred, "gold": gold,
                    "correct": pred in gold, "type": col["type"][i],
                    "weights": weights.astype(np.float64)})
    return out


def best_head_examples(result: Result, examples: Sequence[Example], maps_of, n: int = 3,
                       ) -> list[tuple[int, Any, dict]]:
    """The best head's examples for the figure: a few windows of distinct documents (their
    word-level maps from ``maps_of(indices)``) and, in each, the head's choice to show (a correct
    one at some distance, as the paper's figure): at most ``n`` of ``(window index, map,
    choice)`` (:func:`head_choices`)."""
    rows = result.tables["table2"]
    if len(rows) <= len(BASELINES):
        return []
    best = rows[len(BASELINES)]
    layer, head = best["layer"], best["head"]
    candidates, ties = result.params["candidates"], result.params["ties"]
    chosen, seen_docs = [], set()
    for i, ex in enumerate(examples):
        info = ex.fields["coref"]
        if info["doc_index"] in seen_docs or not any(info["mentions"]["score"]):
            continue
        chosen.append(i)
        seen_docs.add(info["doc_index"])
        if len(chosen) >= 4 * n:
            break
    picks = []
    for amap in maps_of(chosen):
        if len(picks) >= n:
            break
        i = amap.index
        choices = head_choices(amap, examples[i].fields["coref"], layer, head, candidates, ties)
        # prefer a correct choice at some distance, as the paper's figure shows
        good = [c for c in choices if c["correct"] and 0 <= c["pred"] and c["query"] - c["pred"] <= 50]
        if good:
            picks.append((i, amap, max(good, key=lambda c: (c["query"] - c["pred"], -c["query"]))))
    return picks
