"""DuoAttention's mixed attention (Xiao et al. 2024): every key/value head's output is
``a * full + (1 - a) * streaming``, ``full`` the head's causal attention and ``streaming`` the same
head restricted to the first ``sink`` keys and the last ``window`` (``j < sink`` or
``i - window < j <= i``), ``a`` the KV head's gate, shared by its query heads. With every gate at
1 the model is unchanged; the gates are what :mod:`attnscope.analyses.duo` trains.
"""

from __future__ import annotations

from attnscope.errors import AttnscopeError

#: the model mechanisms the mixed attention computes as the model does (torch's sdpa on the
#: head's queries, keys and values, with its own masks)
COMPUTES = frozenset({"scale", "value-size"})


class GateMix:
    """The ``"attend"`` hook (:func:`attnscope.models.forward.hooked`) of the mixed attention,
    differentiable in ``gates`` ``[L Hkv]`` (a tensor that may require grad). Batch rows are
    unpadded sequences of one length (the training data)."""

    def __init__(self, gates, sink: int, window: int):
        self.gates, self.sink, self.window = gates, sink, window
        self._masks: dict = {}

    def masks(self, T: int, device):
        """``(causal, streaming)`` bool ``[T T]`` (True: the key is attended)."""
        import torch

        key = (T, str(device))
        if key not in self._masks:
            i = torch.arange(T, device=device)[:, None]
            j = torch.arange(T, device=device)[None, :]
            causal = j <= i
            self._masks[key] = (causal, causal & ((j < self.sink) | (j > i - self.window)))
        return self._masks[key]

    def __call__(self, site, query):
        import torch.nn.functional as F

        if getattr(getattr(site.module, "config", None), "attn_logit_softcapping", None):
            raise AttnscopeError("DuoAttention's gates: soft-capped attention (Gemma 2) is not supported",
                                 params=("model",))
        B, Hq, T, _ = query.shape
        k, v = site.key, site.value
        g = Hq // k.shape[1]
        causal, streaming = self.masks(T, query.device)
        full = F.scaled_dot_product_attention(query, k, v, attn_mask=causal, scale=site.scaling, enable_gqa=True)
        local = F.scaled_dot_product_attention(query, k, v, attn_mask=streaming, scale=site.scaling,
                                               enable_gqa=True)
        a = self.gates[site.layer].to(query.dtype).repeat_interleave(g)[None, :, None, None]  # [1 Hq 1 1]
        return (local + a * (full - local)).transpose(1, 2)  # [B T Hq d]
