"""What attnscope needs to know about each model family, keyed by ``config.model_type``.

Nothing else in attnscope names a special token or a module path: it asks this table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelFamily:
    """Facts about one architecture family.

    ``query``/``key`` are module paths (``{layer}`` is filled in) of the projections that the
    neuron view hooks; ``fused_qkv`` marks a single projection producing query, key and value
    concatenated (GPT-2's ``c_attn``).
    """

    name: str
    causal: bool
    mlm_class: str | None  # transformers class with a masked-LM head
    token_types: bool  # trained with segment ids 0/1
    query: str | None = None
    key: str | None = None
    fused_qkv: bool = False
    #: Decoder LLMs (Llama, Qwen2, ...): no [CLS]/[SEP]; the first token (BOS, when the
    #: tokenizer adds one) plays the sink role; may use grouped-query attention.
    decoder_llm: bool = False
    #: The config attribute holding the number of key/value heads (grouped-query attention).
    kv_heads: str | None = None
    #: Encoder-decoder models (T5, BART): three kinds of attention, encoder self-attention,
    #: decoder self-attention and cross-attention (:mod:`attnscope.extract.seq2seq`).
    encoder_decoder: bool = False


MODEL_FAMILIES: dict[str, ModelFamily] = {
    f.name: f
    for f in [
        ModelFamily("bert", False, "BertForMaskedLM", True,
               "encoder.layer.{layer}.attention.self.query", "encoder.layer.{layer}.attention.self.key"),
        ModelFamily("roberta", False, "RobertaForMaskedLM", False,
               "encoder.layer.{layer}.attention.self.query", "encoder.layer.{layer}.attention.self.key"),
        ModelFamily("xlm-roberta", False, "XLMRobertaForMaskedLM", False,
               "encoder.layer.{layer}.attention.self.query", "encoder.layer.{layer}.attention.self.key"),
        ModelFamily("camembert", False, "CamembertForMaskedLM", False,
               "encoder.layer.{layer}.attention.self.query", "encoder.layer.{layer}.attention.self.key"),
        ModelFamily("electra", False, "ElectraForMaskedLM", True,
               "encoder.layer.{layer}.attention.self.query", "encoder.layer.{layer}.attention.self.key"),
        ModelFamily("distilbert", False, "DistilBertForMaskedLM", False,
               "transformer.layer.{layer}.attention.q_lin", "transformer.layer.{layer}.attention.k_lin"),
        ModelFamily("mpnet", False, "MPNetForMaskedLM", False,
               "encoder.layer.{layer}.attention.attn.q", "encoder.layer.{layer}.attention.attn.k"),
        ModelFamily("albert", False, "AlbertForMaskedLM", True,
               "encoder.albert_layer_groups.0.albert_layers.0.attention.query",
               "encoder.albert_layer_groups.0.albert_layers.0.attention.key"),
        ModelFamily("gpt2", True, None, False, "h.{layer}.attn.c_attn", "h.{layer}.attn.c_attn",
               fused_qkv=True),
        *[ModelFamily(name, True, None, False, "layers.{layer}.self_attn.q_proj",
                 "layers.{layer}.self_attn.k_proj", decoder_llm=True, kv_heads="num_key_value_heads")
          for name in ("llama", "qwen2", "mistral", "gemma", "phi")],
        *[ModelFamily(name, False, None, False, encoder_decoder=True)
          for name in ("t5", "mt5", "bart", "mbart", "marian", "pegasus")],
    ]
}


def module_at(model, path: str):
    """The module at a table path (``{layer}`` filled in) of ``model``, looked up on the model
    itself and under its base-model prefix (a model loaded with its head); None if neither has it."""
    for candidate in (path, f"{getattr(model, 'base_model_prefix', '')}.{path}"):
        try:
            return model.get_submodule(candidate)
        except AttributeError:
            continue
    return None


def family_for(model_type: str) -> ModelFamily:
    """The family of a ``config.model_type``; unknown types get a generic encoder entry.

    A generic entry still works for extraction (special tokens come from the tokenizer); only
    the neuron view and the masked-LM gradient analysis need the table's module names.
    """
    fam = MODEL_FAMILIES.get(model_type)
    if fam is not None:
        return fam
    return ModelFamily(model_type, causal=False, mlm_class=None, token_types=False)
