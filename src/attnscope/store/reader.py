"""Reading a store: streaming shard by shard, or random access by example."""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from attnscope.data.records import recorded_layers
from attnscope.errors import AttnscopeError, StoreError
from attnscope.maps import AttentionBatch, AttentionMap
from attnscope.store.format import FORMAT_NAME, INDEX, MANIFEST, SHARDS, array_key
from attnscope.store.writer import file_sha256


class Store:
    """A store folder opened for reading.

    ``len(store)`` examples; ``store[i]`` is the i-th stored example in input order (an
    :class:`AttentionMap` with ``attn`` as float32 ``[L H q k]``); ``store.by_index(n)`` finds
    the example that was number ``n`` in the input. Iterating streams shard by shard, holding
    one shard's maps at a time; ``store.batches()`` yields one :class:`AttentionBatch` per shard.
    """

    def __init__(self, path: str | Path, kind: str | None = None):
        self.path = Path(path)
        mpath = self.path / MANIFEST
        if not self.path.is_dir():
            raise StoreError(f"{self.path}: no such store folder")
        if not mpath.is_file():
            raise StoreError(f"{self.path}: not an attnscope store (no {MANIFEST})")
        self.manifest = _read_json_object(mpath, "manifest")
        if self.manifest.get("format") != FORMAT_NAME:
            raise StoreError(f"{mpath}: not an attnscope store manifest")
        _check_fields(self.manifest, _MANIFEST_FIELDS, mpath, "manifest")
        self.kind = self._choose_kind(kind, mpath)
        #: the kind read from the arrays and records beside the main ones (None: the main ones)
        self._other = self.kind if self.kind not in (None, "encoder") else None
        self._entries = self._load_entries()
        self._by_index = {e["index"]: k for k, e in enumerate(self._entries)}
        self._header_cache: OrderedDict[str, list[dict]] = OrderedDict()
        self._cache_lock = threading.Lock()  # a viewer reads one store from several threads

    def _choose_kind(self, kind: str | None, mpath: Path) -> str | None:
        """An encoder-decoder store reads as one kind of attention: "encoder" (the default),
        "decoder" or "cross"; the manifest seen through this object then describes that kind
        (its layers and heads; ``causal`` for the decoder), so analyses need nothing else."""
        kinds = self.manifest.get("attention_kinds")
        if not kinds:
            if kind is not None:
                raise StoreError(f"{self.path}: attention kind {kind!r}: not an encoder-decoder "
                                 "store (it has one kind of attention)", params=("kind",))
            return None
        if not isinstance(kinds, dict) or any(
                not isinstance(v, dict) or not isinstance(v.get("num_layers"), int)
                or not isinstance(v.get("num_heads"), int) for v in kinds.values()):
            raise StoreError(f"{mpath}: corrupt manifest (attention_kinds)")
        kind = kind or "encoder"
        if kind not in kinds:
            raise StoreError(f"{self.path}: no attention kind {kind!r} (it has {', '.join(kinds)})",
                             params=("kind",))
        if kind != "encoder":
            model = dict(self.manifest["model"], **kinds[kind], causal=kind == "decoder")
            self.manifest = dict(self.manifest, model=model)
        return kind

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of attention stored: ``("encoder", "decoder", "cross")`` for an
        encoder-decoder model, else ``()``."""
        return tuple(self.manifest.get("attention_kinds") or ())

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
            index = _read_json_object(ipath, "index")
            entries = index.get("examples")
            if not isinstance(entries, list):
                raise StoreError(f"{ipath}: corrupt index (no list of examples)")
            for k, e in enumerate(entries):
                _check_fields(e, _ENTRY_FIELDS, ipath, f"index entry {k}")
                if not _SHARD_NAME.fullmatch(e["shard"]):
                    raise StoreError(f"{ipath}: corrupt index (entry {k} names shard {e['shard']!r})")
        else:
            entries = []  # an unfinished store: read what the whole shards hold
            for f in sorted((self.path / SHARDS).glob("*.safetensors")):
                if not _SHARD_NAME.fullmatch(f.name):
                    continue  # not a shard this format writes
                for r in self._records(f):
                    entries.append({"index": r["index"], "shard": f.name, "pos": r["pos"],
                                    "length": len(r["tokens"])})
            entries.sort(key=lambda e: e["index"])
        seen: set[int] = set()
        for e in entries:
            if e["index"] in seen:
                raise StoreError(f"{ipath if ipath.is_file() else self.path / SHARDS}: example "
                                 f"{e['index']} is stored twice")
            seen.add(e["index"])
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
                records = json.loads(sf.metadata()["records"])
            except (KeyError, TypeError, ValueError, RecursionError):
                raise StoreError(f"{shard}: corrupt shard (no records in its header)") from None
        if not isinstance(records, list):
            raise StoreError(f"{shard}: corrupt shard (its records are not a list)")
        for k, r in enumerate(records):
            _check_fields(r, _RECORD_FIELDS, shard, f"record {k}")
        return records

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
        with self._cache_lock:
            if shard in cache:
                cache.move_to_end(shard)
                return cache[shard]
        records = self._records(self.path / SHARDS / shard)
        with self._cache_lock:
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
        rec = next((r for r in self.shard_records(e["shard"]) if r["pos"] == e["pos"]), None)
        if rec is None:
            raise StoreError(f"{shard}: corrupt shard (no record at position {e['pos']})")
        with self._open(shard) as sf:
            attn = self._get(sf, shard, e["pos"])
        return self._map(rec, attn, shard)

    def by_index(self, index: int) -> AttentionMap:
        """The example that was number ``index`` in the input."""
        if index not in self._by_index:
            raise KeyError(f"example {index} is not in the store (skipped or out of range)")
        return self[self._by_index[index]]

    def _get(self, sf, shard: Path, pos: int) -> np.ndarray:
        try:
            attn = sf.get_tensor(array_key(pos, self._other)).astype(np.float32)
        except Exception as exc:
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise StoreError(f"{shard}: corrupt shard, cannot read example at position {pos} "
                             f"({first})") from None
        if attn.ndim != 4 or attn.shape[:2] != (self.num_layers, self.num_heads) \
                or (attn.shape[2] != attn.shape[3] and self.kind != "cross"):
            raise StoreError(f"{shard}: corrupt shard, example at position {pos} has shape "
                             f"{list(attn.shape)}, expected [{self.num_layers}, {self.num_heads}, n, n]")
        return attn

    def _map(self, rec: dict, attn: np.ndarray, shard: Path) -> AttentionMap:
        n = attn.shape[2]
        if self._other:  # the kind's own units, the encoder record's example
            other = (rec.get("others") or {}).get(self._other)
            if not isinstance(other, dict) or not all(k in other for k in ("tokens", "special", "segment", "word_ids")):
                raise StoreError(f"{shard}: corrupt shard, no {self.kind} record at position {rec['pos']}")
            rec = {**other, "index": rec["index"], "example": rec["example"], "pos": rec["pos"]}
            if self.kind == "cross" and len(rec.get("key_tokens") or []) != attn.shape[3]:
                raise StoreError(f"{shard}: corrupt shard, the cross record at position {rec['pos']} "
                                 f"does not match its {n} x {attn.shape[3]} map")
        if any(len(rec[k]) != n for k in ("tokens", "special", "segment", "word_ids")) or \
                len(rec.get("token_text") or rec["tokens"]) != n:
            raise StoreError(f"{shard}: corrupt shard, the record at position {rec['pos']} does not "
                             f"match its {n} x {n} map")
        try:
            amap = AttentionMap.from_record(rec, attn)
        except (AttnscopeError, KeyError, TypeError, ValueError, AttributeError, OverflowError):
            raise StoreError(f"{shard}: corrupt shard, bad record at position {rec['pos']}") from None
        amap.layers = recorded_layers(self.manifest.get("model"))
        return amap

    def shards(self) -> list[Path]:
        names = sorted({e["shard"] for e in self._entries})
        return [self.path / SHARDS / n for n in names]

    def batches(self) -> Iterator[AttentionBatch]:
        """One batch per shard, in shard order; only one shard's maps in memory at a time."""
        for shard in self.shards():
            records = self._records(shard)
            with self._open(shard) as sf:
                items = [self._map(r, self._get(sf, shard, r["pos"]), shard) for r in records]
            yield AttentionBatch(items)

    def __iter__(self) -> Iterator[AttentionMap]:
        for batch in self.batches():
            yield from batch

    def check_shards(self) -> None:
        """Every shard the store lists is on disk and whole, or a StoreError naming the first
        that is not. Cheap (no array is read): a safetensors header says where each array
        ends, so a shard cut short or grown no longer matches its own header. A shard changed
        in place keeps its size; :meth:`verify` finds that one by its checksum."""
        for shard in self.shards():
            with self._open(shard):
                pass

    def verify(self) -> list[str]:
        """Check every shard against the checksums in the index; returns the problems."""
        problems = []
        ipath = self.path / INDEX
        if not ipath.is_file():
            return [f"{self.path}: no index.json: the store is unfinished (finish it with "
                    "'attnscope extract ... --resume')"]
        index = _read_json_object(ipath, "index")
        shards = index.get("shards")
        if not isinstance(shards, list):
            raise StoreError(f"{ipath}: corrupt index (no list of shards)")
        for k, s in enumerate(shards):
            _check_fields(s, (("file", str), ("sha256", str)), ipath, f"shard entry {k}")
            if not _SHARD_NAME.fullmatch(s["file"]):
                raise StoreError(f"{ipath}: corrupt index (shard entry {k} names {s['file']!r})")
            f = self.path / SHARDS / s["file"]
            if not f.is_file():
                problems.append(f"{f}: missing")
            elif file_sha256(f) != s["sha256"]:
                problems.append(f"{f}: checksum mismatch (corrupt)")
        return problems

    def summary(self) -> dict:
        try:
            return self._summary()
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise StoreError(f"{self.path / MANIFEST}: corrupt manifest (bad or missing {exc})") from None

    def _summary(self) -> dict:
        m = self.manifest
        lengths = self.lengths()
        size = sum(f.stat().st_size for f in (self.path / SHARDS).glob("*.safetensors"))
        return {
            "path": str(self.path), "status": m.get("status"), "model": m["model"]["name"],
            "model_source": m["model"]["source"], "weights_sha256": m["model"]["weights_sha256"],
            **({"attention_kinds": ", ".join(self.kinds)} if self.kinds else {}),
            "layers": self.num_layers, "heads": self.num_heads, "level": self.level,
            "from_word": m.get("from_word"), "dtype": m["dtype"], "examples": len(self),
            "shards": len(self.shards()),
            # what the model read (pieces, special tokens included) vs. what the store holds
            # per example (at word level: words + special tokens): they differ at word level
            "model_tokens": (m.get("summary") or {}).get("tokens") if self.complete else None,
            "stored_positions": int(sum(lengths)),
            "mean_length": float(np.mean(lengths)) if lengths else 0.0,
            "max_length": int(max(lengths)) if lengths else 0, "bytes_on_disk": size,
            "skipped": len(m.get("summary", {}).get("skipped", [])),
            "max_seq_len": m["arguments"]["options"]["max_seq_len"], "seed": m.get("seed"),
            "attnscope_version": m["versions"]["attnscope"],
        }


#: A shard file name as the writer makes it (no folders: an index cannot point outside).
_SHARD_NAME = re.compile(r"[0-9]{5,}\.safetensors")

#: (dotted key, type) that a readable manifest / index entry / shard record must have.
_MANIFEST_FIELDS = (("level", str), ("dtype", str), ("model", dict), ("model.name", str),
                    ("model.num_layers", int), ("model.num_heads", int))
_ENTRY_FIELDS = (("index", int), ("shard", str), ("pos", int), ("length", int))
_RECORD_FIELDS = (("index", int), ("pos", int), ("tokens", list), ("special", list),
                  ("segment", list), ("word_ids", list), ("level", str), ("example", dict))


def _read_json_object(path: Path, what: str) -> dict:
    """A JSON object from ``path``, or a one-line StoreError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the {what} ({exc.strerror})") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise StoreError(f"{path}: corrupt {what} ({first})") from None
    if not isinstance(data, dict):
        raise StoreError(f"{path}: corrupt {what} (not a JSON object)")
    return data


def _check_fields(obj, fields, path: Path, what: str) -> None:
    """Each dotted key of ``fields`` is present in ``obj`` with its type (bool is not an int)."""
    if not isinstance(obj, dict):
        raise StoreError(f"{path}: corrupt {what} (not a JSON object)")
    for key, kind in fields:
        node = obj
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        ok = isinstance(node, kind) and not (kind is int and isinstance(node, bool))
        if ok and kind is int and node < (1 if key.startswith("model.") else 0):
            ok = False
        if not ok:
            raise StoreError(f"{path}: corrupt {what} (bad or missing '{key}')")


def open_store(path: str | Path, kind: str | None = None) -> Store:
    """Open a store folder for reading (see :class:`Store`); ``kind`` picks the attention an
    encoder-decoder store reads as ("encoder", the default, "decoder" or "cross")."""
    return Store(path, kind)
