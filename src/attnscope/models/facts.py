"""What a model is, read from the model itself (:class:`ModelFacts`).

Nothing here is looked up by name. The facts come from one short forward pass over a few tokens
(:func:`read_facts`) with transformers' eager attention:

- the kind: ``encoder-decoder`` where the config says so (``is_encoder_decoder``); otherwise
  ``causal`` where every layer's eager map is exactly zero above its diagonal (a query sees no
  later key: masked scores give probability 0 exactly, unmasked ones never do), ``bidirectional``
  where none is; a model whose layers disagree is refused, never guessed;
- which of the model's layers have attention (the attention modules' own ``layer_idx``: a hybrid
  with Mamba or linear-attention layers has attention in only some of them);
- query heads, key/value heads, and the query/key and value head sizes, kept apart (multi-head
  latent attention: DeepSeek-V3's value heads are smaller than its query heads), from the tensors
  each layer's attention is handed;
- the mechanisms: learned sinks (GPT-OSS's ``s_aux``), logit soft-capping, sliding windows and
  chunks, a score scale other than ``1/sqrt(d)``, ALiBi, and a bias per query and key (a
  relative-position bias).

Longformer, LED and LongT5 report local attention in a layout of their own (a column per offset,
or blocks: :mod:`attnscope.models.local_maps`); the probe names it (:attr:`ModelFacts.local`) and
every later pass lays their maps out over the tokens.

Where a model does not route attention through transformers' ``AttentionInterface`` the pass
returns only the maps: the kind, the layers and the heads come from them, the head sizes from the
config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnscope.errors import ModelError
from attnscope.models import adapters
from attnscope.models.local_maps import layout_of, token_maps

KINDS = ("causal", "bidirectional", "encoder-decoder")
#: the mechanisms a model can have that change how attention is computed, as :attr:`ModelFacts.mechanisms` names them
MECHANISMS = ("sinks", "sink-scale", "value-size", "softcap", "window", "chunk", "scale", "alibi", "position-bias",
              "hybrid")


@dataclass(frozen=True)
class ModelFacts:
    """What a model's attention is (see the module docstring).

    >>> f = ModelFacts("causal", 2, (0, 1), 4, 2, 8, 8, 8 ** -0.5)
    >>> f.causal, f.kv_groups, f.mechanisms
    (True, 2, ())
    """

    kind: str
    layers: int  # the model's layers (with attention or not)
    attention_layers: tuple[int, ...]  # the model's own indices of those with attention
    heads: int  # query heads per layer
    kv_heads: int  # key/value heads per layer (fewer under grouped-query attention)
    qk_size: int  # query/key head size
    v_size: int  # value head size
    scale: float  # what q.k is multiplied by before the softmax
    sinks: bool = False  # a learned logit per head that takes probability mass and is dropped
    #: where there are sinks: whether the model's maps count the mass the sink takes (GPT-OSS: its
    #: rows sum to less than 1) or are the plain softmax, the sink scaling only the layer's output
    #: (Granite-SWA: ``P V sigmoid(lse - sink)``, the same output)
    sink_mass: bool = True
    softcap: float | None = None  # scores are cap * tanh(s / cap)
    window: int | None = None  # sliding window (keys), in some or all layers
    chunk: int | None = None  # chunked attention (Llama 4): keys in the query's chunk only
    alibi: bool = False  # a linear bias on the scores by distance
    #: a bias on the scores per query and key (MPNet's relative-position buckets, DeBERTa's
    #: disentangled position terms): a ``[B H T K]`` tensor the adapter hands over
    position_bias: bool = False
    hooks: bool = True  # attention runs through attnscope's attention function (hook points)
    #: a right-padded batch (:func:`~attnscope.models.forward.pad_batch`) gives each sequence the
    #: maps it has alone; False where padding changes them (ConvBERT's convolution and CPM-Ant read
    #: the padded positions, Nystromformer's landmarks average over them): its sequences are then
    #: batched one length at a time (:func:`~attnscope.models.forward.batches`)
    pads: bool = True
    #: it gets there by an adapter of the family's own attention code (:mod:`attnscope.models.adapters`:
    #: Bloom, MPT), not by transformers' AttentionInterface
    adapted: bool = False
    #: its ``output_attentions`` are in a local layout of its own (:mod:`attnscope.models.local_maps`:
    #: ``window``, Longformer and LED; ``blocks``, LongT5), laid out as token maps on the way out
    local: str = ""

    @property
    def causal(self) -> bool:
        return self.kind == "causal"

    @property
    def encoder_decoder(self) -> bool:
        return self.kind == "encoder-decoder"

    @property
    def kv_groups(self) -> int:
        return self.heads // max(1, self.kv_heads)

    @property
    def mechanisms(self) -> tuple[str, ...]:
        """The :data:`MECHANISMS` this model has, in that order."""
        has = {"sinks": self.sinks and self.sink_mass, "sink-scale": self.sinks and not self.sink_mass,
               "value-size": self.v_size != self.qk_size, "softcap": bool(self.softcap),
               "window": bool(self.window), "chunk": bool(self.chunk),
               "scale": abs(self.scale - self.qk_size ** -0.5) > 1e-6 * self.scale, "alibi": self.alibi,
               "position-bias": self.position_bias, "hybrid": len(self.attention_layers) != self.layers}
        return tuple(m for m in MECHANISMS if has[m])

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "layers": self.layers, "attention_layers": list(self.attention_layers),
                "heads": self.heads, "kv_heads": self.kv_heads, "qk_head_size": self.qk_size,
                "v_head_size": self.v_size, "scale": self.scale, "softcap": self.softcap,
                "window": self.window, "chunk": self.chunk, "mechanisms": list(self.mechanisms),
                "hooks": self.hooks, "adapted": self.adapted, "local": self.local, "pads": self.pads}


def config_layers(config) -> int:
    """The model's layers, by whichever name its config uses."""
    text = getattr(config, "text_config", None) or config
    for name in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
        value = getattr(text, name, None)
        if isinstance(value, int):
            return value
    raise ModelError(f"{type(config).__name__}: the config names no number of layers")


def _probe_ids(tokenizer, vocab: int, n: int = 6) -> list[int]:
    specials = set(getattr(tokenizer, "all_special_ids", []) or [])
    ordinary = [i for i in range(min(vocab, 4096)) if i not in specials][:n]
    bos = getattr(tokenizer, "bos_token_id", None)
    return ([bos] + ordinary[:n - 1]) if bos is not None and bos < vocab else ordinary


def _kind_of(maps: list, name: str) -> str:
    """``causal`` / ``bidirectional`` from each layer's eager map ``[H n n]``."""
    causal = [bool((m.triu(1) == 0).all()) for m in maps]
    if all(causal):
        return "causal"
    if not any(causal):
        return "bidirectional"
    raise ModelError(f"{name}: some of its attention layers see later tokens and some do not "
                     f"(causal by layer: {causal}); attnscope cannot classify it")


def _pads(model, ids, maps: list, tokenizer) -> bool:
    """Whether the probe's maps, right-padded in a batch beside a longer sequence, are the maps it
    has alone, within the float32 rounding of a softmax row of ``n`` terms carried through every
    layer (``eps n (1 + ln n) L``: a batch's other shapes change how its sums round; padding that
    reaches the model changes them by far more, 0.76 on ConvBERT). Encoder-decoders (extracted one
    example at a time) and local attention (Longformer pads to its window itself) are not asked."""
    import math

    import torch

    from attnscope.models.forward import padded_maps

    pad = getattr(tokenizer, "pad_token_id", None)
    padded = padded_maps(model, ids, 0 if pad is None else int(pad))
    if len(padded) != len(maps):
        return False
    n = int(ids.shape[-1])
    eps = torch.finfo(maps[0].dtype).eps if maps[0].is_floating_point() else 0.0
    bound = eps * n * (1 + math.log(n)) * len(maps)
    return all(float((a.double() - b.double()).abs().max()) <= bound for a, b in zip(maps, padded))


def read_facts(model, tokenizer, name: str = "the model") -> ModelFacts:
    """The :class:`ModelFacts` of ``model`` (a transformers model with its tokenizer), from one
    forward pass over a few tokens (see the module docstring). A model that returns no attention
    is refused in one line."""
    import torch

    from attnscope.models.forward import model_device, probe_attention

    config = model.config
    text = getattr(config, "text_config", None) or config
    layers = config_layers(config)
    vocab = int(getattr(text, "vocab_size", None) or len(tokenizer))
    ids = torch.tensor([_probe_ids(tokenizer, vocab)], device=model_device(model))
    encdec = bool(getattr(config, "is_encoder_decoder", False))
    sites, maps, attention_layers = probe_attention(model, ids, encdec)
    if not maps:
        raise ModelError(f"{name}: the model returned no attention maps for a short probe "
                         f"({type(model).__name__}); attnscope reads attention from output_attentions")
    n = int(ids.shape[-1])
    local = layout_of(maps, n, text, name)
    # (keys a query reads: Longformer's 2r + 1 columns; LongT5's keys within b - 1 of it, its
    # local radius)
    reach = {"window": int(maps[0].shape[-1]), "blocks": 2 * int(maps[0].shape[-2]) - 1}.get(local)
    maps = token_maps(maps, local, n)
    shapes = [tuple(m.shape) for m in maps]
    bad = [s for s in shapes if len(s) != 4 or s[-2] != n]
    if not encdec and bad:
        # (RWKV and YOSO fill output_attentions with something else: [1 n D]; Canine's deep
        # layers read a downsampled sequence; Longformer's local attention is [1 H n w], a row
        # per query, which the maps path reads)
        raise ModelError(f"{name}: the model returned no attention maps of its {n} tokens for a short probe "
                         f"({type(model).__name__}: an output_attentions entry is shaped {list(bad[0])}, "
                         "not [batch, heads, n, keys])")
    if not encdec and len({s[1] for s in shapes}) > 1:
        raise ModelError(f"{name}: its attention layers have different numbers of heads "
                         f"({', '.join(str(s[1]) for s in shapes)}); attnscope holds one [layers heads n n] map")
    kind = "encoder-decoder" if encdec else _kind_of([m[0] for m in maps], name)
    pads = encdec or bool(local) or _pads(model, ids, maps, tokenizer)
    alibi = any(s["bias"] == 3 for s in sites) or callable(getattr(model, "build_alibi_tensor", None)) or \
        bool(getattr(text, "alibi", False)) or bool(getattr(getattr(text, "attn_config", None), "alibi", False))
    chunk = getattr(text, "attention_chunk_size", None)
    layers = max(layers, len(maps))
    if not sites:  # outside AttentionInterface: the maps and the config only
        heads = int(maps[0].shape[1])
        size = int(getattr(text, "head_dim", None) or getattr(text, "hidden_size", heads) // heads)
        return ModelFacts(kind, layers, tuple(attention_layers), heads, heads, size, size, size ** -0.5,
                          window=reach, alibi=alibi, hooks=False, local=local, pads=pads)
    first = sites[0]
    heads, kv_heads = int(first["query"].shape[1]), int(first["key"].shape[1])
    qk, v = int(first["query"].shape[-1]), int(first["value"].shape[-1])
    sinks = [i for i, s in enumerate(sites) if s["sinks"]]
    # the maps of a layer with a sink: rows summing to less than 1 count its mass (float32 rows of
    # a handful of keys sum to 1 within a few eps when they do not)
    sink_mass = any(float(maps[i][0].sum(-1).min()) < 1 - 1e-4 for i in sinks if i < len(maps))
    windows = [s["window"] for s in sites if s["window"]]
    caps = [s["softcap"] for s in sites if s["softcap"]]
    return ModelFacts(
        kind, layers, tuple(attention_layers), heads, kv_heads, qk, v, float(first["scaling"]),
        sinks=bool(sinks), sink_mass=sink_mass or not sinks, softcap=float(caps[0]) if caps else None,
        window=int(windows[0]) if windows else None,
        chunk=int(chunk) if isinstance(chunk, int) and chunk > 0 else None, alibi=alibi,
        position_bias=any(s["bias"] == 4 for s in sites), pads=pads,
        adapted=adapters.adapted(model))
