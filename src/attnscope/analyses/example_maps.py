"""The attribution family's one-example passes: the maps of one example by every method that
draws one (:func:`example_maps`: raw attention, rollout and flow, norms, value zeroing), and the
measured cost per token of a forward and a loss pass (:func:`seconds_per_token`), which says how
long a long method will take before it starts. Run through the executor
(:meth:`attnscope.families.base.Passes.call`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from attnscope.analyses.lm_objective import loss_inputs
from attnscope.analyses.norms import NormDecomposer, example_norm_maps
from attnscope.analyses.rollout import attention_flow, attention_rollout
from attnscope.analyses.value_zeroing import MAX_VZ_TOKENS, forward_passes, value_zeroing
from attnscope.models.forward import forward, pad_batch


def seconds_per_token(lm, encoded, batch_size: int, objective=None) -> tuple[float, float]:
    """Measured seconds per token over the first batch: of a forward pass, and of ``objective``'s
    loss on top of it (its loss pass less the forward pass; 0 without ``objective``)."""
    chunk = encoded[:batch_size]
    tokens = max(1, sum(len(e) for e in chunk))
    t = time.perf_counter()
    forward(lm, pad_batch(lm, [e.input_ids for e in chunk], [e.token_type_ids for e in chunk]))
    passed = time.perf_counter() - t
    if objective is None:
        return passed / tokens, 0.0
    t = time.perf_counter()
    objective.run(loss_inputs(objective, chunk))
    return passed / tokens, max(0.0, time.perf_counter() - t - passed) / tokens


def example_maps(lm, e, methods: list[str], *, flow_max_tokens: int, notes: list[str],
                 announce: Callable | None = None) -> dict | None:
    """The maps of one encoded example ``e`` by every method that draws one (rollout, flow,
    norms, value zeroing), or None when none was chosen; what is skipped goes to ``notes``.
    ``announce(name, method, cost, tokens, per_token)``: told before value zeroing, with its
    cost (:func:`seconds_per_token`), so a caller can say how long it will take."""
    if not any(m in methods for m in ("rollout", "norms", "value-zeroing")):
        return None
    maps = example_norm_maps(NormDecomposer(lm), e) if "norms" in methods else None
    weights = maps["weights"] if maps is not None else example_attention(lm, e)  # [L H n n]
    example = {"index": e.index, "tokens": list(e.tokens), "weights": weights.mean(1),
               "norms": maps["layer_norms"] if maps is not None else None}
    if "rollout" in methods:
        example["rollout"] = attention_rollout(weights)
        if len(e) <= flow_max_tokens:
            example["flow"] = attention_flow(weights, max_tokens=flow_max_tokens)
        else:
            notes.append(f"attention flow of example {e.index} skipped: {len(e)} tokens is above "
                         f"--attribution-flow-max-tokens {flow_max_tokens}")
    if "value-zeroing" in methods:
        if len(e) <= MAX_VZ_TOKENS:
            if announce is not None:
                announce("value zeroing", "value-zeroing", (forward_passes(lm, len(e)), 0), len(e),
                         seconds_per_token(lm, [e], 1))
            example["value_zeroing"] = value_zeroing(lm, e)
        else:
            notes.append(f"value zeroing of example {e.index} skipped: {len(e)} tokens is above "
                         f"{MAX_VZ_TOKENS}")
    return example


def example_attention(lm, encoded) -> np.ndarray:
    """One example's attention maps ``[L H n n]`` float64 (the model's own, no hook needed)."""
    out = forward(lm, pad_batch(lm, [encoded.input_ids], [encoded.token_type_ids]), attentions=True)
    return np.stack([a[0].double().cpu().numpy() for a in out.attentions])
