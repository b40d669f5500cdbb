"""Norm-based analysis of attention (Kobayashi, Kuribayashi, Yokoi & Inui 2020, "Attention is Not
Only a Weight").

A head's contribution of token ``j`` to token ``i`` is the vector ``alpha_ij f(x_j)`` with
``f(x) = (x W_V + b_V) W_O``: the value vector (bias included) carried through that head's
slice of the output projection. Its norm ``||alpha_ij f(x_j)|| = alpha_ij ||f(x_j)||`` says how
much actually moves; a large weight on a token with a tiny ``f`` moves little (the paper's
finding for [CLS] and [SEP]). The identity that ties it to the model:

    sum over heads h and keys j of alpha^h_ij f^h(x_j) + b_O = the output projection's output at i

(the layer's attention output before the residual and LayerNorm); the output bias ``b_O`` is
added once per token and belongs to no pair, as in the paper.

``W_O`` is found generically: during one tiny pass, the module whose input equals the
``"head_out"`` tensor of a layer is that layer's output projection (``attention.output.dense``
in BERT, ``c_proj`` in GPT-2, ``o_proj`` in Llama); its linear part ``M`` (``[Hq*d D]``) and bias
are read by applying it to the identity and to zero, so ``nn.Linear``, GPT-2's ``Conv1D`` and
any other affine module work. Values come from the forward helper's :class:`Site` (after any
bias, repeated over query heads under grouped-query attention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnscope.analyses.base import EncodedAnalysis, Result, register
from attnscope.analyses.token_classes import TokenClasser
from attnscope.data.records import layer_number
from attnscope.errors import AttnscopeError
from attnscope.models.forward import batches, forward, pad_batch

SHARE_CLASSES = ("first", "separator", "punct", "other")


def output_projections(lm) -> list:
    """Each layer's output projection module, found by matching its input to ``"head_out"``."""
    import torch

    ids = lm.tokenizer("the cat sat on the mat")["input_ids"]
    batch = pad_batch(lm, [ids])
    head_outs: list = []
    calls: list = []
    linear = [m for m in lm.model.modules() if isinstance(getattr(m, "weight", None), torch.Tensor)
              and m.weight.dim() == 2 and not isinstance(m, torch.nn.Embedding)]
    forward(lm, batch, hooks={"head_out": lambda site, out: head_outs.append(out.detach().clone())},
            module_hooks=[(m, lambda m, args, _out: calls.append((len(head_outs), m, args[0] if args else None)))
                          for m in linear])
    found: list = [None] * len(head_outs)
    for after, module, x in calls:
        layer = after - 1
        if layer < 0 or found[layer] is not None or not isinstance(x, torch.Tensor):
            continue
        ref = head_outs[layer]
        if x.numel() == ref.numel() and torch.equal(x.reshape(-1), ref.reshape(-1)):
            found[layer] = module
    missing = [i for i, m in enumerate(found) if m is None]
    if missing:
        raise AttnscopeError(f"{lm.name}: could not find the output projection of layers {missing} "
                             "(no module takes the heads' outputs as its input)")
    return found


def affine_parts(module, in_features: int, like) -> tuple[Any, Any]:
    """``(M [in D], b [D])`` of an affine module: ``module(z) = z M + b``."""
    import torch

    with torch.inference_mode():
        eye = torch.eye(in_features, dtype=like.dtype, device=like.device)
        zero = torch.zeros(1, in_features, dtype=like.dtype, device=like.device)
        b = module(zero)[0]
        m = module(eye) - b
    return m.clone(), b.clone()


@dataclass
class LayerNorms:
    """One layer of one batch: ``attn [B H T T]``, ``fnorm [B H T]`` (``||f^h(x_j)||`` per key j),
    ``f [B H T D]`` (the vectors, when kept), ``bias [D]``, ``proj_out [B T D]`` (when kept)."""

    attn: Any
    fnorm: Any
    f: Any = None
    bias: Any = None
    proj_out: Any = None

    def norms(self):
        """``||alpha_ij f(x_j)||`` per head: ``[B H T T]``."""
        return self.attn * self.fnorm[:, :, None, :]


class NormDecomposer:
    """Runs a batch and returns :class:`LayerNorms` per layer."""

    def __init__(self, lm):
        self.lm = lm
        self.projections = output_projections(lm)
        self._parts: dict[int, tuple] = {}

    def parts(self, layer: int, in_features: int, like):
        if layer not in self._parts:
            self._parts[layer] = affine_parts(self.projections[layer], in_features, like)
        return self._parts[layer]

    def run(self, batch, *, keep_vectors: bool = False, keep_outputs: bool = False) -> list[LayerNorms]:
        import torch

        layers: list[LayerNorms] = []
        probs: dict[int, Any] = {}
        proj_out: dict[int, Any] = {}

        def grab_attn(site, attn):
            probs[site.layer] = attn.detach()

        def grab_values(site, out):  # out [B T Hq d]
            v = site.value.detach()  # [B Hkv T d]
            v = v.repeat_interleave(site.kv_groups, dim=1)  # [B Hq T d]
            B, Hq, T, d = v.shape
            m, b = self.parts(site.layer, Hq * d, v)
            f = torch.einsum("bhtd,hde->bhte", v, m.reshape(Hq, d, -1).to(v.dtype))  # [B Hq T D]
            layers.append(LayerNorms(attn=probs[site.layer], fnorm=f.norm(dim=-1),
                                     f=f if keep_vectors else None, bias=b))

        keep = [(module, lambda m, a, o, i=i: proj_out.__setitem__(i, o.detach()))
                for i, module in enumerate(self.projections)] if keep_outputs else []
        forward(self.lm, batch, hooks={"attn": grab_attn, "head_out": grab_values}, module_hooks=keep)
        for i, ln in enumerate(layers):
            ln.proj_out = proj_out.get(i)
        return layers


def example_norm_maps(decomposer: NormDecomposer, encoded) -> dict[str, np.ndarray]:
    """One example's maps: ``weights [L H n n]``, ``norms [L H n n]`` (per head) and
    ``layer_norms [L n n]`` (``||sum_h alpha^h_ij f^h(x_j)||``, the layer as a whole)."""
    import torch

    batch = pad_batch(decomposer.lm, [encoded.input_ids], [encoded.token_type_ids])
    w, nm, ln = [], [], []
    for layer in decomposer.run(batch, keep_vectors=True):
        w.append(layer.attn[0].double().cpu().numpy())
        nm.append(layer.norms()[0].double().cpu().numpy())
        comb = torch.einsum("hij,hjd->ijd", layer.attn[0].double(), layer.f[0].double())
        ln.append(comb.norm(dim=-1).cpu().numpy())
    return {"weights": np.stack(w), "norms": np.stack(nm), "layer_norms": np.stack(ln)}


@register
class NormShares(EncodedAnalysis):
    """Per layer and key class: the share of attention weight vs the share of ``||alpha f||``.

    For every head and every real query row, the weight share of a class is the sum of the
    row's weights on keys of the class, and the norm share the sum of ``||alpha_ij f(x_j)||``
    over those keys divided by the sum over all keys; both are averaged over heads and rows.
    Class "first" is the first special token (``[CLS]``, ``<s>``, BOS); on a causal model whose
    input does not start with one (GPT-2, SmolLM2 add no BOS) it is position 0, the attention
    sink. ``update`` takes encoded examples (it needs the model).
    """

    name = "norm-shares"
    summed = ("weight", "norm", "rows", "examples")
    requires = frozenset({"model"})

    @classmethod
    def for_model(cls, model, *, seed: int = 0) -> "NormShares":
        return cls(model)

    def __init__(self, lm, classer: TokenClasser | None = None, *, batch_size: int = 16):
        self.lm = lm
        self.classer = classer or TokenClasser.from_tokenizer(lm.tokenizer)
        self.batch_size = int(batch_size)
        self.decomposer: NormDecomposer | None = None
        L, C = lm.num_layers, len(SHARE_CLASSES)
        self.weight = np.zeros((L, C), dtype=np.float64)
        self.norm = np.zeros((L, C), dtype=np.float64)
        self.rows = 0  # head-rows per layer
        self.examples = 0

    def params(self) -> dict[str, Any]:
        return {"model": self.lm.name, "token_classes": self.classer.params(),
                "first": "the first special token; position 0 on a causal model without one",
                "average": "over heads and real query rows"}

    def update(self, encoded) -> None:
        if self.decomposer is None:
            self.decomposer = NormDecomposer(self.lm)
        encoded = list(encoded)
        for chunk in batches(self.lm, encoded, self.batch_size):
            batch = pad_batch(self.lm, [e.input_ids for e in chunk], [e.token_type_ids for e in chunk])
            layers = self.decomposer.run(batch)
            for b, e in enumerate(chunk):
                n = len(e.input_ids)
                k = self.classer.classify(e.tokens, np.asarray(e.special, dtype=bool))
                first = k.first.copy()
                if self.lm.facts.causal and n and not first[0]:  # no BOS: the sink is position 0
                    first[0] = True
                cols = np.stack([first, k.separator & ~first, k.punct & ~first,
                                 k.other & ~first]).astype(np.float64).T  # [n C]
                for layer, ln in enumerate(layers):
                    a = ln.attn[b, :, :n, :n].double().cpu().numpy()  # [H n n]
                    nm = a * ln.fnorm[b, :, None, :n].double().cpu().numpy()
                    tot = nm.sum(-1, keepdims=True)
                    share = np.divide(nm, tot, out=np.zeros_like(nm), where=tot > 0)
                    self.weight[layer] += (a @ cols).sum((0, 1))
                    self.norm[layer] += (share @ cols).sum((0, 1))
                self.rows += self.lm.num_heads * n
                self.examples += 1

    def finalize(self) -> Result:
        res = Result(self.name, params=self.params(), meta={"examples": self.examples})
        if not self.rows:
            res.summary.append("no examples")
            return res
        w, nm = self.weight / self.rows, self.norm / self.rows
        res.arrays["weight_share"] = w
        res.arrays["norm_share"] = nm
        res.tables["norm_shares"] = [
            {"layer": layer, "name": str(layer_number(layer)),
             **{f"weight_{c}": float(w[layer, i]) for i, c in enumerate(SHARE_CLASSES)},
             **{f"norm_{c}": float(nm[layer, i]) for i, c in enumerate(SHARE_CLASSES)}}
            for layer in range(w.shape[0])]
        return res
