"""Pure functions from an :class:`AttentionMap` to the plain dicts that the views draw.

Two kinds of dict:

- *view states* (:func:`head_payload`, :func:`heatmap_payload`, :func:`model_payload`): exactly
  what one view shows for one choice of layer, heads, pair filter and special-token toggle, as
  nested lists. They define the semantics; the page's JavaScript applies the same rules to the
  embedded data interactively, and the browser tests check that it agrees with them.
- the *page payload* (:func:`page_payload`): everything a page needs to switch between views
  with no server: tokens, every layer and head (as a compact blob, see
  :mod:`attnscope.viz.encoding`), model-view thumbnails, the initial state, and optionally the
  neuron view's query/key vectors.

Semantics (also in docs/views.md):

- pair filters ``"A->B"`` etc. keep queries of the first segment and keys of the second; they
  select, they do not renormalise (a shown weight is still a share of the whole row).
- ``hide_special=True`` removes special tokens from queries and keys and divides each row by
  its mass on the remaining (non-special) keys, so each row sums to 1 again (a row with no
  mass left stays 0). Pages say so when the toggle is on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnscope.analyses.longctx import bucket_labels, bucket_of
from attnscope.errors import AttnscopeError, IndexRangeError
from attnscope.maps import AttentionMap
from attnscope.models.pieces import readable, visible
from attnscope.viz.encoding import encode_u8

PAIR_FILTERS = ("all", "A->A", "A->B", "B->A", "B->B")
VIEWS = ("head", "model", "heatmap", "neuron", "profile")
RENORM_NOTE = ("special tokens hidden: each row is divided by its attention to non-special "
               "tokens, so the weights shown are shares of the attention to real tokens")
PAYLOAD_VERSION = 1
#: Inputs longer than this (units) are shown as a window of query rows (see :func:`window_units`).
LONG_INPUT = 512
#: Query rows in that window (the last ones by default; ``offset`` moves it).
WINDOW = 256


def _where(amap: AttentionMap) -> str:
    return f"example {amap.index}"


#: How many heads a page's head view shows first (:func:`pointing_heads`).
SHOWN_HEADS = 3


def check_layer_heads(amap: AttentionMap, layer: int, heads) -> list[int]:
    """Validate ``layer`` and ``heads`` against the map; returns the head list (all by default)."""
    num_layers, num_heads = amap.attn.shape[:2]
    if not 0 <= layer < num_layers:
        raise IndexRangeError(_where(amap), "layer", layer, num_layers)
    if heads is None:
        return list(range(num_heads))
    heads = [int(h) for h in heads]
    if not heads:
        raise AttnscopeError(f"{_where(amap)}: no head chosen (the model has {num_heads} heads per layer)")
    bad = [h for h in heads if not 0 <= h < num_heads]
    if bad:
        raise IndexRangeError(_where(amap), "head", bad[0], num_heads)
    return heads


def pointing_heads(amap: AttentionMap, layer: int, k: int = SHOWN_HEADS) -> list[int]:
    """The heads a page shows first: all of a layer of at most ``k + 1`` heads, else the ``k``
    that point at words most sharply on this example (the largest mean, over the rows of
    words, of the row's largest weight on a word), in head order. Twelve heads drawn at once
    are a hairball; the page's head boxes add the others.

    """
    num_heads = amap.attn.shape[1]
    if num_heads <= k + 1:
        return list(range(num_heads))
    words = ~np.asarray(amap.special, dtype=bool)
    a = np.asarray(amap.attn[layer], dtype=np.float64)  # [H q k]
    if amap.key_tokens is not None or not words.any():
        return list(range(k))
    sharp = a[:, words][:, :, words].max(axis=-1).mean(axis=-1)  # [H]
    return sorted(np.argsort(-sharp, kind="stable")[:k].tolist())


def is_pair(amap: AttentionMap) -> bool:
    """Whether the example has a second segment."""
    return bool((np.asarray(amap.segment) == 1).any())


def visible_units(amap: AttentionMap, pair_filter: str = "all",
                  hide_special: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Query units (rows) and key units (columns) shown, as sorted index arrays ``[r]``, ``[c]``.

    >>> # [CLS] a [SEP] b [SEP] with segments 0 0 0 1 1: "A->B" keeps rows 0-2, columns 3-4
    """
    if pair_filter not in PAIR_FILTERS:
        raise AttnscopeError(f"unknown pair filter {pair_filter!r}; choose one of "
                             f"{', '.join(PAIR_FILTERS)}")
    n = amap.num_units
    seg = np.asarray(amap.segment)
    keep = np.ones(n, bool)
    if hide_special:
        keep &= ~np.asarray(amap.special, bool)
    rows = cols = keep
    if amap.key_tokens is not None:  # cross-attention: the columns are the encoder's tokens
        cols = ~amap.keys[1] if hide_special else np.ones(len(amap.key_tokens), bool)
    if pair_filter != "all":
        if not is_pair(amap):
            raise AttnscopeError(f"{_where(amap)}: filter {pair_filter} needs a sentence pair, "
                                 "but the example has one segment")
        src, dst = pair_filter.split("->")
        rows = keep & (seg == (0 if src == "A" else 1))
        cols = keep & (seg == (0 if dst == "A" else 1))
    return np.nonzero(rows)[0], np.nonzero(cols)[0]


def renormalise_without_special(attn: np.ndarray, special: np.ndarray) -> np.ndarray:
    """``attn [.., q, k]`` with special keys zeroed and rows rescaled to sum to 1 (0 rows stay 0)."""
    a = np.where(np.asarray(special, bool), 0.0, attn.astype(np.float64))  # [.. q k]
    total = a.sum(-1, keepdims=True)
    return np.divide(a, total, out=np.zeros_like(a), where=total > 0)


def _matrices(amap: AttentionMap, layer: int, heads: list[int], pair_filter: str,
              hide_special: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = amap.attn[layer][heads].astype(np.float64)  # [h q k]
    if hide_special:
        a = renormalise_without_special(a, amap.keys[1])
    rows, cols = visible_units(amap, pair_filter, hide_special)
    return a[:, rows][:, :, cols], rows, cols  # [h r c]


def _units(amap: AttentionMap) -> dict:
    """The units of a map; a cross-attention map adds its key units, a map over a continuation
    marks each generated unit (``generated``: a bool per unit, or None). ``tokens`` are the raw
    pieces (``ĠParis``), ``token_text`` what the views show (``·Paris``: the tokenizer's text,
    whitespace made visible); the pages show the raw piece on hover."""
    keys = {}
    if amap.key_tokens is not None:
        key_text = readable(amap.key_tokens, amap.key_special, amap.key_token_text, amap.level)
        keys = {"key_tokens": list(amap.key_tokens), "key_special": [bool(s) for s in amap.key_special],
                "key_token_text": [visible(t) for t in key_text]}
    generated = None if amap.generated is None else [i >= amap.generated for i in range(amap.num_units)]
    text = readable(amap.tokens, amap.special, amap.token_text, amap.level)
    return {"tokens": list(amap.tokens), "token_text": [visible(t) for t in text],
            "special": [bool(s) for s in amap.special],
            "segment": [int(s) for s in amap.segment], "level": amap.level,
            "is_pair": is_pair(amap), "kind": amap.kind, "generated": generated, **keys}


def head_payload(amap: AttentionMap, layer: int = 0, heads=None, *, pair_filter: str = "all",
                 hide_special: bool = False) -> dict:
    """What the head view shows: ``attn`` is ``[len(heads), len(rows), len(cols)]``.

    ``rows``/``cols`` are the unit positions of the shown queries and keys.
    """
    heads = check_layer_heads(amap, layer, heads)
    a, rows, cols = _matrices(amap, layer, heads, pair_filter, hide_special)
    return {"view": "head", "index": amap.index, "layer": layer, "heads": heads, **_units(amap),
            "pair_filter": pair_filter, "hide_special": hide_special, "renormalised": hide_special,
            "note": RENORM_NOTE if hide_special else "", "rows": rows.tolist(),
            "cols": cols.tolist(), "attn": a.tolist()}


def heatmap_payload(amap: AttentionMap, layer: int = 0, head: int = 0, *, pair_filter: str = "all",
                    hide_special: bool = False) -> dict:
    """One head's matrix with its labels: ``attn`` is ``[len(rows), len(cols)]``."""
    p = head_payload(amap, layer, [head], pair_filter=pair_filter, hide_special=hide_special)
    p.update(view="heatmap", head=head, attn=p["attn"][0],
             row_labels=[p["token_text"][i] for i in p["rows"]],
             col_labels=[p.get("key_token_text", p["token_text"])[j] for j in p["cols"]])
    del p["heads"]
    return p


def bin_edges(n: int, size: int) -> np.ndarray:
    """Edges of ``min(n, size)`` near-equal bins over ``n`` positions, ``[t + 1]``."""
    t = max(1, min(n, size))
    return np.rint(np.linspace(0, n, t + 1)).astype(np.int64)


def pool(attn: np.ndarray, size: int) -> np.ndarray:
    """Shrink ``[..., q, k]`` to ``[..., min(q, size), min(k, size)]`` for thumbnails.

    A cell is the mean over its query bin of the summed weight on its key bin, so each pooled
    row still sums to 1, like the rows it stands for.
    """
    nq, nk = attn.shape[-2:]
    rows, cols = bin_edges(nq, size), bin_edges(nk, size)
    lead = attn.shape[:-2]
    flat = attn.reshape(-1, nq, nk)
    out = np.empty((flat.shape[0], len(rows) - 1, len(cols) - 1))
    for i, m in enumerate(flat):  # one [q k] at a time: a long input's maps never double in memory
        summed = np.add.reduceat(np.asarray(m, dtype=np.float64), cols[:-1], axis=-1)  # [q tk]
        out[i] = np.add.reduceat(summed, rows[:-1], axis=0) / np.diff(rows)[:, None]  # [tq tk]
    return out.reshape(*lead, len(rows) - 1, len(cols) - 1)


def model_payload(amap: AttentionMap, *, thumb_size: int = 32) -> dict:
    """The grid of every layer and head: ``thumbnails`` is ``[L][H][t][t]`` (see :func:`pool`)."""
    num_layers, num_heads = amap.attn.shape[:2]
    edges = bin_edges(amap.num_units, thumb_size)
    return {"view": "model", "index": amap.index, **_units(amap), "num_layers": num_layers,
            "num_heads": num_heads, "bins": edges.tolist(),
            "thumbnails": pool(amap.attn, thumb_size).tolist()}


def window_units(n: int, window: int = WINDOW, offset: int | None = None) -> np.ndarray:
    """The units a long input's page shows: ``window`` consecutive positions from ``offset``
    (default: the last ``window``), with position 0 (the first token: [CLS] or BOS, the sink)
    always in front. Sorted, ``[m]`` with ``m <= window + 1``.

    >>> window_units(1000, 4).tolist()
    [0, 996, 997, 998, 999]
    >>> window_units(1000, 4, offset=0).tolist()
    [0, 1, 2, 3]
    """
    if window < 1:
        raise AttnscopeError(f"window {window}: must be at least 1", params=("window",))
    w = min(window, n)
    last = n - w
    if offset is None:
        offset = last
    if not 0 <= offset <= last:
        raise AttnscopeError(f"offset {offset}: out of range for {n} units and a window of {w} "
                             f"(0 .. {last})", params=("offset",))
    units = np.arange(offset, offset + w)
    return units if offset == 0 else np.concatenate([[0], units])


def window_map(amap: AttentionMap, units: np.ndarray) -> tuple[AttentionMap, np.ndarray]:
    """The map restricted to ``units`` (rows and columns), and each shown row's mass on keys
    outside them, ``outside [L H m]`` (``1 - `` the shown row's sum, clipped at 0)."""
    units = np.asarray(units, dtype=np.int64)
    sub, outside = _window_rows(amap.attn, units)
    return _window_part(amap, units, sub), outside


def _window_rows(attn: np.ndarray, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``attn [.. n n]`` at rows and columns ``units`` ``[.. m m]``, and each row's mass outside
    them ``[.. m]``."""
    rows = np.asarray(attn[..., units, :], dtype=np.float32)  # [.. m n]
    sub = rows[..., units]
    outside = np.clip(rows.sum(-1, dtype=np.float64) - sub.sum(-1, dtype=np.float64), 0.0, 1.0)
    return sub, outside


def _window_part(amap: AttentionMap, units: np.ndarray, sub: np.ndarray) -> AttentionMap:
    """The map of the window's units with ``sub`` ``[L H m m]`` as its weights."""
    generated = None if amap.generated is None else int(np.searchsorted(units, amap.generated))
    text = readable(amap.tokens, amap.special, amap.token_text, amap.level)  # in the whole input's context
    return AttentionMap(amap.index, sub, [amap.tokens[i] for i in units],
                        np.asarray(amap.special)[units], np.asarray(amap.segment)[units],
                        np.asarray(amap.word_ids)[units], amap.level, amap.example, kind=amap.kind,
                        generated=generated, token_text=[text[i] for i in units], layers=amap.layers)


@dataclass
class Windowed:
    """A long input's page made without its whole map: ``amap`` is the window (the first unit
    and ``size`` query rows, as :func:`window_map` cuts it), ``outside`` ``[L H m]`` each shown
    row's mass on keys outside it, ``thumbnails`` ``[L H t t]`` and ``profile`` (a
    :func:`distance_profile`) of the whole input, all reduced layer by layer while the model
    ran (:func:`window_reducer`), so no ``[L H n n]`` array ever existed."""

    amap: AttentionMap
    units: np.ndarray
    size: int
    num_units: int
    outside: np.ndarray
    thumbnails: np.ndarray
    profile: dict


def _window_info(units: np.ndarray, size: int, n: int, long_input: int, outside: np.ndarray) -> dict:
    """The page's ``window`` entry: which units it shows and how much lies outside them."""
    return {"units": np.asarray(units).tolist(), "offset": int(units[-1]) + 1 - size, "size": size,
            "num_units": n, "long_input": long_input, "outside": encode_u8(outside)}


def window_reducer(units: np.ndarray, size: int, thumb_size: int = 32):
    """``(add, finish)``: ``add(attn [H n n])`` takes one layer's whole map and keeps only what a
    long input's page shows of it (the window's rows and columns and their outside mass, the
    pooled thumbnails, the distance profile: the functions :func:`page_payload` applies to a
    whole map); ``finish(amap)`` returns the :class:`Windowed` page of ``amap``, a map that
    carries the input's units (its ``attn`` is not read)."""
    units = np.asarray(units, dtype=np.int64)
    parts: list[tuple] = []

    def add(layer_attn: np.ndarray) -> None:
        a = np.asarray(layer_attn, dtype=np.float32)[None]  # [1 H n n]
        sub, outside = _window_rows(a, units)
        parts.append((sub[0], outside[0], pool(a, thumb_size)[0], distance_profile(a)))

    def finish(amap: AttentionMap) -> Windowed:
        sub, outside, thumbs, profiles = (list(x) for x in zip(*parts))
        profile = dict(profiles[0], values=[p["values"][0] for p in profiles])
        return Windowed(_window_part(amap, units, np.stack(sub)), units, size, amap.num_units,
                        np.stack(outside), np.stack(thumbs), profile)

    return add, finish


def distance_profile(attn: np.ndarray, *, causal: bool | None = None) -> dict:
    """Per-head attention against distance of one map, ``attn [L H n n]``: the mean over query
    rows ``1 .. n-1`` of the mass at distance ``|i - j|``, summed per log-spaced bucket
    (0 | 1 | 2 | 3-4 | 5-8 | ..., the buckets of :mod:`attnscope.analyses.longctx`, whose
    ``dist_mass`` is the same statistic over a corpus). Each head's profile sums to 1.

    Returns ``{"buckets": [labels], "values": [L][H][B]}`` with ``B`` the buckets up to ``n``.
    ``causal`` is only recorded (a causal map simply has no mass at ``j > i``).
    """
    L, H, n = attn.shape[0], attn.shape[1], attn.shape[-1]
    if n < 2:
        return {"buckets": [], "values": [[[] for _ in range(H)] for _ in range(L)]}
    B = int(bucket_of(np.array([n - 1]))[0]) + 1
    lo = np.array([0, 1] + [2 ** (k - 2) + 1 for k in range(2, B)])[None, :]  # [1 B] distances
    hi = np.array([0, 1] + [2 ** (k - 1) for k in range(2, B)])[None, :]
    i = np.arange(1, n)[:, None]  # [(n-1) 1] query rows
    # row prefix sums cs[r, j] = sum of the row's keys < j; a band of keys is a difference of two
    below = (np.clip(i - lo + 1, 0, n), np.clip(i - hi, 0, n))  # keys i-hi .. i-lo (j <= i)
    above = (np.clip(i + hi + 1, 0, n), np.clip(i + lo, 0, n))  # keys i+lo .. i+hi (j > i)
    above[1][:, 0] = above[0][:, 0]  # distance 0 is counted once, on the left side
    out = np.zeros((L, H, B))
    cs = np.zeros((n - 1, n + 1))
    for layer in range(L):
        for head in range(H):
            np.cumsum(np.asarray(attn[layer, head, 1:, :], dtype=np.float64), axis=1, out=cs[:, 1:])
            mass = sum(np.take_along_axis(cs, a, 1) - np.take_along_axis(cs, b, 1)
                       for a, b in (below, above))  # [(n-1) B]
            out[layer, head] = mass.sum(0) / (n - 1)
    return {"buckets": bucket_labels()[:B], "values": out.tolist(), "rows": "query positions >= 1",
            "causal": causal}


def example_text(amap: AttentionMap) -> str:
    """A one-line text of the example (its text, or its words / tokens joined)."""
    ex = amap.example
    if ex.text is not None:
        first = ex.text
    elif ex.words is not None:
        first = " ".join(ex.words)
    elif ex.tokens is not None:
        first = " ".join(ex.tokens)
    else:
        first = " ".join(t for t, s in zip(amap.tokens, amap.special) if not s)
    second = ex.text_pair if ex.text_pair is not None else (
        " ".join(ex.words_pair) if ex.words_pair else None)
    if isinstance(ex.fields.get("continuation"), str):  # a model's own continuation follows
        return f"{first} \u2192 (generated) {ex.fields['continuation']}"
    if isinstance(ex.fields.get("target"), str):  # what an encoder-decoder model's decoder read
        return f"{first} \u2192 (target) {ex.fields['target']}"
    return first if second is None else f"{first} || {second}"


def page_payload(amap: AttentionMap, view: str = "head", *, layer: int = 0, heads=None,
                 head: int | None = None, pair_filter: str = "all", hide_special: bool = False,
                 title: str | None = None, neuron: dict | None = None, thumb_size: int = 32,
                 model: str | None = None, long_input: int = LONG_INPUT, window: int = WINDOW,
                 offset: int | None = None) -> dict:
    """Everything a self-contained page needs for one example (JSON-able).

    ``attn`` is a ``u8`` blob ``[L H n n]``; ``thumbnails`` a ``u8`` blob ``[L H t t]``;
    ``state`` the view to open first; ``neuron`` the :func:`attnscope.viz.neuron.neuron_payload`
    of one layer, when given; ``profile`` the :func:`distance_profile` of the example.

    Long inputs (more than ``long_input`` units): the page would need ``L H n^2`` weights and the
    head view ``n^2`` lines, so the payload carries only a window (:func:`window_units`: the first
    unit plus ``window`` query rows from ``offset``, the last ones by default), as a square map
    over those units: ``tokens``, ``attn`` etc. are the window's, ``window`` says which positions
    they are (``units``) and how much of each shown row goes to keys outside (``outside``, ``u8``
    ``[L H m]``). The thumbnails and the distance profile still cover the whole input. Layer,
    head and query numbers in ``state`` refer to the window's units. ``amap`` may be a
    :class:`Windowed` (a long input reduced while the model ran): its window is the page's.
    """
    pre = amap if isinstance(amap, Windowed) else None
    if pre is not None:
        amap = pre.amap
    if view not in VIEWS:
        raise AttnscopeError(f"unknown view {view!r}; choose one of {', '.join(VIEWS)}")
    if view == "neuron" and neuron is None:
        raise AttnscopeError("the neuron view needs query/key vectors (neuron_payload)")
    if view == "profile" and amap.key_tokens is not None:
        raise AttnscopeError("view profile: a cross-attention map has no distance profile (its rows "
                             "and columns are two sequences)", params=("view",))
    heads = check_layer_heads(amap, layer, heads if heads is not None else pointing_heads(amap, layer))
    head = heads[0] if head is None else check_layer_heads(amap, layer, [head])[0]
    visible_units(amap, pair_filter, hide_special)  # validates the filter early
    num_layers, num_heads = amap.attn.shape[:2]
    full, n_full = amap, amap.num_units
    win = None
    cross = amap.key_tokens is not None
    if pre is not None:
        if offset is not None:
            raise AttnscopeError(f"offset {offset}: this page's window was cut while the model ran; "
                                 "choose the offset there", params=("offset",))
        n_full = pre.num_units
        win = _window_info(pre.units, pre.size, n_full, long_input, pre.outside)
    elif n_full > long_input and not cross:  # cross-attention maps are shown whole
        units = window_units(n_full, window, offset)
        amap, outside = window_map(full, units)
        win = _window_info(units, min(window, n_full), n_full, long_input, outside)
    elif offset is not None:
        raise AttnscopeError(f"offset {offset}: example {full.index} has {n_full} units, not more than "
                             f"{long_input}, so the whole input is shown (no window to move)",
                             params=("offset",))
    attn = np.asarray(amap.attn, dtype=np.float32)  # [L H m m]
    return {
        "version": PAYLOAD_VERSION,
        "title": title or f"example {amap.index}",
        "index": amap.index,
        "text": example_text(amap),
        "model": model,
        **_units(amap),
        "num_layers": num_layers,
        "num_heads": num_heads,
        "layer_numbers": full.layer_numbers,  # the model's own (a hybrid's attention layers)
        "state": {"view": view, "layer": layer, "heads": heads, "head": head,
                  "pair_filter": pair_filter, "hide_special": bool(hide_special)},
        "renorm_note": RENORM_NOTE,
        "attn": encode_u8(attn),
        "thumb_bins": bin_edges(n_full, thumb_size).tolist(),
        "thumbnails": encode_u8(pool(full.attn, thumb_size) if pre is None else pre.thumbnails),
        "neuron": neuron,
        "window": win,
        "profile": None if cross else distance_profile(full.attn) if pre is None else pre.profile,
    }


KIND_LABELS = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
               "cross": "cross-attention (decoder \u2192 encoder)"}


def kinds_payload(maps: dict[str, AttentionMap], kind: str, *, layer: int = 0, heads=None,
                  title: str | None = None, **kwargs) -> dict:
    """A page over an encoder-decoder model's kinds of attention (``{"encoder": map, ...}``,
    :class:`attnscope.extract.seq2seq.Seq2SeqMaps`), opening on ``kind``: one
    :func:`page_payload` per kind under ``kinds``, and the page switches between them.
    ``layer``/``heads`` apply to the opening kind; the others open on the same layer where they
    have it (else their first) with all heads."""
    if kind not in maps:
        raise AttnscopeError(f"unknown attention kind {kind!r}; choose one of {', '.join(maps)}",
                             params=("kind",))
    pages = {}
    for k, amap in maps.items():
        if k == kind:
            pages[k] = page_payload(amap, layer=layer, heads=heads, title=title, **kwargs)
        else:
            lk = layer if layer < amap.attn.shape[0] else 0
            view = kwargs.get("view", "head")
            if view == "profile" and amap.key_tokens is not None:
                view = "head"  # a cross-attention map has no distance profile
            pages[k] = page_payload(amap, layer=lk, title=title, **{**kwargs, "head": None, "view": view})
    first = pages[kind]
    return {"version": PAYLOAD_VERSION, "title": first["title"], "kind": kind, "kinds": pages,
            "labels": {k: KIND_LABELS.get(k, k) for k in pages}}
