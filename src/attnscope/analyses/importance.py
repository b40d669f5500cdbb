"""Head importance of Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?".

Every head's output is multiplied by a gate ``xi[l, h]`` (1 = the unchanged model) and

    I[l, h] = E_x | dL(x) / d xi[l, h] |     at xi = 1,

the expected absolute gradient of an example's loss (:mod:`attnscope.analyses.lm_objective`)
with respect to the gate, over the corpus (``norm="paper"``, the default). Gates are given per
example (``[B L H]``), so one backward pass over a padded batch yields every example's own
gradient. As in the paper's section 4.1, the scores of each layer are then divided by their L2
norm over the layer's heads (``importance``); the raw expectation is kept too
(``importance_raw``).

``norm="released"`` is the normalisation of Michel et al.'s released code instead: a gate per
head and *position* ``t`` (its output at ``t``, ``dL/d xi_t = <dL/d o_t, o_t>``), the absolute
value taken per position, summed over positions and examples and divided by the number of
tokens::

    I_released[l, h] = sum_x sum_t | dL(x) / d xi_t[l, h] |  /  sum_x n_x

with ``n_x`` the example's tokens (all of them, special tokens included, as the code's
``input_mask``). Since ``dL/d xi = sum_t dL/d xi_t``, the paper takes the absolute value of the
sum and the code the sum of absolute values. Both are then normalised per layer the same way.

>>> imp = HeadImportance(objective); imp.update(encoded); imp.finalize()   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnscope.analyses.base import EncodedAnalysis, Result, register
from attnscope.analyses.lm_objective import LossInput, Objective, loss_inputs
from attnscope.data.records import HeadId
from attnscope.models.forward import batches

#: ``norm`` of :class:`HeadImportance`: the paper's equation, or Michel et al.'s released code.
NORMS = ("paper", "released")


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


def position_gate_gradients(objective: Objective, inputs: list[LossInput]) -> list[np.ndarray]:
    """``dL_b / d xi[b, t, l, h]`` at xi = 1 with one gate per head and position (multiplying
    the head's output at ``t`` through the ``"head_out"`` hook): one ``[n L H]`` float64 array
    per example (its ``n`` real positions)."""
    import torch

    lm = objective.lm
    dtype = next(lm.model.parameters()).dtype
    width = max(len(x) for x in inputs)
    gates = torch.ones(len(inputs), lm.num_layers, width, lm.num_heads, dtype=dtype,
                       requires_grad=True, device=lm.device)  # [B L T H]

    def gate(site, out):  # out [B T H d]
        return out * gates[:, site.layer].to(out.dtype)[..., None]

    with torch.enable_grad():
        out = objective.run(inputs, hooks={"head_out": gate}, grad=True)
        (grad,) = torch.autograd.grad(out.loss.sum(), gates)
    grad = grad.detach().double().cpu().numpy().transpose(0, 2, 1, 3)  # [B T L H]
    return [grad[b, :len(x)] for b, x in enumerate(inputs)]


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
    summed = ("sums", "examples", "tokens", "skipped")
    requires = frozenset({"model"})

    @classmethod
    def for_model(cls, model, *, seed: int = 0) -> "HeadImportance":
        return cls(Objective(model, seed=seed))

    def __init__(self, objective: Objective, *, batch_size: int = 8, norm: str = "paper"):
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {', '.join(NORMS)}, not {norm!r}")
        self.objective = objective
        self.batch_size = int(batch_size)
        self.norm = norm
        self.sums: np.ndarray | None = None  # [L H] sum of |dL/d xi| (per example or per position)
        self.examples = 0
        self.tokens = 0  # real positions of the examples added
        self.skipped = 0  # examples with nothing to predict

    def params(self) -> dict[str, Any]:
        estimate = ("mean over examples of |dL/d gate| at gate 1 (one gate per head and example)"
                    if self.norm == "paper" else
                    "sum over examples and positions of |dL/d gate| at gate 1 (one gate per head and "
                    "position), divided by the number of tokens (Michel et al.'s released code)")
        return {"objective": self.objective.describe(), "normalisation": "L2 per layer",
                "norm": self.norm, "estimate": estimate}

    def add(self, grads: np.ndarray) -> None:
        """Accumulate per-example gate gradients ``[B L H]`` (``norm="paper"``)."""
        mag = np.abs(np.asarray(grads, dtype=np.float64)).sum(0)
        self.sums = mag if self.sums is None else self.sums + mag
        self.examples += int(grads.shape[0])

    def add_positions(self, grads: list[np.ndarray]) -> None:
        """Accumulate per-position gate gradients, one ``[n L H]`` per example (``norm="released"``)."""
        for g in grads:
            mag = np.abs(np.asarray(g, dtype=np.float64)).sum(0)
            self.sums = mag if self.sums is None else self.sums + mag
            self.examples += 1
            self.tokens += int(g.shape[0])

    def update(self, encoded) -> None:
        inputs = []
        for x in loss_inputs(self.objective, encoded):
            if x.positions.size:
                inputs.append(x)
            else:
                self.skipped += 1
        for chunk in batches(self.objective.lm, inputs, self.batch_size):
            if self.norm == "paper":
                self.add(gate_gradients(self.objective, chunk))
                self.tokens += sum(len(x) for x in chunk)
            else:
                self.add_positions(position_gate_gradients(self.objective, chunk))

    def finalize(self) -> Result:
        res = Result(self.name, params=self.params(),
                     meta={"examples": self.examples, "tokens": self.tokens, "skipped": self.skipped})
        if self.sums is None or self.examples == 0:
            res.summary.append("no examples")
            return res
        raw = self.sums / (self.examples if self.norm == "paper" else self.tokens)
        norm = normalise_per_layer(raw)
        res.arrays["importance_raw"] = raw
        res.arrays["importance"] = norm
        order = np.argsort(-norm, axis=None, kind="stable")
        rank = np.empty(norm.size, dtype=np.int64)
        rank[order] = np.arange(1, norm.size + 1)
        H = norm.shape[1]
        res.tables["head_importance"] = [
            {"layer": layer, "head": head, "name": f"{HeadId(layer, head)}",
             "importance": float(norm[layer, head]), "importance_raw": float(raw[layer, head]),
             "rank": int(rank[layer * H + head])}
            for layer in range(norm.shape[0]) for head in range(H)]
        return res
