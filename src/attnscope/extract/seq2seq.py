"""Encoder-decoder models (T5, BART, ...): the three kinds of attention of one example.

An encoder-decoder model attends three ways, and each is one :class:`AttentionMap` with its
``kind``:

- ``encoder``: the encoder's self-attention over the source, ``[L H s s]``;
- ``decoder``: the decoder's causal self-attention over what it reads, ``[L' H' t t]``;
- ``cross``: each decoder position's attention to the source, ``[L' H' t s]`` (rows are the
  decoder's tokens, columns the encoder's ``key_tokens``).

What the decoder reads: the model's decoder start token followed by the target's tokens
(``target`` given: teacher forcing, the target as its tokenizer writes it, EOS included), or by
the model's own greedy continuation of the source (``generate=N``: up to N tokens, as
``generate(do_sample=False, num_beams=1)``; ``decoder.generated`` is then 1). The maps are the
model's own ``output_attentions`` of one forward pass over source and decoder input (eager
attention), which for the generated tokens are the attention of each generation step.

>>> from attnscope.models import load_model
>>> maps = extract_seq2seq(load_model("debug:t5"), "the cat sat", target="a dog ran")
>>> [maps[k].attn.shape[-2:] for k in KINDS]
[(6, 6), (7, 7), (7, 6)]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnscope.data.records import Example
from attnscope.errors import AttnscopeError
from attnscope.extract.encode import Encoder
from attnscope.maps import AttentionMap, token_word_ids
from attnscope.models.capture import seq2seq_attention
from attnscope.models.generation import seq2seq_greedy
from attnscope.models.pieces import piece_texts

KINDS = ("encoder", "decoder", "cross")


@dataclass
class Seq2SeqMaps:
    """The three maps of one example (see the module docstring)."""

    encoder: AttentionMap
    decoder: AttentionMap
    cross: AttentionMap

    def __getitem__(self, kind: str) -> AttentionMap:
        if kind not in KINDS:
            raise KeyError(f"unknown attention kind {kind!r}; choose one of {', '.join(KINDS)}")
        return getattr(self, kind)

    def items(self) -> list[tuple[str, AttentionMap]]:
        return [(k, self[k]) for k in KINDS]


def check_seq2seq(lm, what: str = "this") -> None:
    """A one-line error unless ``lm`` is an encoder-decoder model."""
    if not lm.facts.encoder_decoder:
        raise AttnscopeError(f"{lm.name} is not an encoder-decoder model ({what} needs one, e.g. "
                             "T5 or BART)")


def kind_shapes(lm) -> dict[str, dict[str, int]]:
    """``{kind: {"num_layers", "num_heads"}}`` of an encoder-decoder model (a store's manifest
    records them as ``attention_kinds``)."""
    cfg = lm.model.config
    dec_layers = getattr(cfg, "decoder_layers", None) or getattr(cfg, "num_decoder_layers", None) \
        or lm.num_layers
    dec_heads = getattr(cfg, "decoder_attention_heads", None) or lm.num_heads
    dec = {"num_layers": int(dec_layers), "num_heads": int(dec_heads)}
    return {"encoder": {"num_layers": lm.num_layers, "num_heads": lm.num_heads}, "decoder": dec,
            "cross": dict(dec)}


def decoder_input(lm, target: str) -> list[int]:
    """The decoder start token followed by ``target``'s tokens (EOS included)."""
    start = lm.model.config.decoder_start_token_id
    if start is None:
        raise AttnscopeError(f"{lm.name}: its config names no decoder_start_token_id")
    return [int(start)] + list(lm.tokenizer(text_target=target)["input_ids"])


def extract_seq2seq(lm, source: str, target: str | None = None, *, generate: int | None = None,
                    index: int = 0, max_seq_len: int | None = None) -> Seq2SeqMaps:
    """The encoder, decoder and cross-attention maps of ``source`` with ``target`` (teacher
    forcing) or with the model's greedy continuation of up to ``generate`` tokens."""

    check_seq2seq(lm, "extract_seq2seq")
    if (target is None) == (generate is None):
        raise AttnscopeError("extract_seq2seq: give a target or generate=N (one of the two)",
                             params=("target", "generate"))
    if generate is not None and generate < 1:
        raise AttnscopeError(f"generate {generate}: must be at least 1", params=("generate",))
    enc = Encoder(lm).encode(Example(text=source), index)
    limit = max_seq_len or lm.max_positions
    if len(enc) > limit:
        raise AttnscopeError(f"example {index}: the source has {len(enc)} tokens, more than "
                             f"{limit}", params=("max_seq_len",))
    if target is not None:
        return seq2seq_maps(lm, enc, decoder_input(lm, target), fields={"target": target},
                            max_seq_len=limit)
    dec = seq2seq_greedy(lm, enc.input_ids, generate)
    fields = {"continuation": lm.tokenizer.decode(dec[1:], skip_special_tokens=True),
              "generated_ids": dec[1:]}
    return seq2seq_maps(lm, enc, dec, fields=fields, generated=1, max_seq_len=limit)


def seq2seq_maps(lm, enc, dec: list[int], *, fields: dict | None = None, generated: int | None = None,
                 max_seq_len: int | None = None) -> Seq2SeqMaps:
    """The three maps of one encoded source (:class:`~attnscope.extract.encode.Encoded`) with the
    decoder reading ``dec`` (ids, its start token first): one forward pass, eager attention."""

    limit = max_seq_len or lm.max_positions
    if len(dec) > limit:
        raise AttnscopeError(f"example {enc.index}: the decoder reads {len(dec)} tokens, more than "
                             f"{limit}", params=("max_seq_len",))
    tok = lm.tokenizer
    enc_attn, dec_attn, cross_attn = seq2seq_attention(lm, enc.input_ids, dec)

    specials = set(tok.all_special_ids)
    dec_tokens = tok.convert_ids_to_tokens(dec)
    dec_special = np.array([i in specials for i in dec], dtype=bool)
    dec_words = token_word_ids(dec_special)
    zeros = np.zeros(len(dec), dtype=np.int64)
    example = enc.example
    if fields:
        example = Example.from_dict({**example.to_dict(), **fields})
    enc_special = np.asarray(enc.special, bool)
    dec_text = piece_texts(tok, dec_tokens, dec_special)
    encoder = AttentionMap(enc.index, enc_attn, list(enc.tokens), enc_special,
                           np.asarray(enc.segment, np.int64), np.asarray(enc.word_ids, np.int64),
                           "token", example, kind="encoder", token_text=enc.texts)
    decoder = AttentionMap(enc.index, dec_attn, dec_tokens, dec_special, zeros,
                           dec_words, "token", example, kind="decoder", generated=generated,
                           token_text=dec_text)
    cross = AttentionMap(enc.index, cross_attn, dec_tokens, dec_special, zeros,
                         dec_words, "token", example, kind="cross", key_tokens=list(enc.tokens),
                         key_special=enc_special, generated=generated, token_text=dec_text,
                         key_token_text=enc.texts)
    return Seq2SeqMaps(encoder, decoder, cross)
