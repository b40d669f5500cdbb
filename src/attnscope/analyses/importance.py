"""Head importance of Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?".

Every head's output is multiplied by a gate ``xi[l, h]`` (1 = the unchanged model) and

    I[l, h] = E_x | dL(x) / d xi[l, h] |     at xi = 1,

the expected absolute gradient of an example's loss (:mod:`attnscope.analyses.lm_objective`)
with respect to the gate, over the corpus. Gates are given per example (``[B L H]``), so one
backward pass over a padded batch yields every example's own gradient. As in the paper's
section 4.1, the scores of each layer are then divided by their L2 norm over the layer's heads
(``importance``); the raw expectation is kept too (``importance_raw``).

>>> imp = HeadImportance(objective); imp.update(encoded); imp.finalize()   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnscope.analyses.base import EncodedAnalysis, Result, register
from attnscope.analyses.lm_objective import LossInput, Objective, loss_inputs


def gate_gradients(objective: Objective, inputs: list[LossInput]) -> np.ndarray:
    """``dL_b / d xi[b, l, h]`` at xi = 1 for each example of ``inputs``: ``[B L H]`` float64."""
    import torch

    lm = objective.lm
    dtype = next(lm.model.parameters()).dtype
    gates = torch.ones(len(inputs), lm.num_layers, lm.num_heads, dtype=dtype, requires_grad=True,
                       device=lm.device)
    with torch.enable_grad():
        out = objective.run(inputs, gates=gates, grad=True)
        (grad,) = torch.autograd.grad(out.loss.sum(), gates)
    return grad.detach().double().cpu().numpy()


def normalise_per_layer(scores: np.ndarray) -> np.ndarray:
    """Divide each layer's row of ``[L H]`` scores by its L2 norm (Michel et al., section 4.1).

    >>> normalise_per_layer(np.array([[3.0, 4.0], [0.0, 0.0]])).tolist()
    [[0.6, 0.8], [0.0, 0.0]]
    """
    norm = np.linalg.norm(scores, axis=-1, keepdims=True)
    return np.divide(scores, norm, out=np.zeros_like(scores, dtype=np.float64), where=norm > 0)


@register
class HeadImportance(EncodedAnalysis):
    """Expected |dL/d gate| per head; ``update`` takes encoded examples (it needs the model)."""

    name = "head-importance"
    requires = frozenset({"model"})

    @classmethod
    def for_model(cls, model, *, seed: int = 0) -> "HeadImportance":
        return cls(Objective(model, seed=seed))

    def __init__(self, objective: Objective, *, batch_size: int = 8):
        self.objective = objective
        self.batch_size = int(batch_size)
        self.sums: np.ndarray | None = None  # [L H] sum over examples of |dL/d xi|
        self.examples = 0
        self.skipped = 0  # examples with nothing to predict

    def params(self) -> dict[str, Any]:
        return {"objective": self.objective.describe(), "normalisation": "L2 per layer",
                "estimate": "mean over examples of |dL/d gate| at gate 1"}

    def add(self, grads: np.ndarray) -> None:
        """Accumulate per-example gate gradients ``[B L H]``."""
        mag = np.abs(np.asarray(grads, dtype=np.float64)).sum(0)
        self.sums = mag if self.sums is None else self.sums + mag
        self.examples += int(grads.shape[0])

    def update(self, encoded) -> None:
        inputs = []
        for x in loss_inputs(self.objective, encoded):
            if x.positions.size:
                inputs.append(x)
            else:
                self.skipped += 1
        for i in range(0, len(inputs), self.batch_size):
            self.add(gate_gradients(self.objective, inputs[i:i + self.batch_size]))

    def merge(self, other: "HeadImportance") -> "HeadImportance":
        self._check_mergeable(other)
        if other.sums is not None:
            self.sums = other.sums.copy() if self.sums is None else self.sums + other.sums
        self.examples += other.examples
        self.skipped += other.skipped
        return self

    def finalize(self) -> Result:
        res = Result(self.name, params=self.params(),
                     meta={"examples": self.examples, "skipped": self.skipped})
        if self.sums is None or self.examples == 0:
            res.summary.append("no examples")
            return res
        raw = self.sums / self.examples
        norm = normalise_per_layer(raw)
        res.arrays["importance_raw"] = raw
        res.arrays["importance"] = norm
        order = np.argsort(-norm, axis=None, kind="stable")
        rank = np.empty(norm.size, dtype=np.int64)
        rank[order] = np.arange(1, norm.size + 1)
        H = norm.shape[1]
        res.tables["head_importance"] = [
            {"layer": layer, "head": head, "name": f"{layer + 1}-{head + 1}",
             "importance": float(norm[layer, head]), "importance_raw": float(raw[layer, head]),
             "rank": int(rank[layer * H + head])}
            for layer in range(norm.shape[0]) for head in range(H)]
        return res
