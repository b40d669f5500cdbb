"""The random-initialisation baseline model (paper section 5, Table 3).

The same architecture with freshly initialised weights (``type(model)(config)`` after
``torch.manual_seed(seed)``, i.e. the library's own initialiser) but the pretrained embedding
layer copied over, as the paper describes: what the probe finds in its attention is what the
architecture and the word embeddings give without any training of the attention layers.
"""

from __future__ import annotations

import copy

from attnscope.models.loading import LoadedModel

#: Added to the seed so that the twin of a debug model (itself random, built with the same
#: seed) does not get the very same weights.
RANDOM_INIT_SEED_OFFSET = 1_000_003


def _embedding_modules(model):
    """The embedding module(s) whose weights are kept: BERT-style ``embeddings``, else the
    input embeddings plus GPT-2's position table ``wpe`` when present."""
    base = getattr(model, "base_model", model)
    if hasattr(base, "embeddings"):
        return {"embeddings": base.embeddings}
    out = {"input": base.get_input_embeddings()}
    if hasattr(base, "wpe"):
        out["wpe"] = base.wpe
    return out


def random_init_model(lm: LoadedModel, seed: int = 0) -> LoadedModel:
    """A copy of ``lm`` with random weights except the embeddings (seeded, eager attention)."""
    import torch

    config = copy.deepcopy(lm.model.config)
    config._attn_implementation = "eager"
    torch.manual_seed(RANDOM_INIT_SEED_OFFSET + seed)
    model = type(lm.model)(config)
    model.eval()
    src, dst = _embedding_modules(lm.model), _embedding_modules(model)
    with torch.no_grad():
        for key, module in src.items():
            dst[key].load_state_dict(module.state_dict())
    return LoadedModel(model=model, tokenizer=lm.tokenizer, family=lm.family,
                       name=f"{lm.name} (random init, seed {seed}, pretrained embeddings)",
                       source=lm.source, weights_hash=f"random-init:{seed}:{lm.weights_hash}",
                       revision=lm.revision, has_mlm_head=False,
                       extra={"random_init_seed": seed, "embeddings_from": lm.weights_hash})
