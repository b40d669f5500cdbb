"""Readable tokens: every view shows a token as the tokenizer's text with its whitespace made
visible (``ĠParis`` as ``·Paris``, ``Ċ`` as ``⏎``) and keeps the raw piece for the hover, for
byte-level BPE (GPT-2, RoBERTa, Llama 3 style) and SentencePiece (``▁``) tokenizers."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from attnscope.models.pieces import guess_piece_texts, piece_texts, visible
from attnscope.viz.payload import page_payload

TEXT = "The cat sat on the mat.\nShe said hé ran 😀 there"


def payload_of(html: str) -> dict:
    m = re.search(r'<script id="attnscope-data" type="application/json">(.*?)</script>', html, re.S)
    return json.loads(m.group(1))


@pytest.fixture(scope="module", params=["gpt2", "roberta", "llama"])
def lm(request):
    from attnscope.models import load_model

    return load_model(f"debug:{request.param}")


def _map(lm, text=TEXT, word_level=False):
    from attnscope.extract.runner import ExtractOptions, extract

    return next(iter(extract([{"text": text}], lm, options=ExtractOptions(word_level=word_level)))).items[0]


def test_payload_shows_the_tokenizers_text_and_keeps_the_raw_piece(lm):
    """The texts of the ordinary tokens, joined, are the tokenizer's own decoding of the ids
    (whitespace made visible), but for the pieces that only open a character split over
    several tokens (shown as the tokenizer shows them alone: U+FFFD; the piece that completes
    it shows the character); the raw pieces are convert_ids_to_tokens' own."""
    tok = lm.tokenizer
    ids = tok(TEXT)["input_ids"]
    m = _map(lm)
    p = page_payload(m)
    assert p["tokens"] == tok.convert_ids_to_tokens(ids)
    ordinary = [i for i, s in enumerate(p["special"]) if not s]
    joined = "".join(p["token_text"][i] for i in ordinary)
    assert joined.replace("\ufffd", "") == visible(tok.decode(ids, skip_special_tokens=True))
    assert joined.count("\ufffd") == 4  # é = 2 bytes, 😀 = 4 bytes, here one byte per piece
    for i, s in enumerate(p["special"]):
        if s:
            assert p["token_text"][i] == p["tokens"][i]  # special tokens as they are
    pieces = dict(zip(p["tokens"], p["token_text"]))
    assert pieces["Ġon"] == "\u00b7on" and pieces["Ċ"] == "\u23ce" and pieces["Ġsaid"] == "\u00b7said"
    assert pieces["Ġ"] == "\u00b7"
    assert not any("Ġ" in t or "Ċ" in t for t in p["token_text"])
    assert any("é" in t for t in p["token_text"]) and any("😀" in t for t in p["token_text"])


def test_the_text_survives_the_store_and_reaches_the_page(lm, tmp_path):
    """`attnscope view` on a store: the page's payload has each token's text and raw piece;
    a store written without the texts (before) shows the same, read from the pieces' marks."""
    from attnscope.cli.main import main
    from attnscope.data.io import example_from_dict
    from attnscope.jobs import extract_to_store
    from attnscope.store import open_store

    m = _map(lm)
    extract_to_store([example_from_dict({"text": TEXT}, 0)], tmp_path / "s", lm)
    stored = open_store(tmp_path / "s").by_index(0)
    assert stored.token_text == m.token_text and stored.tokens == m.tokens
    out = tmp_path / "v.html"
    for view in ("head", "heatmap", "model"):
        assert main(["view", str(tmp_path / "s"), "--view", view, "--out", str(out)]) == 0
        p = payload_of(out.read_text(encoding="utf-8"))
        assert p["tokens"] == m.tokens and p["token_text"] == page_payload(m)["token_text"]
    old = page_payload(type(m)(**{**m.__dict__, "token_text": None}))
    assert old["token_text"] == page_payload(m)["token_text"]


def test_neuron_and_generated_views_show_text(lm):
    from attnscope.viz.generate import continuation_map
    from attnscope.viz.neuron import capture_qk, neuron_payload

    n = neuron_payload(capture_qk(lm, TEXT, 0))
    assert n["token_text"] == page_payload(_map(lm))["token_text"] and n["tokens"] == _map(lm).tokens
    if not lm.facts.causal:
        return
    g = page_payload(continuation_map(lm, "the cat sat on the", 3))
    ids = lm.tokenizer("the cat sat on the")["input_ids"]
    assert g["tokens"][:len(ids)] == lm.tokenizer.convert_ids_to_tokens(ids)
    assert "".join(t for t, s in zip(g["token_text"], g["special"]) if not s).startswith(
        visible("the cat sat on the"))


def test_word_level_units_are_words(lm):
    """Word-level units from text: the tokenizer's text of the word's pieces read together
    (hé, not hÃ©), which is the input's text under the word's character offsets."""
    enc = lm.tokenizer(TEXT, return_offsets_mapping=True)
    spans: dict[int, list] = {}
    for w, (a, b) in zip(enc.word_ids(), enc["offset_mapping"]):
        if w is not None:
            spans.setdefault(w, []).append((a, b))
    expect = [TEXT[s[0][0]:s[-1][1]].strip() for _, s in sorted(spans.items())]
    m = _map(lm, word_level=True)
    words = [t for t, s in zip(m.tokens, m.special) if not s]
    assert words == expect and "hé" in words and "😀" in words
    assert page_payload(m)["token_text"] == [visible(t) for t in m.tokens]


def test_wordpiece_pieces_are_their_own_text(debug_bert):
    m = _map(debug_bert)
    assert m.token_text is None and page_payload(m)["token_text"] == m.tokens
    assert guess_piece_texts(m.tokens, m.special) is None


def test_convention_agrees_with_the_tokenizer_on_byte_level(lm):
    tok = lm.tokenizer
    ids = tok(TEXT)["input_ids"]
    tokens = tok.convert_ids_to_tokens(ids)
    special = [i in tok.all_special_ids for i in ids]
    assert guess_piece_texts(tokens, special) == piece_texts(tok, tokens, special)


@pytest.fixture(scope="module")
def sentencepiece():
    """A tiny SentencePiece-style tokenizer: Metaspace pieces (``▁the``), byte fallback."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁the": 3, "▁cat": 4, "▁sat": 5, "▁on": 6, "▁mat": 7,
             ".": 8, "▁": 9, "s": 10, "a": 11, "t": 12, "<0x0A>": 13}
    tk = Tokenizer(models.Unigram([(p, -float(i)) for p, i in sorted(vocab.items(), key=lambda x: x[1])],
                                  unk_id=0, byte_fallback=True))
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tk.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def test_sentencepiece_pieces_read_as_text(sentencepiece):
    tok = sentencepiece
    tokens = ["<s>", "▁the", "▁cat", "▁sat", "s", "<0x0A>", "▁on", "▁the", "▁mat", "."]
    special = [True] + [False] * (len(tokens) - 1)
    texts = piece_texts(tok, tokens, special)
    joined = "".join(t for t, s in zip(texts, special) if not s)
    assert joined == tok.convert_tokens_to_string(tokens[1:])  # the decoder's whole text
    assert texts[1] == "the" and texts[2] == " cat" and texts[4] == "s" and texts[5] == "\n"
    assert guess_piece_texts(tokens, special) == texts
    from conftest import make_map

    n = len(tokens)
    p = page_payload(make_map(np.full((n, n), 1 / n), tokens, special=special, level="token"))
    assert p["token_text"][2] == "\u00b7cat" and p["token_text"][5] == "\u23ce" and p["tokens"][2] == "▁cat"


def test_token_text_is_escaped_in_the_page(map_factory):
    """A byte-level token holding markup shows as text; the page never holds the raw markup."""
    from attnscope.viz.pages import head_view_html

    evil = "Ġ<script>window.pwned=1</script>"
    m = map_factory(np.full((3, 3), 1 / 3), ["<s>", "Ġcat", evil], special=[True, False, False], level="token")
    html = head_view_html(m)
    assert "<script>window" not in html
    assert payload_of(html)["token_text"] == ["<s>", "\u00b7cat", "\u00b7<script>window.pwned=1</script>"]
