"""Sentence-per-line text into BERT pre-training style pairs ``[CLS] A [SEP] B [SEP]``.

Documents are separated by blank lines. Within a document, consecutive sentences are packed
into chunks that fit ``max_seq_len`` tokens (with the model's special tokens); each chunk of
two or more sentences is split at a seeded random sentence boundary into segment A (ids 0)
and segment B (ids 1). A chunk of one sentence becomes a single-segment example
``[CLS] A [SEP]``, so one-sentence documents are kept (the paper's code drops them). A
sentence longer than the budget on its own is cut to fit and counted. The last document is
kept even without a trailing blank line.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from attnscope.data.io import read_text
from attnscope.data.records import Example
from attnscope.errors import InputError


@dataclass
class UnlabeledStats:
    documents: int = 0
    sentences: int = 0
    examples: int = 0
    cut_sentences: list[int] = field(default_factory=list)  # line numbers


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


def prepare_unlabeled(path: str | Path, tokenizer, *, max_seq_len: int = 128, seed: int = 0,
                      num_docs: int | None = None, num_examples: int | None = None,
                      stats: UnlabeledStats | None = None) -> list[Example]:
    """Build pair examples from a sentence-per-line file (see the module docstring).

    ``tokenizer`` is a fast tokenizer; lengths count its pieces plus the special tokens it adds
    for a pair (3 for BERT, 4 for RoBERTa, 0 for GPT-2).
    """
    stats = stats if stats is not None else UnlabeledStats()
    rng = random.Random(seed)
    pair_extra = len(tokenizer("a", "b")["input_ids"]) - len(tokenizer("a", add_special_tokens=False)["input_ids"]) \
        - len(tokenizer("b", add_special_tokens=False)["input_ids"])
    budget = max_seq_len - pair_extra
    if budget < 2:
        raise InputError(path, f"--max-seq-len {max_seq_len} leaves no room for text")
    examples: list[Example] = []
    for d, doc in enumerate(read_documents(path)):
        if num_docs is not None and d >= num_docs:
            break
        stats.documents += 1
        sents = []
        for lineno, s in doc:
            ids = tokenizer(s, add_special_tokens=False)["input_ids"]
            if len(ids) > budget:
                s = _cut(s, tokenizer, budget)
                ids = tokenizer(s, add_special_tokens=False)["input_ids"]
                stats.cut_sentences.append(lineno)
            sents.append((lineno, s, len(ids)))
        stats.sentences += len(sents)
        i = 0
        while i < len(sents):
            chunk = [sents[i]]
            total = sents[i][2]
            j = i + 1
            while j < len(sents) and total + sents[j][2] <= budget:
                chunk.append(sents[j])
                total += sents[j][2]
                j += 1
            fields = {"doc": d, "line": chunk[0][0]}
            if len(chunk) == 1:
                ex = Example(text=chunk[0][1], fields=fields)
            else:
                split = rng.randint(1, len(chunk) - 1)
                ex = Example(text=" ".join(c[1] for c in chunk[:split]),
                             text_pair=" ".join(c[1] for c in chunk[split:]), fields=fields)
            examples.append(ex)
            stats.examples += 1
            if num_examples is not None and len(examples) >= num_examples:
                return examples
            i = j
    if not examples:
        raise InputError(path, "holds no sentences")
    return examples


def _cut(sentence: str, tokenizer, budget: int) -> str:
    """The longest prefix of whole words of ``sentence`` that fits ``budget`` tokens."""
    words = sentence.split()
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer(" ".join(words[:mid]), add_special_tokens=False)["input_ids"]) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


@dataclass
class LongDocument:
    """One long input: its token ids (with the tokenizer's special tokens), where it came from
    (``file:first_line-last_line`` or ``file#example``), how many source documents it joins,
    and whether it was cut at the length limit."""

    ids: list[int]
    source: str
    documents: int = 1
    cut: bool = False


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
        raise InputError(path, f"--max-seq-len {max_seq_len} is too short for a document")
    texts: list[tuple[str, str]] = []  # (source, text)
    if path.suffix.lower() in (".json", ".jsonl"):
        from attnscope.data.io import iter_examples

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
        ids = tokenizer("\n\n".join(t for _, t in group))["input_ids"]
        first, last = group[0][0], group[-1][0]
        source = first if len(group) == 1 else f"{first} .. {last}"
        out.append(LongDocument(list(ids[:max_seq_len]), source, len(group), len(ids) > max_seq_len))

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
