"""Attention over a model's own continuation: a decoder LLM continues a prompt greedily, and
the map spans prompt and continuation.

The continuation comes from :func:`attnscope.models.generation.continuation` (one pass over the
prompt, then one token at a time with the key/value cache: what ``generate(do_sample=False)``
does); the map is then one forward pass over prompt + continuation
(:func:`attnscope.models.capture.attention`). Row ``i`` of that pass is
the attention the model paid when it read token ``i`` during generation (the same keys, the same
causal mask), so the generated rows are the generation's own attention; the last row is the
attention of the step that would come next.

>>> from attnscope.models import load_model
>>> amap = continuation_map(load_model("debug:llama"), "the cat sat on the", 3)
>>> amap.generated, amap.num_units - amap.generated
(9, 3)
"""

from __future__ import annotations

import numpy as np

from attnscope.data.records import Example
from attnscope.errors import AttnscopeError
from attnscope.extract.encode import Encoder
from attnscope.extract.runner import extract
from attnscope.extract.seq2seq import extract_seq2seq
from attnscope.maps import AttentionMap
from attnscope.models.capture import attention
from attnscope.models.generation import continuation
from attnscope.models.pieces import piece_texts
from attnscope.viz.payload import window_reducer, window_units


def continuation_map(lm, prompt: str, new_tokens: int, *, seed: int = 0, index: int = 0,
                     max_seq_len: int | None = None, long_input: int | None = None,
                     window: int = 256, offset: int | None = None, thumb_size: int = 32):
    """The token-level map of ``prompt`` and up to ``new_tokens`` greedily generated tokens
    (fewer when the model ends its text). ``amap.generated`` is where the continuation starts;
    ``amap.example.fields["continuation"]`` is its text. ``seed`` draws the random output head of a
    tiny ``debug:`` model (real models use their own).

    ``long_input``: when prompt and continuation pass it, return instead the
    :class:`~attnscope.viz.payload.Windowed` page of ``window`` query rows from ``offset``
    (default: the last, so the continuation's), reduced layer by layer as the model runs: one
    layer's ``[H n n]`` at a time, never the whole ``[L H n n]`` map.
    """
    if not lm.facts.causal or lm.facts.encoder_decoder:
        raise AttnscopeError(f"generate {new_tokens}: {lm.name} is not a decoder model; an encoder "
                             "cannot continue a prompt (encoder-decoder models: "
                             "attnscope.extract.seq2seq)", params=("generate",))
    if new_tokens < 1:
        raise AttnscopeError(f"generate {new_tokens}: must be at least 1", params=("generate",))
    enc = Encoder(lm).encode(Example(text=prompt), index)
    limit = max_seq_len or lm.max_positions
    if len(enc) + new_tokens > limit:
        raise AttnscopeError(f"generate {new_tokens}: the prompt has {len(enc)} tokens, so prompt and "
                             f"continuation would pass the limit of {limit}", params=("generate",))
    new = continuation(lm, enc.input_ids, new_tokens, seed=seed)
    ids = list(enc.input_ids) + new
    tok = lm.tokenizer
    specials = set(tok.all_special_ids)
    example = Example(text=prompt, fields={"continuation": tok.decode(new), "generated_ids": new})

    tokens = list(enc.tokens) + tok.convert_ids_to_tokens(new)
    special = list(enc.special) + [i in specials for i in new]
    texts = piece_texts(tok, tokens, special)

    def as_map(attn: np.ndarray) -> AttentionMap:
        return AttentionMap(index, attn, tokens, np.array(special, dtype=bool),
                            np.zeros(len(ids), dtype=np.int64),
                            np.array(list(enc.word_ids) + [-1] * len(new), dtype=np.int64),
                            "token", example, generated=len(enc), token_text=texts,
                            layers=lm.facts.attention_layers)

    if long_input is None or len(ids) <= long_input:
        return as_map(attention(lm, ids))  # [L H n n]

    units = window_units(len(ids), window, offset)
    add, finish = window_reducer(units, min(window, len(ids)), thumb_size)
    attention(lm, ids, each_layer=add)
    return finish(as_map(np.empty((0, 0, 0, 0), np.float32)))


def model_maps(lm, text: str, *, generate: int | None = None, target: str | None = None,
               long_input: int | None = None, window: int = 256, offset: int | None = None):
    """What a view of ``lm`` reading ``text`` shows: an encoder-decoder model's three maps
    (``{kind: map}``, with ``target`` or ``generate``: :func:`~attnscope.extract.seq2seq.extract_seq2seq`),
    a decoder's continuation (``generate``: :func:`continuation_map`, a windowed page past
    ``long_input``), or the map of ``text`` alone."""
    if lm.facts.encoder_decoder:
        return dict(extract_seq2seq(lm, text, target=target, generate=generate).items())
    if target is not None:
        raise AttnscopeError(f"a target is for encoder-decoder models; {lm.name} is not one",
                             params=("target",))
    if generate:
        return continuation_map(lm, text, generate, long_input=long_input, window=window, offset=offset)
    return next(iter(extract([Example(text=text)], lm, max_seq_len=lm.max_positions))).items[0]
