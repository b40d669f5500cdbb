"""Probe inputs: one :class:`ProbeSentence` per word-level map, streamed and batched.

A sentence of ``n`` words becomes ``m = n + 1`` units: unit 0 is ROOT, units 1..n the words,
so a gold head (1-based, 0 = ROOT) is directly a unit index. ``attn[k, i, j]`` is head
``k``'s (= ``layer * H + head``) attention from unit ``i`` to unit ``j``.

ROOT's attention (``root``):

- ``"special"`` (default): the special tokens together act as ROOT, the way a split word's
  pieces act as one word (paper section 4.1): attention TO ROOT is the SUM over the special
  tokens, attention FROM ROOT the MEAN of their rows;
- ``"first"``: the first special token only ([CLS] for BERT), which is where ROOT sits in the
  paper code's maps (it drops [SEP] and keeps [CLS] at position 0).

Punctuation (left out of UAS, kept in training): a word whose dependency relation is
``punct`` (what the paper's code checks; UD and the paper's Stanford-dependency files both
have the relation). Only an example without relations falls back to UPOS ``PUNCT``, else a
PTB punctuation tag, else a word made only of Unicode punctuation characters.

A sentence in which some word has no unit (cut off by truncation, or turned into zero
tokens; :func:`attnscope.analyses.units.word_units`) is skipped and counted
(:attr:`SentenceSource.skipped`): the probes' ROOT-plus-words layout needs every word.
"""

from __future__ import annotations

import tempfile
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from attnscope.analyses.units import word_units
from attnscope.data.records import Example
from attnscope.maps import AttentionBatch, AttentionMap

PTB_PUNCT = frozenset({"``", "''", ",", ".", ":", "-LRB-", "-RRB-", "#", "$", "HYPH", "NFP"})
ROOT_MODES = ("special", "first")


def punctuation_mask(ex: Example) -> np.ndarray:
    """``[n]`` bool: which words count as punctuation (see the module docstring).

    >>> punctuation_mask(Example(words=["-LRB-", "$", "x"], relns=["punct", "dep", "punct"])).tolist()
    [True, False, True]
    """
    words = ex.all_words or []
    if ex.relns is not None and len(ex.relns) == len(words):
        return np.array([r.split(":", 1)[0] == "punct" for r in ex.relns], dtype=bool)
    if ex.upos is not None and len(ex.upos) == len(words):
        return np.array([u == "PUNCT" for u in ex.upos], dtype=bool)
    if ex.pos is not None and len(ex.pos) == len(words):
        return np.array([p in PTB_PUNCT for p in ex.pos], dtype=bool)
    return np.array([all(unicodedata.category(c).startswith("P") for c in w) for w in words], dtype=bool)


@dataclass
class ProbeSentence:
    """One sentence ready for the probes (``m = n + 1`` units, unit 0 = ROOT)."""

    index: int
    attn: np.ndarray  # [K m m] float16
    heads: np.ndarray  # [n] int64 gold head unit, 0 = ROOT
    scored: np.ndarray  # [n] bool: counted in UAS (not punctuation)
    glove: np.ndarray  # [n] int64 rows of the GloVe table

    @property
    def num_words(self) -> int:
        return len(self.heads)

    def nbytes(self) -> int:
        return self.attn.nbytes + self.heads.nbytes * 2 + self.scored.nbytes


def probe_sentence(m: AttentionMap, glove=None, root: str = "special") -> ProbeSentence | None:
    """Features of one word-level map; None when it has no tree or words were cut off."""
    if root not in ROOT_MODES:
        raise ValueError(f"root must be one of {ROOT_MODES}, not {root!r}")
    ex = m.example
    if ex.heads is None or m.level != "word":
        return None
    n = len(ex.heads)
    units = word_units(m, n)
    if not units.present.all():
        return None
    pos = units.positions  # [n]
    L, H = m.attn.shape[:2]
    a = m.attn.reshape(L * H, m.attn.shape[2], m.attn.shape[3])  # [K u u]
    spec = np.nonzero(m.special)[0]
    if root == "first":
        spec = spec[:1]
    out = np.zeros((L * H, n + 1, n + 1), np.float32)  # [K m m]
    out[:, 1:, 1:] = a[:, pos[:, None], pos[None, :]]
    if len(spec):
        out[:, 1:, 0] = a[:, pos[:, None], spec[None, :]].sum(-1)  # words -> ROOT: sum over specials
        out[:, 0, 1:] = a[:, spec[:, None], pos[None, :]].mean(-2)  # ROOT -> words: mean of their rows
    words = ex.all_words or []
    gl = glove.lookup(words) if glove is not None else np.zeros(n, np.int64)
    return ProbeSentence(m.index, out.astype(np.float16), np.asarray(ex.heads, np.int64),
                         ~punctuation_mask(ex), gl)


class SentenceSource:
    """Probe sentences from batches of maps, read from the store once.

    ``batches`` is a function returning a fresh iterable of :class:`AttentionBatch` (e.g.
    ``store.batches``). The features of each sentence are built once, on the first pass:
    they are kept in memory up to ``cache_bytes``, and what does not fit is written once to
    a temporary float16 file that later epochs read through a memory map (the page cache
    keeps it warm). So later epochs neither read the store nor rebuild features, however
    large the set. The order of sentences is the input order either way.
    """

    def __init__(self, batches: Callable[[], Iterable[AttentionBatch]], glove=None, *,
                 root: str = "special", cache_bytes: int = 1 << 30, spill_dir: str | None = None,
                 expected: int | None = None):
        self._batches = batches
        self.expected = expected  # how many maps ``batches`` yields, when known (for progress)
        self.glove = glove
        self.root = root
        self.cache_bytes = cache_bytes
        self.spill_dir = spill_dir
        self._cache: list[list[ProbeSentence]] | None = None
        self._spill = None  # the temporary file holding features past cache_bytes
        self.skipped = 0
        self.num_sentences = 0
        self.store_passes = 0

    def chunks(self) -> Iterator[list[ProbeSentence]]:
        """One list of sentences per input batch (a store shard), in input order."""
        if self._cache is not None:
            yield from self._cache
            return

        cache: list[list[ProbeSentence]] = []
        spilled: list[tuple[ProbeSentence, int]] = []  # (sentence, byte offset in the spill file)
        size = skipped = count = 0
        spill = None
        self.store_passes += 1
        try:
            for batch in self._batches():
                chunk = []
                for m in batch:
                    s = probe_sentence(m, self.glove, self.root)
                    if s is None:
                        skipped += 1
                        continue
                    chunk.append(s)
                count += len(chunk)
                yield chunk
                kept = []
                for s in chunk:
                    if size + s.nbytes() <= self.cache_bytes:
                        size += s.nbytes()
                        kept.append(s)
                        continue
                    if spill is None:
                        spill = tempfile.TemporaryFile(dir=self.spill_dir)
                    spilled.append((s, spill.tell()))
                    spill.write(np.ascontiguousarray(s.attn, np.float16).tobytes())
                    kept.append(s)
                cache.append(kept)
        except GeneratorExit:  # an unfinished pass caches nothing
            if spill is not None:
                spill.close()
            raise
        if spill is not None:
            spill.flush()
            mm = np.memmap(spill, dtype=np.float16, mode="r")
            for s, offset in spilled:
                n = s.attn.size
                s.attn = mm[offset // 2: offset // 2 + n].reshape(s.attn.shape)
            self._spill = spill
        self.skipped, self.num_sentences = skipped, count
        self._cache = cache

    @property
    def size(self) -> int | None:
        """How many sentences a pass yields: counted once the first pass is done, else the
        ``expected`` maps (None when unknown)."""
        return self.num_sentences if self._cache is not None else self.expected

    def sentences(self) -> list[ProbeSentence]:
        """Every sentence (one pass over the store the first time)."""
        return [s for chunk in self.chunks() for s in chunk]

    def shuffled_batches(self, batch_size: int, rng: np.random.Generator,
                         buffer_chunks: int = 8, by_length: bool = True) -> Iterator[list[ProbeSentence]]:
        """Minibatches in a seeded random order, of sentences of similar length.

        Sentences are shuffled within a window of ``buffer_chunks`` chunks (a shuffle
        buffer, so memory stays bounded on the first pass), sorted by length within the
        window (random order among equal lengths), cut into batches, and the batches are
        shuffled. Similar lengths cut the padding, which costs quadratically: with random
        batches of 32 EWT sentences most of a ``[B K M M]`` batch is padding.
        ``by_length=False``: plain random batches from the window.
        """
        cut = _bucketed if by_length else _random
        buf: list[ProbeSentence] = []
        held = 0
        for chunk in self.chunks():
            buf.extend(chunk)
            held += 1
            if held >= buffer_chunks:
                yield from cut(buf, batch_size, rng)
                buf, held = [], 0
        if buf:
            yield from cut(buf, batch_size, rng)

    def ordered_batches(self, batch_size: int, by_length: bool = False) -> Iterator[list[ProbeSentence]]:
        """Batches in input order, or (``by_length``) of sentences sorted by length."""
        if by_length:
            sents = sorted(self.sentences(), key=lambda s: s.num_words)
            for i in range(0, len(sents), batch_size):
                yield sents[i:i + batch_size]
            return
        buf: list[ProbeSentence] = []
        for chunk in self.chunks():
            buf.extend(chunk)
            while len(buf) >= batch_size:
                yield buf[:batch_size]
                buf = buf[batch_size:]
        if buf:
            yield buf


def _random(buf: list[ProbeSentence], batch_size: int, rng: np.random.Generator):
    order = rng.permutation(len(buf))
    for i in range(0, len(order), batch_size):
        yield [buf[j] for j in order[i:i + batch_size]]


def _bucketed(buf: list[ProbeSentence], batch_size: int, rng: np.random.Generator):
    order = rng.permutation(len(buf))
    order = order[np.argsort([buf[j].num_words for j in order], kind="stable")]
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    for b in rng.permutation(len(batches)):
        yield [buf[j] for j in batches[b]]


def sentences_from_maps(maps: Iterable[AttentionMap], glove=None, root: str = "special") -> list[ProbeSentence]:
    """All probe sentences of some maps (small inputs and tests)."""
    out = []
    for m in maps:
        s = probe_sentence(m, glove, root)
        if s is not None:
            out.append(s)
    return out


@dataclass
class ProbeBatch:
    """Padded tensors for a minibatch (``B`` sentences, ``M`` = longest ``m``)."""

    attn: "object"  # torch [B K M M] float32
    glove: "object"  # torch [B M] int64; unit 0 (ROOT) and padding hold -1
    heads: "object"  # torch [B M] int64 gold head of each unit, -1 for ROOT and padding
    scored: "object"  # torch [B M] bool
    candidates: "object"  # torch [B M M] bool: [b, dependent, candidate] allowed
    lengths: "object"  # torch [B] units per sentence (n + 1)


def collate(batch: list[ProbeSentence], with_attn: bool = True) -> ProbeBatch:
    """Pad sentences into one :class:`ProbeBatch`; ROOT is a candidate, never a dependent."""
    import torch

    B = len(batch)
    M = max(s.num_words for s in batch) + 1
    K = batch[0].attn.shape[0]
    attn = np.zeros((B, K if with_attn else 0, M, M), np.float32)
    glove = np.full((B, M), -1, np.int64)
    heads = np.full((B, M), -1, np.int64)
    scored = np.zeros((B, M), bool)
    lengths = np.zeros(B, np.int64)
    for b, s in enumerate(batch):
        m = s.num_words + 1
        if with_attn:
            attn[b, :, :m, :m] = s.attn
        glove[b, 1:m] = s.glove
        heads[b, 1:m] = s.heads
        scored[b, 1:m] = s.scored
        lengths[b] = m
    idx = np.arange(M)
    valid = idx[None, :] < lengths[:, None]  # [B M]
    cand = valid[:, None, :] & valid[:, :, None] & (idx[None, :, None] != idx[None, None, :])
    return ProbeBatch(torch.from_numpy(attn), torch.from_numpy(glove), torch.from_numpy(heads),
                      torch.from_numpy(scored), torch.from_numpy(cand), torch.from_numpy(lengths))
