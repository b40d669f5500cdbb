"""The viewer's list of examples: paging and text search over a store, read lazily.

Opening costs nothing beyond :func:`attnscope.store.open_store` (manifest and index). Texts
live in each shard's JSON header; a shard's header is read the first time a page or a search
reaches it and its texts are kept (a few bytes per example), never its arrays.
"""

from __future__ import annotations

from attnscope.data.records import Example


def record_text(rec: dict) -> str:
    """One line of text for a stored record (its example's text, words or tokens)."""
    ex = Example.from_dict(rec.get("example", {}))
    if ex.text is not None:
        first = ex.text
    elif ex.words is not None:
        first = " ".join(ex.words)
    else:
        first = " ".join(rec.get("tokens", []))
    second = ex.text_pair if ex.text_pair is not None else (
        " ".join(ex.words_pair) if ex.words_pair else None)
    return first if second is None else f"{first} || {second}"


class Catalog:
    """Example positions, input indices and texts of an open store, read shard by shard."""

    def __init__(self, store):
        self.store = store
        self._entries = store.entries  # [{"index", "shard", "pos", "length"}] in input order
        self._texts: dict[str, dict[int, str]] = {}  # shard file -> plan position -> text

    def __len__(self) -> int:
        return len(self._entries)

    def _shard_texts(self, shard: str) -> dict[int, str]:
        if shard not in self._texts:
            records = self.store.shard_records(shard)
            self._texts[shard] = {r["pos"]: record_text(r) for r in records}
        return self._texts[shard]

    def item(self, i: int) -> dict:
        """The ``i``-th stored example: ``{"pos", "index", "length", "text"}``."""
        e = self._entries[i]
        return {"pos": i, "index": e["index"], "length": e["length"],
                "text": self._shard_texts(e["shard"]).get(e["pos"], "")}

    def page(self, offset: int = 0, limit: int = 50) -> dict:
        """Examples ``offset .. offset + limit`` in input order."""
        offset = max(0, offset)
        stop = min(len(self), offset + max(0, limit))
        items = [self.item(i) for i in range(offset, stop)]
        return {"items": items, "total": len(self), "next": stop if stop < len(self) else None}

    def search(self, query: str, offset: int = 0, limit: int = 50) -> dict:
        """Examples whose text contains ``query`` (case-insensitive), from position ``offset``.

        Stops as soon as ``limit`` matches are found; ``next`` is where to continue.
        """
        q = query.casefold().strip()
        if not q:
            return self.page(offset, limit)
        items = []
        i = max(0, offset)
        while i < len(self) and len(items) < limit:
            it = self.item(i)
            if q in it["text"].casefold():
                items.append(it)
            i += 1
        return {"items": items, "total": None, "next": i if i < len(self) else None}
