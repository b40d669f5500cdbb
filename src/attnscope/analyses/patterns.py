"""Jesse Vig's attention patterns ("Deconstructing BERT") as measured per-head statistics.

Vig describes heads that attend to the next (1) or previous (2) word, to identical words (3),
to identical words in the other sentence (4), to the other pieces of the same word (5), to
delimiter tokens (6), and "bag of words" heads that spread their attention evenly over their
own sentence. 1, 2 and 6 are the paper's section 3 statistics (relative position, special
tokens); :class:`VigPatterns` measures the others, and :class:`KeyConcentration` measures the
[SEP]-key signature of his second post (a few strongly active key dimensions).

Definitions, for one example with ``n`` units, one head's attention ``a`` (``[n n]``, row =
from), segment ids ``s``, word ids ``w`` and unit texts ``t`` (word markers ``##``/``Ġ``/``▁``
removed):

- *visible* keys of row ``i``: all ``n`` columns (encoder), columns ``j <= i`` (causal);
  ``k_i`` = their number.
- *word tokens*: units that are neither special nor a period/comma
  (:class:`~attnscope.analyses.token_classes.TokenClasser`).
- ``repeat_same`` (pattern 3): for a word-token row ``i``, ``D_i`` = visible word tokens
  ``j != i`` with ``t[j] == t[i]`` (exact text) and ``s[j] == s[i]``; row mass
  ``sum_{j in D_i} a[i, j]``.
- ``repeat_other`` (pattern 4): the same with ``s[j] != s[i]``.
- ``pieces`` (pattern 5): for a non-special row, ``D_i`` = the other pieces of its word
  (``w[j] == w[i]``, ``s[j] == s[i]``, ``j != i``, visible); ``pieces_earlier`` keeps
  ``j < i``, ``pieces_later`` keeps ``j > i``.
- ``within`` / ``across`` (bag of words): for a non-special row, ``D_i`` = visible non-special
  columns with ``s[j] == s[i]`` (the row itself included) / ``s[j] != s[i]``.
- ``within_entropy``: for a non-special row with ``|D_i| >= 2`` (``D_i`` of ``within``), the
  entropy in nats of the within-segment part renormalised, ``p_j = a[i, j] / sum_{D_i} a[i, .]``
  (0 when the row puts nothing there).

A row counts for a statistic only when its ``D_i`` is not empty (the rows where the pattern
*can* occur). Each statistic is the **pooled row average**: the sum of the row masses over
every counted row of every example, divided by the number of counted rows. Its **chance
level** is the same average of ``|D_i| / k_i``, the mass uniform attention over the row would
put on ``D_i`` (for ``within_entropy``: ``ln |D_i|``, the entropy of uniform attention over
``D_i``). Sums and row counts are added over examples, so the result does not depend on
batching or sharding. Causal models were not trained with segments, so for them the whole
input is one segment: ``repeat_other`` and ``across`` are not computed (not applicable), and
neither is ``pieces_later`` (a causal row cannot see later pieces).

The chance levels of the section 3 statistics that the labels use (they are per-example means
there, so their chance levels are too): delimiter ``mean over examples of (#first + #separator) / n``;
previous ``mean over examples of mean_{i>=1} 1 / k_i``; next ``1 / n`` per example (encoders).

For a link into the head view, each statistic also keeps, per head, the example where the
head's own per-example row average is highest (lowest example index on ties).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnscope.analyses.base import EncodedAnalysis, MapsAnalysis, Result, register
from attnscope.analyses.relative_position import per_head_rows
from attnscope.analyses.token_classes import TokenClasser
from attnscope.data.records import HeadId, layer_number
from attnscope.maps import AttentionBatch
from attnscope.models.forward import forward, pad_batch

#: The statistics of :class:`VigPatterns`, in their order in the accumulators.
STATS = ("repeat_same", "repeat_other", "pieces", "pieces_earlier", "pieces_later", "within",
         "across", "within_entropy")
#: Why a statistic is not applicable to a causal model.
CAUSAL_NOT_APPLICABLE = {
    "repeat_other": "a causal model has no segments",
    "across": "a causal model has no segments",
    "pieces_later": "a causal model cannot attend to later tokens",
    "next": "a causal model cannot attend to the next token",
    "pieces_both": "a causal model cannot attend to later tokens",
}
#: Labels, in the order they are tested (the first that holds wins).
PATTERN_LABELS = ("delimiter", "previous", "next", "word pieces", "repeat, other segment",
                  "repeat, same segment", "bag of words", "other")
#: Token classes of :class:`KeyConcentration`.
KEY_CLASSES = ("first", "separator", "punct", "other")


@dataclass(frozen=True)
class PatternThresholds:
    """Thresholds of the pattern labels (see :func:`pattern_labels`)."""

    delimiter: float = 0.6  # the paper's [SEP]/[CLS] threshold (Figure 6)
    position: float = 0.5  # the paper's previous/next threshold (section 3.1)
    repeat: float = 0.3
    pieces: float = 0.3
    lift: float = 3.0  # repeat/pieces must also be this many times their chance level
    bag_within: float = 0.6
    bag_evenness: float = 0.8


def _visible(n: int, causal: bool) -> np.ndarray:
    return np.tril(np.ones((n, n), dtype=bool)) if causal else np.ones((n, n), dtype=bool)


@register
class VigPatterns(MapsAnalysis):
    """Per head: patterns 3, 4, 5 and the bag-of-words split, each with its chance level."""

    name = "vig-patterns"
    summed = ("chance", "rows", "examples", "delimiter_chance_sum", "previous_chance_sum", "next_chance_sum",
              "position_examples")
    requires = frozenset()

    def __init__(self, classer: TokenClasser | None = None, causal: bool = False):
        self.classer = classer or TokenClasser.positional()
        self.causal = bool(causal)
        self.sums: np.ndarray | None = None  # [S L H] float64: row masses (entropies) summed
        self.chance = np.zeros(len(STATS), dtype=np.float64)  # [S] chance levels summed over rows
        self.rows = np.zeros(len(STATS), dtype=np.int64)  # [S] counted rows
        self.best: np.ndarray | None = None  # [S L H] highest per-example row average
        self.best_index: np.ndarray | None = None  # [S L H] int64, -1 = none
        self.examples = 0
        self.delimiter_chance_sum = 0.0  # sum over examples of (#first + #separator) / n
        # chance levels of the section 3.1 statistics, per example as relative-position averages
        self.previous_chance_sum = 0.0  # sum over examples of mean_{i>=1} 1/k_i
        self.next_chance_sum = 0.0  # sum over examples of mean_{i<=n-2} [i+1 visible]/k_i
        self.position_examples = 0  # examples with n >= 2
        self.first_index: int | None = None  # lowest example index seen

    def params(self) -> dict[str, Any]:
        return {"causal": self.causal, "token_classes": self.classer.params(),
                "average": "pooled over rows: sum of row values / number of counted rows"}

    def _targets(self, m) -> tuple[np.ndarray, np.ndarray]:
        """``[S n n]`` bool target sets ``D_i`` per row, and ``[S n]`` which rows count."""
        n = m.num_units
        k = self.classer.classify_map(m)
        special = np.asarray(m.special, dtype=bool)
        word = ~special & ~k.punct
        # decoders were not trained with segments: the whole input is one segment for them
        seg = np.zeros(n, dtype=np.int64) if self.causal else np.asarray(m.segment)
        wid = np.asarray(m.word_ids)
        bare = np.array([TokenClasser.bare(t) for t in m.tokens], dtype=object)
        vis = _visible(n, self.causal)
        not_self = ~np.eye(n, dtype=bool)
        same_seg = seg[:, None] == seg[None, :]
        real = ~special[:, None] & ~special[None, :]
        same_text = (bare[:, None] == bare[None, :]) & word[:, None] & word[None, :] & not_self & vis
        pieces = (wid[:, None] == wid[None, :]) & (wid[:, None] >= 0) & same_seg & real & not_self & vis
        idx = np.arange(n)
        within = real & same_seg & vis
        sets = np.zeros((len(STATS), n, n), dtype=bool)
        sets[0] = same_text & same_seg
        sets[2] = pieces
        sets[3] = pieces & (idx[None, :] < idx[:, None])
        sets[4] = pieces & (idx[None, :] > idx[:, None])
        sets[5] = within
        sets[7] = within
        if not self.causal:
            sets[1] = same_text & ~same_seg
            sets[6] = real & ~same_seg & vis
        size = sets.sum(-1)  # [S n]
        counted = size > 0
        counted[7] = size[7] >= 2
        return sets, counted

    def _add(self, m) -> None:
        attn = m.attn  # [L H n n]
        n = m.num_units
        sets, counted = self._targets(m)
        L, H = attn.shape[:2]
        if self.sums is None:
            self.sums = np.zeros((len(STATS), L, H), dtype=np.float64)
            self.best = np.full((len(STATS), L, H), -np.inf)
            self.best_index = np.full((len(STATS), L, H), -1, dtype=np.int64)
        elif self.sums.shape[1:] != (L, H):
            raise ValueError(f"maps of {L}x{H} heads after maps of {self.sums.shape[1]}x{self.sums.shape[2]} "
                             "(different models mixed in one analysis)")
        a = np.asarray(attn, dtype=np.float64)
        masses = np.einsum("lhij,sij->slhi", a, sets[:7].astype(np.float64))  # [7 L H n]
        row_values = np.empty((len(STATS), L, H, n))
        row_values[:7] = masses
        # entropy of the renormalised within-segment part
        w = masses[5]  # [L H n]
        part = a * sets[7][None, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            p = np.where(w[..., None] > 0, part / w[..., None], 0.0)
            logs = np.where(p > 0, np.log(np.where(p > 0, p, 1.0)), 0.0)
        row_values[7] = -(p * logs).sum(-1)
        k_i = _visible(n, self.causal).sum(-1).astype(np.float64)  # [n]
        size = sets.sum(-1).astype(np.float64)  # [S n]
        chance_rows = size / k_i[None, :]
        chance_rows[7] = np.log(np.maximum(size[7], 1.0))
        for s in range(len(STATS)):
            rows = counted[s]
            c = int(rows.sum())
            if c == 0:
                continue
            v = row_values[s][..., rows]  # [L H c]
            self.sums[s] += v.sum(-1)
            self.chance[s] += float(chance_rows[s][rows].sum())
            self.rows[s] += c
            mean = v.mean(-1)
            better = (mean > self.best[s]) | ((mean == self.best[s]) & (m.index < self.best_index[s]))
            self.best[s] = np.where(better, mean, self.best[s])
            self.best_index[s] = np.where(better, m.index, self.best_index[s])
        k = self.classer.classify_map(m)
        self.delimiter_chance_sum += float((k.first | k.separator).sum()) / max(n, 1)
        if n >= 2:
            self.previous_chance_sum += float((1.0 / k_i[1:]).mean())
            self.next_chance_sum += 0.0 if self.causal else 1.0 / n
            self.position_examples += 1
        self.first_index = m.index if self.first_index is None else min(self.first_index, m.index)
        self.examples += 1

    def update(self, batch: AttentionBatch) -> None:
        for m in batch:
            if m.level != "token":
                raise ValueError("vig-patterns needs token-level maps (pattern 5 is about word pieces)")
            self._add(m)

    def merge(self, other: "VigPatterns") -> "VigPatterns":
        self._check_mergeable(other)  # before any sum moves
        if other.sums is not None:
            if self.sums is None:
                self.sums, self.best = other.sums.copy(), other.best.copy()
                self.best_index = other.best_index.copy()
            else:
                if self.sums.shape != other.sums.shape:
                    raise ValueError("cannot merge accumulators of different models")
                self.sums += other.sums
                better = (other.best > self.best) | ((other.best == self.best) & (other.best_index >= 0)
                                                     & ((self.best_index < 0) | (other.best_index < self.best_index)))
                self.best = np.where(better, other.best, self.best)
                self.best_index = np.where(better, other.best_index, self.best_index)
        if other.first_index is not None:
            self.first_index = other.first_index if self.first_index is None else min(self.first_index,
                                                                                      other.first_index)
        return super().merge(other)

    def finalize(self) -> Result:
        res = Result(self.name, params=self.params(),
                     meta={"examples": self.examples, "causal": self.causal,
                           "rows": {s: int(self.rows[i]) for i, s in enumerate(STATS)},
                           "not_applicable": [s for s in STATS if s in CAUSAL_NOT_APPLICABLE] if self.causal else []})
        if self.sums is None:
            res.summary.append("no examples")
            return res
        with np.errstate(invalid="ignore", divide="ignore"):
            counts = np.where(self.rows > 0, self.rows, np.nan)
            values = self.sums / counts[:, None, None]
            chance = self.chance / counts
        res.meta["chance"] = {s: (None if not math.isfinite(chance[i]) else float(chance[i]))
                              for i, s in enumerate(STATS)}
        res.meta["delimiter_chance"] = self.delimiter_chance_sum / self.examples
        pe = self.position_examples
        res.meta["previous_chance"] = self.previous_chance_sum / pe if pe else None
        res.meta["next_chance"] = self.next_chance_sum / pe if pe else None
        res.meta["first_index"] = self.first_index
        res.arrays = {s: values[i].copy() for i, s in enumerate(STATS)}
        for i, s in enumerate(STATS):
            res.arrays[f"best_example_{s}"] = self.best_index[i].copy()
        res.tables["vig_patterns"] = per_head_rows({s: values[i] for i, s in enumerate(STATS)})
        for i, s in enumerate(STATS):
            if self.rows[i] == 0:
                continue
            layer, head = np.unravel_index(int(np.nanargmax(values[i])), values[i].shape)
            res.summary.append(f"{s}: highest {values[i][layer, head]:.3f} at head {HeadId(layer, head)} "
                               f"(chance {chance[i]:.3f}, {int(self.rows[i])} rows)")
        return res


def pattern_labels(stats: dict[str, np.ndarray], chance: dict[str, float | None], *, causal: bool = False,
                   thresholds: PatternThresholds = PatternThresholds()) -> np.ndarray:
    """One label per head, ``[L H]`` of str; the first test that holds wins (order of
    :data:`PATTERN_LABELS`):

    - ``delimiter``: ``delimiter`` (attention to first special + separators) > ``delimiter``
    - ``previous`` / ``next``: > ``position``
    - ``word pieces``: mass on the earlier pieces or on the later pieces (causal: earlier
      only) > ``pieces`` and > ``lift`` x chance; tested after previous/next, so a positional
      head (whose earlier or later pieces are mostly its previous or next token) keeps its
      positional label
    - ``repeat, other segment`` / ``repeat, same segment``: mass > ``repeat`` and > ``lift`` x chance
    - ``bag of words``: ``within`` > ``bag_within`` and ``within_entropy`` / its uniform level
      >= ``bag_evenness``
    """
    shape = next(iter(stats.values())).shape
    t = thresholds

    def get(key: str) -> np.ndarray:
        return np.nan_to_num(np.asarray(stats.get(key, np.full(shape, np.nan)), dtype=np.float64), nan=-np.inf)

    def lifted(key: str, limit: float) -> np.ndarray:
        c = chance.get(key)
        if c is None:
            return np.zeros(shape, dtype=bool)
        v = get(key)
        return (v > limit) & (v > t.lift * c)

    tests = [("delimiter", get("delimiter") > t.delimiter),
             ("previous", get("previous") > t.position), ("next", get("next") > t.position),
             ("word pieces", lifted("pieces_earlier", t.pieces)
              | (np.zeros(shape, dtype=bool) if causal else lifted("pieces_later", t.pieces))),
             ("repeat, other segment", lifted("repeat_other", t.repeat)),
             ("repeat, same segment", lifted("repeat_same", t.repeat))]
    ce = chance.get("within_entropy")
    if ce:
        tests.append(("bag of words", (get("within") > t.bag_within) & (get("within_entropy") / ce >= t.bag_evenness)))
    labels = np.full(shape, "other", dtype=object)
    done = np.zeros(shape, dtype=bool)
    for label, hit in tests:
        labels[hit & ~done] = label
        done |= hit
    return labels


@register
class KeyConcentration(EncodedAnalysis):
    """How concentrated key vectors are, per layer and token class (Vig's [SEP]-key signature).

    Reads the keys at the forward helper's ``"k"`` hook (``[B Hkv T d]`` per layer): ``update``
    runs the model on a batch of encoded examples itself, and :meth:`hooks` lets the same keys
    be read during a pass that is made anyway (the maps pass of the patterns family). For each
    real token ``t`` and key/value head ``h`` the key vector ``x`` (``d`` components) gives

    - ``top_share``: the share of ``|x|^2`` in its ``ceil(top_fraction * d)`` largest squared
      components (``top_fraction * d / d`` ~ 0.05 for a vector with equal components; 1 when
      one dimension holds everything);
    - ``kurtosis``: the excess kurtosis of its components, ``m4 / m2^2 - 3`` with
      ``m_r = mean_c (x_c - mean(x))^r`` (0 for Gaussian-like components; large when a few
      dimensions stand out).

    Both are pooled averages over every (token, head) pair of a class in a layer: sums and
    counts, divided only in :meth:`finalize`. ``meta["gaussian_reference"]`` gives both for
    vectors of independent normal components of the same ``d`` (no distinctive dimensions). Classes: first special (``[CLS]``/``<s>``),
    separators (``[SEP]``/``</s>``), periods/commas, other tokens.
    """

    name = "key-concentration"
    requires = frozenset({"model"})

    @classmethod
    def for_model(cls, model, *, seed: int = 0) -> "KeyConcentration":
        return cls(lm=model, classer=TokenClasser.for_model(model)[0])

    def __init__(self, top_fraction: float = 0.05, *, lm=None, classer: TokenClasser | None = None):
        if not 0 < top_fraction <= 1:
            raise ValueError(f"top_fraction must be in (0, 1], not {top_fraction}")
        self.top_fraction = float(top_fraction)
        self.lm, self.classer = lm, classer or TokenClasser.positional()
        self.layers: dict[int, np.ndarray] = {}  # layer -> [4 C]: share sum, share count, kurt sum, kurt count
        self.dim: int | None = None

    def params(self) -> dict[str, Any]:
        return {"top_fraction": self.top_fraction, "classes": list(KEY_CLASSES),
                "average": "pooled over (token, key head) pairs"}

    @staticmethod
    def class_ids(classer: TokenClasser, tokens: list[str], special) -> np.ndarray:
        """``[T]`` index into :data:`KEY_CLASSES` for each unit."""
        k = classer.classify(tokens, np.asarray(special, dtype=bool))
        out = np.full(len(tokens), 3, dtype=np.int64)
        out[k.punct] = 2
        out[k.separator] = 1
        out[k.first] = 0
        return out

    def hooks(self, batch: list) -> dict:
        """The forward helper's hooks that read ``batch``'s keys (encoded examples, padded on
        the right) during a forward pass over it."""
        width = max(len(e) for e in batch)
        classes = np.full((len(batch), width), -1, dtype=np.int64)  # -1: padding, ignored
        for b, e in enumerate(batch):
            classes[b, :len(e)] = self.class_ids(self.classer, e.tokens, e.special)

        def read(site, k):
            self.add_keys(site.layer, k.float().cpu().numpy(), classes)

        return {"k": read}

    def update(self, batch: list) -> None:
        """Run the model on a batch of encoded examples and read their keys."""
        if self.lm is None:
            raise ValueError("key concentration runs the model: build it with lm=")
        if batch:
            inputs = pad_batch(self.lm, [e.input_ids for e in batch], [e.token_type_ids for e in batch])
            forward(self.lm, inputs, hooks=self.hooks(batch))

    def add_keys(self, layer: int, keys: np.ndarray, classes: np.ndarray) -> None:
        """One layer's keys ``[B H T d]`` and ``[B T]`` class ids (-1 = padding, ignored)."""
        x = np.asarray(keys, dtype=np.float64)
        d = x.shape[-1]
        if self.dim is None:
            self.dim = d
        top = max(1, math.ceil(self.top_fraction * d))
        sq = x * x
        total = sq.sum(-1)  # [B H T]
        top_sum = -np.sort(-sq, axis=-1)[..., :top].sum(-1)
        c = x - x.mean(-1, keepdims=True)
        m2 = (c ** 2).mean(-1)
        m4 = (c ** 4).mean(-1)
        ok_share, ok_kurt = total > 0, m2 > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(ok_share, top_sum / np.where(ok_share, total, 1.0), 0.0)
            kurt = np.where(ok_kurt, m4 / np.where(ok_kurt, m2, 1.0) ** 2 - 3.0, 0.0)
        cls = np.asarray(classes)
        onehot = (cls[..., None] == np.arange(len(KEY_CLASSES))).astype(np.float64)  # [B T C]
        acc = self.layers.setdefault(layer, np.zeros((4, len(KEY_CLASSES))))
        acc[0] += np.einsum("bht,btc->c", share * ok_share, onehot)
        acc[1] += np.einsum("bht,btc->c", ok_share.astype(np.float64), onehot)
        acc[2] += np.einsum("bht,btc->c", kurt * ok_kurt, onehot)
        acc[3] += np.einsum("bht,btc->c", ok_kurt.astype(np.float64), onehot)

    def merge(self, other: "KeyConcentration") -> "KeyConcentration":
        if type(other) is not type(self) or other.params() != self.params():
            raise ValueError("cannot merge key-concentration accumulators with other parameters")
        for layer, acc in other.layers.items():
            self.layers.setdefault(layer, np.zeros_like(acc))
            self.layers[layer] += acc
        if self.dim is None:
            self.dim = other.dim
        return self

    def gaussian_reference(self, samples: int = 20000, seed: int = 0) -> dict[str, float] | None:
        """Both statistics for key vectors of independent standard normal components (same
        ``d``, seeded Monte Carlo): the level of a key with no distinctive dimensions."""
        if self.dim is None:
            return None
        ref = KeyConcentration(self.top_fraction)
        x = np.random.default_rng(seed).standard_normal((1, 1, samples, self.dim))
        ref.add_keys(0, x, np.zeros((1, samples), dtype=np.int64))
        acc = ref.layers[0]
        return {"top_share": float(acc[0, 0] / acc[1, 0]), "kurtosis": float(acc[2, 0] / acc[3, 0]),
                "samples": samples, "seed": seed}

    def finalize(self) -> Result:
        res = Result(self.name, params=self.params(), meta={"dim": self.dim})
        res.meta["gaussian_reference"] = self.gaussian_reference()
        if not self.layers:
            res.summary.append("no keys")
            return res
        L = max(self.layers) + 1
        acc = np.stack([self.layers.get(i, np.zeros((4, len(KEY_CLASSES)))) for i in range(L)])  # [L 4 C]
        with np.errstate(invalid="ignore", divide="ignore"):
            share = acc[:, 0] / np.where(acc[:, 1] > 0, acc[:, 1], np.nan)
            kurt = acc[:, 2] / np.where(acc[:, 3] > 0, acc[:, 3], np.nan)
        res.arrays = {"top_share": share, "kurtosis": kurt, "count": acc[:, 1].astype(np.int64)}
        res.meta["top_dims"] = None if self.dim is None else max(1, math.ceil(self.top_fraction * self.dim))
        rows = []
        for layer in range(L):
            row: dict[str, Any] = {"layer": layer, "name": str(layer_number(layer))}
            for c, cname in enumerate(KEY_CLASSES):
                row[f"{cname}_top_share"] = None if not np.isfinite(share[layer, c]) else float(share[layer, c])
                row[f"{cname}_kurtosis"] = None if not np.isfinite(kurt[layer, c]) else float(kurt[layer, c])
                row[f"{cname}_count"] = int(acc[layer, 1, c])
            rows.append(row)
        res.tables["key_concentration"] = rows
        return res


# -- what the statistics say: the best head of each pattern (the report lays it out) ----------
#: The rows of the best-heads table: (pattern, statistic ranked, what it is).
PATTERNS = (
    ("1 next word", "next", "attention to the next token"),
    ("2 previous word", "previous", "attention to the previous token"),
    ("3 same token, same segment", "repeat_same", "mass on other occurrences of the token in its segment"),
    ("4 same token, other segment", "repeat_other", "mass on occurrences of the token in the other segment"),
    ("5 other pieces of the word", "pieces", "mass on the other pieces of the token's word"),
    ("5a earlier pieces", "pieces_earlier", "mass on the word's earlier pieces"),
    ("5b later pieces", "pieces_later", "mass on the word's later pieces"),
    ("5c pieces both ways", "pieces_both", "the smaller of the earlier- and later-pieces masses "
     "(what the label tests: a previous/next-token head reaches only one side)"),
    ("6 delimiters", "delimiter", "attention to [CLS]/[SEP] (special-tokens analysis)"),
    ("bag of words", "bag", "within-segment mass x evenness of the within-segment part"),
)


def finite(x) -> float | None:
    """``x`` as a float, None where it is None or not finite (a table's empty cell)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def pattern_stats(results: dict) -> tuple[dict[str, np.ndarray], dict[str, float | None]]:
    """``[L H]`` statistics by name and their chance levels, from the finalized results of the
    patterns family's analyses (``vig-patterns``, ``special-tokens``, ``relative-position``,
    ``entropy``)."""
    vig = results["vig-patterns"]
    special = results["special-tokens"].arrays
    stats = {s: vig.arrays[s] for s in STATS}
    stats["delimiter"] = special["first"] + special["separator"]
    for k in ("first", "separator", "punct"):
        stats[k] = special[k]
    for k in ("previous", "next"):
        stats[k] = results["relative-position"].arrays[k]
    if "entropy" in results and results["entropy"].arrays:
        stats["entropy"] = results["entropy"].arrays["entropy"]
    chance = dict(vig.meta["chance"])
    stats["pieces_both"] = np.minimum(stats["pieces_earlier"], stats["pieces_later"])
    ce, cl = chance.get("pieces_earlier"), chance.get("pieces_later")
    chance["pieces_both"] = None if ce is None or cl is None else min(ce, cl)
    chance["delimiter"] = vig.meta.get("delimiter_chance")
    chance["previous"] = vig.meta.get("previous_chance")
    chance["next"] = vig.meta.get("next_chance")
    return stats, chance


def best_heads(stats: dict[str, np.ndarray], chance: dict[str, float | None], results: dict,
               labels: np.ndarray, causal: bool) -> list[dict]:
    """One row per pattern (:data:`PATTERNS`): the head with the highest value of its statistic,
    the value, its chance level and their ratio (``lift``), the example where the head scores
    highest, the head's label, or a note saying why the pattern has no head."""
    vig = results["vig-patterns"]
    rows = []
    first_index = vig.meta.get("first_index")
    ce = chance.get("within_entropy")
    for pattern, key, what in PATTERNS:
        row: dict[str, Any] = {"pattern": pattern, "statistic": key, "what": what}
        if causal and key in CAUSAL_NOT_APPLICABLE:
            row.update(head=None, value=None, chance=None, lift=None, example=None,
                       note=f"not applicable: {CAUSAL_NOT_APPLICABLE[key]}")
            rows.append(row)
            continue
        if key == "bag":
            within = stats["within"]
            even = stats["within_entropy"] / ce if ce else np.full(within.shape, np.nan)
            score, value_key = within * even, "within"
        else:
            score, value_key = stats[key], key
        if key == "delimiter" and not chance.get("delimiter"):
            row.update(head=None, value=None, chance=None, lift=None, example=None,
                       note="the inputs have no first-special or separator tokens")
            rows.append(row)
            continue
        if not np.isfinite(score).any():
            row.update(head=None, value=None, chance=None, lift=None, example=None,
                       note="no rows where the pattern can occur")
            rows.append(row)
            continue
        layer, head = (int(x) for x in np.unravel_index(int(np.nanargmax(score)), score.shape))
        value = finite(stats[value_key][layer, head])
        c = finite(chance.get(value_key))
        best_key = {"bag": "within_entropy", "pieces_both": "pieces"}.get(key, key)
        arr = vig.arrays.get(f"best_example_{best_key}")
        example = int(arr[layer, head]) if arr is not None and arr[layer, head] >= 0 else first_index
        note = ""
        if key == "bag" and ce:
            note = f"within-segment entropy {stats['within_entropy'][layer, head] / ce:.0%} of uniform"
        row.update(head=str(HeadId(layer, head)), layer=layer, head_index=head, value=value, chance=c,
                   lift=(value / c) if value is not None and c else None, example=example,
                   label=str(labels[layer, head]), note=note)
        rows.append(row)
    return rows
