"""A tiny random model of any architecture transformers ships, built from its own config class.

:func:`tiny_config` shrinks a model type's default config (its sub-configs too) to 2 layers of 4
query heads on 2 key/value heads, head size 8, and few experts; :func:`build_tiny` builds the
model class of the task asked for from it, seeded. This is what ``load_model("debug:<model
type>")`` gives for a type outside the hand-made debug families, and what the architecture
matrix (``tests/models/test_architectures.py``, ``docs/models.md``) runs on.
"""

from __future__ import annotations

from typing import Any

from attnscope.errors import ModelError

#: the sizes a tiny config gets, by every name transformers' configs use for them
SIZES: dict[tuple[str, ...], int] = {
    ("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "model_dim"): 32,
    ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads", "decoder_attention_heads",
     "n_heads", "attention_heads"): 4,
    ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num", "num_key_value_groups"): 2,
    ("head_dim", "d_kv", "attention_head_size", "kv_channels", "head_size"): 8,
    ("intermediate_size", "d_ff", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner", "ffn_hidden_size",
     "inner_hidden_size"): 64,
    ("moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size",
     "moe_ffn_hidden_size", "intermediate_size_mlp"): 16,
    ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers", "num_decoder_layers",
     "n_layers"): 2,
    ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_experts_routed"): 4,
    ("num_experts_per_tok", "top_k", "moe_topk", "num_selected_experts", "experts_per_token"): 2,
    ("n_shared_experts", "num_shared_experts"): 1,
    ("first_k_dense_replace",): 1,
    ("num_layers_per_stack", "H_cycles", "L_cycles"): 1,  # HRM: a stack of layers run in cycles
    ("n_group", "topk_group"): 1,
    ("q_lora_rank",): 16,
    ("kv_lora_rank",): 16,
    ("qk_rope_head_dim",): 4,
    ("qk_nope_head_dim",): 4,
    ("v_head_dim",): 6,  # multi-head latent attention: value heads differ in size from query heads
    ("sliding_window", "attention_window_size", "local_window_size"): 4,
    ("attention_chunk_size",): 4,
    # state-space layers of a hybrid (Mamba 2): heads x head size = expand x hidden (2 x 32)
    ("mamba_d_head", "mamba_headdim", "mamba_head_dim"): 8,
    ("mamba_n_heads", "n_mamba_heads", "mamba_num_heads"): 8,
    ("mamba_d_ssm",): 64,
    ("mamba_d_state", "ssm_state_size"): 16,
    ("mamba_dt_rank",): 8,
    ("attention_hidden_size",): 64,  # Zamba 2's shared attention reads [hidden | embeddings]
    ("attention_head_dim",): 16,
    ("encoder_hash_byte_group_vocab",): 64,  # BLT's hashed byte n-gram tables
    # where a hybrid's attention and expert layers fall (Jamba: every 2nd layer from the 2nd)
    ("attn_layer_period", "expert_layer_period"): 2,
    ("attn_layer_offset", "expert_layer_offset"): 1,
}
#: a layer's type in ``config.layer_types`` that is attention (the others: Mamba, linear attention, ...)
ATTENTION_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "attention", "global",
                   "local", "hybrid")


def _set(config, name: str, value) -> None:
    try:
        setattr(config, name, value)
    except (AttributeError, TypeError, ValueError):  # a derived property (a hybrid's layer kinds)
        pass


def _get(config, name: str):
    try:
        return getattr(config, name, None)
    except Exception:  # a per-layer attribute transformers refuses to read globally
        return None


def _shrink(config, vocab_size: int, tokens: dict[str, int | None]) -> None:
    for names, value in SIZES.items():
        for name in names:
            current = _get(config, name)
            if isinstance(current, int) and not isinstance(current, bool):
                _set(config, name, value)
    if isinstance(_get(config, "qk_rope_head_dim"), int):  # latent attention: rotary on part of q/k
        _set(config, "head_dim", config.qk_rope_head_dim)
        if _get(config, "num_key_value_heads") is not None:  # (its keys are made per query head)
            _set(config, "num_key_value_heads", config.num_attention_heads)
    layers = 2
    for field in ("layer_types", "layers_block_type"):
        types = _get(config, field)
        if isinstance(types, (list, tuple)) and types:
            # keep two layers: the first two kinds of layer, so a hybrid stays a hybrid, with
            # attention among them where the model has any (Nemotron-H: Mamba, MoE, attention)
            kinds = list(dict.fromkeys(types))
            kept = kinds[:2] if len(kinds) > 1 else [kinds[0], kinds[0]]
            attention = next((t for t in kinds if t in ATTENTION_TYPES), None)
            if attention not in kept:  # (a default of Mamba layers only: Granite-MoE-hybrid)
                kept = [kinds[0], attention or "full_attention"]
            _set(config, field, list(kept))
            layers = len(kept)
    for name in ("num_hidden_layers", "n_layer", "num_layers"):
        if isinstance(_get(config, name), int):
            _set(config, name, layers)
    if hasattr(config, "attn_layer_indices"):  # Bamba: attention in the second layer, Mamba in the first
        _set(config, "attn_layer_indices", [1])
    if isinstance(_get(config, "vocab_size"), int):
        _set(config, "vocab_size", vocab_size)
    for name, value in tokens.items():
        if _get(config, name) is not None and value is not None:
            _set(config, name, value)
    if isinstance(_get(config, "initializer_range"), float):
        _set(config, "initializer_range", 0.3)  # larger than the default 0.02, so heads are not near-uniform
    from transformers import PretrainedConfig

    for inner in list(vars(config).values()):  # every sub-config (text, encoder, decoder, global ...)
        if isinstance(inner, PretrainedConfig):
            _shrink(inner, vocab_size, tokens)


def tiny_config(model_type: str, vocab_size: int, tokens: dict[str, int | None] | None = None):
    """The default config of ``model_type`` shrunk to a tiny model (:data:`SIZES`), with
    ``vocab_size`` and the special token ids ``tokens`` (``pad_token_id`` ...) of its tokenizer."""
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise ModelError(f"debug:{model_type}: transformers has no config for that model type")
    config = CONFIG_MAPPING[model_type]()
    _shrink(config, vocab_size, tokens or {})
    config._attn_implementation = "eager"
    return config


#: the auto mappings a tiny model's class is taken from, in order
MAPPINGS = ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
            "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "MODEL_MAPPING_NAMES")


def model_class(model_type: str, base: bool = True) -> Any:
    """The class of a tiny ``model_type``: its base model (``base``), else its causal-LM,
    masked-LM or seq-to-seq class, whichever transformers maps first."""
    import transformers
    from transformers.models.auto import modeling_auto

    order = (MAPPINGS[-1], *MAPPINGS[:-1]) if base else MAPPINGS
    for mapping in order:
        name = getattr(modeling_auto, mapping).get(model_type)
        if isinstance(name, (list, tuple)):
            name = name[0]
        if name and hasattr(transformers, name):
            return getattr(transformers, name)
    raise ModelError(f"debug:{model_type}: transformers maps no model class to that model type")


def build_tiny(model_type: str, tokenizer, *, seed: int = 0, base: bool = True):
    """A tiny random ``model_type`` model (eval mode, eager attention) for ``tokenizer``."""
    import torch

    tokens = {k: getattr(tokenizer, k, None) for k in ("pad_token_id", "bos_token_id", "eos_token_id")}
    config = tiny_config(model_type, max(len(tokenizer), 64), tokens)
    if getattr(config, "is_encoder_decoder", False):
        config.decoder_start_token_id = tokens["pad_token_id"]
    torch.manual_seed(seed)
    model = model_class(model_type, base)(config)
    return model.eval()
