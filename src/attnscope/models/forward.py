"""The one place that runs a model: pad -> forward, with named hook points inside attention.

Every family whose transformers implementation routes self-attention through
``AttentionInterface`` (BERT, RoBERTa, ELECTRA, DistilBERT, ALBERT, GPT-2, Llama, Qwen2,
Mistral, Gemma, Phi, ...) is switched to attnscope's attention function when loaded. During
:func:`forward` that function calls the hooks registered for the pass; outside a pass it is
exactly the family's own eager attention, so ``model(**inputs)`` behaves as with
``attn_implementation="eager"``.

Hook points, called once per layer in layer order (shapes per layer)::

    "q"         [B Hq T d]   queries after position encoding (rotary), before scaling
    "k"         [B Hkv T d]  keys after position encoding; Hkv < Hq under grouped-query attention
    "v"         [B Hkv T d]  values
    "attn"      [B Hq T T]   attention probabilities (rows over unmasked keys sum to 1)
    "head_out"  [B T Hq d]   each head's output (its attention-weighted values), before the
                             layer's output projection; a hook may return a replacement
    "attend"    [B Hq T d]   the queries, when the layer's attention is about to be computed; a
                             hook may return the heads' outputs ``[B T Hq d]`` itself, and then
                             the layer's own attention does not run (when no probabilities are
                             requested: the streaming engine's one pass)

A hook is ``fn(site, tensor) -> tensor | None``; :class:`Site` carries the layer index, the
attention module, all of q/k/v, the additive mask and the scaling, so a hook can recompute
anything the layer computes (the streaming statistics do exactly that). Returning a tensor
replaces the value at that point (only for ``"head_out"``: ablation, gating; and ``"attend"``).

Inputs and gates may live on the CPU: :func:`forward` moves them to the model's device
(``load_model(..., device=)``); outputs and hook tensors stay on that device, so a consumer
calls ``.cpu()`` before ``.numpy()``.

``gates`` (``[L H]``, optionally requiring grad) multiply ``head_out``: gate 1 changes
nothing, gate 0 removes the head's contribution (zero ablation). Gates of shape ``[B L H]``
give each sequence of the batch its own gates, so one backward pass yields every example's
own ``dL_b/d gate`` (head importance needs per-example gradient magnitudes).

``layers=(a, b)`` with ``hidden`` ``[B T D]`` runs only layers ``a .. b-1``, the first of them on
``hidden`` (the input of layer ``a``: ``lm.layer_input(hidden_states, a)`` of an earlier pass);
the other layers are skipped (their input is passed through). So layer ``b - 1``'s output
(``lm.layer_output``; when ``b = L``, the model's final output) is that of the full model, at
the cost of ``b - a`` layers: many variants of one example (ablations, value zeroing) start
from its cached input. ``a`` and ``b`` count the layers with attention, as every array does; a
hybrid's Mamba or linear-attention layers among them run too (after the last, to the model's
end when ``b = L``).

When no hook needs the probabilities, the layer's output comes from torch's fused
``scaled_dot_product_attention``; otherwise from the family's own eager code.

>>> from attnscope.models import load_model
>>> lm = load_model("debug:bert")
>>> inputs = pad_batch(lm, [lm.tokenizer("the cat sat")["input_ids"]])
>>> out = forward(lm, inputs, attentions=True)
>>> len(out.attentions), tuple(out.attentions[0].shape)      # L layers of [B H T T]
(2, (1, 2, 5, 5))
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Any

from attnscope.errors import AttnscopeError, ModelError
from attnscope.models import adapters
from attnscope.models.local_maps import token_maps

#: The name attnscope's attention function is registered under in transformers.
ATTN_IMPLEMENTATION = "attnscope"
HOOK_POINTS = ("q", "k", "v", "attend", "attn", "head_out")

Hook = Callable[["Site", Any], Any]


@dataclass
class Site:
    """Where a hook is called: one layer's self-attention during one forward pass."""

    layer: int  # counts the layers with attention, 0 .. lm.num_layers - 1 (see model_layer)
    module: Any  # the attention nn.Module
    query: Any  # [B Hq T d]
    key: Any  # [B Hkv T d]
    value: Any  # [B Hkv T d]
    mask: Any  # additive float mask [B 1 T T] (0 = attend, very negative = masked); with
    # forward(lean_mask=True): transformers' sdpa mask, boolean [B 1 T T] (True = attend) or
    # None (plain causal or full attention, no padding). Read it through allowed().
    scaling: float
    #: what the model's attention is handed besides (transformers' keyword arguments): GPT-OSS's
    #: learned sink logits ``[Hq]`` (``s_aux``), the logit soft-capping, the sliding window
    sinks: Any = None
    softcap: float | None = None
    window: int | None = None
    #: a bias on the scores, added after the scaling, which :mod:`attnscope.models.adapters` hands
    #: over (``score_bias``) for the families that compute it inline: per head and key, ``[B Hq K]``,
    #: the same for every query (ALiBi: Bloom, MPT), or per head, query and key, ``[B Hq T K]`` (a
    #: relative-position bias: MPNet's buckets, DeBERTa's disentangled c2p and p2c terms)
    bias: Any = None

    @property
    def model_layer(self) -> int:
        """The model's own index of this layer (its attention module's ``layer_idx``). It differs
        from :attr:`layer`, which counts the layers with attention, in a hybrid whose other layers
        are Mamba or linear attention (Qwen3-Next: ``layer`` 0 is the model's layer 3)."""
        index = getattr(self.module, "layer_idx", None)
        return index if isinstance(index, int) else self.layer

    def allowed(self, q0: int, q1: int, k1: int | None = None) -> Any:
        """Which keys the queries ``q0:q1`` may attend to: bool ``[B 1 q1-q0 k1]``.

        Works for every mask form (additive float, boolean, None), so a hook can rebuild the
        attention of a block of query rows without a ``[T T]`` mask existing.
        """
        import torch

        T = self.key.shape[2]
        k1 = T if k1 is None else k1
        m = self.mask
        if m is None:
            rows = torch.arange(q0, q1, device=self.key.device)[:, None]
            cols = torch.arange(k1, device=self.key.device)[None, :]
            ok = cols <= rows if getattr(self.module, "is_causal", False) else torch.ones_like(cols <= rows)
            return ok[None, None].expand(self.query.shape[0], 1, q1 - q0, k1)
        # (a mask of one row for every query, [B 1 1 T] as BERT-style code makes it, broadcasts)
        tile = m[:, :, :1, :k1].expand(-1, -1, q1 - q0, -1) if m.shape[2] == 1 else m[:, :, q0:q1, :k1]
        if tile.dtype == torch.bool:
            return tile
        return tile > torch.finfo(tile.dtype).min / 2

    @property
    def kv_groups(self) -> int:
        """Query heads per key/value head (1 without grouped-query attention)."""
        return self.query.shape[1] // self.key.shape[1]


@dataclass
class ModelInputs:
    """A padded batch: ``input_ids``, ``attention_mask``, ``token_type_ids`` ``[B T]`` long
    tensors, and each sequence's real length."""

    input_ids: Any
    attention_mask: Any
    token_type_ids: Any
    lengths: list[int]

    def __len__(self) -> int:
        return len(self.lengths)


@dataclass
class ForwardOutput:
    """The model's own output object and, when asked, each layer's ``[B H T T]`` attention."""

    output: Any
    attentions: list | None = None


@dataclass
class _Pass:
    hooks: dict[str, list[Hook]]
    gates: Any = None
    layer: int = 0
    attentions: list | None = None
    extra: dict = field(default_factory=dict)
    lean_mask: bool = False
    wrap: int = 0  # hooked(): several model calls, so layers count modulo this (0: one call)
    probe: list | None = None  # probe_attention(): every call's Site

    @property
    def needs_probs(self) -> bool:
        return self.attentions is not None or "attn" in self.hooks


_ACTIVE: contextvars.ContextVar[_Pass | None] = contextvars.ContextVar("attnscope_pass", default=None)


def batches(lm, items: Sequence, size: int) -> Iterator[list]:
    """``items`` (each with a length: encoded examples, a loss's inputs) in consecutive batches of
    at most ``size``, in order; for a model whose outputs padding changes (:attr:`ModelFacts.pads
    <attnscope.models.facts.ModelFacts.pads>` False) a batch ends where the length changes, so
    none is padded (items sorted by length then stay in batches of ``size``).

    >>> facts = type("F", (), {"pads": False})()
    >>> [len(b) for b in batches(type("LM", (), {"facts": facts})(), ["ab", "cd", "efg", "h"], 3)]
    [2, 1, 1]
    """
    items = list(items)
    one_length = not getattr(getattr(lm, "facts", None), "pads", True)
    start = 0
    while start < len(items):
        end = min(start + max(1, size), len(items))
        if one_length:
            end = next((i for i in range(start + 1, end) if len(items[i]) != len(items[start])), end)
        yield items[start:end]
        start = end


def pad_batch(lm, sequences: Sequence[Sequence[int]],
              token_types: Sequence[Sequence[int] | None] | None = None) -> ModelInputs:
    """Right-pad token id sequences (and their segment ids) into one batch.

    >>> lm = type("LM", (), {"tokenizer": type("T", (), {"pad_token_id": 0})()})()
    >>> b = pad_batch(lm, [[5, 6, 7], [5]])
    >>> b.input_ids.tolist(), b.attention_mask.tolist(), b.lengths
    ([[5, 6, 7], [5, 0, 0]], [[1, 1, 1], [1, 0, 0]], [3, 1])
    """
    import torch

    pad = lm.tokenizer.pad_token_id
    pad = 0 if pad is None else int(pad)
    lengths = [len(s) for s in sequences]
    if len(set(lengths)) > 1 and not getattr(getattr(lm, "facts", None), "pads", True):
        # (the planners batch such a model's sequences by length: a padded batch here is a caller
        # that forgot, and would change its numbers without a word)
        raise ModelError(f"{lm.name}: padding changes its outputs (ModelFacts.pads), so its sequences "
                         f"are batched one length at a time; this batch holds lengths {sorted(set(lengths))}")
    width = max(lengths, default=0)
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    types = torch.zeros((len(sequences), width), dtype=torch.long)
    for b, seq in enumerate(sequences):
        n = lengths[b]
        ids[b, :n] = torch.as_tensor(list(seq), dtype=torch.long)
        mask[b, :n] = 1
        if token_types is not None and token_types[b] is not None:
            types[b, :n] = torch.as_tensor(list(token_types[b]), dtype=torch.long)
    return ModelInputs(ids, mask, types, lengths)


def probe_attention(model, ids, encoder_decoder: bool = False) -> tuple[list[dict], list, list[int]]:
    """One pass of ``model`` over token ids ``ids`` ``[1 n]`` with eager attention: what each
    self-attention call was handed (``query``, ``key``, ``value`` tensors, ``scaling``, ``sinks``,
    ``softcap``, ``window`` and the module's ``layer_idx``; empty where the model does not route
    attention through attnscope's function), each attention layer's ``[1 H n n]`` maps (an
    encoder-decoder's encoder maps) and the model's own index of each of those layers (its
    attention modules' ``layer_idx``, read from the calls or, outside AttentionInterface, from
    the modules that returned the weights; a hybrid's Mamba layers return none). What
    :func:`attnscope.models.facts.read_facts` reads."""
    import torch

    kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if encoder_decoder:
        kwargs["decoder_input_ids"] = ids[:, :2]
    if "use_cache" in inspect.signature(model.forward).parameters:
        kwargs["use_cache"] = False
    hooked_model = _hooked(model)
    state = _Pass(hooks={}, attentions=[], probe=[])
    token = _ACTIVE.set(state)
    order: list[int] = []  # the layer_idx of each module that returned attention weights, in call order

    def weights_from(module, _inputs, output):
        w = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if isinstance(w, torch.Tensor) and w.dim() == 4 and w.shape[-1] == ids.shape[-1] \
                and module.layer_idx not in order:  # (a layer that returns its attention's weights: once)
            order.append(module.layer_idx)

    handles = [m.register_forward_hook(weights_from) for m in model.modules()
               if isinstance(getattr(m, "layer_idx", None), int)]
    try:
        with torch.inference_mode():
            out = model(**kwargs, output_attentions=True)
    finally:
        _ACTIVE.reset(token)
        for h in handles:
            h.remove()
    maps = getattr(out, "encoder_attentions", None) if encoder_decoder else getattr(out, "attentions", None)
    maps = [m for m in (maps or ()) if m is not None]
    if hooked_model and not encoder_decoder:
        maps = state.attentions or maps
    sites = [{"query": s.query, "key": s.key, "value": s.value, "scaling": s.scaling,
              "sinks": s.sinks is not None, "softcap": s.softcap, "window": s.window, "bias": 0 if s.bias is None else s.bias.dim(),
              "layer_idx": s.model_layer} for s in state.probe]
    if encoder_decoder:  # the encoder's calls only: as many as its maps
        return sites[:len(maps)], maps, list(range(len(maps)))
    index = [s["layer_idx"] for s in sites] if sites else order
    n = ids.shape[-1]
    reported = [m for m in (getattr(out, "attentions", None) or ()) if m is not None and m.shape[-2:] == (n, n)]
    if sites and reported and len(sites) != len(reported):
        raise ModelError(f"{type(model).__name__}: its attention runs {len(sites)} times where it reports "
                         f"{len(reported)} maps (more than one softmax per head and layer, as differential "
                         "attention has); attnscope reads one map per head")
    if len(index) != len(maps) or len(set(index)) != len(index) or not all(isinstance(i, int) for i in index):
        index = list(range(len(maps)))  # (no module says which layer it is: the maps in order)
    return sites, maps, index


def padded_maps(model, ids, pad_id: int, extra: int = 3) -> list:
    """Each attention layer's ``[1 H n n]`` maps of token ids ``ids`` ``[1 n]`` read from a batch
    in which they are right-padded, as :func:`pad_batch` pads them, beside a sequence ``extra``
    tokens longer (the same ids, repeated): what the facts probe compares with the maps of ``ids``
    alone (:attr:`attnscope.models.facts.ModelFacts.pads`)."""
    import torch

    n = int(ids.shape[-1])
    longer = torch.cat([ids, ids[:, :extra]], -1)
    batch = torch.cat([longer, torch.full_like(longer[:, :1], pad_id).expand(1, n + extra).clone()])
    batch[1, :n] = ids[0]
    mask = torch.zeros_like(batch)
    mask[0], mask[1, :n] = 1, 1
    kwargs = {"input_ids": batch, "attention_mask": mask}
    if "use_cache" in inspect.signature(model.forward).parameters:
        kwargs["use_cache"] = False
    state = _Pass(hooks={}, attentions=[])
    token = _ACTIVE.set(state)
    try:
        with torch.inference_mode():
            out = model(**kwargs, output_attentions=True)
    finally:
        _ACTIVE.reset(token)
    maps = (state.attentions if _hooked(model) else None) or getattr(out, "attentions", None) or ()
    return [m[1:, ..., :n, :n] for m in maps if m is not None]


def model_device(model) -> Any:
    """The ``torch.device`` of ``model``'s weights (its first parameter; CPU without any)."""
    import torch

    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def model_configs(model) -> list:
    """``model``'s config and its sub-models' own (a composite's language model reads its
    ``text_config``; DPR's BERT shares its wrapper's), each once."""
    found: list = []
    for module in model.modules():
        config = getattr(module, "config", None)
        if hasattr(config, "_attn_implementation") and all(config is not c for c in found):
            found.append(config)
    return found


def _hooked(model) -> bool:
    text = getattr(model.config, "text_config", None)
    return ATTN_IMPLEMENTATION in (getattr(model.config, "_attn_implementation", None),
                                   getattr(text, "_attn_implementation", None)) or adapters.adapted(model)


def supports_hooks(lm) -> bool:
    """Whether the model's attention runs through attnscope's attention function (transformers'
    ``AttentionInterface``, or an adapter of :mod:`attnscope.models.adapters`): the model is set
    up for it and its facts' probe saw its layers call it (:attr:`ModelFacts.hooks`)."""
    return _hooked(lm.model) and lm.facts.hooks


def install(model) -> bool:
    """Route ``model``'s self-attention through attnscope's function, if its family allows.

    Called once by the model loader (the model in eval mode). A family whose class does not take
    custom attention functions gets, in this order: an adapter where :mod:`attnscope.models.adapters`
    has one (Bloom, MPT, the BERT line, XLM, the first GPT ...); else, where its attention modules look their function up in transformers'
    registry by the config's name (the hybrids), attnscope's name in the config, kept only when a
    six-token probe shows each attention layer calls it once and the maps equal eager's exactly
    (:func:`_routes_exactly`; never for an encoder-decoder); otherwise False, and the model is left
    on eager attention (e.g. LUKE).
    """
    if not getattr(type(model), "_supports_attention_backend", False):
        if adapters.install(model, _attention, lambda: _ACTIVE.get() is not None):
            return True
        if getattr(model.config, "is_encoder_decoder", False) or not _dispatches(model):
            return False
        # a model whose attention modules look their function up in transformers' registry by
        # the config's name, but whose class turns custom functions down (the hybrids: Qwen3-Next,
        # Jamba, Bamba, OLMo-hybrid, Nemotron-H ... for their linear-attention kernels): the
        # config names attnscope's where a probe shows every layer's attention then reaches it,
        # once each, and gives the eager maps exactly; elsewhere the model stays on eager
        _register()
        configs = model_configs(model)
        names = [c._attn_implementation for c in configs]
        for config in configs:
            config._attn_implementation = ATTN_IMPLEMENTATION
        if _routes_exactly(model, configs):
            return True
        for config, name in zip(configs, names):
            config._attn_implementation = name
        return False
    _register()
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    return True


def _routes_exactly(model, configs: list) -> bool:
    """Whether ``model`` (its ``configs`` naming attnscope's function) calls it once per layer that
    reports a map, and its maps then equal the model's eager ones exactly (a probe of six
    tokens each way)."""
    import torch

    text = getattr(model.config, "text_config", None) or model.config
    vocab = getattr(text, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 8:
        return False
    kwargs = {"input_ids": torch.arange(1, 7, device=model_device(model))[None]}
    if "use_cache" in inspect.signature(model.forward).parameters:
        kwargs["use_cache"] = False
    state = _Pass(hooks={}, attentions=[], probe=[])
    try:
        with torch.inference_mode():
            token = _ACTIVE.set(state)
            try:
                model(**kwargs)
            finally:
                _ACTIVE.reset(token)
            for config in configs:  # (every config that names attnscope's function: eager)
                config._attn_implementation = "eager"
            try:
                theirs = [a for a in (model(**kwargs, output_attentions=True).attentions or ()) if a is not None]
            finally:
                for config in configs:
                    config._attn_implementation = ATTN_IMPLEMENTATION
    except Exception:  # a model that needs other inputs (pixels, boxes): not routed
        return False
    ours = state.attentions
    return bool(state.probe) and len(state.probe) == len(ours) == len(theirs) and \
        all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(ours, theirs))


def _dispatches(model) -> bool:
    """Whether the code of any of ``model``'s modules (a wrapper's BERT, a composite's language
    model) looks attention functions up in transformers' ``ALL_ATTENTION_FUNCTIONS`` (the registry
    ``AttentionInterface`` fills)."""
    return any(_source_dispatches(type(m).__module__) for m in model.modules())


@lru_cache(maxsize=None)
def _source_dispatches(name: str) -> bool:
    module = sys.modules.get(name)
    try:
        return module is not None and "ALL_ATTENTION_FUNCTIONS" in inspect.getsource(module)
    except (OSError, TypeError):
        return False


def forward(lm, inputs: ModelInputs, *, attentions: bool = False,
            hooks: dict[str, Hook | Sequence[Hook]] | None = None, gates: Any = None,
            grad: bool = False, lean_mask: bool = False, layers: tuple[int, int] | None = None,
            hidden: Any = None, module_hooks: Sequence[tuple[Any, Callable]] = (),
            **model_kwargs) -> ForwardOutput:
    """Run ``lm`` on a padded batch; see the module docstring for hooks and gates.

    ``attentions``: also return each layer's ``[B H T T]`` probabilities (with autograd when
    ``grad``). ``grad``: build the autograd graph (gradients with respect to attention or
    gates); otherwise the pass runs under ``torch.inference_mode``. ``model_kwargs`` go to
    the model (e.g. ``output_hidden_states=True``). ``lean_mask``: when no probabilities are
    needed, build transformers' sdpa mask (None for plain causal input without padding) instead
    of a float ``[B 1 T T]`` one, which at 16k tokens alone takes 1 GB; hooks then read the
    mask with :meth:`Site.allowed`. ``layers``, ``hidden``: run only some layers (module
    docstring). ``module_hooks``: ``(module, fn)`` pairs, ``fn(module, inputs, output)`` called
    after each call of ``module`` of the model during this pass only (a projection's output, the
    input embeddings for saliency): the one place attnscope hooks a model's modules.
    """
    import torch

    device = model_device(lm.model)
    kwargs = {"input_ids": inputs.input_ids, "attention_mask": inputs.attention_mask, **model_kwargs}
    if "use_cache" in inspect.signature(lm.model.forward).parameters:
        # one pass: a key/value cache would only hold memory (and a hybrid's cache of Mamba
        # states is refused by transformers when the model is handed no cache object)
        kwargs.setdefault("use_cache", False)
    if lm.family.token_types and inputs.token_type_ids is not None:
        kwargs["token_type_ids"] = inputs.token_type_ids
    # The one place a batch goes to the model's device (a no-op when it is already there);
    # gates keep their autograd link to the caller's leaf tensor through .to().
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    if gates is not None:
        gates = gates.to(device)
    hooks = {k: ([v] if callable(v) else list(v)) for k, v in (hooks or {}).items()}
    unknown = set(hooks) - set(HOOK_POINTS)
    if unknown:
        raise ValueError(f"unknown hook points {sorted(unknown)}; known: {', '.join(HOOK_POINTS)}")
    context = torch.enable_grad() if grad else torch.inference_mode()
    if layers is not None and tuple(layers) != (0, lm.num_layers):
        for module in layer_modules(lm):  # (what a skipped layer returns, probed before the
            _layers_return_tuples(lm, module)  # caller's module hooks can see the probe)
    handles = [module.register_forward_hook(fn) for module, fn in module_hooks]
    try:
        return _forward(lm, kwargs, context, hooks=hooks, gates=gates, attentions=attentions,
                        lean_mask=lean_mask, layers=layers, hidden=hidden)
    finally:
        for h in handles:
            h.remove()


def _forward(lm, kwargs: dict, context, *, hooks, gates, attentions: bool, lean_mask: bool, layers,
             hidden) -> ForwardOutput:
    if not supports_hooks(lm):
        if hooks or gates is not None:
            raise AttnscopeError(f"{lm.name}: its transformers code does not route attention through "
                                 "AttentionInterface, so attnscope cannot hook its heads (only the "
                                 "attention maps are available)")
        with context, _only_layers(lm, *(layers or (0, lm.num_layers)), hidden):
            out = lm.model(**kwargs, output_attentions=attentions)
        maps = token_maps(out.attentions, lm.facts.local, kwargs["input_ids"].shape[-1]) if attentions else None
        return ForwardOutput(out, maps)
    first, last = (0, lm.num_layers) if layers is None else layers
    state = _Pass(hooks=hooks, gates=gates, attentions=[] if attentions else None, lean_mask=lean_mask,
                  layer=first)
    token = _ACTIVE.set(state)
    try:
        with context, _only_layers(lm, first, last, hidden):
            out = lm.model(**kwargs)
    finally:
        _ACTIVE.reset(token)
    if state.layer != last:
        raise AttnscopeError(f"{lm.name}: attention ran {state.layer - first} times for {last - first} layers; "
                             "attnscope's hook points assume one self-attention call per layer")
    return ForwardOutput(out, state.attentions)


@contextlib.contextmanager
def hooked(lm, hooks: dict[str, Hook | Sequence[Hook]] | None = None, *, lean_mask: bool = True):
    """Keep ``hooks`` active for every call of ``lm``'s layers inside the block, whatever module
    makes the call (the model itself, or a wrapper with a language-model head sharing its
    layers): a prefill and the decoding steps that follow it with a key/value cache are one
    pass, and :attr:`Site.layer` counts modulo the model's layers. Under a cache a layer's
    ``"k"``/``"v"`` are the whole cache (the keys so far) and ``"q"`` only the new rows. Without
    hooks, attention is torch's fused ``scaled_dot_product_attention`` (outside any pass it is
    the family's eager code). The caller chooses autograd (e.g. ``torch.no_grad()``)."""
    if not supports_hooks(lm):
        raise AttnscopeError(f"{lm.name}: its transformers code does not route attention through "
                             "AttentionInterface, so attnscope cannot hook its heads")
    hooks = {k: ([v] if callable(v) else list(v)) for k, v in (hooks or {}).items()}
    unknown = set(hooks) - set(HOOK_POINTS)
    if unknown:
        raise ValueError(f"unknown hook points {sorted(unknown)}; known: {', '.join(HOOK_POINTS)}")
    token = _ACTIVE.set(_Pass(hooks=hooks, lean_mask=lean_mask, wrap=lm.num_layers))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def hidden_states(lm, ids: Any, hooks: dict[str, Hook | Sequence[Hook]] | None = None) -> Any:
    """The last layer's hidden states ``[B T D]`` of ``lm`` reading token ids ``ids`` (a ``[B T]``
    tensor) with ``hooks`` at the hook points (:func:`hooked`; without hooks attention is torch's
    fused kernel). The caller chooses autograd (DuoAttention's gate training)."""
    with hooked(lm, hooks):
        return lm.model(input_ids=ids).last_hidden_state


def layer_modules(lm) -> list:
    """The model's transformer layers in order (transformers' ``GradientCheckpointingLayer``):
    every one of them, a hybrid's Mamba and linear-attention layers too (``lm.facts.layers``)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    found = [m for m in lm.model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if len(found) != lm.facts.layers:
        raise AttnscopeError(f"{lm.name}: found {len(found)} transformer layers for {lm.facts.layers}; "
                             "running only some layers needs one module per layer")
    return found


#: layer class -> whether its forward returns a tuple (its hidden states first; Bloom, MPT) rather
#: than the hidden states alone (most of transformers 5)
_TUPLE_LAYERS: dict[type, bool] = {}


def _layers_return_tuples(lm, layer) -> bool:
    """Whether ``layer`` (one of :func:`layer_modules`) returns a tuple, from one call of the model
    on two tokens (once per layer class)."""
    import torch

    kind = type(layer)
    if kind not in _TUPLE_LAYERS:
        seen = []
        handle = layer.register_forward_hook(lambda _m, _i, out: seen.append(isinstance(out, tuple)))
        ids = torch.zeros(1, 2, dtype=torch.long, device=model_device(lm.model))
        token = _ACTIVE.set(None)  # (outside the pass being set up: no hook sees this call)
        try:
            kwargs = {"decoder_input_ids": ids} if lm.facts.encoder_decoder else {}
            if "use_cache" in inspect.signature(lm.model.forward).parameters:
                kwargs["use_cache"] = False  # (a hybrid's cache of Mamba states is refused without a cache object)
            with torch.inference_mode():
                lm.model(input_ids=ids, **kwargs)
        finally:
            _ACTIVE.reset(token)
            handle.remove()
        _TUPLE_LAYERS[kind] = bool(seen and seen[0])
    return _TUPLE_LAYERS[kind]


@contextlib.contextmanager
def _only_layers(lm, first: int, last: int, hidden):
    """Within the block, layers outside ``first .. last-1`` (counting those with attention; a
    hybrid's other layers between them run) pass their input through and layer ``first`` reads
    ``hidden`` instead of its input (all layers run when ``first .. last`` is all of them)."""
    if (first, last) == (0, lm.num_layers):
        yield
        return
    if not 0 <= first < last <= lm.num_layers or hidden is None:
        raise ValueError(f"layers must be 0 <= first < last <= {lm.num_layers} with the hidden "
                         f"states entering layer first; got {(first, last)}")
    modules = layer_modules(lm)
    own = lm.facts.attention_layers  # array layer -> the model's own layer
    start, stop = own[first], (own[last - 1] + 1 if last < lm.num_layers else len(modules))

    def skip(hidden_states, *args, _as_tuple=False, **kwargs):
        return (hidden_states, None) if _as_tuple else hidden_states

    def enter(hidden_states, *args, _run=modules[start].forward, **kwargs):
        return _run(hidden.to(hidden_states.device, hidden_states.dtype), *args, **kwargs)

    patched = [i for i in range(len(modules)) if not start < i < stop]
    as_tuple = {i: _layers_return_tuples(lm, modules[i]) for i in patched if i != start}
    try:
        for i in patched:  # an instance attribute shadows the class's forward
            modules[i].forward = enter if i == start else partial(skip, _as_tuple=as_tuple[i])
        yield
    finally:
        for i in patched:
            del modules[i].forward


# -- the attention function ----------------------------------------------------------------
def family_eager(module) -> Callable:
    """The family's own eager attention (exact per-family maths: scaling, soft-capping, GQA; an
    adapted family's, :mod:`attnscope.models.adapters`)."""
    fn = adapters.eager_for(module) or getattr(sys.modules.get(type(module).__module__),
                                               "eager_attention_forward", None)
    if fn is None:
        from transformers.models.llama.modeling_llama import eager_attention_forward as fn
    return fn


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """attnscope's ``AttentionInterface`` function: hooks around the family's attention."""
    state = _ACTIVE.get()
    if state is None:
        return family_eager(module)(module, query, key, value, attention_mask, scaling=scaling,
                                     dropout=dropout, **kwargs)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    layer = state.layer % state.wrap if state.wrap else state.layer
    site = Site(layer, module, query, key, value, attention_mask, float(scaling), sinks=kwargs.get("s_aux"),
                softcap=kwargs.get("softcap") or None, window=kwargs.get("sliding_window") or None,
                bias=kwargs.get("score_bias"))
    if state.probe is not None:
        state.probe.append(site)
    for point, tensor in (("q", query), ("k", key), ("v", value)):
        for hook in state.hooks.get(point, ()):
            hook(site, tensor)
    out = probs = None
    for hook in state.hooks.get("attend", ()):
        given = hook(site, query)
        if given is not None and not state.needs_probs:
            out = given  # the heads' outputs came from a hook: the layer's own attention is skipped
    if out is None and state.needs_probs:
        out, probs = family_eager(module)(module, query, key, value, attention_mask, scaling=scaling,
                                           dropout=dropout, **kwargs)
        for hook in state.hooks.get("attn", ()):
            hook(site, probs)
        if state.attentions is not None:
            state.attentions.append(probs)
    elif out is None and (site.sinks is not None or site.softcap or site.bias is not None):  # what sdpa would drop
        out, probs = family_eager(module)(module, query, key, value, attention_mask, scaling=scaling,
                                           dropout=dropout, **kwargs)
    elif out is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        out, probs = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                            dropout=dropout, **kwargs)
    if state.gates is not None:
        if state.gates.dim() == 3:  # [B L H]: per-sequence gates
            out = out * state.gates[:, layer].to(out.device, out.dtype)[:, None, :, None]
        else:
            out = out * state.gates[layer].to(out.device, out.dtype)[None, None, :, None]
    for hook in state.hooks.get("head_out", ()):
        replaced = hook(site, out)
        if replaced is not None:
            out = replaced
    state.layer += 1
    return out, probs


def _mask(*args, **kwargs):
    """The mask builder: eager's additive float mask, or sdpa's lean one (see ``lean_mask``)."""
    from transformers.masking_utils import eager_mask, sdpa_mask

    state = _ACTIVE.get()
    if state is not None and state.lean_mask and not state.needs_probs:
        return sdpa_mask(*args, **kwargs)
    return eager_mask(*args, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    if ATTN_IMPLEMENTATION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTN_IMPLEMENTATION, _attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPLEMENTATION, _mask)
