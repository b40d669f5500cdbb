"""The on-disk attention store: safetensors shards, a manifest, no pickle."""

from attnscope.store.reader import Store, open_store
from attnscope.store.writer import extract_to_store

__all__ = ["Store", "extract_to_store", "open_store"]
