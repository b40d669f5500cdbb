"""What a tokenizer's pieces read as: each token as text, for the views.

Byte-level BPE (GPT-2, RoBERTa, Llama 3, SmolLM2) writes a space as ``Ġ``, a newline as ``Ċ``
and every other byte of UTF-8 as one printable character (``é`` is ``Ã©``); SentencePiece
writes a space as ``▁`` and unknown bytes as ``<0x0A>``. :func:`piece_texts` asks the tokenizer
itself (its decoder, as ``convert_tokens_to_string`` does) what each token says, in the
context of the few tokens before it, so a SentencePiece token keeps its leading space and
the last piece of a character split over several tokens shows the character. WordPiece
pieces are their own text (``##`` marks a continuation), so they get None.

:func:`guess_piece_texts` does the same by convention, for tokens that come without their
tokenizer (a store written before the texts were kept, a BertViz-style list of tokens).

>>> guess_piece_texts(["<s>", "The", "Ġcat", "Ċ"], [True, False, False, False])
['<s>', 'The', ' cat', '\\n']
>>> guess_piece_texts(["<s>", "▁The", "▁cat", "<0x0A>"], [True, False, False, False])
['<s>', 'The', ' cat', '\\n']
>>> guess_piece_texts(["[CLS]", "the", "##s"], [True, False, False]) is None
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

#: Tokens of context before a token when its text is worked out.
CONTEXT = 4
REPLACEMENT = "\ufffd"


def piece_decoder(tokenizer) -> Callable[[list[str]], str] | None:
    """The tokenizer's own ``pieces -> text`` (its decoder, what ``convert_tokens_to_string``
    calls); None for a tokenizer whose pieces are already text (WordPiece) or without one."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    if decoder is None or type(decoder).__name__ == "WordPiece":
        return None
    return decoder.decode


def piece_texts(tokenizer, tokens: Sequence[str], special: Sequence[bool]) -> list[str] | None:
    """Each token as the text ``tokenizer`` makes of it; special tokens as they are. None
    for a tokenizer whose pieces are already text (WordPiece) or that has no decoder."""
    convert = piece_decoder(tokenizer)
    return None if convert is None else _in_context(convert, tokens, special)


def guess_piece_texts(tokens: Sequence[str], special: Sequence[bool] | None = None) -> list[str] | None:
    """:func:`piece_texts` without the tokenizer, by the marks of byte-level BPE (``Ġ``,
    ``Ċ``, every character of its byte alphabet) and SentencePiece (``▁``); None when the
    tokens carry neither (WordPiece, words)."""
    special = [False] * len(tokens) if special is None else list(special)
    pieces = [t for t, s in zip(tokens, special) if not s]
    if any("\u2581" in t for t in pieces):
        convert = _sentencepiece
    elif any(("Ġ" in t or "Ċ" in t) for t in pieces) and all(set(t) <= _byte_alphabet() for t in pieces):
        convert = _byte_level
    else:
        return None
    texts = _in_context(convert, tokens, special)
    first = next((i for i, s in enumerate(special) if not s), None)
    if convert is _sentencepiece and first is not None and texts[first].startswith(" "):
        texts[first] = texts[first][1:]  # as SentencePiece's decoder does with the first piece
    return texts


#: How a view shows the whitespace inside a token's text: a space as a middle dot, a newline
#: as a return sign; other control characters as their Unicode control pictures.
VISIBLE = {" ": "\u00b7", "\n": "\u23ce", "\t": "\u21e5", "\r": "\u240d", "\u00a0": "\u237d"}


def visible(text: str) -> str:
    """``text`` with its whitespace and control characters made visible.

    >>> visible(" Paris"), visible("\\n\\n"), visible("a\\tb")
    ('\u00b7Paris', '\u23ce\u23ce', 'a\u21e5b')
    """
    out = []
    for c in text:
        o = ord(c)
        out.append(VISIBLE.get(c) or (chr(0x2400 + o) if o < 32 else "\u2421" if o == 127 else c))
    return "".join(out)


def readable(tokens: list[str], special, texts: list[str] | None, level: str) -> list[str]:
    """Each unit as text: the tokenizer's ``texts`` where the map carries them, else the pieces
    read by convention (:func:`guess_piece_texts`) at token level, else the units themselves
    (words, WordPiece); an empty text shows its raw piece."""
    if texts is None and level == "token":
        texts = guess_piece_texts(list(tokens), [bool(s) for s in special])
    return list(tokens) if texts is None else [t if t else raw for t, raw in zip(texts, tokens)]


def running_text(tokens: Sequence[str], special: Sequence[bool], texts: Sequence[str] | None,
                 level: str) -> list[tuple[str, bool]]:
    """Each unit as it reads in a line of text: ``(text, space before it)``. A piece that
    continues a word (WordPiece's ``##``, a byte-level or SentencePiece piece without a leading
    space) joins the one before it, so a word split into pieces reads as the word; words (word
    level) and special tokens stand apart. Whitespace other than the leading space stays in the
    text (shown by :func:`visible`).

    >>> running_text(["[CLS]", "play", "##ing", "now", "[SEP]"], [1, 0, 0, 0, 1], None, "token")
    [('[CLS]', False), ('play', True), ('ing', False), ('now', True), ('[SEP]', True)]
    >>> running_text(["<s>", "The", "Ġcat", "s", "Ġ", "a"], [1, 0, 0, 0, 0, 0], None, "token")
    [('<s>', False), ('The', True), ('cat', True), ('s', False), (' ', False), ('a', False)]
    """
    if texts is None and level == "token":
        texts = guess_piece_texts(list(tokens), [bool(s) for s in special])
    out: list[tuple[str, bool]] = []
    for i, (raw, sp) in enumerate(zip(tokens, special)):
        text = raw if texts is None or not texts[i] else texts[i]
        if sp or level != "token" or (i > 0 and special[i - 1]):
            joined = False
        elif texts is None:  # WordPiece: the pieces are their text, ## continues a word
            joined = raw.startswith("##") and len(raw) > 2
            text = raw[2:] if joined else raw
        else:  # a piece that is only a space stays one, shown (it is a unit of its own)
            joined = not text.startswith(" ") or text == " "
            text = text if joined else text[1:]
        out.append((text, i > 0 and not joined))
    return out


def _in_context(convert: Callable[[list[str]], str], tokens: Sequence[str],
                special: Sequence[bool]) -> list[str]:
    """Each token's text: what ``convert`` adds for it after up to :data:`CONTEXT` ordinary
    tokens before it (its text alone where that does not extend theirs)."""
    out = []
    for i, (tok, sp) in enumerate(zip(tokens, special)):
        if sp:
            out.append(tok)
            continue
        lo = i
        while lo > 0 and i - lo < CONTEXT and not special[lo - 1]:
            lo -= 1
        text = convert([tok])
        if lo < i:
            before = convert(list(tokens[lo:i])).rstrip(REPLACEMENT)  # a character still open
            both = convert(list(tokens[lo:i + 1]))
            if both.startswith(before):
                text = both[len(before):]
        out.append(text)
    return out


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable character for each byte (``bytes_to_unicode``), reversed."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


@lru_cache(maxsize=1)
def _byte_alphabet() -> frozenset[str]:
    return frozenset(_byte_decoder())


def _byte_level(pieces: list[str]) -> str:
    table = _byte_decoder()
    return bytes(table[c] for p in pieces for c in p).decode("utf-8", errors="replace")


def _sentencepiece(pieces: list[str]) -> str:
    out = bytearray()
    for p in pieces:
        if len(p) == 6 and p.startswith("<0x") and p.endswith(">"):  # byte fallback
            try:
                out.append(int(p[3:5], 16))
                continue
            except ValueError:
                pass
        out.extend(p.replace("\u2581", " ").encode("utf-8"))
    return out.decode("utf-8", errors="replace")
