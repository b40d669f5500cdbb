"""Value zeroing (Mohebbi, Zuidema, Chrupała & Alishahi 2023, "Quantifying Context Mixing in
Transformers").

For layer ``l`` and context token ``j``, token ``j``'s value vector is set to zero in every head
of layer ``l`` (only there), and token ``i``'s output of layer ``l`` (after its feed-forward block)
is compared with the unchanged one:

    VZ_l[i, j] = 1 - cos(x~_i^(not j), x_i),      then each row divided by its sum.

Zeroing ``v_j`` is done on the heads' outputs through the forward helper's ``"head_out"`` hook:
the head output at ``i`` is ``sum_k alpha_ik v_k``, so removing ``alpha_ij v_j`` is the same as
having zeroed ``v_j`` before the weighted sum (the probabilities ``alpha`` do not depend on the
values). Only layer ``l`` changes, so each zeroed copy runs that one layer from the example's
cached input of layer ``l`` (``forward(layers=(l, l + 1))``), up to :data:`PASS_COPIES` copies
per pass: a layer costs about ``n`` single-layer passes, ``n`` forward passes for all layers
(``batched=False``, one zeroed token per pass of the whole model as before, costs ``n * L``).
Inputs above :data:`MAX_VZ_TOKENS` are refused. For the last layer, a model whose
``hidden_states`` end after a final norm (GPT-2, Llama) is compared after that norm.
"""

from __future__ import annotations

import numpy as np

from attnscope.errors import AttnscopeError
from attnscope.models.forward import forward, pad_batch

#: Longest input value zeroing accepts by default.
MAX_VZ_TOKENS = 128
#: Zeroed copies of the example per batched pass (bounds the memory: [copies H n n] probabilities).
PASS_COPIES = 32


def forward_passes(lm, n: int, batched: bool = True) -> float:
    """Cost of :func:`value_zeroing` on ``n`` tokens in forward passes of the one example."""
    return float(n + 1) if batched else float(n * lm.num_layers + 1)


def value_zeroing(lm, encoded, *, layers: list[int] | None = None,
                  max_tokens: int = MAX_VZ_TOKENS, batched: bool = True,
                  pass_copies: int = PASS_COPIES) -> np.ndarray:
    """``[L n n]`` value-zeroing maps of one encoded example (rows sum to 1 where any context mixed).

    ``batched=False``: one zeroed token per pass of the whole model (the reference the batched
    path is tested against)."""
    import torch

    n = len(encoded.input_ids)
    if n > max_tokens:
        raise AttnscopeError(f"value zeroing is limited to {max_tokens} tokens; this input has {n}")
    if pass_copies < 1:
        raise ValueError("pass_copies must be at least 1")
    layers = list(range(lm.num_layers)) if layers is None else list(layers)
    ref = forward(lm, pad_batch(lm, [encoded.input_ids], [encoded.token_type_ids]),
                  output_hidden_states=True).output.hidden_states  # L+1 of [1 T D]
    out = np.zeros((len(layers), n, n), dtype=np.float64)
    step = pass_copies if batched else 1
    for li, target in enumerate(layers):
        for j0 in range(0, n, step):
            zeroed = torch.arange(j0, min(n, j0 + step), device=lm.device)  # copy b zeroes token j0 + b
            c = len(zeroed)
            batch = pad_batch(lm, [encoded.input_ids] * c, [encoded.token_type_ids] * c)
            probs = {}

            def grab(site, attn, target=target, probs=probs):
                if site.layer == target:
                    probs["p"] = attn

            def zero(site, head_out, target=target, probs=probs, zeroed=zeroed):  # head_out [c T Hq d]
                if site.layer != target:
                    return None
                v = site.value.repeat_interleave(site.kv_groups, dim=1)  # [c Hq T d]
                p = probs["p"]  # [c Hq T T]
                b = torch.arange(len(zeroed), device=p.device)
                vj = v[b, :, zeroed]  # [c Hq d]: value of the zeroed token in copy b
                pj = p[b, :, :, zeroed]  # [c Hq T]: every query's weight on it
                return head_out - torch.einsum("bht,bhd->bthd", pj, vj).to(head_out.dtype)

            start = ({"layers": (target, target + 1), "hidden": lm.layer_input(ref, target).expand(c, -1, -1)}
                     if batched else {})
            res = forward(lm, batch, hooks={"attn": grab, "head_out": zero}, output_hidden_states=True,
                          **start)
            h = lm.layer_output(res.output.hidden_states, target).double()  # [c T D]
            cos = torch.nn.functional.cosine_similarity(h, lm.layer_output(ref, target).double(), dim=-1)  # [c(j) T(i)]
            out[li, :, j0:j0 + c] = (1 - cos).clamp_min(0).T.cpu().numpy()  # [i j]
    tot = out.sum(-1, keepdims=True)
    return np.divide(out, tot, out=np.zeros_like(out), where=tot > 0)
