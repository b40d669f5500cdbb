"""Value zeroing (Mohebbi, Zuidema, Chrupała & Alishahi 2023, "Quantifying Context Mixing in
Transformers").

For layer ``l`` and context token ``j``, token ``j``'s value vector is set to zero in every head
of layer ``l`` (only there), and token ``i``'s output of layer ``l`` (after its feed-forward block)
is compared with the unchanged one:

    VZ_l[i, j] = 1 - cos(x~_i^(not j), x_i),      then each row divided by its sum.

Zeroing ``v_j`` is done on the heads' outputs through the forward helper's ``"head_out"`` hook:
the head output at ``i`` is ``sum_k alpha_ik v_k``, so removing ``alpha_ij v_j`` is the same as
having zeroed ``v_j`` before the weighted sum (the probabilities ``alpha`` do not depend on the
values). One layer costs one batched forward of ``n + 1`` copies of the example (copy ``j``
zeroes token ``j``; the last copy is the unchanged reference), so inputs above
:data:`MAX_VZ_TOKENS` are refused. For the last layer, a model whose ``hidden_states`` end after
a final norm (GPT-2, Llama) is compared after that norm.
"""

from __future__ import annotations

import numpy as np

from attnscope.errors import AttnscopeError

#: Longest input value zeroing accepts by default (one batch of n + 1 copies per layer).
MAX_VZ_TOKENS = 128


def value_zeroing(lm, encoded, *, layers: list[int] | None = None,
                  max_tokens: int = MAX_VZ_TOKENS) -> np.ndarray:
    """``[L n n]`` value-zeroing maps of one encoded example (rows sum to 1 where any context mixed)."""
    import torch

    from attnscope.models.forward import forward, pad_batch

    n = len(encoded.input_ids)
    if n > max_tokens:
        raise AttnscopeError(f"value zeroing is limited to {max_tokens} tokens (one batch of n + 1 "
                             f"copies per layer); this input has {n}")
    layers = list(range(lm.num_layers)) if layers is None else list(layers)
    batch = pad_batch(lm, [encoded.input_ids] * (n + 1), [encoded.token_type_ids] * (n + 1))
    zeroed = torch.arange(n, device=lm.device)  # copy b zeroes token b; copy n is the reference
    out = np.zeros((len(layers), n, n), dtype=np.float64)
    for li, target in enumerate(layers):
        probs = {}

        def grab(site, attn, target=target, probs=probs):
            if site.layer == target:
                probs["p"] = attn

        def zero(site, head_out, target=target, probs=probs):  # head_out [B T Hq d]
            if site.layer != target:
                return None
            v = site.value.repeat_interleave(site.kv_groups, dim=1)  # [B Hq T d]
            p = probs["p"]  # [B Hq T T]
            b = torch.arange(n, device=p.device)
            vj = v[b, :, zeroed]  # [n Hq d]: value of the zeroed token in copy b
            pj = p[b, :, :, zeroed]  # [n Hq T]: every query's weight on it
            new = head_out.clone()
            new[:n] -= torch.einsum("bht,bhd->bthd", pj, vj).to(head_out.dtype)
            return new

        res = forward(lm, batch, hooks={"attn": grab, "head_out": zero}, output_hidden_states=True)
        h = res.output.hidden_states[target + 1].double()  # [n+1 T D]
        ref = h[n]  # [T D]
        cos = torch.nn.functional.cosine_similarity(h[:n], ref[None], dim=-1)  # [n(j) T(i)]
        dist = (1 - cos).clamp_min(0).T  # [i j]
        out[li] = dist.cpu().numpy()
    tot = out.sum(-1, keepdims=True)
    return np.divide(out, tot, out=np.zeros_like(out), where=tot > 0)
