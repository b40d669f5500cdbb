"""Ablating heads: the loss change when one head is removed, and pruning curves (Michel et al. 2019).

- Zero ablation: the head's gate is 0, so its output (before the output projection) is zero.
- Mean ablation: the head's output at every position is replaced by its mean over all real
  token positions of the corpus (:class:`HeadMeans`, a first pass), through the forward
  helper's ``"head_out"`` hook; this keeps the average signal the next layers expect.
- Pruning curve: heads are removed (gate 0) cumulatively in a given order, e.g. least important
  first (Michel et al.'s Figure 3/4) against a seeded random order; at each fraction of heads
  removed the mean per-example loss and the accuracy of the scored positions (masked tokens for
  masked LMs, next tokens for causal models) are recorded. Each distinct set of removed heads is
  one pass (none removed, or all, is the same set in every order), from the cached input of its
  first pruned layer.

All three accumulate sums and counts over examples and divide in ``finalize``.

Ablating head ``(l, h)`` leaves layers ``0 .. l-1`` unchanged, so :class:`AblationEffect` runs
one pass of the full model per chunk of examples (the reference loss and every layer's input),
then, for each layer, every (head, example) variant from that layer's cached input on
(``forward(layers=(l, L))``), up to :data:`PASS_SEQUENCES` variants per pass: ``H (L + 1) / 2``
forward passes per example instead of ``L H`` (``batched=False``: one head per pass of the
whole model, the reference the batched path is tested against).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from attnscope.analyses.base import EncodedAnalysis, Result, register
from attnscope.analyses.lm_objective import LossInput, Objective, loss_inputs
from attnscope.data.records import HeadId
from attnscope.models.forward import batches, forward, pad_batch

#: Fractions of all heads removed along a pruning curve.
DEFAULT_FRACTIONS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
#: Sequences (head, example variants) per batched ablation pass; bounds the memory (a masked-LM
#: head's [B T V] logits: 32 x 128 tokens x 30k words take 0.5 GB).
PASS_SEQUENCES = 32


def _scorable(objective: Objective, encoded) -> tuple[list[LossInput], int]:
    keep, skipped = [], 0
    for x in loss_inputs(objective, encoded):
        if x.positions.size:
            keep.append(x)
        else:
            skipped += 1
    return keep, skipped


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


@register
class HeadMeans(EncodedAnalysis):
    """Mean of each head's output over all real token positions: ``[L H d]``."""

    name = "head-means"
    summed = ("sums", "tokens")
    requires = frozenset({"model"})

    @classmethod
    def for_model(cls, model, *, seed: int = 0) -> "HeadMeans":
        return cls(model)

    def __init__(self, lm, *, batch_size: int = 16):
        self.lm = lm
        self.batch_size = int(batch_size)
        self.sums: np.ndarray | None = None  # [L H d] float64
        self.tokens = 0

    def params(self) -> dict[str, Any]:
        return {"model": self.lm.name, "over": "real token positions"}

    def update(self, encoded) -> None:
        for chunk in batches(self.lm, encoded, self.batch_size):
            batch = pad_batch(self.lm, [e.input_ids for e in chunk], [e.token_type_ids for e in chunk])
            real = batch.attention_mask.bool().to(self.lm.device)  # [B T], indexes head outputs
            layers: list[np.ndarray] = []

            def grab(site, out, real=real, layers=layers):  # out [B T H d]
                layers.append(out[real].double().sum(0).cpu().numpy())  # [H d]

            forward(self.lm, batch, hooks={"head_out": grab})
            sums = np.stack(layers)
            self.sums = sums if self.sums is None else self.sums + sums
            self.tokens += int(real.sum())

    def finalize(self) -> Result:
        res = Result(self.name, params=self.params(), meta={"tokens": self.tokens})
        if self.sums is None or not self.tokens:
            res.summary.append("no examples")
            return res
        res.arrays["mean"] = self.sums / self.tokens
        return res


def _head_ablation_hook(layer: int, heads, values):
    """A ``"head_out"`` hook setting head ``heads[b]``'s output of sequence ``b`` at ``layer`` to
    ``values[b]`` ``[d]`` (None: zero, zero ablation; the head's mean: mean ablation)."""
    import torch

    def hook(site, out):  # out [B T H d]
        if site.layer != layer:
            return None
        new = out.clone()
        b = torch.arange(out.shape[0], device=out.device)
        h = heads.to(out.device)
        new[b, :, h, :] = 0 if values is None else values.to(out.device, out.dtype)[:, None, :]
        return new

    return hook


def mean_ablation_hook(means: np.ndarray, layer: int, head: int):
    """A ``"head_out"`` hook replacing head ``(layer, head)``'s output by ``means[layer, head]``."""
    import torch

    value = torch.as_tensor(means[layer, head])

    def hook(site, out):
        if site.layer != layer:
            return None
        new = out.clone()
        new[:, :, head, :] = value.to(out.device, out.dtype)
        return new

    return hook


@register
class AblationEffect(EncodedAnalysis):
    """Mean over examples of ``loss(head ablated) - loss(full model)`` for every head."""

    name = "ablation"
    summed = ("delta", "base", "examples", "skipped")
    requires = frozenset({"model"})

    @classmethod
    def for_model(cls, model, *, seed: int = 0) -> "AblationEffect":
        return cls(Objective(model, seed=seed))

    def __init__(self, objective: Objective, *, mode: str = "zero", means: np.ndarray | None = None,
                 batch_size: int = 16, batched: bool = True, pass_sequences: int = PASS_SEQUENCES):
        if mode not in ("zero", "mean"):
            raise ValueError(f"ablation mode must be zero or mean, not {mode!r}")
        if mode == "mean" and means is None:
            raise ValueError("mean ablation needs the heads' mean outputs (HeadMeans)")
        self.objective = objective
        self.mode = mode
        self.means = None if means is None else np.asarray(means, dtype=np.float64)
        self.batch_size = int(batch_size)
        self.batched = bool(batched)
        self.pass_sequences = int(pass_sequences)
        if self.pass_sequences < 1:
            raise ValueError("pass_sequences must be at least 1")
        lm = objective.lm
        self.delta = np.zeros((lm.num_layers, lm.num_heads), dtype=np.float64)  # sum of loss changes
        self.base = 0.0  # sum of full-model losses
        self.examples = 0
        self.skipped = 0

    def params(self) -> dict[str, Any]:
        return {"objective": self.objective.describe(), "mode": self.mode}

    def update(self, encoded) -> None:
        import torch

        inputs, skipped = _scorable(self.objective, encoded)
        self.skipped += skipped
        lm = self.objective.lm
        L, H = lm.num_layers, lm.num_heads
        dtype = next(lm.model.parameters()).dtype
        for chunk in batches(lm, inputs, self.batch_size):
            if self.batched:
                self._update_batched(chunk)
                continue
            base = self.objective.run(chunk).loss.double().cpu().numpy()
            for layer in range(L):
                for head in range(H):
                    if self.mode == "zero":
                        gates = torch.ones(L, H, dtype=dtype, device=lm.device)
                        gates[layer, head] = 0
                        out = self.objective.run(chunk, gates=gates)
                    else:
                        out = self.objective.run(chunk, hooks={"head_out": mean_ablation_hook(
                            self.means, layer, head)})
                    self.delta[layer, head] += float((out.loss.double().cpu().numpy() - base).sum())
            self.base += float(base.sum())
            self.examples += len(chunk)

    def cost(self) -> tuple[float, int]:
        """Cost of :meth:`update` over the same examples: forward passes of the encoder (a pass
        from layer ``l`` on counts ``(L - l) / L``) and passes of the loss (every variant's scored
        positions go through the whole vocabulary, however late its first layer)."""
        L, H = self.objective.lm.num_layers, self.objective.lm.num_heads
        return 1 + (H * (L + 1) / 2 if self.batched else L * H), 1 + L * H

    def _update_batched(self, chunk: list[LossInput]) -> None:
        import torch

        lm = self.objective.lm
        L, H = lm.num_layers, lm.num_heads
        ref = self.objective.run(chunk, output_hidden_states=True)
        base = ref.loss.double().cpu().numpy()
        hidden = ref.output.hidden_states  # one per model layer and one more: lm.layer_input(hidden, l) enters layer l
        dev = lm.device
        means = torch.as_tensor(self.means, device=dev) if self.mode == "mean" else None
        variants = [(head, b) for head in range(H) for b in range(len(chunk))]
        for layer in range(L):
            for part in _chunks(variants, self.pass_sequences):
                hs, bs = [h for h, _ in part], [b for _, b in part]
                heads = torch.tensor(hs, device=dev)
                values = None if means is None else means[layer, heads]
                width = max(len(chunk[b]) for b in bs)
                out = self.objective.run([chunk[b] for b in bs],
                                         hooks={"head_out": _head_ablation_hook(layer, heads, values)},
                                         layers=(layer, L),
                                         hidden=lm.layer_input(hidden, layer)[torch.tensor(bs, device=dev), :width])
                np.add.at(self.delta[layer], hs, out.loss.double().cpu().numpy() - base[bs])
        self.base += float(base.sum())
        self.examples += len(chunk)

    def finalize(self) -> Result:
        res = Result(self.name, params=self.params(),
                     meta={"examples": self.examples, "skipped": self.skipped})
        if not self.examples:
            res.summary.append("no examples")
            return res
        delta = self.delta / self.examples
        res.arrays["loss_change"] = delta
        res.meta["base_loss"] = self.base / self.examples
        H = delta.shape[1]
        res.tables[f"ablation_{self.mode}"] = [
            {"layer": layer, "head": head, "name": f"{HeadId(layer, head)}",
             "loss_change": float(delta[layer, head])}
            for layer in range(delta.shape[0]) for head in range(H)]
        return res


def importance_order(importance: np.ndarray) -> list[tuple[int, int]]:
    """Heads from least to most important (ties by position), the order Michel et al. prune in.

    >>> importance_order(np.array([[0.5, 0.1], [0.9, 0.1]]))
    [(0, 1), (1, 1), (0, 0), (1, 0)]
    """
    flat = np.asarray(importance, dtype=np.float64).ravel()
    H = importance.shape[1]
    return [divmod(int(i), H) for i in np.argsort(flat, kind="stable")]


def random_order(num_layers: int, num_heads: int, seed: int) -> list[tuple[int, int]]:
    """All heads in a seeded random order."""
    perm = np.random.default_rng(seed).permutation(num_layers * num_heads)
    return [divmod(int(i), num_heads) for i in perm]


@register
class PruningCurve(EncodedAnalysis):
    """Loss and accuracy as heads are removed cumulatively along each named order."""

    name = "pruning-curve"
    summed = ("loss", "correct", "scored", "examples", "skipped")
    requires = frozenset({"model"})

    @classmethod
    def for_model(cls, model, *, seed: int = 0) -> "PruningCurve":
        heads = [(layer, head) for layer in range(model.num_layers) for head in range(model.num_heads)]
        return cls(Objective(model, seed=seed), {"in order": heads, "reversed": heads[::-1]})

    def __init__(self, objective: Objective, orders: dict[str, Sequence[tuple[int, int]]], *,
                 fractions: Sequence[float] = DEFAULT_FRACTIONS, batch_size: int = 16):
        self.objective = objective
        self.orders = {k: [tuple(map(int, h)) for h in v] for k, v in orders.items()}
        self.fractions = tuple(float(f) for f in fractions)
        self.batch_size = int(batch_size)
        shape = (len(self.orders), len(self.fractions))
        self.loss = np.zeros(shape, dtype=np.float64)
        self.correct = np.zeros(shape, dtype=np.int64)
        self.scored = np.zeros(shape, dtype=np.int64)
        self.examples = 0
        self.skipped = 0

    def params(self) -> dict[str, Any]:
        return {"objective": self.objective.describe(), "orders": {k: [list(h) for h in v]
                                                                   for k, v in self.orders.items()},
                "fractions": list(self.fractions)}

    def removed(self, fraction: float) -> int:
        lm = self.objective.lm
        return int(round(fraction * lm.num_layers * lm.num_heads))

    def plan(self) -> dict[frozenset, list[tuple[int, int]]]:
        """Each distinct set of removed heads -> the curve points ``(order, fraction)`` it gives
        (no head removed, or all of them, is one pass whatever the order)."""
        sets: dict[frozenset, list[tuple[int, int]]] = {}
        for o, order in enumerate(self.orders.values()):
            for f, frac in enumerate(self.fractions):
                sets.setdefault(frozenset(order[:self.removed(frac)]), []).append((o, f))
        return sets

    def _schedule(self) -> tuple[dict[frozenset, list[tuple[int, int]]], dict[frozenset, int], bool]:
        """:meth:`plan`, each set's first pruned layer (0 for the set with no head removed), and
        whether the full pass runs: it gives that set's point and the layer inputs the sets that
        start past layer 0 begin from."""
        plan = self.plan()
        firsts = {heads: min((layer for layer, _ in heads), default=0) for heads in plan}
        return plan, firsts, frozenset() in plan or any(firsts.values())

    def cost(self) -> tuple[float, int]:
        """Cost of :meth:`update` over the same examples, as :meth:`AblationEffect.cost`: one
        pass per distinct set, from its first pruned layer on, and the full pass whose layer
        inputs they start from."""
        L = self.objective.lm.num_layers
        _, firsts, full = self._schedule()
        pruned = [first for heads, first in firsts.items() if heads]
        return int(full) + sum((L - first) / L for first in pruned), int(full) + len(pruned)

    def update(self, encoded) -> None:
        import torch

        inputs, skipped = _scorable(self.objective, encoded)
        self.skipped += skipped
        lm = self.objective.lm
        L = lm.num_layers
        dtype = next(lm.model.parameters()).dtype
        plan, firsts, needs_full = self._schedule()
        for chunk in batches(lm, inputs, self.batch_size):
            # layers before a set's first pruned head are the full model's: start from their output
            full = self.objective.run(chunk, output_hidden_states=True) if needs_full else None
            for heads, points in plan.items():
                if not heads:
                    out = full
                else:
                    gates = torch.ones(L, lm.num_heads, dtype=dtype, device=lm.device)
                    for layer, head in heads:
                        gates[layer, head] = 0
                    first = firsts[heads]
                    start = {} if not first else dict(layers=(first, L),
                                                      hidden=lm.layer_input(full.output.hidden_states, first))
                    out = self.objective.run(chunk, gates=gates, **start)
                loss, correct, scored = float(out.loss.double().sum()), int(out.correct.sum()), int(out.scored.sum())
                for o, f in points:
                    self.loss[o, f] += loss
                    self.correct[o, f] += correct
                    self.scored[o, f] += scored
            self.examples += len(chunk)

    def finalize(self) -> Result:
        res = Result(self.name, params=self.params(),
                     meta={"examples": self.examples, "skipped": self.skipped})
        if not self.examples:
            res.summary.append("no examples")
            return res
        loss = self.loss / self.examples
        with np.errstate(invalid="ignore", divide="ignore"):
            acc = self.correct / np.where(self.scored > 0, self.scored, np.nan)
        res.arrays["loss"] = loss
        res.arrays["accuracy"] = acc
        rows = []
        for o, name in enumerate(self.orders):
            for f, frac in enumerate(self.fractions):
                rows.append({"order": name, "fraction_removed": frac, "heads_removed": self.removed(frac),
                             "loss": float(loss[o, f]), "accuracy": float(acc[o, f])})
        res.tables["pruning_curve"] = rows
        return res
