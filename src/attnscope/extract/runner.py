"""Run a model over examples and yield :class:`AttentionBatch` items, without touching disk.

Examples are read in windows; within a window they are sorted by length and cut into
batches, so each batch is padded only to its own longest example. The plan depends only on
the inputs and the arguments, which is what lets a store resume exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from attnscope.data.io import example_from_dict
from attnscope.data.records import Example
from attnscope.errors import AttnscopeError, InputError
from attnscope.extract.encode import Encoded, Encoder, token_units
from attnscope.extract.seq2seq import decoder_input, seq2seq_maps
from attnscope.extract.wordlevel import to_word_level
from attnscope.maps import AttentionBatch, AttentionMap
from attnscope.models.forward import batches, forward, pad_batch
from attnscope.models.loading import LoadedModel, as_loaded
from attnscope.models.pieces import piece_decoder


@dataclass
class ExtractOptions:
    """Everything that decides what the maps are; recorded in a store's manifest."""

    max_seq_len: int = 128
    batch_size: int = 16
    word_level: bool = False
    from_word: str = "mean"  # "first": the paper code's behaviour
    truncate: bool = False
    casing: str | None = None  # None: the tokenizer's own; "cased" / "uncased"
    window: int = 1024  # examples sorted by length together
    seed: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class ExtractStats:
    """What happened: counts, and which examples were skipped and why."""

    examples_in: int = 0
    examples_out: int = 0
    tokens: int = 0
    truncated: list[int] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # {"index", "reason", "tokens"}
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class Extractor:
    """Encodes, plans and runs batches for one model and one set of options."""

    def __init__(self, model: LoadedModel | str = "default", options: ExtractOptions | None = None,
                 stats: ExtractStats | None = None):
        self.options = options or ExtractOptions()
        self.lm = as_loaded(model, seed=self.options.seed)
        self.stats = stats if stats is not None else ExtractStats()
        limit = self.lm.max_positions
        # decoder LLMs (rotary positions) run past their configured length; the families say so
        if self.options.max_seq_len > limit and not self.lm.facts.causal:
            raise AttnscopeError(f"max_seq_len {self.options.max_seq_len} is above the position "
                                 f"limit of {self.lm.name} ({limit})", params=("max_seq_len",))
        if self.lm.facts.encoder_decoder and self.options.word_level:
            raise AttnscopeError(f"{self.lm.name} is an encoder-decoder model: its maps stay at token "
                                 "level (the decoder's tokens have no input words), so word_level "
                                 "is not available", params=("word_level",))
        if self.options.from_word not in ("mean", "first"):
            raise AttnscopeError(f"from_word must be 'mean' or 'first', not {self.options.from_word!r}",
                                 params=("from_word",))
        self.encoder = Encoder(self.lm, self.options.casing, warn=self.stats.warnings.append)

    # -- planning -------------------------------------------------------------------------
    def encode_all(self, examples: Iterable[Example]) -> Iterator[Encoded]:
        """Encode examples, dropping (and counting) or cutting the ones that are too long."""
        max_len = self.options.max_seq_len
        for index, ex in enumerate(examples):
            self.stats.examples_in += 1
            self.check_target(ex, index)
            enc = self.encoder.encode(ex, index)
            if len(enc) > max_len:
                if not self.options.truncate:
                    self.stats.skipped.append({"index": index, "reason": "too long", "tokens": len(enc)})
                    continue
                enc = _truncate(enc, max_len)
                self.stats.truncated.append(index)
            yield enc

    def check_target(self, ex: Example, index: int) -> None:
        """Encoder-decoder models: the example must say what the decoder reads."""
        if self.lm.facts.encoder_decoder and not isinstance(ex.fields.get("target"), str):
            raise InputError(None, f"example {index}: {self.lm.name} is an encoder-decoder model; "
                                   "each input needs a 'target' field (the text its decoder reads)")

    def plan(self, examples: Iterable[Example]) -> Iterator[list[Encoded]]:
        """Batches of encoded examples, similar lengths together, in a deterministic order
        (the same on every executor: plan position ``p`` is the same example everywhere)."""
        window: list[Encoded] = []
        for enc in self.encode_all(examples):
            window.append(enc)
            if len(window) >= self.options.window:
                yield from self._batches(window)
                window = []
        if window:
            yield from self._batches(window)

    def _batches(self, window: list[Encoded]) -> Iterator[list[Encoded]]:
        yield from batches(self.lm, sorted(window, key=lambda e: (len(e), e.index)), self.options.batch_size)

    # -- running --------------------------------------------------------------------------
    def run_batch(self, batch: list[Encoded], hooks: dict | None = None) -> AttentionBatch:
        """Run the model on one planned batch; padded positions never leave this function.

        ``hooks``: more of the forward helper's hook points to call during the same pass
        (:func:`attnscope.models.forward.forward`), e.g. ``{"k": ...}`` for key vectors."""
        if self.lm.facts.encoder_decoder:
            return self._run_seq2seq(batch)
        inputs = pad_batch(self.lm, [e.input_ids for e in batch], [e.token_type_ids for e in batch])
        out = forward(self.lm, inputs, attentions=True, hooks=hooks)
        # per layer [B H T T], views of torch's memory; one copy per example below, instead of
        # stacking the whole padded batch first (that copy was the largest allocation of a run)
        layers = [a.float().cpu().numpy() for a in out.attentions]
        del out
        items = []
        for b, e in enumerate(batch):
            n = len(e)
            attn = np.stack([layer[b, :, :n, :n] for layer in layers])  # [L H n n]
            items.append(self._to_map(e, attn))
            self.stats.tokens += n
            self.stats.examples_out += 1
        return AttentionBatch(items)

    def _run_seq2seq(self, batch: list[Encoded]) -> AttentionBatch:
        """Encoder-decoder models, one example at a time: the encoder map, carrying the decoder
        and cross-attention maps in ``others`` (:mod:`attnscope.extract.seq2seq`)."""
        items = []
        for e in batch:
            dec = decoder_input(self.lm, e.example.fields["target"])
            maps = seq2seq_maps(self.lm, e, dec, max_seq_len=self.options.max_seq_len)
            items.append(dataclasses.replace(maps.encoder, others={"decoder": maps.decoder,
                                                                   "cross": maps.cross}))
            self.stats.tokens += len(e)
            self.stats.examples_out += 1
        return AttentionBatch(items)

    def count(self, batch: list[Encoded]) -> None:
        """Count a planned batch whose maps were made elsewhere (another executor's workers, or
        shards already on disk) as :meth:`run_batch` counts it."""
        self.stats.tokens += sum(len(e) for e in batch)
        self.stats.examples_out += len(batch)

    def _to_map(self, e: Encoded, attn: np.ndarray) -> AttentionMap:
        special = np.asarray(e.special, dtype=bool)
        word_ids = np.asarray(e.word_ids, dtype=np.int64)
        segment = np.asarray(e.segment, dtype=np.int64)
        layers = self.lm.facts.attention_layers
        if not self.options.word_level:
            return AttentionMap(e.index, np.ascontiguousarray(attn), list(e.tokens), special, segment,
                                word_ids, "token", e.example, token_text=e.texts, layers=layers)
        units = token_units(word_ids, special)
        wattn = to_word_level(attn, units, self.options.from_word)
        first = np.searchsorted(units, np.arange(int(units[-1]) + 1))
        words = _unit_texts(e, units, piece_decoder(self.lm.tokenizer))
        return AttentionMap(e.index, wattn, words, special[first], segment[first], word_ids[first],
                            "word", e.example, layers=layers)


@contextmanager
def small_matrix_threads():
    """Run numpy's BLAS on one thread for the duration of an extraction run.

    Word-level conversion multiplies many small matrices; with OpenBLAS's default threads on a
    busy machine one such product was measured to stall for seconds (benchmarks/extract.py),
    against milliseconds on one thread. Set once per run: each change costs about 8 ms.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _unit_texts(e: Encoded, units: np.ndarray, convert=None) -> list[str]:
    """The text of each word-level unit: the input word where known, else its pieces as the
    tokenizer reads them together (``convert``, :func:`~attnscope.models.pieces.piece_decoder`),
    else the pieces joined without their word markers."""
    words = e.example.all_words
    out: list[str] = []
    for u in range(int(units[-1]) + 1):
        toks = np.nonzero(units == u)[0]
        t0 = toks[0]
        if e.special[t0]:
            out.append(e.tokens[t0])
        elif words is not None:
            out.append(words[e.word_ids[t0]])
        elif convert is not None:
            out.append(convert([e.tokens[t] for t in toks]).strip())
        else:
            out.append(_join_pieces([e.tokens[t] for t in toks]))
    return out


def _join_pieces(pieces: list[str]) -> str:
    text = "".join(p[2:] if i and p.startswith("##") else p for i, p in enumerate(pieces))
    return text.replace("Ġ", "").replace("▁", "")


def _truncate(enc: Encoded, max_len: int) -> Encoded:
    """Cut an encoded example to ``max_len`` tokens, keeping its final special token(s)."""
    tail = 0
    while tail < len(enc) and enc.special[len(enc) - 1 - tail]:
        tail += 1
    tail = min(tail, 1)
    keep = list(range(max_len - tail)) + list(range(len(enc) - tail, len(enc)))

    def cut(xs):
        return None if xs is None else [xs[i] for i in keep]

    return Encoded(index=enc.index, example=enc.example, input_ids=cut(enc.input_ids),
                   token_type_ids=cut(enc.token_type_ids), tokens=cut(enc.tokens),
                   special=cut(enc.special), segment=cut(enc.segment), word_ids=cut(enc.word_ids),
                   texts=cut(enc.texts))


def extract(examples: Iterable[Example | dict], model: LoadedModel | str = "default", *,
            options: ExtractOptions | None = None, stats: ExtractStats | None = None,
            on_batch: Callable[[AttentionBatch], None] | None = None,
            **kwargs) -> Iterator[AttentionBatch]:
    """Yield the attention of ``examples`` batch by batch, without writing anything.

    ``examples`` are :class:`Example` records or input dicts (validated like file inputs).
    Keyword arguments are :class:`ExtractOptions` fields, e.g. ``word_level=True``.

    >>> for batch in extract([{"text": "The cat sat."}], model="debug"):  # doctest: +SKIP
    ...     print(batch.items[0].attn.shape)   # [layer, head, query, key]
    """
    opts = options or ExtractOptions(**kwargs)
    ex_iter = (e if isinstance(e, Example) else example_from_dict(e, i) for i, e in enumerate(examples))
    extractor = Extractor(model, opts, stats)
    with small_matrix_threads():
        for planned in extractor.plan(ex_iter):
            batch = extractor.run_batch(planned)
            if on_batch is not None:
                on_batch(batch)
            yield batch
