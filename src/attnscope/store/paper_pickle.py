"""The paper code's ``<name>_attn.pkl`` layout, for people with the old notebooks.

That file is a pickled list of the input dicts, each with ``tokens`` (the model's tokens,
special tokens included) and ``attns`` (float16 ``[layer, head, query, key]``). Writing one is
safe. Reading one runs the pickle machinery, which can execute code: :func:`read_paper_pickle`
refuses unless ``allow_pickle=True``, and even then only rebuilds lists, dicts, strings,
numbers and numpy arrays (any other class in the file is rejected).
"""

from __future__ import annotations

import io
import json
import pickle
import shutil
from pathlib import Path

import numpy as np

from attnscope.data.io import atomic_write_bytes, atomic_write_text, example_from_dict, to_plain
from attnscope.data.records import Example
from attnscope.errors import InputError, StoreError
from attnscope.maps import AttentionMap, token_word_ids
from attnscope.store.format import FORMAT_NAME, FORMAT_VERSION, MANIFEST, SHARDS
from attnscope.store.reader import Store
from attnscope.store.writer import DTYPES, ShardWriter, _write_index, file_sha256, versions


def export_paper_pickle(store: Store, path: str | Path) -> int:
    """Write the store as the paper code's pickle; returns the number of examples."""
    items = []
    for m in (store[i] for i in range(len(store))):
        d = m.example.to_dict()
        d["tokens"] = list(m.tokens)
        d["attns"] = m.attn.astype(np.float16)
        items.append(d)
    atomic_write_bytes(Path(path), pickle.dumps(items, protocol=4))
    return len(items)


_ALLOWED = {
    ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"), ("builtins", "list"), ("builtins", "dict"),
    ("collections", "OrderedDict"), ("numpy", "float16"), ("numpy", "float32"),
    # protocol 2 writes bytes through codecs.encode; protocol 5 arrays through _frombuffer
    ("_codecs", "encode"), ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {f'{module}.{name}'!r} from a pickle")


def read_paper_pickle(path: str | Path, *, allow_pickle: bool = False) -> list[dict]:
    """Read a paper-code ``*_attn.pkl`` (only with ``allow_pickle=True``)."""
    path = Path(path)
    if not allow_pickle:
        raise InputError(path, "is a pickle, and loading a pickle can run code: pass allow_pickle "
                               "if you trust where it came from", params=("allow_pickle",))
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror}") from None
    try:
        data = _RestrictedUnpickler(io.BytesIO(raw), encoding="latin1").load()
    except Exception as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__  # one line, whatever it says
        raise InputError(path, f"not a readable paper-format pickle ({detail})") from None
    if not isinstance(data, list) or not data:
        raise InputError(path, "expected a non-empty list of example dicts")
    first_shape = None
    for i, d in enumerate(data):
        if not isinstance(d, dict) or "tokens" not in d or "attns" not in d:
            raise InputError(path, f"example {i}: needs 'tokens' and 'attns'")
        tokens = d["tokens"]
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
            raise InputError(path, f"example {i}: 'tokens' must be a non-empty list of strings")
        a = d["attns"]
        if not isinstance(a, np.ndarray) or a.dtype.kind != "f":
            raise InputError(path, f"example {i}: 'attns' must be a float array")
        if a.nbytes > len(raw):  # not read from the file: made by ndarray(shape), never filled
            raise InputError(path, f"example {i}: 'attns' claims {a.nbytes} bytes, more than the "
                                   f"file's {len(raw)}")
        n = len(tokens)
        if a.ndim != 4 or a.shape[2:] != (n, n) or 0 in a.shape:
            raise InputError(path, f"example {i}: 'attns' has shape {list(a.shape)}, expected [L, H, {n}, {n}]")
        if first_shape is not None and a.shape[:2] != first_shape:
            raise InputError(path, f"example {i}: 'attns' has {a.shape[0]} layers x {a.shape[1]} heads, "
                                   f"example 0 has {first_shape[0]} x {first_shape[1]}")
        first_shape = a.shape[:2]
        if not np.isfinite(a).all():
            raise InputError(path, f"example {i}: 'attns' holds NaN or infinite values")
        try:  # the import keeps the other fields: they must be plain data
            import json

            json.dumps(to_plain({k: v for k, v in d.items() if k not in ("tokens", "attns")}))
        except (TypeError, ValueError, RecursionError) as exc:
            raise InputError(path, f"example {i}: a field holds something that is not plain data "
                                   f"({type(exc).__name__})") from None
        content = {k: d[k] for k in ("text", "words") if k in d}
        if content:  # the import builds the example from these: check them as an input file's

            example_from_dict(content, i, path)
    return data


def import_paper_pickle(path: str | Path, out: str | Path, *, allow_pickle: bool = False,
                        overwrite: bool = False, shard_size: int = 128, dtype: str = "float16") -> int:
    """Turn a paper-code pickle into a store (token level, as that code stores tokens)."""
    data = read_paper_pickle(path, allow_pickle=allow_pickle)
    root = Path(out)
    if root.exists() and any(root.iterdir()):
        if not overwrite:
            raise StoreError(f"{root}: already exists (use overwrite to replace it)", params=("overwrite",))
        shutil.rmtree(root)
    (root / SHARDS).mkdir(parents=True, exist_ok=True)
    L, H = np.asarray(data[0]["attns"]).shape[:2]
    specials = {"[CLS]", "[SEP]", "<s>", "</s>", "[PAD]"}
    manifest = {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "status": "incomplete",
        "model": {"name": "imported", "source": f"paper pickle {Path(path).name}",
                  "weights_sha256": "unknown", "family": "unknown", "num_layers": int(L),
                  "num_heads": int(H)},
        "level": "token", "from_word": None, "dtype": dtype, "seed": None,
        "arguments": {"options": {"max_seq_len": max(len(d["tokens"]) for d in data)},
                      "dtype": dtype, "shard_size": shard_size},
        "input": {"path": str(path), "sha256": file_sha256(Path(path)), "examples": len(data)},
        "versions": versions(), "command": None,
    }
    atomic_write_text(root / MANIFEST, json.dumps(manifest, indent=1))
    writer = ShardWriter(root, shard_size, dtype if dtype in DTYPES else "float16", set())
    for i, d in enumerate(data):
        tokens = [str(t) for t in d["tokens"]]
        fields = {k: v for k, v in d.items() if k not in ("tokens", "attns")}
        ex = Example.from_dict(to_plain(fields)) if any(k in fields for k in ("text", "words", "tokens")) \
            else Example(tokens=tokens, fields=to_plain(fields))
        special = np.array([t in specials for t in tokens])
        seg, segment = 0, []
        for t in tokens:
            segment.append(seg)
            if t in ("[SEP]", "</s>"):
                seg = 1
        writer.add(i, AttentionMap(i, np.asarray(d["attns"], dtype=np.float32), tokens, special,
                                   np.array(segment), token_word_ids(special),
                                   "token", ex))
    writer.finish()
    _write_index(root, shard_size)
    manifest["status"] = "complete"
    manifest["summary"] = {"examples_in": len(data), "examples_out": len(data), "skipped": []}
    atomic_write_text(root / MANIFEST, json.dumps(manifest, indent=1))
    return len(data)


