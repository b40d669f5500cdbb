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
from attnscope.analyses.token_classes import TokenClasser, UnitClasses
from attnscope.analyses.top_examples import TopExamples, units_of
from attnscope.maps import AttentionBatch, AttentionMap

TO_CLASSES = ("first", "separator", "period", "comma", "punct")
STATS = TO_CLASSES + ("sep_to_sep", "other_to_sep")


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
        self.acc = PerExampleMeans(STATS)
        self.examples = 0
        self.class_counts = {k: 0 for k in ("first", "separator", "period", "comma", "units")}
        self.top = TopExamples(TO_CLASSES, seed=seed)  # where each head looks at a class most

    def params(self) -> dict[str, Any]:
        return {"denominator": self.denominator, "token_classes": self.classer.params(),
                "average": "mean over examples of per-example means", "seed": self.top.seed}

    def _add(self, attn: np.ndarray, tokens: list[str], special: np.ndarray,
             m: "AttentionMap | None" = None) -> None:
        """One example's ``attn`` ``[L H n n]`` over ``tokens`` (and its map ``m``, whose top
        rows are kept)."""
        n = len(tokens)
        k = self.classer.classify(tokens, special)
        cols = np.stack([k.first, k.separator, k.period, k.comma, k.punct]).astype(attn.dtype)  # [5 n]
        to_class = np.moveaxis(attn @ cols.T, -1, 0).astype(np.float64)  # [5 L H q]
        values = np.empty((len(STATS),) + attn.shape[:2], dtype=np.float64)  # [S L H]
        values[:5] = to_class.sum(-1) / n
        sep = k.separator
        n_sep = int(sep.sum())
        to_sep = to_class[1]  # [L H q]
        if self.denominator == "paper-code":
            d_ss, d_os = 2, n - 2
        else:
            d_ss, d_os = n_sep, n - n_sep
        values[5] = to_sep[:, :, sep].sum(-1) / max(d_ss, 1)
        values[6] = to_sep[:, :, ~sep].sum(-1) / max(d_os, 1)
        defined = np.array([True] * 5 + [n_sep > 0, n_sep > 0 and n - n_sep > 0])
        self.add_means(values, defined, k)
        if m is not None:
            self.top.offer(m.index, units_of(m), values[:5], defined[:5], to_class, attn)

    def add_means(self, values: np.ndarray, defined: np.ndarray, classes: UnitClasses) -> None:
        """One example's per-head means ``[7 L H]`` (:data:`STATS` order), which of them it
        defines ``[7]``, and its units' classes: what :meth:`update` computes from a map, and
        what the streaming engine hands over from its sums (no map)."""
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
                           "examples_with_separators": int(self.acc.counts[STATS.index("sep_to_sep")])})
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
