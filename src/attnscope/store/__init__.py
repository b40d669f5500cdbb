"""The on-disk formats: the attention store (safetensors shards, a manifest, no pickle) and the
results folder (strict JSON, :mod:`attnscope.store.results`)."""

from attnscope.store.reader import Store, open_store

__all__ = ["Store", "open_store"]
