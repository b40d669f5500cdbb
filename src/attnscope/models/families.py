"""The true exceptions among model families, keyed by ``config.model_type``: where the neuron
view finds the query/key projections, which masked-LM class a family has, and which families
were trained with segment ids 0/1.

What a model *is* (causal, bidirectional or encoder-decoder; its heads and head sizes; which
layers have attention; sinks, soft-capping, windows) is not here: it is read from the model
itself (:mod:`attnscope.models.facts`). A model type missing from this table loses only what the
table holds: the neuron view through projections and segment ids.
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
    mlm_class: str | None  # transformers class with a masked-LM head
    token_types: bool  # trained with segment ids 0/1
    query: str | None = None
    key: str | None = None
    fused_qkv: bool = False


MODEL_FAMILIES: dict[str, ModelFamily] = {
    f.name: f
    for f in [
        ModelFamily("bert", "BertForMaskedLM", True,
               "encoder.layer.{layer}.attention.self.query", "encoder.layer.{layer}.attention.self.key"),
        ModelFamily("roberta", "RobertaForMaskedLM", False,
               "encoder.layer.{layer}.attention.self.query", "encoder.layer.{layer}.attention.self.key"),
        ModelFamily("xlm-roberta", "XLMRobertaForMaskedLM", False,
               "encoder.layer.{layer}.attention.self.query", "encoder.layer.{layer}.attention.self.key"),
        ModelFamily("camembert", "CamembertForMaskedLM", False,
               "encoder.layer.{layer}.attention.self.query", "encoder.layer.{layer}.attention.self.key"),
        ModelFamily("electra", "ElectraForMaskedLM", True,
               "encoder.layer.{layer}.attention.self.query", "encoder.layer.{layer}.attention.self.key"),
        ModelFamily("distilbert", "DistilBertForMaskedLM", False,
               "transformer.layer.{layer}.attention.q_lin", "transformer.layer.{layer}.attention.k_lin"),
        ModelFamily("mpnet", "MPNetForMaskedLM", False,
               "encoder.layer.{layer}.attention.attn.q", "encoder.layer.{layer}.attention.attn.k"),
        ModelFamily("albert", "AlbertForMaskedLM", True,
               "encoder.albert_layer_groups.0.albert_layers.0.attention.query",
               "encoder.albert_layer_groups.0.albert_layers.0.attention.key"),
        ModelFamily("gpt2", None, False, "h.{layer}.attn.c_attn", "h.{layer}.attn.c_attn",
               fused_qkv=True),
        *[ModelFamily(name, None, False, "layers.{layer}.self_attn.q_proj", "layers.{layer}.self_attn.k_proj")
          for name in ("llama", "qwen2", "mistral", "gemma", "phi")],
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
    """The exceptions of a ``config.model_type``; a type outside the table has none (no segment
    ids, no projection paths: the neuron view reads the hook points, which every model routed
    through AttentionInterface has)."""
    fam = MODEL_FAMILIES.get(model_type)
    if fam is not None:
        return fam
    return ModelFamily(model_type, mlm_class=None, token_types=False)
