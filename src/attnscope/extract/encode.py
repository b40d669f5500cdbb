"""Turn examples into model inputs with a token-to-word alignment from the fast tokenizer.

``words`` inputs are joined with single spaces and aligned through the tokenizer's character
offsets, which works the same for WordPiece, byte-level BPE and SentencePiece (no
re-tokenising word by word). A token is assigned to the word in which it starts.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from attnscope.data.records import Example
from attnscope.errors import InputError
from attnscope.models.loading import LoadedModel
from attnscope.models.pieces import piece_texts

#: Prefixes that tokenizers put on pieces to mark word starts or continuations.
WORD_MARKERS = ("##", "Ġ", "▁", "Ċ")


@dataclass
class Encoded:
    """One example ready for the model; per-token arrays have the same length."""

    index: int
    example: Example
    input_ids: list[int]
    token_type_ids: list[int] | None
    tokens: list[str]
    special: list[bool]
    segment: list[int]
    word_ids: list[int]  # -1 for special tokens
    #: each token as the tokenizer's text (:func:`~attnscope.models.pieces.piece_texts`; None:
    #: the pieces are their own text, WordPiece)
    texts: list[str] | None = None

    def __len__(self) -> int:
        return len(self.input_ids)


class Encoder:
    """Encodes examples for one model; ``casing`` is None (the tokenizer's own), "cased" or "uncased"."""

    def __init__(self, lm: LoadedModel, casing: str | None = None, warn=None):
        self.lm = lm
        self.family = lm.family
        tok = lm.tokenizer
        self.lowercase_input = False
        lowers = lm.do_lower_case
        if casing is not None:
            vocab_cased = _vocab_is_cased(tok)
            if casing == "cased" and not vocab_cased and warn:
                warn(f"--cased, but the vocabulary of {lm.name} has (almost) no uppercase entries")
            if casing == "uncased" and vocab_cased and warn:
                warn(f"--uncased, but the vocabulary of {lm.name} is cased")
            if casing == "uncased":
                self.lowercase_input = True
            elif casing == "cased" and lowers:
                tok = copy.deepcopy(tok)
                _disable_lowercase(tok)
        self.tokenizer = tok
        self.special_ids = set(tok.all_special_ids)
        self.wrap = list(tok("", add_special_tokens=True)["input_ids"])  # specials around one segment
        self.unk_id = tok.unk_token_id

    def _case(self, s: str) -> str:
        return s.lower() if self.lowercase_input else s

    def encode(self, ex: Example, index: int) -> Encoded:
        tok = self.tokenizer
        if ex.tokens is not None:
            return self._encode_tokens(ex, index)
        if ex.words is not None:
            a, a_spans = _join(list(map(self._case, ex.words)))
            b, b_spans = (None, [])
            if ex.words_pair:
                b, b_spans = _join(list(map(self._case, ex.words_pair)))
        else:
            a, a_spans = self._case(ex.text), None
            b, b_spans = (self._case(ex.text_pair), None) if ex.text_pair is not None else (None, None)
        enc = tok(a, b, add_special_tokens=True, return_offsets_mapping=True,
                  return_token_type_ids=True, truncation=False, verbose=False)
        ids = enc["input_ids"]
        seq = enc.sequence_ids()
        offsets = enc["offset_mapping"]
        special = [s is None or i in self.special_ids and off == (0, 0)
                   for i, s, off in zip(ids, seq, offsets)]
        segment = _segments(seq)
        if ex.words is not None:
            word_ids = []
            n_a = len(a_spans)
            for s, off, sp in zip(seq, offsets, special):
                if sp:
                    word_ids.append(-1)
                elif s == 0:
                    word_ids.append(_word_at(a_spans, _anchor(a, off)))
                else:
                    word_ids.append(n_a + _word_at(b_spans, _anchor(b, off)))
        else:
            raw = enc.word_ids()
            n_a = 1 + max((w for w, s in zip(raw, seq) if s == 0 and w is not None), default=-1)
            word_ids = [-1 if sp or w is None else (w if s == 0 else n_a + w)
                        for w, s, sp in zip(raw, seq, special)]
        ttype = enc.get("token_type_ids") if self.family.token_types else None
        tokens = tok.convert_ids_to_tokens(ids)
        return Encoded(index=index, example=ex, input_ids=list(ids),
                       token_type_ids=list(ttype) if ttype is not None else None,
                       tokens=tokens, special=special, segment=segment, word_ids=word_ids,
                       texts=piece_texts(tok, tokens, special))

    def _encode_tokens(self, ex: Example, index: int) -> Encoded:
        tok = self.tokenizer
        tokens = list(ex.tokens)
        ids = tok.convert_tokens_to_ids(tokens)
        for t, i in zip(tokens, ids):
            if i is None or (i == self.unk_id and t != tok.unk_token):
                raise InputError(None, f"example {index}: token {t!r} is not in the vocabulary of {self.lm.name}")
        if self.wrap:
            first, last = self.wrap[0], self.wrap[-1]
            if ids[0] != first or ids[-1] != last:
                want = tok.convert_ids_to_tokens([first, last])
                raise InputError(None, f"example {index}: 'tokens' must start with {want[0]!r} and "
                                       f"end with {want[-1]!r} (the model's special tokens)")
        special = [i in self.special_ids for i in ids]
        # segment 0 up to and including the first separator, 1 after it
        sep_id = self.wrap[-1] if self.wrap else None
        segment, seg = [], 0
        for pos, i in enumerate(ids):
            segment.append(seg)
            if i == sep_id and pos < len(ids) - 1:
                seg = 1
        # words: WordPiece marks continuations with "##"; BPE/SentencePiece mark word starts
        wordpiece = type(tok.backend_tokenizer.model).__name__ == "WordPiece"
        word_ids, w, after_special = [], -1, True
        for t, sp in zip(tokens, special):
            if sp:
                word_ids.append(-1)
                after_special = True
                continue
            starts = not t.startswith("##") if wordpiece else t.startswith(("Ġ", "▁")) or after_special
            w += bool(starts or w < 0)
            word_ids.append(w)
            after_special = False
        ttype = segment if self.family.token_types else None
        return Encoded(index=index, example=ex, input_ids=list(ids), token_type_ids=ttype,
                       tokens=tokens, special=special, segment=segment, word_ids=word_ids,
                       texts=piece_texts(tok, tokens, special))


def _segments(seq: list[int | None]) -> list[int]:
    """Segment id per token: specials belong to the segment they close (BERT's convention)."""
    out, current = [], 0
    for s in seq:
        if s is not None:
            current = s
        out.append(current)
    return out


def _join(words: list[str]) -> tuple[str, list[tuple[int, int]]]:
    spans, pos = [], 0
    for w in words:
        spans.append((pos, pos + len(w)))
        pos += len(w) + 1
    return " ".join(words), spans


def _anchor(text: str, offset: tuple[int, int]) -> int:
    """The character that decides a token's word: its first non-space character. Byte-level
    BPE pieces (SmolLM2, Llama, GPT-2) carry the space before a word, and a piece that is only
    that space belongs to the word after it.

    >>> [_anchor("From the AP", o) for o in [(0, 4), (4, 8), (4, 5), (5, 8)]]
    [0, 5, 5, 5]
    """
    c = offset[0]
    while c < offset[1] and text[c].isspace():
        c += 1
    return min(c, max(len(text) - 1, 0))


def _word_at(spans: list[tuple[int, int]], char: int) -> int:
    """The word whose span holds ``char`` (see :func:`_anchor`)."""
    lo, hi = 0, len(spans) - 1
    while lo < hi:  # the last span starting at or before char
        mid = (lo + hi + 1) // 2
        if spans[mid][0] <= char:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _vocab_is_cased(tok) -> bool:
    specials = set(tok.all_special_tokens)
    vocab = [w for w in tok.get_vocab() if w not in specials and not w.startswith(("[", "<"))]
    upper = sum(1 for w in vocab if any(c.isupper() for c in w))
    return upper > 0.01 * len(vocab)


def _disable_lowercase(tok) -> None:
    from tokenizers import normalizers

    tok.backend_tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    if hasattr(tok, "do_lower_case"):
        tok.do_lower_case = False


def token_units(enc_word_ids: np.ndarray, special: np.ndarray) -> np.ndarray:
    """Unit id of each token: special tokens alone, the pieces of one word together.

    >>> token_units(np.array([-1, 0, 0, 1, -1]), np.array([1, 0, 0, 0, 1], bool)).tolist()
    [0, 1, 1, 2, 3]
    """
    units = np.empty(len(enc_word_ids), dtype=np.int64)
    u, prev = -1, None
    for t, (w, sp) in enumerate(zip(enc_word_ids, special)):
        if sp or w != prev:
            u += 1
        units[t] = u
        prev = None if sp else w
    return units
