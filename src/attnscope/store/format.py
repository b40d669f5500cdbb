"""The on-disk layout of a store (see docs/store-format.md).

```
STORE/
  manifest.json          what made the maps: model, weights hash, tokenizer, options, versions
  shards/00000.safetensors  one file per shard: "attn/<pos>" arrays [L H q k] (float16 by
                          default) + the shard's per-example records as JSON in the header
  index.json             written last: example index -> shard, shard checksums, counts
```

No pickle anywhere. A shard is written to a temporary file and renamed into place, so a
killed run leaves only whole shards; ``--resume`` re-plans the same batches and fills in the
missing shards.
"""

from __future__ import annotations

FORMAT_NAME = "attnscope-store"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
INDEX = "index.json"
SHARDS = "shards"


def shard_name(shard_id: int) -> str:
    return f"{shard_id:05d}.safetensors"


def array_key(pos: int, kind: str | None = None) -> str:
    """The array of plan position ``pos``: ``attn/<pos>``; an encoder-decoder store keeps its
    decoder and cross-attention maps as ``decoder/<pos>`` and ``cross/<pos>``."""
    return f"{kind or 'attn'}/{pos}"
