"""Writing a store: extraction straight to disk, shard by shard, resumable."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import platform
import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from attnscope.data.io import atomic_write_bytes
from attnscope.data.io import file_fingerprint as file_sha256  # the index's shard hashes
from attnscope.data.io import fingerprint as data_fingerprint
from attnscope.data.records import Example
from attnscope.errors import AttnscopeError, StoreError
from attnscope.extract.runner import ExtractOptions, Extractor, ExtractStats
from attnscope.extract.seq2seq import kind_shapes
from attnscope.maps import AttentionMap
from attnscope.models.loading import LoadedModel, as_loaded
from attnscope.store.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX,
    MANIFEST,
    SHARDS,
    array_key,
    shard_name,
)
from attnscope.version import __version__

DTYPES = {"float16": np.float16, "float32": np.float32}


class WriteError(StoreError):
    """The disk refused a write (full, read-only, no permission). The store keeps its finished
    shards, so the same command with ``--resume`` continues once the problem is fixed."""


def _write_file(root: Path, path: Path, data: bytes) -> None:
    """Write ``path`` (inside the store ``root``) atomically; a refused write is a WriteError."""
    try:
        atomic_write_bytes(path, data)
    except OSError as exc:
        reason = (exc.strerror or type(exc).__name__).lower()
        raise WriteError(f"{root}: cannot write {path.relative_to(root)}: {reason}; the finished "
                         "shards are kept: make room (or fix the folder) and run the same command "
                         "with resume", params=("resume",)) from None


def _leftovers_only(root: Path) -> bool:
    """True when ``root`` holds nothing but what a run killed at its very start leaves: the
    temporary files of atomic writes (``.NAME.XXXX.tmp``) and an empty ``shards/``."""
    for p in root.iterdir():
        if p.is_file() and p.name.startswith(".") and p.name.endswith(".tmp"):
            continue
        if p.is_dir() and p.name == SHARDS and all(
                q.is_file() and q.name.startswith(".") and q.name.endswith(".tmp") for q in p.iterdir()):
            continue
        return False
    return True


def versions() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers

    return {"attnscope": __version__, "python": platform.python_version(), "numpy": np.__version__,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__}


class ShardWriter:
    """Collects maps by plan position and writes each shard once all its positions are in."""

    def __init__(self, root: Path, shard_size: int, dtype: str, done: set[int]):
        self.root = root
        self.shard_size = shard_size
        self.dtype = DTYPES[dtype]
        self.done = done  # shard ids already on disk
        self.pending: dict[int, dict[int, AttentionMap]] = {}
        self.expected: dict[int, int] = {}

    def shard_of(self, pos: int) -> int:
        return pos // self.shard_size

    def add(self, pos: int, item: AttentionMap) -> None:
        sid = self.shard_of(pos)
        if sid in self.done:
            return
        # hold the map in the store's dtype (float16: half the memory of a float32 shard in
        # waiting); a new map, so the caller's batch is left as it was
        others = {k: dataclasses.replace(m, attn=m.attn.astype(self.dtype, copy=False))
                  for k, m in (item.others or {}).items()} or None
        item = dataclasses.replace(item, attn=item.attn.astype(self.dtype, copy=False), others=others)
        self.pending.setdefault(sid, {})[pos] = item
        if len(self.pending[sid]) == self.shard_size:
            self.write(sid)

    def finish(self) -> None:
        for sid in sorted(self.pending):
            self.write(sid)

    def write(self, sid: int) -> None:
        from safetensors.numpy import save

        items = self.pending.pop(sid)
        arrays = {array_key(pos, kind): np.ascontiguousarray(m.attn)
                  for pos, it in sorted(items.items())
                  for kind, m in [(None, it), *sorted((it.others or {}).items())]}
        records = [dict(it.record(), pos=pos, **_others_records(it)) for pos, it in sorted(items.items())]
        data = save(arrays, metadata={"records": json.dumps(records, ensure_ascii=False)})
        _write_file(self.root, self.root / SHARDS / shard_name(sid), data)
        self.done.add(sid)


def _kinds(lm: LoadedModel) -> dict:
    if not lm.facts.encoder_decoder:
        return {}

    return {"attention_kinds": kind_shapes(lm)}


def _others_records(item: AttentionMap) -> dict:
    """An encoder-decoder example's decoder and cross-attention records (their units; the
    example and its index are the encoder record's)."""
    if not item.others:
        return {}
    return {"others": {k: {f: v for f, v in m.record().items() if f not in ("index", "example")}
                       for k, m in sorted(item.others.items())}}


def check_output_folder(root: Path, *, resume: bool = False, overwrite: bool = False) -> None:
    """Refuse an output folder that cannot be used, before any model is loaded.

    A missing or empty folder is fine. One that holds a store needs ``resume`` or ``overwrite``;
    one that holds other files is never touched; a file is not a folder.
    """
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise StoreError(f"{root}: is a file, not a store folder")
    if not root.exists() or not any(root.iterdir()) or _leftovers_only(root):
        return
    is_store = (root / MANIFEST).is_file()
    if not is_store:
        if overwrite and (root / SHARDS).is_dir():
            return  # a store whose manifest was lost: --overwrite may replace it
        raise StoreError(f"{root}: already holds other files (not a store); choose another out",
                         params=("out",))
    if not (resume or overwrite):
        raise StoreError(f"{root}: already holds a store (use resume to continue it or "
                         "overwrite to replace it)", params=("resume", "overwrite"))


@dataclasses.dataclass
class StoreJob:
    """A store folder opened for writing by :func:`open_store_job`: the checked folder, the
    model's extractor, the manifest written so far and the shards already on disk (``done``).

    Whoever runs the plan (this process, or the workers of :mod:`attnscope.on_ray.cluster`) writes
    the shards; :meth:`finish` then writes the index and the completed manifest, last."""

    root: Path
    examples: list[Example]
    extractor: Extractor
    stats: ExtractStats
    manifest: dict
    done: set[int]
    fresh: bool
    shard_size: int
    dtype: str

    @contextlib.contextmanager
    def cleanup_on_error(self):
        """Bad input leaves nothing behind; a refused write keeps the whole shards for --resume."""
        try:
            yield
        except AttnscopeError as exc:
            if self.fresh and not isinstance(exc, WriteError):
                shutil.rmtree(self.root, ignore_errors=True)
            raise

    def finish(self) -> None:
        _write_index(self.root, self.shard_size)
        stats = self.stats
        self.manifest["status"] = "complete"
        self.manifest["summary"] = {"examples_in": stats.examples_in, "examples_out": stats.examples_out,
                                    "tokens": stats.tokens, "skipped": stats.skipped,
                                    "truncated": stats.truncated, "warnings": stats.warnings}
        _write_file(self.root, self.root / MANIFEST,
                    json.dumps(self.manifest, indent=1, ensure_ascii=False).encode())


def open_store_job(examples: Iterable[Example], out: str | Path, model: LoadedModel | str = "default",
                   *, options: ExtractOptions | None = None, dtype: str = "float16",
                   shard_size: int = 128, resume: bool = False, overwrite: bool = False,
                   source: dict | None = None, command: str | None = None) -> StoreJob:
    """Check ``out``, load the model, write the first (incomplete) manifest of a fresh store, or
    find the valid shards of a store to resume; see :func:`attnscope.jobs.extract_to_store`."""
    if dtype not in DTYPES:
        raise StoreError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}", params=("dtype",))
    if shard_size < 1:
        raise StoreError("shard size must be at least 1")
    options = options or ExtractOptions()
    examples = list(examples)
    root = Path(out)
    check_output_folder(root, resume=resume, overwrite=overwrite)  # before the model loads
    lm = as_loaded(model, seed=options.seed)
    stats = ExtractStats()
    extractor = Extractor(lm, options, stats)  # validates options against the model
    for i, ex in enumerate(examples):  # before anything is written
        extractor.check_target(ex, i)
    arguments = {"options": options.as_dict(), "dtype": dtype, "shard_size": shard_size}
    fingerprint = data_fingerprint(*(ex.to_dict() for ex in examples))
    manifest = {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "status": "incomplete",
        "model": lm.describe(),
        "special_tokens": {"all": list(lm.tokenizer.all_special_tokens),
                           "policy": "added by the tokenizer; kept as their own units"},
        "level": "word" if options.word_level else "token",
        "from_word": options.from_word if options.word_level else None,
        "dtype": dtype, "seed": options.seed, "arguments": arguments,
        "input": dict(source or {}, examples=len(examples), sha256=fingerprint),
        **_kinds(lm),
        "versions": versions(), "command": command,
    }
    done: set[int] = set()
    if root.is_dir() and not (root / MANIFEST).exists() and _leftovers_only(root):
        shutil.rmtree(root)  # a run killed before its manifest was written: start afresh
    if (root / MANIFEST).exists() or (root.exists() and any(root.iterdir())):
        old = _read_json(root / MANIFEST) if (root / MANIFEST).exists() else None
        if resume and old is not None:
            same = (old.get("arguments") == arguments and old["input"].get("sha256") == fingerprint
                    and old["model"].get("weights_sha256") == lm.describe()["weights_sha256"])
            if not same:
                raise StoreError(f"{root}: cannot resume: the store was made from other inputs, "
                                 "options or weights (use overwrite to start again)", params=("overwrite",))
            done = _valid_shards(root)
            for tmp in root.glob(".*.tmp"):  # a manifest or index in flight when killed
                tmp.unlink()
        elif overwrite:
            if old is None and not (root / SHARDS).exists():
                raise StoreError(f"{root}: not a store; refusing to delete a folder of other files")
            shutil.rmtree(root)
        else:
            what = "a store" if old is not None else "other files"
            raise StoreError(f"{root}: already holds {what} (use resume to continue it or "
                             "overwrite to replace it)", params=("resume", "overwrite"))
    fresh = not done
    if fresh:  # the manifest first: a folder with shards/ always says what it is
        _write_file(root, root / MANIFEST, json.dumps(manifest, indent=1, ensure_ascii=False).encode())
    (root / SHARDS).mkdir(parents=True, exist_ok=True)
    return StoreJob(root=root, examples=examples, extractor=extractor, stats=stats, manifest=manifest,
                    done=done, fresh=fresh, shard_size=shard_size, dtype=dtype)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreError(f"{path}: unreadable ({exc})") from None


def _valid_shards(root: Path) -> set[int]:
    """Ids of the shards on disk whose header reads back; others are written again."""
    from safetensors import safe_open

    ok = set()
    for tmp in (root / SHARDS).glob(".*.tmp"):  # a shard in flight when the run was killed
        tmp.unlink()
    for f in sorted((root / SHARDS).glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="np") as sf:
                sf.metadata()
            ok.add(int(f.stem))
        except Exception:
            f.unlink()
    return ok


def _write_index(root: Path, shard_size: int) -> None:
    from safetensors import safe_open

    examples = []
    shards = []
    for f in sorted((root / SHARDS).glob("*.safetensors")):
        with safe_open(str(f), framework="np") as sf:
            records = json.loads(sf.metadata()["records"])
        shards.append({"file": f.name, "sha256": file_sha256(f), "examples": len(records)})
        for r in records:
            examples.append([r["index"], f.name, r["pos"], len(r["tokens"])])
    examples.sort()
    index = {"shard_size": shard_size, "shards": shards,
             "examples": [{"index": i, "shard": s, "pos": p, "length": n} for i, s, p, n in examples]}
    _write_file(root, root / INDEX, json.dumps(index, ensure_ascii=False).encode())

