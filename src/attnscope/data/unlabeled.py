"""Sentence-per-line text into BERT pre-training style pairs ``[CLS] A [SEP] B [SEP]``.

Documents are separated by blank lines; the last document is kept even without a trailing
blank line. Two ways to pack a document's sentences into examples (``packing``):

- ``"bert"`` (default), as BERT's pre-training data was built: sentences are added to a chunk
  until the chunk reaches the target length in tokens (``max_seq_len`` minus the special
  tokens the model adds to a pair) or the document ends. A chunk of two or more sentences is
  split into segment A (ids 0) and segment B (ids 1) at a sentence boundary drawn at random
  (seeded); a chunk that one sentence fills on its own takes the document's next sentence as
  B (BERT would take a random other document; the paper analyses real continuations). While
  the pair is longer than the target, one token is removed from the longer side (A on a
  tie: BERT's rule), at its front or back by a seeded coin flip. A cut at the front moves on
  to the next word start so that no example starts inside a word; a cut at the back may end
  inside a word, as BERT's does. So almost every example is exactly ``max_seq_len`` tokens;
  the exceptions are documents (or document tails) shorter than the target, which are kept
  and counted, and one-sentence documents, which give ``[CLS] A [SEP]``.
- ``"greedy"`` (attnscope before 0.2): sentences are packed only while they fit, a new
  example starts otherwise, and a sentence longer than the budget is cut to its longest
  whole-word prefix that fits. Most examples are then shorter than the target (on
  WikiText-2 the mean is about 106 of 128 tokens and 11% have one segment).

``unk_marker``: the corpus's marker for an unknown word (WikiText writes ``<unk>``) is
replaced by the tokenizer's own unknown token, so it becomes one ``[UNK]`` instead of junk
pieces like ``<``, ``un``, ``##k``, ``>``. Every occurrence is replaced, inside words too
(``<unk>-<unk>``, ``<unk>-like``, ``1,<unk>``: 364 of WikiText-2 valid's 11,529 markers), but
only when the tokenizer produces an unknown token of its own (WordPiece, SentencePiece without
byte fallback); byte-level tokenizers never do (GPT-2's is its end-of-text token, SmolLM2's its
document separator), so there the marker is left as text; :attr:`UnlabeledStats.unk_note`
says which (:func:`unk_replacement`).

``packed_for``: the model whose tokenizer counted the lengths, recorded in every example's
``packed_for`` field with that tokenizer's vocabulary fingerprint (:func:`tokenizer_fingerprint`)
and ``max_seq_len``, so that an analysis with another tokenizer can say why its examples no
longer fit (:func:`packing_mismatch`). Files without the field (written by hand, or by
attnscope before it recorded one) are read as they are.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from attnscope.data.io import iter_examples, read_text, text_fingerprint
from attnscope.data.records import Example
from attnscope.errors import InputError

PACKINGS = ("bert", "greedy")
DEFAULT_UNK_MARKER = "<unk>"
PACKED_FOR = "packed_for"  # the example field that says which tokenizer the pairs were packed for


@dataclass
class UnlabeledStats:
    """What :func:`prepare_unlabeled` built; ``lengths`` are tokens per example, specials included."""

    documents: int = 0
    sentences: int = 0
    examples: int = 0
    cut_sentences: list[int] = field(default_factory=list)  # line numbers (greedy packing)
    lengths: list[int] = field(default_factory=list)
    single_segment: int = 0
    max_seq_len: int = 0
    packing: str = "bert"
    unk_replaced: int = 0
    unk_note: str = ""

    @property
    def short(self) -> int:
        """Examples shorter than ``max_seq_len`` tokens."""
        return sum(1 for n in self.lengths if n < self.max_seq_len)

    def distribution(self) -> dict[str, float]:
        """Mean length, share at the maximum and share with one segment (0 for no examples)."""
        n = len(self.lengths)
        if not n:
            return {"mean_length": 0.0, "share_at_max": 0.0, "share_single_segment": 0.0}
        return {"mean_length": sum(self.lengths) / n,
                "share_at_max": sum(1 for x in self.lengths if x >= self.max_seq_len) / n,
                "share_single_segment": self.single_segment / n}

    def summary(self) -> str:
        """One line for the command's output."""
        d = self.distribution()
        return (f"{self.examples} examples from {self.documents} documents ({self.sentences} sentences; "
                f"{self.packing} packing): mean {d['mean_length']:.1f} tokens, "
                f"{100 * d['share_at_max']:.1f}% at the maximum {self.max_seq_len}, "
                f"{self.short} shorter, {100 * d['share_single_segment']:.1f}% with one segment"
                + (f"; {len(self.cut_sentences)} over-long sentences cut" if self.packing == "greedy" else "")
                + f"; {self.unk_note}")


def read_documents(path: str | Path) -> Iterator[list[tuple[int, str]]]:
    """Documents as lists of ``(line number, sentence)``."""
    text = read_text(path)
    doc: list[tuple[int, str]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            doc.append((lineno, line.strip()))
        elif doc:
            yield doc
            doc = []
    if doc:
        yield doc


def unk_replacement(tokenizer) -> str | None:
    """The tokenizer's own unknown token, or None when it has none that it produces itself:
    none at all, one shared with its other special tokens (GPT-2 uses its end-of-text token for
    everything), or a byte-level tokenizer's (GPT-2, RoBERTa, Llama 3, SmolLM2), which encodes
    every text without it, so the model never saw it for an unknown word in pre-training
    (SmolLM2-Instruct names its document separator ``<|endoftext|>`` as unknown token)."""
    unk = getattr(tokenizer, "unk_token", None)
    if not unk or _byte_level(tokenizer):
        return None
    others = {getattr(tokenizer, k, None) for k in ("bos_token", "eos_token", "cls_token", "sep_token",
                                                    "pad_token", "mask_token")}
    return None if unk in others else str(unk)


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the tokenizer's vocabulary (every ``token: id`` pair, added tokens included):
    two tokenizers that cut text differently almost always differ here (a tokenizer has no file
    of its own to hash when it was built in memory, as the debug models' are)."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    return text_fingerprint(json.dumps(vocab, ensure_ascii=False))


def packing_mismatch(examples: list[Example], model, path: str | Path) -> str | None:
    """One line when ``examples`` (read from ``path``) were packed by ``prepare unlabeled`` for
    another tokenizer than ``model``'s (a loaded model): their lengths were counted in other
    pieces, so many may now be too long or short. None when they were packed for this one, or
    when the file does not say (it was not made by ``prepare unlabeled``, or before the field)."""
    rec = next((e.fields[PACKED_FOR] for e in examples if isinstance(e.fields.get(PACKED_FOR), dict)), None)
    if rec is None or rec.get("vocab_sha256") == tokenizer_fingerprint(model.tokenizer):
        return None
    return (f"{path}: packed to {rec.get('max_seq_len')} tokens of the tokenizer of "
            f"{rec.get('model')!r}, not of {model.name!r}, so lengths differ here; prepare it for "
            f"this model with 'attnscope prepare unlabeled TEXT --model {model.name} --out FILE'")


def _byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    parts = (getattr(backend, "pre_tokenizer", None), getattr(backend, "decoder", None))
    return any(type(p).__name__ == "ByteLevel" for p in parts)


def prepare_unlabeled(path: str | Path, tokenizer, *, max_seq_len: int = 128, seed: int = 0,
                      num_docs: int | None = None, num_examples: int | None = None,
                      stats: UnlabeledStats | None = None, packing: str = "bert",
                      unk_marker: str | None = DEFAULT_UNK_MARKER,
                      packed_for: str | None = None) -> list[Example]:
    """Build pair examples from a sentence-per-line file (see the module docstring).

    ``tokenizer`` is a fast tokenizer; lengths count its pieces plus the special tokens it adds
    for a pair (3 for BERT, 4 for RoBERTa, 0 for GPT-2). ``unk_marker=None`` keeps the text as
    it is. ``packed_for``: the name of the model the tokenizer belongs to; when given, each
    example records it with the tokenizer's fingerprint and ``max_seq_len`` (field
    ``packed_for``).
    """
    if packing not in PACKINGS:
        raise InputError(None, f"packing must be one of {', '.join(PACKINGS)}, not {packing!r}",
                         params=("packing",))
    stats = stats if stats is not None else UnlabeledStats()
    stats.max_seq_len, stats.packing = max_seq_len, packing
    rng = random.Random(seed)
    pair_extra = _n(tokenizer, "a", "b") - _n(tokenizer, "a") - _n(tokenizer, "b")
    budget = max_seq_len - pair_extra
    if budget < 2:
        raise InputError(path, f"max_seq_len {max_seq_len} leaves no room for text", params=("max_seq_len",))
    unk = unk_replacement(tokenizer) if unk_marker else None
    if not unk_marker:
        stats.unk_note = "unknown-word markers left as text, as asked"
    elif unk is None:
        stats.unk_note = (f"{unk_marker!r} left as text (the tokenizer has no unknown token of its own "
                          "that it produces itself)")
    packed = ({"model": packed_for, "vocab_sha256": tokenizer_fingerprint(tokenizer),
               "max_seq_len": max_seq_len} if packed_for is not None else None)
    examples: list[Example] = []
    for d, doc in enumerate(read_documents(path)):
        if num_docs is not None and d >= num_docs:
            break
        stats.documents += 1
        if unk is not None:
            fixed = []
            for lineno, s in doc:
                stats.unk_replaced += s.count(unk_marker)
                fixed.append((lineno, s.replace(unk_marker, unk)))
            doc = fixed
        stats.sentences += len(doc)
        pack = _pack_bert if packing == "bert" else _pack_greedy
        for a, b, line in pack(doc, tokenizer, budget, rng, stats):
            ex = Example(text=a, text_pair=b, fields={"doc": d, "line": line})
            if packed is not None:
                ex.fields[PACKED_FOR] = dict(packed)
            examples.append(ex)
            stats.examples += 1
            stats.lengths.append(_n(tokenizer, a, b, special=True))
            stats.single_segment += b is None
            if num_examples is not None and len(examples) >= num_examples:
                break
        if num_examples is not None and len(examples) >= num_examples:
            break
    if unk is not None:
        stats.unk_note = f"{stats.unk_replaced} {unk_marker!r} markers mapped to {unk!r}"
    if not examples:
        raise InputError(path, "holds no sentences")
    return examples


def _n(tokenizer, a: str, b: str | None = None, special: bool | None = None) -> int:
    """Tokens of ``a`` (and ``b``); special tokens only for a pair or when asked."""
    add = (b is not None) if special is None else special
    return len(tokenizer(a, b, add_special_tokens=add)["input_ids"])


def _pack_greedy(doc, tokenizer, budget: int, rng: random.Random, stats: UnlabeledStats):
    sents = []
    for lineno, s in doc:
        n = _n(tokenizer, s)
        if n > budget:
            s = _cut(s, tokenizer, budget)
            n = _n(tokenizer, s)
            stats.cut_sentences.append(lineno)
        sents.append((lineno, s, n))
    i = 0
    while i < len(sents):
        chunk = [sents[i]]
        total = sents[i][2]
        j = i + 1
        while j < len(sents) and total + sents[j][2] <= budget:
            chunk.append(sents[j])
            total += sents[j][2]
            j += 1
        if len(chunk) == 1:
            yield chunk[0][1], None, chunk[0][0]
        else:
            split = rng.randint(1, len(chunk) - 1)
            yield (" ".join(c[1] for c in chunk[:split]), " ".join(c[1] for c in chunk[split:]),
                   chunk[0][0])
        i = j


def _pack_bert(doc, tokenizer, budget: int, rng: random.Random, stats: UnlabeledStats):
    sents = [(lineno, s, _n(tokenizer, s)) for lineno, s in doc]
    chunk: list[tuple[int, str, int]] = []
    length = 0
    i = 0
    while i < len(sents):
        chunk.append(sents[i])
        length += sents[i][2]
        last = i == len(sents) - 1
        if last or length >= budget:
            if len(chunk) == 1 and not last:  # one sentence fills the target: B is the next one
                i += 1
                chunk.append(sents[i])
            if len(chunk) == 1:
                a, b = chunk[0][1], None
            else:
                split = rng.randint(1, len(chunk) - 1)
                a = " ".join(c[1] for c in chunk[:split])
                b = " ".join(c[1] for c in chunk[split:])
            a, b = _truncate_pair(a, b, tokenizer, budget, rng)
            yield a, b, chunk[0][0]
            chunk, length = [], 0
        i += 1


def _truncate_pair(a: str, b: str | None, tokenizer, budget: int, rng: random.Random):
    """BERT's ``truncate_seq_pair``: trim the longer side one token at a time, at its front
    or back by a coin flip, until both fit ``budget``; then cut the texts accordingly."""
    enc_a = tokenizer(a, add_special_tokens=False, return_offsets_mapping=True)
    enc_b = tokenizer(b, add_special_tokens=False, return_offsets_mapping=True) if b is not None else None
    n = [len(enc_a["input_ids"]), len(enc_b["input_ids"]) if enc_b is not None else 0]
    cut = [[0, 0], [0, 0]]  # [side][front, back]
    while n[0] + n[1] > budget:
        side = 0 if n[0] >= n[1] else 1
        cut[side][0 if rng.random() < 0.5 else 1] += 1
        n[side] -= 1
    a = _slice(a, enc_a, *cut[0], tokenizer)
    if b is not None:
        b = _slice(b, enc_b, *cut[1], tokenizer)
    return a, b


def _slice(text: str, enc, front: int, back: int, tokenizer) -> str:
    """``text`` without its first ``front`` and last ``back`` tokens (see :func:`_truncate_pair`)."""
    if not front and not back:
        return text
    offsets, words = enc["offset_mapping"], enc.word_ids()
    n = len(offsets)
    stop = n - back
    while 0 < front < stop and words[front] == words[front - 1]:  # start at a word start
        front += 1
    if front >= stop:  # what is left lies inside one word: keep that side's first piece
        front, stop = 0, 1
    out = text[offsets[front][0]:offsets[stop - 1][1]]
    # byte-level BPE may not give back the same pieces for a word cut in two: drop that word
    while stop - front > 1 and _n(tokenizer, out) > stop - front:
        stop -= 1
        while stop - front > 1 and words[stop] == words[stop - 1]:
            stop -= 1
        out = text[offsets[front][0]:offsets[stop - 1][1]]
    return out


def _cut(sentence: str, tokenizer, budget: int) -> str:
    """The longest prefix of whole words of ``sentence`` that fits ``budget`` tokens."""
    words = sentence.split()
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _n(tokenizer, " ".join(words[:mid])) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


@dataclass
class LongDocument:
    """One long input: its token ids (with the tokenizer's special tokens), where it came from
    (``file:first_line-last_line`` or ``file#example``), how many source documents it joins,
    and whether it was cut at the length limit. ``word_ids``: the fast tokenizer's word of each
    token (-1 for special tokens), for word-level statistics; None with a slow tokenizer."""

    ids: list[int]
    source: str
    documents: int = 1
    cut: bool = False
    word_ids: list[int] | None = None


def prepare_documents(path: str | Path, tokenizer, *, max_seq_len: int, join: bool = False,
                      num_docs: int | None = None) -> list[LongDocument]:
    """Documents kept whole (up to ``max_seq_len`` tokens), for long-context analyses.

    ``path``: text with a blank line between documents (the sentences of a document are joined
    with spaces), or JSON / JSON Lines (``.json`` / ``.jsonl``) whose examples have ``text``.
    Each document is tokenized once and cut to ``max_seq_len`` tokens (``cut`` says so).
    ``join``: consecutive documents, in file order, are joined with a blank line into one
    input until it reaches ``max_seq_len`` tokens (how 16k-token inputs are made from
    WikiText-2's articles); the last input may be shorter. ``num_docs``: stop after that many
    inputs.
    """
    path = Path(path)
    if max_seq_len < 2:
        raise InputError(path, f"max_seq_len {max_seq_len} is too short for a document",
                         params=("max_seq_len",))
    texts: list[tuple[str, str]] = []  # (source, text)
    if path.suffix.lower() in (".json", ".jsonl"):
        for i, ex in enumerate(iter_examples(path)):
            if ex.text is None:
                raise InputError(path, f"example {i}: long documents need a 'text' field")
            texts.append((f"{path.name}#{i}", ex.text))
    else:
        for doc in read_documents(path):
            texts.append((f"{path.name}:{doc[0][0]}-{doc[-1][0]}", " ".join(s for _, s in doc)))
    if not texts:
        raise InputError(path, "holds no documents")
    out: list[LongDocument] = []

    def emit(group: list[tuple[str, str]]) -> None:
        enc = tokenizer("\n\n".join(t for _, t in group))
        ids = enc["input_ids"]
        try:
            words = [-1 if w is None else int(w) for w in enc.word_ids()][:max_seq_len]
        except (ValueError, AttributeError):  # a slow tokenizer has no word alignment
            words = None
        first, last = group[0][0], group[-1][0]
        source = first if len(group) == 1 else f"{first} .. {last}"
        out.append(LongDocument(list(ids[:max_seq_len]), source, len(group), len(ids) > max_seq_len,
                                words))

    group: list[tuple[str, str]] = []
    size = 0
    for source, text in texts:
        if num_docs is not None and len(out) >= num_docs:
            break
        if not join:
            emit([(source, text)])
            continue
        group.append((source, text))
        size += len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1
        if size >= max_seq_len:
            emit(group)
            group, size = [], 0
    if group and (num_docs is None or len(out) < num_docs):
        emit(group)
    return out
