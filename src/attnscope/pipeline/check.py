"""``attnscope check MODEL``: is attnscope right about this model? What a user runs before trusting
a new architecture.

On a short built-in text (two sentences and a repeated random sequence, so induction heads have
something to find), in seconds on the CPU:

1. attnscope's attention maps are compared with transformers' own eager ``output_attentions``
   of the same model (run without attnscope's attention function): they must be equal exactly,
   since both come from the family's own eager code;
2. every streaming backend that can take the model on this machine folds the long-context
   statistics (sink, entropy, largest weight, previous token, distances, induction ...) in the
   same pass as the eager maps' (``stream_stats(reference=)``: both see the very same queries and
   keys), and the largest difference is held to float32 rounding of one softmax row of ``n``
   terms and its logarithms, ``eps32 * n * (1 + ln n)``;
3. a backend that cannot take the model is named with the reason (not built here, lacks a
   mechanism the model has, the model's code is outside AttentionInterface).

The verdict is ``exact`` (difference 0), ``rounding`` (within the bound) or ``DISAGREES``; the
command exits 2 when anything disagrees.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope.engines.rows import row_rounding
from attnscope.errors import AttnscopeError

#: the built-in text (with an induction sequence of :data:`INDUCTION` random tokens, twice)
TEXT = ("The old man saw the red house on the hill. When he ran to it, the small dog ran after him, "
        "and she said that it was big.")
INDUCTION = 12
#: the first row: attnscope's maps against transformers' eager ``output_attentions``
MAPS = "eager maps"
#: the length of the long-context pass whose plan the report shows (``analyze longctx``'s default)
LONG = 4096


@dataclass(frozen=True)
class Row:
    """One thing compared: ``what`` (:data:`MAPS` or a streaming backend's name), the largest difference from
    transformers' eager attention (None where nothing ran), the bound it is held to, the
    verdict and, where it did not run, why."""

    what: str
    difference: float | None
    bound: float | None
    verdict: str  # exact | rounding | DISAGREES | refused | unavailable
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict != "DISAGREES"


@dataclass(frozen=True)
class CheckReport:
    """What :func:`check` found for one model."""

    model: str
    facts: Any  # attnscope.models.facts.ModelFacts
    tokens: int
    rows: tuple[Row, ...] = field(default_factory=tuple)
    seed: int = 0
    #: what ``analyze longctx`` would run at its default length (:func:`long_plan`), or why nothing
    plan: Any = None  # attnscope.engines.plan.Plan
    plan_refused: str = ""

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def describe(self) -> dict[str, Any]:
        return {"model": self.model, "attention": self.facts.describe(), "tokens": self.tokens, "seed": self.seed,
                "ok": self.ok, "rows": [{"what": r.what, "difference": r.difference, "bound": r.bound,
                                         "verdict": r.verdict, "reason": r.reason} for r in self.rows],
                "plan": self.plan.describe() if self.plan is not None else None, "plan_refused": self.plan_refused}

    def plan_lines(self) -> list[str]:
        """What ``analyze longctx`` would run on this model at its defaults, and why."""
        if self.plan is None:
            return [f"analyze longctx: refused: {self.plan_refused}"]
        return [f"analyze longctx at {LONG:,} tokens (its defaults), automatically:", *self.plan.lines()]

    def summary(self) -> list[tuple[str, str]]:
        """The model's half of the table, ``(label, value)``."""
        f = self.facts
        own = ", ".join(str(i + 1) for i in f.attention_layers)
        return [("model", self.model), ("kind", f.kind),
                ("layers with attention", f"{len(f.attention_layers)} of {f.layers}"
                 + (f" ({own})" if len(f.attention_layers) != f.layers else "")),
                ("heads", str(f.heads)), ("key/value heads", str(f.kv_heads)),
                ("head size (q/k, v)", f"{f.qk_size}, {f.v_size}"),
                ("mechanisms", ", ".join(f.mechanisms) or "none"),
                ("hooks", "attnscope's adapter of its own attention code" if f.adapted else
                 "AttentionInterface" if f.hooks else "maps only (outside AttentionInterface)"),
                ("padding", "changes no map" if f.pads else "changes the maps: one length a batch"),
                ("tokens checked", str(self.tokens))]


def _verdict(difference: float, bound: float) -> str:
    return "exact" if difference == 0 else "rounding" if difference <= bound else "DISAGREES"


def _largest_difference(got: dict, ref: dict) -> float:
    worst = 0.0
    for key, value in ref.items():
        a, b = np.asarray(got[key], dtype=np.float64), np.asarray(value, dtype=np.float64)
        both = np.isfinite(a) & np.isfinite(b)
        if not np.array_equal(np.isfinite(a), np.isfinite(b)):
            return math.inf  # one side has a value where the other has none
        if both.any():
            worst = max(worst, float(np.abs(a[both] - b[both]).max()))
    return worst


def _maps_row(lm, ids: list[int]) -> Row:
    """attnscope's maps against transformers' own eager ``output_attentions`` of the same model."""
    from attnscope.models.capture import beside_eager

    ours, theirs = beside_eager(lm, ids)
    if len(theirs) != len(ours):
        return Row(MAPS, math.inf, 0.0, "DISAGREES", f"{len(ours)} layers of maps for transformers' {len(theirs)}")
    if any(a.shape != b.shape for a, b in zip(ours, theirs)):
        return Row(MAPS, math.inf, 0.0, "DISAGREES", "maps of other shapes than transformers'")
    diff = max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs))
    return Row(MAPS, diff, 0.0, "exact" if diff == 0 else "DISAGREES")


def _backend_rows(lm, sequences, targets, skip: Collection[str] = ()) -> list[Row]:
    """Each backend asked for by name (its plan refuses what it cannot take, with the reason),
    folding the statistics beside the eager maps' of the same pass; those in ``skip`` are left
    out (``unavailable``, saying so)."""
    from attnscope.analyses.longctx import LongContextStats
    from attnscope.engines import backends
    from attnscope.engines.plan import plan
    from attnscope.engines.streaming import stream_stats

    longest = max(len(s) for s in sequences)
    bound = row_rounding(longest)
    rows = []
    for b in backends.BACKENDS:
        if b.name in skip:
            rows.append(Row(b.name, None, None, "unavailable", "left out by the caller"))
            continue
        if not b.usable(lm.device.type):
            rows.append(Row(b.name, None, None, "unavailable", f"cannot run on {lm.device.type} here ({b.why})"))
            continue
        try:
            p = plan(lm, longest=longest, engine="streaming", backend=b.name, probes=True)
        except AttnscopeError as err:
            rows.append(Row(b.name, None, None, "refused", str(err)))
            continue
        got, ref = (LongContextStats(js_rows=2, causal=lm.facts.causal) for _ in range(2))
        stream_stats(lm, sequences, got, targets=targets, plan=p, reference=ref)
        diff = _largest_difference(got.means(), ref.means())
        rows.append(Row(b.name, diff, bound, _verdict(diff, bound)))
    return rows


def check_loaded(lm, *, seed: int = 0, skip: Collection[str] = ()) -> CheckReport:
    """:func:`check` of a loaded model (:class:`~attnscope.models.loaded.LoadedModel`), without
    the backends named in ``skip``."""
    from attnscope.engines.plan import plan
    from attnscope.engines.streaming import induction_sequences

    ids = list(lm.tokenizer(TEXT)["input_ids"])[: lm.max_positions]
    rows = [_maps_row(lm, ids)]
    if rows[0].ok:  # the statistics are compared with the maps': only once the maps are right
        repeated, targets = induction_sequences(lm, 1, INDUCTION, seed=seed)
        rows += _backend_rows(lm, [ids, *repeated], [None, *targets], skip)
    try:
        long = plan(lm, longest=min(LONG, lm.max_positions), probes=lm.facts.causal)
        refused = ""
    except AttnscopeError as err:
        long, refused = None, str(err)
    return CheckReport(lm.display_name, lm.facts, len(ids), tuple(rows), seed, long, refused)


def check(model: Any = "default", tokenizer: Any = None, *, seed: int = 0, device: str | None = "cpu") -> CheckReport:
    """Compare every engine and backend that can take ``model`` with transformers' own eager
    attention on a short built-in text (module docstring). ``model``: a name
    (:func:`~attnscope.models.load_model`), a loaded model, or a transformers model object with
    its ``tokenizer``.

    >>> report = check("debug:llama")
    >>> report.ok, report.facts.kind, [r.verdict for r in report.rows][:1]
    (True, 'causal', ['exact'])
    """
    from attnscope.models.loading import LoadedModel, borrowed, load_model

    if isinstance(model, LoadedModel):
        return check_loaded(model, seed=seed)
    if isinstance(model, str):
        return check_loaded(load_model(model, seed=seed, device=device), seed=seed)
    with borrowed(model, tokenizer) as lm:
        return check_loaded(lm, seed=seed)
