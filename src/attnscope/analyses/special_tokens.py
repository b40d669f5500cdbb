"""Attention to special tokens and punctuation, per head (paper section 3.2, Figure 2).

For one example with ``n`` units, one head's attention ``a`` (``[n n]``) and the unit classes
of :mod:`attnscope.analyses.token_classes` (``C`` = the columns of a class):

- to first special (``[CLS]``, ``<s>``), separators (``[SEP]``, ``</s>``), periods, commas,
  periods or commas: ``sum_i sum_{j in C} a[i, j] / n``
- separator to separator: ``sum_{i in S} sum_{j in S} a[i, j] / |S|`` (mean over separator rows)
- other to separator: ``sum_{i not in S} sum_{j in S} a[i, j] / (n - |S|)``

Every statistic is averaged over the examples that define it (an example without a
separator does not count towards separator-to-separator). The paper's released code divides
separator-to-separator by 2 and other-to-separator by ``n - 2``, i.e. it assumes exactly two
``[SEP]`` tokens; ``denominator="paper-code"`` reproduces that.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnscope.analyses.base import MapsAnalysis, Result, register
from attnscope.analyses.relative_position import DENOMINATORS, PerExampleMeans, per_head_rows
from attnscope.analyses.stat import Stat, declare, key_class_stats
from attnscope.analyses.token_classes import TokenClasser, UnitClasses
from attnscope.analyses.top_examples import TopExamples, units_of
from attnscope.maps import AttentionBatch, AttentionMap

_SOURCE = "Clark et al. 2019, section 3.2"
TO_CLASSES = declare(
    Stat("first", "attention to the first special token ([CLS], <s>)", "sum_i sum_{j first} a[i,j] / n",
         _SOURCE, "special-tokens", per_layer=True),
    Stat("separator", "attention to separators ([SEP], </s>)", "sum_i sum_{j separator} a[i,j] / n",
         _SOURCE, "special-tokens", per_layer=True),
    Stat("period", "attention to periods", "sum_i sum_{j period} a[i,j] / n", _SOURCE, "special-tokens",
         families=("general",)),
    Stat("comma", "attention to commas", "sum_i sum_{j comma} a[i,j] / n", _SOURCE, "special-tokens",
         families=("general",)),
    Stat("punct", "attention to periods or commas", "sum_i sum_{j period or comma} a[i,j] / n",
         _SOURCE, "special-tokens", per_layer=True),
)
FROM_SEPARATORS = declare(
    Stat("sep_to_sep", "separators' attention to separators", "sum_{i sep} sum_{j sep} a[i,j] / |S|",
         _SOURCE, "special-tokens"),
    Stat("other_to_sep", "other tokens' attention to separators",
         "sum_{i not sep} sum_{j sep} a[i,j] / (n - |S|)", _SOURCE, "special-tokens", families=("general",)),
)
STATS = TO_CLASSES + FROM_SEPARATORS  # and, after them, the declared key classes (Stat.keys)


@register
class SpecialTokens(MapsAnalysis):
    """Per head: mean attention to each token class, and separator-to-separator attention."""

    name = "special-tokens"
    summed = ("acc", "examples", "class_counts", "top")
    requires = frozenset()

    @classmethod
    def for_model(cls, model, *, seed: int = 0) -> "SpecialTokens":
        return cls(TokenClasser.from_tokenizer(model.tokenizer) if model is not None else None, seed=seed)

    def __init__(self, classer: TokenClasser | None = None, denominator: str = "valid", seed: int = 0):
        if denominator not in DENOMINATORS:
            raise ValueError(f"denominator must be one of {DENOMINATORS}, not {denominator!r}")
        self.classer = classer or TokenClasser.positional()
        self.denominator = denominator
        #: the declared key classes (:attr:`Stat.keys`) as of construction, computed after
        #: :data:`STATS`; their predicates travel with the analysis (to Ray workers too)
        self.key_stats = key_class_stats()
        self.keys = tuple(s.name for s in self.key_stats)
        self.to_names = TO_CLASSES + self.keys  # every mass on a class of keys
        self.stats = STATS + self.keys
        self.acc = PerExampleMeans(self.stats)
        self.examples = 0
        self.class_counts = {k: 0 for k in ("first", "separator", "period", "comma", "units")}
        self.top = TopExamples(self.to_names, seed=seed)  # where each head looks at a class most

    def params(self) -> dict[str, Any]:
        return {"denominator": self.denominator, "token_classes": self.classer.params(),
                "average": "mean over examples of per-example means", "seed": self.top.seed,
                **({"declared_key_classes": list(self.keys)} if self.keys else {})}

    def _add(self, attn: np.ndarray, tokens: list[str], special: np.ndarray,
             m: "AttentionMap | None" = None) -> None:
        """One example's ``attn`` ``[L H n n]`` over ``tokens`` (and its map ``m``, whose top
        rows are kept)."""
        n = len(tokens)
        k = self.classer.classify(tokens, special, self.key_stats)
        cols = np.stack([k.mask(name) for name in self.to_names]).astype(attn.dtype)  # [T n]
        to_class = np.moveaxis(attn @ cols.T, -1, 0).astype(np.float64)  # [T L H q]
        sep = k.separator
        n_sep = int(sep.sum())
        to_sep = to_class[1]  # [L H q]
        values = self.example_values(dict(zip(self.to_names, to_class.sum(-1))), to_sep[:, :, sep].sum(-1),
                                     to_sep[:, :, ~sep].sum(-1), n, n_sep)
        defined = self.defined(n, n_sep)
        self.add_means(values, defined, k)
        if m is not None:
            to = [self.stats.index(name) for name in self.to_names]  # to_class's order
            self.top.offer(m.index, units_of(m), values[to], defined[to], to_class, attn)

    def example_values(self, to: dict[str, np.ndarray], sep_to_sep: np.ndarray, other_to_sep: np.ndarray,
                       n: int, n_sep: int) -> np.ndarray:
        """One example's ``[S L H]`` means (:attr:`stats` order) from its sums over rows: each
        key class's mass ``to`` (by name), the separator rows' and the other rows' mass on
        separators, over its ``n`` units, ``n_sep`` of them separators (the maps path and the
        streaming engine's sums both come here)."""
        d_ss, d_os = (2, n - 2) if self.denominator == "paper-code" else (n_sep, n - n_sep)
        return np.stack([to[name] / n for name in TO_CLASSES]
                        + [sep_to_sep / max(d_ss, 1), other_to_sep / max(d_os, 1)]
                        + [to[name] / n for name in self.keys])

    def defined(self, n: int, n_sep: int) -> np.ndarray:
        """``[S]``: which statistics an example of ``n`` units, ``n_sep`` of them separators,
        defines (separator rows need a separator, other rows a unit that is not one)."""
        out = np.ones(len(self.stats), dtype=bool)
        out[len(TO_CLASSES):len(STATS)] = [n_sep > 0, n_sep > 0 and n - n_sep > 0]
        return out

    def add_means(self, values: np.ndarray, defined: np.ndarray, classes: UnitClasses) -> None:
        """One example's per-head means ``[S L H]`` (:attr:`stats` order: :data:`STATS`, then the
        declared key classes), which of them it defines ``[S]``, and its units' classes: what
        :meth:`update` computes from a map, and what the streaming engine hands over from its
        sums (no map)."""
        self.acc.add(values, np.asarray(defined, dtype=bool))
        self.examples += 1
        for name in ("first", "separator", "period", "comma"):
            self.class_counts[name] += int(classes.mask(name).sum())
        self.class_counts["units"] += len(classes.first)

    def update(self, batch: AttentionBatch) -> None:
        for m in batch:
            self._add(m.attn, m.tokens, m.special, m)

    def finalize(self) -> Result:
        means = self.acc.means()
        res = Result(self.name, params=self.params(),
                     meta={"examples": self.examples, "class_counts": dict(self.class_counts),
                           "examples_with_separators": int(self.acc.counts[self.stats.index("sep_to_sep")])})
        if not means:
            res.summary.append("no examples")
            return res
        res.arrays = {k: v.copy() for k, v in means.items()}
        res.tables["special_tokens"] = per_head_rows(means)
        res.meta["standard_error"] = self.acc.standard_errors()
        res.examples = self.top.to_json(means)
        if self.class_counts["separator"] == 0:
            res.summary.append("no separator tokens in the data (e.g. a GPT-2 style model adds none)")
            return res
        layer_sep = np.nanmean(means["separator"], axis=1)  # [L]
        mostly = [i + 1 for i in np.nonzero(layer_sep > 0.5)[0]]
        res.summary.append(
            "layers where over half the attention goes to separators (1-indexed): "
            + (", ".join(map(str, mostly)) if mostly else "none")
            + f" (highest: layer {int(np.nanargmax(layer_sep)) + 1}, {np.nanmax(layer_sep):.2f})")
        ss, os_ = means["sep_to_sep"], means["other_to_sep"]
        if np.isfinite(ss).any():
            res.summary.append(f"separators attend to separators with {np.nanmean(ss):.2f} of their "
                               f"attention on average over heads; other tokens with {np.nanmean(os_):.2f}")
        return res
