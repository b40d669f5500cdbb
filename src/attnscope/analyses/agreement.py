"""How well rollout and flow agree with raw attention and with input-gradient saliency
(Abnar & Zuidema 2020, Table 1), by Spearman rank correlation.

For each example, a few scored rows ``i`` are taken (the masked positions of a masked LM, or
evenly spaced positions predicting the next token for a causal model, at most ``rows``). Over
the keys ``j`` a row can see (all for encoders, ``j <= i`` for causal models), the row of
rollout and of flow is compared with

- ``raw``: the last layer's attention averaged over heads, row ``i``;
- ``saliency``: the input-gradient saliency of position ``i``'s loss,
  ``||dL_i / d e_j||_2`` with ``e_j`` the token embedding of input ``j`` (before position
  embeddings and LayerNorm).

The accumulator sums the correlations and counts the rows (rows where a ranking is constant
have no correlation and are counted apart). Flow is skipped for inputs above its size limit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnscope.analyses.base import EncodedAnalysis, Result, register
from attnscope.analyses.lm_objective import LossInput, Objective, loss_inputs
from attnscope.analyses.rollout import MAX_FLOW_TOKENS, attention_flow, attention_rollout
from attnscope.models.forward import forward, pad_batch

PAIRS = ("rollout~raw", "rollout~saliency", "flow~raw", "flow~saliency", "raw~saliency")


def saliency_and_attention(objective: Objective, x: LossInput, rows: np.ndarray):
    """(attention ``[L H n n]``, saliency ``[k n]`` of the loss at each of ``rows``)."""
    import torch

    lm = objective.lm
    captured = {}
    with torch.enable_grad():
        res = forward(lm, pad_batch(lm, [x.input_ids], [x.token_type_ids]), attentions=True, grad=True,
                      module_hooks=[(lm.model.get_input_embeddings(),
                                     lambda m, a, out: captured.__setitem__("e", out))])
        logits = objective.logits(res.output)[0]  # [n V]
        logp = torch.log_softmax(logits.float() if logits.dtype != torch.float64 else logits, -1)
        where = {int(p): k for k, p in enumerate(x.positions)}
        sal = []
        for i in rows:
            loss = -logp[int(i), int(x.targets[where[int(i)]])]
            (g,) = torch.autograd.grad(loss, captured["e"], retain_graph=True)
            sal.append(g[0].norm(dim=-1).double().cpu().numpy())
    attn = np.stack([a[0].detach().double().cpu().numpy() for a in res.attentions])
    return attn, np.stack(sal) if sal else np.zeros((0, len(x.input_ids)))


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman correlation with average ranks for ties; NaN when either side is constant."""
    from scipy.stats import rankdata

    ra, rb = rankdata(a), rankdata(b)
    if np.ptp(ra) == 0 or np.ptp(rb) == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


@register
class AttributionAgreement(EncodedAnalysis):
    """Mean Spearman correlation of rollout / flow with raw attention and saliency (``PAIRS``)."""

    name = "attribution-agreement"
    summed = ("sums", "counts", "undefined", "examples", "flow_skipped")
    requires = frozenset({"model"})

    @classmethod
    def for_model(cls, model, *, seed: int = 0) -> "AttributionAgreement":
        return cls(Objective(model, seed=seed))

    def __init__(self, objective: Objective, *, rows: int = 4, max_flow_tokens: int = MAX_FLOW_TOKENS):
        self.objective = objective
        self.rows = int(rows)
        self.max_flow_tokens = int(max_flow_tokens)
        self.sums = np.zeros(len(PAIRS), dtype=np.float64)
        self.counts = np.zeros(len(PAIRS), dtype=np.int64)
        self.undefined = np.zeros(len(PAIRS), dtype=np.int64)
        self.examples = 0
        self.flow_skipped = 0

    def params(self) -> dict[str, Any]:
        return {"objective": self.objective.describe(), "rows": self.rows,
                "max_flow_tokens": self.max_flow_tokens, "correlation": "Spearman, average ranks"}

    def pick_rows(self, x: LossInput) -> np.ndarray:
        pos = np.asarray(x.positions)
        if pos.size <= self.rows:
            return pos
        return pos[np.linspace(0, pos.size - 1, self.rows).round().astype(int)]

    def update(self, encoded) -> None:
        causal = self.objective.kind == "causal"
        for x in loss_inputs(self.objective, encoded):
            rows = self.pick_rows(x)
            if rows.size == 0:
                continue
            attn, sal = saliency_and_attention(self.objective, x, rows)
            roll = attention_rollout(attn)
            flow = None
            if len(x.input_ids) <= self.max_flow_tokens:
                flow = attention_flow(attn, max_tokens=self.max_flow_tokens, rows=rows)  # [k n]
            else:
                self.flow_skipped += 1
            raw = attn[-1].mean(0)
            for k, i in enumerate(rows):
                keys = slice(0, int(i) + 1) if causal else slice(None)
                vals = {"rollout": roll[i, keys], "raw": raw[i, keys], "saliency": sal[k, keys]}
                if flow is not None:
                    vals["flow"] = flow[k, keys]
                for p, pair in enumerate(PAIRS):
                    a, b = pair.split("~")
                    if a not in vals or b not in vals or vals[a].size < 2:
                        continue
                    r = spearman(vals[a], vals[b])
                    if np.isnan(r):
                        self.undefined[p] += 1
                    else:
                        self.sums[p] += r
                        self.counts[p] += 1
            self.examples += 1

    def finalize(self) -> Result:
        res = Result(self.name, params=self.params(),
                     meta={"examples": self.examples, "flow_skipped": self.flow_skipped})
        if not self.examples:
            res.summary.append("no examples")
            return res
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = self.sums / np.where(self.counts > 0, self.counts, np.nan)
        res.arrays["spearman"] = mean
        res.tables["agreement"] = [
            {"pair": pair, "spearman": float(mean[p]), "rows": int(self.counts[p]),
             "undefined_rows": int(self.undefined[p])} for p, pair in enumerate(PAIRS)]
        return res
