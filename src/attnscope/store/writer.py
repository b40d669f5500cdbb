"""Writing a store: extraction straight to disk, shard by shard, resumable."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from attnscope import __version__
from attnscope.data.io import atomic_write_bytes, atomic_write_text
from attnscope.data.records import Example
from attnscope.errors import AttnscopeError, StoreError
from attnscope.extract.runner import ExtractOptions, Extractor, ExtractStats, small_matrix_threads
from attnscope.maps import AttentionMap
from attnscope.models.loading import LoadedModel, load_model
from attnscope.store.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX,
    MANIFEST,
    SHARDS,
    array_key,
    shard_name,
)

DTYPES = {"float16": np.float16, "float32": np.float32}


def versions() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers

    return {"attnscope": __version__, "python": platform.python_version(), "numpy": np.__version__,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__}


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
        item = dataclasses.replace(item, attn=item.attn.astype(self.dtype, copy=False))
        self.pending.setdefault(sid, {})[pos] = item
        if len(self.pending[sid]) == self.shard_size:
            self.write(sid)

    def finish(self) -> None:
        for sid in sorted(self.pending):
            self.write(sid)

    def write(self, sid: int) -> None:
        from safetensors.numpy import save

        items = self.pending.pop(sid)
        arrays = {array_key(pos): np.ascontiguousarray(it.attn)
                  for pos, it in sorted(items.items())}
        records = [dict(it.record(), pos=pos) for pos, it in sorted(items.items())]
        data = save(arrays, metadata={"records": json.dumps(records, ensure_ascii=False)})
        atomic_write_bytes(self.root / SHARDS / shard_name(sid), data)
        self.done.add(sid)


def _input_fingerprint(examples: list[Example]) -> str:
    h = hashlib.sha256()
    for ex in examples:
        h.update(json.dumps(ex.to_dict(), sort_keys=True, ensure_ascii=False).encode())
        h.update(b"\n")
    return h.hexdigest()


def extract_to_store(examples: Iterable[Example], out: str | Path, model: LoadedModel | str = "default",
                     *, options: ExtractOptions | None = None, dtype: str = "float16",
                     shard_size: int = 128, resume: bool = False, overwrite: bool = False,
                     source: dict | None = None, command: str | None = None,
                     progress: Callable[[int, int], None] | None = None) -> ExtractStats:
    """Extract ``examples`` into the store folder ``out`` and return what happened.

    ``progress(examples_done, tokens_done)`` is called after each batch. A store that exists
    is refused unless ``resume`` (same inputs and options: continue) or ``overwrite``.
    """
    if dtype not in DTYPES:
        raise StoreError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    if shard_size < 1:
        raise StoreError("shard size must be at least 1")
    options = options or ExtractOptions()
    examples = list(examples)
    root = Path(out)
    lm = load_model(model, seed=options.seed) if isinstance(model, str) else model
    stats = ExtractStats()
    extractor = Extractor(lm, options, stats)  # validates options against the model
    arguments = {"options": options.as_dict(), "dtype": dtype, "shard_size": shard_size}
    fingerprint = _input_fingerprint(examples)
    manifest = {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "status": "incomplete",
        "model": lm.describe(),
        "special_tokens": {"all": list(lm.tokenizer.all_special_tokens),
                           "policy": "added by the tokenizer; kept as their own units"},
        "level": "word" if options.word_level else "token",
        "from_word": options.from_word if options.word_level else None,
        "dtype": dtype, "seed": options.seed, "arguments": arguments,
        "input": dict(source or {}, examples=len(examples), sha256=fingerprint),
        "versions": versions(), "command": command,
    }
    done: set[int] = set()
    if (root / MANIFEST).exists() or (root.exists() and any(root.iterdir())):
        old = _read_json(root / MANIFEST) if (root / MANIFEST).exists() else None
        if resume and old is not None:
            same = (old.get("arguments") == arguments and old["input"].get("sha256") == fingerprint
                    and old["model"].get("weights_sha256") == lm.describe()["weights_sha256"])
            if not same:
                raise StoreError(f"{root}: cannot resume: the store was made from other inputs, "
                                 "options or weights (use --overwrite to start again)")
            done = _valid_shards(root)
        elif overwrite:
            if old is None and not (root / SHARDS).exists():
                raise StoreError(f"{root}: not a store; refusing to delete a folder of other files")
            shutil.rmtree(root)
        else:
            what = "a store" if old is not None else "other files"
            raise StoreError(f"{root}: already holds {what} (use --resume to continue it or "
                             "--overwrite to replace it)")
    fresh = not done
    (root / SHARDS).mkdir(parents=True, exist_ok=True)
    if fresh:
        atomic_write_text(root / MANIFEST, json.dumps(manifest, indent=1, ensure_ascii=False))

    start = time.perf_counter()
    writer = ShardWriter(root, shard_size, dtype, done)
    try:
        with small_matrix_threads():
            _run_plan(extractor, examples, writer, stats, progress)
    except AttnscopeError:
        if fresh:  # bad input: leave nothing behind (a resumed store keeps its whole shards)
            shutil.rmtree(root, ignore_errors=True)
        raise
    writer.finish()
    _write_index(root, shard_size)
    manifest["status"] = "complete"
    manifest["summary"] = {"examples_in": stats.examples_in, "examples_out": stats.examples_out,
                           "tokens": stats.tokens, "skipped": stats.skipped,
                           "truncated": stats.truncated, "warnings": stats.warnings}
    atomic_write_text(root / MANIFEST, json.dumps(manifest, indent=1, ensure_ascii=False))
    stats.elapsed_s = time.perf_counter() - start  # type: ignore[attr-defined]
    return stats


def _run_plan(extractor: Extractor, examples: list[Example], writer: ShardWriter, stats: ExtractStats,
              progress: Callable[[int, int], None] | None) -> None:
    """Run every planned batch whose shard is not on disk yet; hand the maps to the writer."""
    pos = 0
    for planned in extractor.plan(examples):
        positions = list(range(pos, pos + len(planned)))
        pos += len(planned)
        if all(writer.shard_of(p) in writer.done for p in positions):
            stats.examples_out += len(planned)
            stats.tokens += sum(len(e) for e in planned)
        else:
            batch = extractor.run_batch(planned)
            for p, item in zip(positions, batch.items):
                writer.add(p, item)
        if progress is not None:
            progress(stats.examples_out, stats.tokens)


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
    atomic_write_text(root / INDEX, json.dumps(index, ensure_ascii=False))

