"""Generation: a loaded decoder with its language-model head, and greedy continuation.

attnscope loads decoders without their head (attention needs none); :func:`causal_lm_for` puts
one on the loaded weights for what continues a prompt (``--longctx-generate``, the atlas's
needle answers, the generated-text view), :func:`greedy_continue` is the decoding loop, and
:class:`DecoderStep` gives a picklable per-item step its decoder once per process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnscope.errors import ModelError


def causal_lm_for(lm, *, seed: int = 0):
    """The decoder of a :class:`~attnscope.models.loading.LoadedModel` with its language-model
    head (for ``--longctx-generate``), sharing the loaded weights.

    attnscope loads decoders without their head (attention needs none). The head is the input
    embedding when the config ties them (SmolLM2, Qwen2, Gemma), else ``lm_head.weight`` from
    the model folder's safetensors; a tiny random ``debug:`` model gets a random head drawn
    from ``seed``.
    """
    import torch
    import transformers

    base = lm.model
    if not lm.facts.causal:
        raise ModelError(f"{lm.name} is not a decoder: it cannot continue a prompt")
    if base.get_output_embeddings() is not None:
        return base
    config = base.config
    torch.manual_seed(seed)
    wrapper = transformers.AutoModelForCausalLM.from_config(config)
    setattr(wrapper, wrapper.base_model_prefix, base)  # the loaded decoder, not a new one
    head = wrapper.get_output_embeddings()
    if getattr(config, "tie_word_embeddings", False):
        head.weight = base.get_input_embeddings().weight
    elif not lm.name.startswith("debug:"):
        folder = Path(lm.extra.get("dequantized_cache") or lm.source)
        weight = _tensor_from_folder(folder, "lm_head.weight")
        if weight is None:
            raise ModelError(f"{lm.name}: no 'lm_head.weight' in {folder}; cannot generate")
        with torch.no_grad():
            head.weight.copy_(weight)
    wrapper.to(base.device)
    wrapper.eval()
    return wrapper


class DecoderStep:
    """Base of a picklable per-item step (:meth:`attnscope.families.base.Units.tasks`) that
    needs the model's decoder with its language-model head: :meth:`decoder` makes it once per
    process that runs the step (:func:`causal_lm_for`, head seeded by ``seed``), and it is never
    pickled with the step."""

    seed: int = 0

    def decoder(self, lm):
        cached = self.__dict__.get("_decoder")
        if cached is None or cached[0] is not lm.model:
            cached = self.__dict__["_decoder"] = (lm.model, causal_lm_for(lm, seed=self.seed))
        return cached[1]

    def eos(self, lm) -> frozenset[int]:
        """The end-of-sequence ids of the decoder this step runs (what stops a greedy answer)."""
        return eos_ids(self.decoder(lm))

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_decoder"}


@dataclass
class ContinueStep(DecoderStep):
    """One prompt's greedy continuation by up to ``new_tokens`` tokens: ``{"ids": [...]}``."""

    new_tokens: int
    seed: int = 0

    def __call__(self, lm, ids: list[int]) -> dict:
        return {"ids": greedy_continue(self.decoder(lm), ids, self.new_tokens)}


def _tensor_from_folder(folder: Path, key: str):
    from safetensors import safe_open

    for f in sorted(folder.glob("*.safetensors")) if folder.is_dir() else []:
        with safe_open(str(f), framework="pt") as st:
            if key in st.keys():
                return st.get_tensor(key)
    return None


def continuation(lm, ids: list[int], new_tokens: int, *, seed: int = 0) -> list[int]:
    """The ids that greedy decoding appends to ``ids`` (:func:`greedy_continue`) with ``lm``'s
    decoder and its language-model head (:func:`causal_lm_for`, a ``debug:`` model's head drawn
    from ``seed``): what a view of a model's own continuation asks for."""
    return greedy_continue(causal_lm_for(lm, seed=seed), ids, new_tokens)


def eos_ids(model) -> frozenset[int]:
    """The ids that end a decoder's text (its generation config's ``eos_token_id``)."""
    eos = model.generation_config.eos_token_id
    return frozenset() if eos is None else frozenset(eos if isinstance(eos, list) else [eos])


def greedy_continue(model, ids: list[int], new_tokens: int) -> list[int]:
    """The ``new_tokens`` ids that greedy decoding appends to ``ids`` (fewer when the model
    emits one of its end-of-sequence ids, which is kept, as ``generate`` does).

    One pass over the prompt, then one token at a time with the key/value cache (transformers'
    ``cache=`` argument and output, which replaced ``past_key_values`` in 5.24); the next
    token is the arg-max of the last position's logits (the first on ties), which is what
    ``model.generate(do_sample=False)`` does with the default generation settings.
    """
    import torch

    eos = eos_ids(model)
    out: list[int] = []
    if new_tokens <= 0:
        return out
    device = next(model.parameters()).device
    with torch.no_grad():
        step = model(input_ids=torch.tensor([list(ids)], device=device), use_cache=True)
        for _ in range(new_tokens):
            nxt = int(step.logits[0, -1].argmax())
            out.append(nxt)
            if nxt in eos or len(out) == new_tokens:
                break
            step = model(input_ids=torch.tensor([[nxt]], device=device), cache=step.cache,
                         use_cache=True)
    return out


def seq2seq_greedy(lm, source_ids: list[int], new_tokens: int) -> list[int]:
    """What an encoder-decoder model's decoder reads when it continues ``source_ids`` greedily:
    its start token and up to ``new_tokens`` tokens (``generate(do_sample=False, num_beams=1)``)."""
    import torch

    src = torch.tensor([list(source_ids)], device=lm.device)
    with torch.inference_mode():
        out = lm.model.generate(input_ids=src, attention_mask=torch.ones_like(src),
                                max_new_tokens=new_tokens, min_new_tokens=0, do_sample=False, num_beams=1)
    return [int(i) for i in out[0]]
