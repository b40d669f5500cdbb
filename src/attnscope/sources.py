"""The one rule by which a family's input path becomes data (:func:`read_source`).

A family declares which kinds its input accepts (:attr:`attnscope.families.base.Input.kinds`);
the path's kind is decided here, the same way for every family:

- ``store``: a folder (a store written by ``attnscope extract``; an unfinished one is refused);
- ``examples``: a ``.json`` / ``.jsonl`` file, or any file whose text starts with ``[`` or ``{``
  (a JSON list of dicts, or JSON Lines);
- ``trees``: dependency trees, CoNLL-U or the paper's ``word head-relation`` format;
- ``text``: sentence-per-line text with blank lines between documents, made into BERT-style
  ``[CLS] A [SEP] B [SEP]`` pairs (:func:`attnscope.data.unlabeled.prepare_unlabeled`).

>>> from pathlib import Path
>>> kind_of(Path("wiki.txt"), ("store", "examples", "text"))   # doctest: +SKIP
'text'
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnscope.data.depparse import iter_depparse
from attnscope.data.io import read_examples, read_text
from attnscope.data.records import Example
from attnscope.data.unlabeled import (
    DEFAULT_UNK_MARKER,
    UnlabeledStats,
    packing_mismatch,
    prepare_unlabeled,
)
from attnscope.errors import AttnscopeError, InputError
from attnscope.store import Store, open_store
from attnscope.store.format import MANIFEST

KINDS = ("store", "examples", "trees", "text")
WHAT = {"store": "a store folder", "examples": "examples JSON / JSON Lines",
        "trees": "dependency trees (CoNLL-U or word head-relation)", "text": "sentence-per-line text"}


def kind_of(path: Path, accepts: tuple[str, ...]) -> str:
    """The kind of ``path`` among those a family ``accepts``; refused (naming the path and
    what is accepted) when it is none of them."""
    path = Path(path)
    if path.is_dir():
        kind = "store"
    elif not path.is_file():
        raise InputError(path, "no such file" + (" or store folder" if "store" in accepts else ""))
    elif path.suffix.lower() in (".json", ".jsonl") or _starts_like_json(path):
        kind = "examples"
    else:
        kind = "trees" if "trees" in accepts else "text"
    if kind not in accepts:
        raise InputError(path, f"is {WHAT[kind]}; this input takes "
                               + ", ".join(WHAT[k] for k in accepts))
    return kind


def _starts_like_json(path: Path) -> bool:
    return read_text(path).lstrip()[:1] in ("[", "{")


def open_input_store(path: Path, attention: str | None = None):
    """A store folder given as a family's input: refused, naming the folder, when it is not a
    store or its extraction did not finish (analyses of part of a corpus would look whole).
    ``attention``: the kind an encoder-decoder store is read as."""
    if not (Path(path) / MANIFEST).is_file():
        raise InputError(path, "is a folder but not an attnscope store (no manifest.json)")
    store = open_store(path, attention)
    if not store.complete:
        raise InputError(path, "is an unfinished store (its extraction was interrupted); finish it "
                               "with 'attnscope extract ... --resume' first")
    return store


def _already_read(data: Any, accepts: tuple[str, ...], *, model, limit: int | None,
                  require_model: bool, attention: str | None) -> Source:
    """An input given from Python already read: an opened store, or examples."""
    if isinstance(data, Store):
        if "store" not in accepts:
            raise InputError(data.path, "is a store; this input takes " + ", ".join(WHAT[k] for k in accepts))
        if attention is None and data.complete:
            return Source(data.path, "store", data)
        return Source(data.path, "store", open_input_store(data.path, attention or data.kind))
    examples = list(data) if isinstance(data, (list, tuple)) else None
    wrong = next((e for e in examples or () if not isinstance(e, Example)), None)
    if not examples or wrong is not None:
        what = (type(data).__name__ if examples is None else "an empty list" if not examples
                else f"a list holding {type(wrong).__name__}")
        raise AttnscopeError("an input given from Python is a path, an opened store or a list of "
                             f"attnscope.data.records.Example, not {what}")
    if "examples" not in accepts and "trees" not in accepts:
        raise AttnscopeError("this input takes " + ", ".join(WHAT[k] for k in accepts) + ", not examples")
    if attention is not None:
        raise AttnscopeError(f"attention {attention} reads an encoder-decoder store, and this input is "
                             "examples", params=("attention",))
    if model is None and require_model:
        raise AttnscopeError("examples need a tokenizer: give model, or a store", params=("model",))
    return Source(None, "examples", examples[:limit])


@dataclass
class Source:
    """An input read by :func:`read_source`: ``data`` is a list of
    :class:`~attnscope.data.records.Example` or an opened store; ``text`` says how
    sentence-per-line text became pairs (None for other kinds); ``note``, when set, goes among
    the findings and into the error when no example fits."""

    path: Path | None  # None for what was given from Python already read
    kind: str
    data: Any
    text: Any = None
    note: str | None = None  # one line about the examples (packed for another tokenizer)

    @property
    def is_store(self) -> bool:
        return self.kind == "store"

    def __len__(self) -> int:
        return len(self.data)


def read_source(path: str | Path | Store | Sequence[Example], accepts: tuple[str, ...], *, model=None,
                max_seq_len: int = 128,
                seed: int = 0, num_examples: int | None = None, packing: str = "bert",
                keep_unk: bool = False, limit: int | None = None, require_model: bool = False,
                attention: str | None = None) -> Source:
    """Read ``path`` as the kind :func:`kind_of` decides. Text needs ``model`` (its tokenizer
    cuts the pairs to ``max_seq_len``); ``num_examples`` pairs are built from text, with
    ``packing`` and ``keep_unk`` (:func:`~attnscope.data.unlabeled.prepare_unlabeled`);
    ``limit`` keeps only the first examples of any kind but a store; ``require_model``: refuse
    anything but a store without ``model``; ``attention``: the kind of an encoder-decoder store
    to read (anything but a store is then refused). Examples that ``prepare unlabeled`` packed for
    another tokenizer than ``model``'s get a ``note`` saying so
    (:func:`~attnscope.data.unlabeled.packing_mismatch`). ``path`` may also be what was read
    already, from Python: an opened store, or a list of examples (``path`` is then None)."""
    if not isinstance(path, (str, os.PathLike)):
        return _already_read(path, accepts, model=model, limit=limit, require_model=require_model,
                             attention=attention)
    path = Path(path)
    kind = kind_of(path, accepts)
    if kind == "store":
        return Source(path, kind, open_input_store(path, attention))
    if attention is not None:
        raise AttnscopeError(f"{path}: attention {attention} reads an encoder-decoder store, and "
                             "this input is not a store (attnscope extract makes one)",
                             params=("attention",))
    if model is None and (require_model or kind == "text"):
        what = "sentence-per-line text" if kind == "text" else WHAT[kind]
        raise AttnscopeError(f"{path}: {what} need a tokenizer: give model, or a store folder",
                             params=("model",))
    if kind == "examples":
        examples = read_examples(path)[:limit]
        return Source(path, kind, examples, note=packing_mismatch(examples, model, path) if model else None)
    if kind == "trees":
        examples = list(iter_depparse(path))
        if not examples:
            raise InputError(path, "holds no sentences")
        return Source(path, kind, examples[:limit])

    stats = UnlabeledStats()
    examples = prepare_unlabeled(path, model.tokenizer, max_seq_len=max_seq_len, seed=seed,
                                 num_examples=num_examples, packing=packing, stats=stats,
                                 unk_marker=None if keep_unk else DEFAULT_UNK_MARKER)
    return Source(path, kind, examples[:limit], text=stats)
