"""Reading a store: streaming shard by shard, or random access by example."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from attnscope.errors import StoreError
from attnscope.maps import AttentionBatch, AttentionMap
from attnscope.store.format import FORMAT_NAME, INDEX, MANIFEST, SHARDS, array_key


class Store:
    """A store folder opened for reading.

    ``len(store)`` examples; ``store[i]`` is the i-th stored example in input order (an
    :class:`AttentionMap` with ``attn`` as float32 ``[L H q k]``); ``store.by_index(n)`` finds
    the example that was number ``n`` in the input. Iterating streams shard by shard, holding
    one shard's maps at a time; ``store.batches()`` yields one :class:`AttentionBatch` per shard.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        mpath = self.path / MANIFEST
        if not self.path.is_dir():
            raise StoreError(f"{self.path}: no such store folder")
        if not mpath.is_file():
            raise StoreError(f"{self.path}: not an attnscope store (no {MANIFEST})")
        try:
            self.manifest = json.loads(mpath.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StoreError(f"{mpath}: corrupt manifest ({exc})") from None
        if self.manifest.get("format") != FORMAT_NAME:
            raise StoreError(f"{mpath}: not an attnscope store manifest")
        self._entries = self._load_entries()
        self._by_index = {e["index"]: k for k, e in enumerate(self._entries)}
        self._header_cache: OrderedDict[str, list[dict]] = OrderedDict()

    # -- metadata ---------------------------------------------------------------------------
    @property
    def complete(self) -> bool:
        return self.manifest.get("status") == "complete"

    @property
    def level(self) -> str:
        return self.manifest["level"]

    @property
    def num_layers(self) -> int:
        return self.manifest["model"]["num_layers"]

    @property
    def num_heads(self) -> int:
        return self.manifest["model"]["num_heads"]

    def _load_entries(self) -> list[dict]:
        ipath = self.path / INDEX
        if ipath.is_file() and self.complete:
            try:
                index = json.loads(ipath.read_text(encoding="utf-8"))
                return index["examples"]
            except (UnicodeDecodeError, json.JSONDecodeError, KeyError) as exc:
                raise StoreError(f"{ipath}: corrupt index ({exc})") from None
        entries = []  # an unfinished store: read what the whole shards hold
        for f in sorted((self.path / SHARDS).glob("*.safetensors")):
            for r in self._records(f):
                entries.append({"index": r["index"], "shard": f.name, "pos": r["pos"],
                                "length": len(r["tokens"])})
        entries.sort(key=lambda e: e["index"])
        return entries

    def _open(self, shard: Path):
        from safetensors import safe_open

        if not shard.is_file():
            raise StoreError(f"{shard}: shard missing")
        try:
            return safe_open(str(shard), framework="np")
        except Exception as exc:
            raise StoreError(f"{shard}: corrupt or truncated shard ({str(exc).splitlines()[0]})") from None

    def _records(self, shard: Path) -> list[dict]:
        with self._open(shard) as sf:
            try:
                return json.loads(sf.metadata()["records"])
            except (KeyError, TypeError, json.JSONDecodeError):
                raise StoreError(f"{shard}: corrupt shard (no records in its header)") from None

    # -- access -----------------------------------------------------------------------------
    @property
    def entries(self) -> list[dict]:
        """Per stored example, in input order: ``{"index", "shard", "pos", "length"}`` (read-only)."""
        return self._entries

    def shard_records(self, shard: str) -> list[dict]:
        """The per-example records in the header of shard file ``shard`` (no arrays).

        The last few shards' headers are cached, so reading examples of one shard one by one
        parses its header once.
        """
        cache = self._header_cache
        if shard in cache:
            cache.move_to_end(shard)
            return cache[shard]
        records = self._records(self.path / SHARDS / shard)
        cache[shard] = records
        if len(cache) > 4:
            cache.popitem(last=False)
        return records

    def __len__(self) -> int:
        return len(self._entries)

    def indices(self) -> list[int]:
        """Input indices of the stored examples, in order."""
        return [e["index"] for e in self._entries]

    def lengths(self) -> list[int]:
        return [e["length"] for e in self._entries]

    def __getitem__(self, i: int) -> AttentionMap:
        if not -len(self) <= i < len(self):
            raise IndexError(f"store has {len(self)} examples, no example {i}")
        e = self._entries[i]
        shard = self.path / SHARDS / e["shard"]
        rec = next(r for r in self.shard_records(e["shard"]) if r["pos"] == e["pos"])
        with self._open(shard) as sf:
            attn = self._get(sf, shard, e["pos"])
        return AttentionMap.from_record(rec, attn)

    def by_index(self, index: int) -> AttentionMap:
        """The example that was number ``index`` in the input."""
        if index not in self._by_index:
            raise KeyError(f"example {index} is not in the store (skipped or out of range)")
        return self[self._by_index[index]]

    def _get(self, sf, shard: Path, pos: int) -> np.ndarray:
        try:
            return sf.get_tensor(array_key(pos)).astype(np.float32)
        except Exception as exc:
            raise StoreError(f"{shard}: corrupt shard, cannot read example at position {pos} "
                             f"({str(exc).splitlines()[0]})") from None

    def shards(self) -> list[Path]:
        names = sorted({e["shard"] for e in self._entries})
        return [self.path / SHARDS / n for n in names]

    def batches(self) -> Iterator[AttentionBatch]:
        """One batch per shard, in shard order; only one shard's maps in memory at a time."""
        for shard in self.shards():
            records = self._records(shard)
            with self._open(shard) as sf:
                items = [AttentionMap.from_record(r, self._get(sf, shard, r["pos"])) for r in records]
            yield AttentionBatch(items)

    def __iter__(self) -> Iterator[AttentionMap]:
        for batch in self.batches():
            yield from batch

    def verify(self) -> list[str]:
        """Check every shard against the checksums in the index; returns the problems."""
        from attnscope.store.writer import file_sha256

        problems = []
        ipath = self.path / INDEX
        if not ipath.is_file():
            return ["no index.json: the store is unfinished (run extract again with --resume)"]
        index = json.loads(ipath.read_text(encoding="utf-8"))
        for s in index["shards"]:
            f = self.path / SHARDS / s["file"]
            if not f.is_file():
                problems.append(f"{f}: missing")
            elif file_sha256(f) != s["sha256"]:
                problems.append(f"{f}: checksum mismatch (corrupt)")
        return problems

    def summary(self) -> dict:
        m = self.manifest
        lengths = self.lengths()
        size = sum(f.stat().st_size for f in (self.path / SHARDS).glob("*.safetensors"))
        return {
            "path": str(self.path), "status": m.get("status"), "model": m["model"]["name"],
            "model_source": m["model"]["source"], "weights_sha256": m["model"]["weights_sha256"],
            "layers": self.num_layers, "heads": self.num_heads, "level": self.level,
            "from_word": m.get("from_word"), "dtype": m["dtype"], "examples": len(self),
            "shards": len(self.shards()), "tokens": int(sum(lengths)),
            "mean_length": float(np.mean(lengths)) if lengths else 0.0,
            "max_length": int(max(lengths)) if lengths else 0, "bytes_on_disk": size,
            "skipped": len(m.get("summary", {}).get("skipped", [])),
            "max_seq_len": m["arguments"]["options"]["max_seq_len"], "seed": m.get("seed"),
            "attnscope_version": m["versions"]["attnscope"],
        }


def open_store(path: str | Path) -> Store:
    """Open a store folder for reading (see :class:`Store`)."""
    return Store(path)
