"""The two sides of a comparison: where their maps are, that they hold the same inputs, and
how one example's maps of A and B are put over the same units.

A side is a store written by ``attnscope extract`` (token or word level) or a ``run`` folder
made with ``--save-maps`` (its stores are under ``OUT/maps/<family>``, e.g. ``maps/general``
or ``maps/syntax/dev``). Everything here reads manifests and the records in the shards'
headers only, so every refusal happens before anything is written.

Units. Two models with the same tokenizer are compared token by token. Otherwise both sides
are converted to words as in the paper's section 4.1 (attention TO a word is the sum over its
pieces, FROM a word the mean of its pieces' rows; special tokens stay as their own units).
When the two word-level maps then have the same units (same words, same special tokens) they
are compared as they are; when the special tokens differ (``[CLS] .. [SEP]`` against
``<s> .. </s></s> ..``, or none for GPT-2), the common units are the words: rows are the
words' rows, columns the words plus one column holding all attention to special tokens, so
every row still sums to 1.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attnscope.errors import AttnscopeError
from attnscope.extract.encode import token_units
from attnscope.extract.wordlevel import to_word_level
from attnscope.maps import AttentionMap
from attnscope.report.html import model_display_name
from attnscope.store.format import MANIFEST
from attnscope.store.reader import Store, open_store

LEVELS = ("auto", "token", "word")
#: the column that holds all attention to special tokens in the common word units
SPECIAL_COLUMN = "(special tokens)"


@dataclass
class Side:
    """One model's side: the store compared, and the run folder it came from (if any)."""

    label: str  # "A" or "B"
    path: Path  # what was given
    store: Store
    run_dir: Path | None = None  # a run folder: its tables/ give Tables 1-3
    which: str = ""  # which of the run folder's stores ("general", "syntax/dev")

    @property
    def model(self) -> dict:
        return dict(self.store.manifest.get("model") or {})

    @property
    def name(self) -> str:
        return model_display_name(self.model)


def run_stores(run_dir: Path) -> dict[str, Path]:
    """The complete stores a run folder kept with ``--save-maps``, by name relative to
    ``maps/`` (``general``, ``syntax/dev``, ...)."""
    found = {}
    root = run_dir / "maps"
    if root.is_dir():
        for manifest in sorted(root.rglob(MANIFEST)):
            found[manifest.parent.relative_to(root).as_posix()] = manifest.parent
    return found


def _is_run(path: Path) -> bool:
    return (path / "results.json").is_file() or (path / "run" / "state.json").is_file() or (
        path / "maps").is_dir()


def open_sides(a: str | Path, b: str | Path, which: str | None = None) -> tuple[Side, Side]:
    """Open both sides; for run folders pick the store ``which`` (default: ``general`` when
    both have it, else the first name both have)."""
    pa, pb = Path(a), Path(b)
    for p in (pa, pb):
        if not p.exists():
            raise AttnscopeError(f"{p}: no such store or run folder")
        if not (p / MANIFEST).is_file() and not _is_run(p):
            raise AttnscopeError(f"{p}: neither an attnscope store nor a run folder")
    runs = [_is_run(p) and not (p / MANIFEST).is_file() for p in (pa, pb)]
    if runs[0] != runs[1]:
        raise AttnscopeError("give two stores or two run folders, not one of each")
    if not runs[0]:
        if which:
            raise AttnscopeError(f"which {which!r}: only run folders have saved maps to choose from; "
                                 "A and B are stores", params=("which",))
        return Side("A", pa, _open(pa)), Side("B", pb, _open(pb))
    sa, sb = run_stores(pa), run_stores(pb)
    for p, s in ((pa, sa), (pb, sb)):
        if not s:
            raise AttnscopeError(f"{p}: a run folder without saved maps (keep them with "
                                 "'attnscope run ... --save-maps')")
    common = [k for k in sa if k in sb]
    if which is None:
        if not common:
            raise AttnscopeError(f"{pa} and {pb} kept maps of different inputs "
                                 f"({', '.join(sa)} vs {', '.join(sb)})")
        which = "general" if "general" in common else common[0]
    elif which not in common:
        raise AttnscopeError(f"which {which!r}: not in both run folders (both have: "
                             f"{', '.join(common) or 'none'})", params=("which",))
    return (Side("A", pa, _open(sa[which]), pa, which), Side("B", pb, _open(sb[which]), pb, which))


def _open(path: Path) -> Store:
    store = open_store(path)
    if not store.complete:
        raise AttnscopeError(f"{path}: the store is unfinished (finish it with "
                             "'attnscope extract ... --resume')")
    return store


def _records(store: Store) -> dict[int, dict]:
    """Every stored example's record (no arrays), by input index."""
    out = {}
    for shard in sorted({e["shard"] for e in store.entries}):
        for r in store.shard_records(shard):
            out[int(r["index"])] = r
    return out


def _word_units_of(rec: dict) -> tuple[list[str], list[bool], list[int]]:
    """The word-level units of a record: texts, special flags and word ids."""
    if rec["level"] == "word":
        return list(rec["tokens"]), [bool(x) for x in rec["special"]], [int(x) for x in rec["word_ids"]]
    special = np.asarray(rec["special"], dtype=bool)
    ids = np.asarray(rec["word_ids"], dtype=np.int64)
    units = token_units(ids, special)
    first = np.searchsorted(units, np.arange(int(units[-1]) + 1)) if len(units) else np.array([], int)
    texts = list(_texts(rec["tokens"], special, units))
    return texts, [bool(special[t]) for t in first], [int(ids[t]) for t in first]


def _texts(tokens, special, units) -> Iterator[str]:
    """Each unit's text: a special token's own, else its pieces joined without word markers."""
    for u in range(int(units[-1]) + 1 if len(units) else 0):
        toks = np.nonzero(units == u)[0]
        if special[toks[0]]:
            yield tokens[toks[0]]
        else:
            pieces = [tokens[t] for t in toks]
            text = "".join(p[2:] if i and p.startswith("##") else p for i, p in enumerate(pieces))
            yield text.replace("Ġ", "").replace("▁", "")


@dataclass
class Pairing:
    """Which examples are compared and at which level, checked before anything is written."""

    level: str  # "token" or "word"
    indices: list[int]  # input indices stored on both sides, in order
    only_a: list[int] = field(default_factory=list)  # stored by A only (e.g. too long for B)
    only_b: list[int] = field(default_factory=list)
    layout: str = ""  # "same units" | "words + special column"
    notes: list[str] = field(default_factory=list)


def check_pairing(a: Side, b: Side, level: str = "auto") -> Pairing:
    """Refuse, with one line, two sides that are not of the same inputs; choose the level.

    Checked: the input fingerprints in the stores' manifests (when both have one), then every
    example both stored (its input record must be identical), then, at word level, that both
    tokenizers give the same words.
    """
    if level not in LEVELS:
        raise AttnscopeError(f"level must be one of {', '.join(LEVELS)}, not {level!r}", params=("level",))
    ia, ib = a.store.manifest.get("input") or {}, b.store.manifest.get("input") or {}
    ha, hb = ia.get("sha256"), ib.get("sha256")
    if ha and hb and ha != hb:
        raise AttnscopeError(f"{a.store.path} and {b.store.path} were made from different inputs "
                             f"(input sha256 {ha[:12]}... vs {hb[:12]}...)")
    ra, rb = _records(a.store), _records(b.store)
    both = sorted(set(ra) & set(rb))
    if not both:
        raise AttnscopeError(f"{a.store.path} and {b.store.path} have no example in common")
    for i in both:
        if ra[i]["example"] != rb[i]["example"]:
            raise AttnscopeError(f"{a.store.path} and {b.store.path} hold different inputs "
                                 f"(example {i} differs)")
    fa, fb = a.store.manifest.get("from_word"), b.store.manifest.get("from_word")
    if (fa or "mean") != (fb or "mean"):
        raise AttnscopeError(f"the stores were converted to words differently (from_word {fa or 'mean'} "
                             f"vs {fb or 'mean'}); extract both the same way")
    levels = {a.store.level, b.store.level}
    same_tokens = levels == {"token"} and all(ra[i]["tokens"] == rb[i]["tokens"] for i in both)
    if level == "token":
        if levels != {"token"}:
            raise AttnscopeError("level token needs two token-level stores", params=("level",))
        if not same_tokens:
            raise AttnscopeError("level token needs the same tokens on both sides (the models "
                                 "tokenize differently; use level word)", params=("level",))
        chosen = "token"
    else:
        chosen = "token" if level == "auto" and same_tokens else "word"
    pairing = Pairing(chosen, both, sorted(set(ra) - set(rb)), sorted(set(rb) - set(ra)))
    if chosen == "word":
        layouts = set()
        for i in both:
            _, sa, wa = _word_units_of(ra[i])
            _, sb, wb = _word_units_of(rb[i])
            if sa == sb and wa == wb:
                layouts.add("same units")
                continue
            words_a = [w for w, s in zip(wa, sa) if not s]
            words_b = [w for w, s in zip(wb, sb) if not s]
            if words_a != words_b or words_a != list(range(len(words_a))):
                raise AttnscopeError(
                    f"example {i}: the two tokenizers split it into different words "
                    f"({len(words_a)} vs {len(words_b)}); give inputs split into words "
                    "(JSON 'words' or CoNLL-U) to compare them at word level")
            layouts.add("words + special column")
        # one layout for every example: words only as soon as one example's special tokens differ
        pairing.layout = "same units" if layouts == {"same units"} else "words + special column"
    else:
        pairing.layout = "same units"
    if pairing.only_a or pairing.only_b:
        pairing.notes.append(f"{len(both)} examples compared; {len(pairing.only_a)} stored by A only "
                             f"and {len(pairing.only_b)} by B only (skipped as too long) are left out")
    return pairing


def to_words(m: AttentionMap) -> AttentionMap:
    """A token-level map converted to words (paper section 4.1); a word-level map as it is."""
    if m.level == "word":
        return m
    units = token_units(m.word_ids, m.special)
    attn = to_word_level(m.attn, units, "mean")
    first = np.searchsorted(units, np.arange(int(units[-1]) + 1))
    texts = list(_texts(m.tokens, m.special, units))
    if m.example.all_words is not None:
        texts = [t if m.special[f] else m.example.all_words[m.word_ids[f]] for t, f in zip(texts, first)]
    return AttentionMap(m.index, attn, texts, m.special[first], m.segment[first], m.word_ids[first],
                        "word", m.example, layers=m.layers)


def word_rows(m: AttentionMap) -> np.ndarray:
    """``[L H W W+1]``: the words' rows; columns the words, then all attention to special
    tokens summed into one column. Rows still sum to 1."""
    real = ~np.asarray(m.special, dtype=bool)
    rows = m.attn[:, :, real, :]
    return np.concatenate([rows[..., real], rows[..., ~real].sum(-1, keepdims=True)], axis=-1)


def common_units(ma: AttentionMap, mb: AttentionMap, layout: str = "same units"
                 ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Both maps over the same units (see the module docstring) and the units' texts;
    ``layout`` is the pairing's (``"same units"`` or ``"words + special column"``)."""
    if layout == "same units":
        return ma.attn, mb.attn, list(ma.tokens)
    words = [t for t, s in zip(ma.tokens, ma.special) if not s]
    return word_rows(ma), word_rows(mb), words + [SPECIAL_COLUMN]


def paired_maps(a: Side, b: Side, pairing: Pairing) -> Iterator[tuple[AttentionMap, AttentionMap]]:
    """Each compared example's maps, A's and B's, at the pairing's level; A's store is read
    shard by shard, B's by example."""
    wanted = set(pairing.indices)
    for ma in a.store:
        if ma.index not in wanted:
            continue
        mb = b.store.by_index(ma.index)
        if pairing.level == "word":
            ma, mb = to_words(ma), to_words(mb)
        yield ma, mb
