"""Views from Python and in Jupyter: ``head_view``, ``model_view``, ``heatmap``, ``neuron_view``,
``results_view``.

Each returns a :class:`View`: in a notebook it displays inline (an ``<iframe srcdoc>``, so the
page's script and styles stay isolated from the notebook's); ``.save("view.html")`` writes the
same self-contained page; ``.save_png(...)``/``.save_svg(...)`` export with headless Chromium.
IPython is never imported.

>>> from attnscope.notebook import head_view
>>> head_view(store[0], layer=7, heads=[9])                    # doctest: +SKIP
>>> head_view(attentions, tokens).save("head.html")            # BertViz-style inputs  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import html as _html
import json
import re
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from attnscope.data.io import atomic_write_text
from attnscope.data.records import Example, HeadId, layer_number
from attnscope.errors import NoAttentionError
from attnscope.extract.runner import extract
from attnscope.maps import AttentionMap, token_word_ids
from attnscope.models.loading import LoadedModel, as_loaded, borrowed
from attnscope.views import LongDocumentView, head_page_html, results_view_html
from attnscope.viz.export import export_html
from attnscope.viz.generate import model_maps
from attnscope.viz.pages import maps_html, neuron_view_html
from attnscope.viz.payload import LONG_INPUT


class View:
    """A rendered view page: ``html`` is the complete self-contained page.

    In a notebook the page sits in a sandboxed ``<iframe srcdoc>`` that starts ``height``
    pixels tall and then fits its content (the page posts its height to the notebook). Under
    the frame, one line says what the view shows (``caption``; by default read from the page);
    a notebook opened untrusted drops the frame and keeps that line, which then asks to run
    the cell.
    """

    def __init__(self, html: str, kind: str, height: int = 640, caption: str | None = None):
        self.html = html
        self.kind = kind
        self.height = height
        self._caption = caption

    @property
    def caption(self) -> str:
        """One line: the view, its layer and heads, its length (e.g. ``attnscope head view ·
        layer 3 · heads 3-2, 3-5, 3-9 of 12 · 24 tokens``); layers and heads 1-indexed, as the page
        shows them."""
        if self._caption is None:
            self._caption = self._describe(self.kind, self._payload(self.html))
        return self._caption

    @staticmethod
    def _payload(html: str) -> dict:
        """The page's data block, or ``{}`` when it has none that parses."""
        m = re.search(r'<script id="attnscope-data" type="application/json">(.*?)</script>', html, re.S)
        try:
            payload = json.loads(m.group(1)) if m else {}
        except ValueError:
            return {}
        return payload if isinstance(payload, dict) else {}

    @staticmethod
    def _describe(kind: str, p: dict) -> str:
        """The caption of a ``kind`` view from its page payload ``p`` (what it lacks is left out)."""
        names = {"head": "head view", "model": "model view", "heatmap": "heatmap",
                 "neuron": "neuron view", "results": "results view", "head page": "head page",
                 "long document": "long document"}
        kinds = p.get("kinds") if isinstance(p.get("kinds"), dict) else None
        if kinds and p.get("kind") in kinds and isinstance(kinds[p["kind"]], dict):
            # an encoder-decoder page: the kind it opens on, then that kind's own caption
            label = (p.get("labels") or {}).get(p["kind"], p["kind"])
            inner = View._describe(kind, kinds[p["kind"]])
            return inner.replace(" \u00b7 ", f" \u00b7 {label} \u00b7 ", 1) if " \u00b7 " in inner \
                else f"{inner} \u00b7 {label}"
        parts = [f"attnscope {names.get(kind, kind + ' view')}"]
        state = p.get("state") if isinstance(p.get("state"), dict) else {}
        layer, heads, head = state.get("layer"), state.get("heads"), state.get("head")
        own = p.get("layer_numbers")  # the model's own numbers (a hybrid's attention layers)
        number = (own[layer] if isinstance(own, list) and isinstance(layer, int) and 0 <= layer < len(own)
                  else layer_number(layer) if isinstance(layer, int) else None)
        if kind == "head" and isinstance(layer, int):
            parts.append(f"layer {number}")
            total = p.get("num_heads")
            if isinstance(heads, list) and isinstance(total, int) and 0 < len(heads) < total:
                shown = ", ".join(f"{number}-{h + 1}" for h in heads)  # which, when not all
                parts.append(f"head{'s' * (len(heads) != 1)} {shown} of {total}")
            elif isinstance(heads, list):
                parts.append(f"{len(heads)} head{'s' * (len(heads) != 1)}")
        elif kind in ("heatmap", "neuron") and isinstance(layer, int) and isinstance(head, int):
            parts.append(f"head {number}-{head + 1}")
        elif kind == "model" and isinstance(p.get("num_layers"), int) and isinstance(p.get("num_heads"), int):
            parts.append(f"{p['num_layers']} layers x {p['num_heads']} heads")
        elif kind == "head page" and isinstance(p.get("head"), str):
            parts.append(f"head {p['head']}")
            stats = p.get("examples") if isinstance(p.get("examples"), dict) else {}
            parts.append(f"top examples for {len(stats)} statistics" if stats else "no top examples")
        elif kind == "long document" and isinstance(p.get("layer"), int) and isinstance(p.get("head"), int):
            parts.append(f"head {HeadId(p['layer'], p['head'])}")
            if isinstance(p.get("n"), int):
                parts.append(f"{p['n']:,} tokens")
            if isinstance(p.get("rows"), list):
                parts.append(f"{len(p['rows'])} row{'s' * (len(p['rows']) != 1)}")
        elif kind == "results":
            has = [what for key, what in (("attribution", "attribution maps"),
                                          ("profiles", "long-context profiles"),
                                          ("sinks", "sink mass")) if p.get(key)]
            parts.extend(has)
        tokens = p.get("tokens")
        if isinstance(tokens, list) and tokens:
            unit = "words" if p.get("level") == "word" else "tokens"
            window = p.get("window") if isinstance(p.get("window"), dict) else None
            if window and isinstance(window.get("num_units"), int):
                parts.append(f"{len(tokens)} of {window['num_units']} {unit} shown")
            else:
                parts.append(f"{len(tokens)} {unit}")
            generated = p.get("generated")
            if isinstance(generated, list) and any(generated):
                parts.append(f"{sum(bool(g) for g in generated)} generated")
        return " \u00b7 ".join(parts)

    def _repr_html_(self) -> str:
        frame = f"attnscope-{secrets.token_hex(6)}"
        # The page posts {"attnscopeHeight": h} to its parent (page.html.j2); only the message
        # from this frame's own window sets this frame's height. Without a trusted output (a
        # notebook opened untrusted) the sanitiser drops the iframe and both scripts, and the
        # caption stays, with its "run the cell" hint, which the script hides otherwise.
        listen = ("(function(){var f=document.getElementById('@ID@');if(!f)return;"
                  "var hint=document.getElementById('@ID@-hint');if(hint)hint.style.display='none';"
                  "function on(e){if(!document.body.contains(f)){window.removeEventListener('message',on);return;}"
                  "if(e.source!==f.contentWindow||!e.data||typeof e.data.attnscopeHeight!=='number')return;"
                  "var h=Math.min(Math.max(Math.ceil(e.data.attnscopeHeight),80),20000);"
                  "if(Math.abs(parseFloat(f.style.height)-h)>1)f.style.height=h+'px';}"
                  "window.addEventListener('message',on);})();").replace("@ID@", frame)
        caption = _html.escape(self.caption, quote=False)
        return (f'<div class="attnscope-view">'
                f'<iframe id="{frame}" srcdoc="{_html.escape(self.html, quote=True)}" '
                f'style="width:100%;height:{self.height}px;border:1px solid #ddd" '
                f'sandbox="allow-scripts allow-downloads" title="{_html.escape(self.caption)}"></iframe>'
                f'<p class="attnscope-caption" style="margin:2px 0;color:#555;font-size:12px">{caption}'
                f'<span id="{frame}-hint"> \u2014 run the cell to interact</span></p>'
                f'<script>{listen}</script></div>')

    def save(self, path: str | Path) -> Path:
        """Write the page (atomically); returns the path."""
        path = Path(path)
        atomic_write_text(path, self.html)
        return path

    def save_png(self, path: str | Path, scale: float = 2.0) -> tuple[int, int]:
        """Export the view as PNG with headless Chromium; returns (width, height)."""
        return self._export(png=Path(path), scale=scale)["png"]

    def save_svg(self, path: str | Path) -> tuple[int, int]:
        """Export the view as SVG with headless Chromium; returns (width, height)."""
        return self._export(svg=Path(path))["svg"]

    def _export(self, **kwargs) -> dict:
        """:func:`~attnscope.viz.export.export_html` of this page. Playwright's sync API refuses
        to run where an asyncio loop is running (a Jupyter kernel has one), so there it runs
        on a thread of its own."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return export_html(self.html, **kwargs)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnscope-export") as pool:
            return pool.submit(export_html, self.html, **kwargs).result()

    def __repr__(self) -> str:
        return f"<attnscope View {self.kind}, {len(self.html)} bytes of HTML>"


def as_map(attention, tokens=None, *, special=None, segment=None, key_tokens=None, key_special=None,
           kind: str | None = None) -> AttentionMap:
    """An :class:`AttentionMap` from a map, or from BertViz-style ``(attention, tokens)``.

    ``attention`` is ``[L H n n]`` (numpy or torch) or a tuple of per-layer ``[1 H n n]`` /
    ``[H n n]`` tensors (what ``model(..., output_attentions=True).attentions`` gives).
    ``special`` marks special tokens (none by default); ``segment`` gives 0/1 segment ids.
    A cross-attention map ``[L H t s]`` takes the decoder's ``tokens`` (rows) and the encoder's
    ``key_tokens`` (columns). Empty or None attention (what a model running sdpa or flash
    attention returns for ``output_attentions=True``) raises :class:`NoAttentionError`, which
    names both ways out.
    """
    if isinstance(attention, AttentionMap):
        return attention
    if attention is None or (isinstance(attention, (tuple, list))
                             and (not attention or any(a is None for a in attention))):
        raise NoAttentionError(f"{kind}_attention" if kind else "attention")
    if tokens is None:
        raise TypeError("pass tokens with a raw attention array")
    if isinstance(attention, (tuple, list)):
        layers = [np.asarray(_to_numpy(a), dtype=np.float32) for a in attention]
        attn = np.stack([a[0] if a.ndim == 4 else a for a in layers])  # [L H q k]
    else:
        attn = np.asarray(_to_numpy(attention), dtype=np.float32)
        if attn.ndim == 5:
            attn = attn[:, 0] if attn.shape[1] == 1 else attn[0]
    n = len(tokens)
    nk = n if key_tokens is None else len(key_tokens)
    if attn.ndim != 4 or attn.shape[-2:] != (n, nk):
        raise ValueError(f"attention must be [layer, head, {n}, {nk}] for {n} query and {nk} key "
                         f"tokens, got {list(attn.shape)}")
    special = np.zeros(n, bool) if special is None else np.asarray(special, bool)
    segment = np.zeros(n, np.int64) if segment is None else np.asarray(segment, np.int64)
    word_ids = token_word_ids(special)
    keys = {}
    if key_tokens is not None:
        keys = {"key_tokens": [str(t) for t in key_tokens],
                "key_special": np.zeros(nk, bool) if key_special is None else np.asarray(key_special, bool)}
    return AttentionMap(0, attn, [str(t) for t in tokens], special, segment, word_ids, "token",
                        Example(tokens=[str(t) for t in tokens]), kind=kind, **keys)


def _to_numpy(a):
    if hasattr(a, "detach"):
        return a.detach().float().cpu().numpy()
    return a


def _maps(attention, tokens, *, generate=None, target=None, encoder_attention=None,
          decoder_attention=None, cross_attention=None, encoder_tokens=None, decoder_tokens=None,
          sentence_b_start=None, window: int = 256, offset: int | None = None, tokenizer=None,
          **map_kwargs) -> AttentionMap | dict[str, AttentionMap]:
    """What a view shows: one map, or an encoder-decoder model's ``{kind: map}``.

    Three ways in: a map or BertViz-style ``(attention, tokens)``; BertViz's encoder-decoder
    keywords (``encoder_attention=``, ``decoder_attention=``, ``cross_attention=`` with
    ``encoder_tokens=``/``decoder_tokens=``); or a model (a name, a loaded model, or a
    transformers model object with its ``tokenizer=``, loaded any way) and a text,
    with ``generate=N`` (the model's greedy continuation) or, for an encoder-decoder model,
    ``target=``. A continuation past 512 tokens comes as the long-input window of ``window``
    rows from ``offset``, made layer by layer (:class:`~attnscope.viz.payload.Windowed`).
    """
    if any(a is not None for a in (encoder_attention, decoder_attention, cross_attention)):
        maps = {}
        if encoder_attention is not None:
            maps["encoder"] = as_map(encoder_attention, encoder_tokens, kind="encoder", **map_kwargs)
        if decoder_attention is not None:
            maps["decoder"] = as_map(decoder_attention, decoder_tokens, kind="decoder")
        if cross_attention is not None:
            if encoder_tokens is None or decoder_tokens is None:
                raise TypeError("cross_attention needs encoder_tokens and decoder_tokens")
            maps["cross"] = as_map(cross_attention, decoder_tokens, key_tokens=encoder_tokens,
                                   kind="cross")
        return maps
    if isinstance(attention, (LoadedModel, str)) or hasattr(attention, "set_attn_implementation"):
        if not isinstance(tokens, str):
            raise TypeError("with a model, pass the text to read: head_view(model, text, generate=N)")
        options = {"generate": generate, "target": target, "long_input": LONG_INPUT,
                   "window": window, "offset": offset}
        if isinstance(attention, (LoadedModel, str)):
            return model_maps(as_loaded(attention), tokens, **options)
        with borrowed(attention, tokenizer) as lm:  # a transformers model, loaded any way
            return model_maps(lm, tokens, **options)
    if generate or target is not None:
        raise TypeError("generate= and target= need a model: head_view(model, text, generate=N)")
    if sentence_b_start is not None and "segment" not in map_kwargs and tokens is not None:
        map_kwargs["segment"] = (np.arange(len(tokens)) >= sentence_b_start).astype(np.int64)
    return as_map(attention, tokens, **map_kwargs)


def _view(maps, view: str, kind: str | None, **kwargs) -> View:
    return View(maps_html(maps, view, kind=kind, **kwargs), view)


def head_view(attention=None, tokens=None, *, layer: int = 0, heads=None, pair_filter: str = "all",
              hide_special: bool = False, title: str | None = None, offset: int | None = None,
              window: int = 256, kind: str | None = None, **inputs) -> View:
    """Lines from each token to what it attends to, for ``heads`` of ``layer`` (0-indexed).

    Inputs: ``head_view(attention, tokens)`` (BertViz-style; ``sentence_b_start=`` marks a
    pair), ``head_view(encoder_attention=..., decoder_attention=..., cross_attention=...,
    encoder_tokens=..., decoder_tokens=...)`` for encoder-decoder outputs (the page switches
    between the three; ``kind`` picks the one it opens on), or ``head_view(model, text,
    generate=N)``: the model's greedy continuation of ``text``, generated tokens marked
    (``target=`` instead gives an encoder-decoder model's decoder a text to read). ``model`` is
    a name, a loaded model, or a transformers model loaded any way (transformers' default sdpa
    attention returns no weights; attnscope captures them) with ``tokenizer=``.

    Inputs longer than 512 units show ``window`` query rows from ``offset`` (default: the last
    ones, so a long continuation's own rows) plus the first token, and a distance-profile tab
    for the whole input.
    """
    return _view(_maps(attention, tokens, window=window, offset=offset, **inputs), "head", kind,
                 layer=layer, heads=heads,
                 pair_filter=pair_filter, hide_special=hide_special, title=title, offset=offset,
                 window=window)


def model_view(attention=None, tokens=None, *, title: str | None = None, offset: int | None = None,
               window: int = 256, kind: str | None = None, **inputs) -> View:
    """Every layer and head as thumbnails; click one to open it in the head view (for a long
    input, the head view shows a window: see :func:`head_view`, which takes the same inputs)."""
    return _view(_maps(attention, tokens, window=window, offset=offset, **inputs), "model", kind,
                 title=title, offset=offset, window=window)


def head_page(folder, head: str) -> View:
    """The page of one head of an output folder (``attnscope run`` / ``analyze general``), named
    as the pages name heads (``"5-3"``: layer 5, head 3, from 1): its statistics with intervals
    and ranks, its labels with their evidence, and the examples where it scores highest. A
    strip opens the whole example here; ``head_view(store[i], layer=, heads=[...])`` draws its
    full head view, and ``attnscope view OUT --head-page 5-3`` writes one per example."""
    return View(head_page_html(folder, head), "head page")


def long_document(path, *, model: str, layer: int, head: int, queries=None,
                  max_seq_len: int = 16384) -> View:
    """One head (``layer``, ``head``: 0-indexed) over the long document ``path`` (as
    ``attnscope view --long``): its profiles along the document and its whole row at each of
    ``queries`` (token positions; default the last), from one forward pass of ``model``, without
    ``n x n`` maps. ``View.document`` keeps the pass's queries and keys:
    ``view.document.row(layer, head, query)`` gives any other row (``O(n)``),
    ``view.document.head(layer, head)`` any other head's profiles and rows."""
    doc = LongDocumentView(path, model=model, layer=layer, head=head, queries=queries,
                           max_seq_len=max_seq_len)
    view = View(doc.html(), "long document")
    view.document = doc
    return view


def results_view(folder, *, title: str | None = None) -> View:
    """The attribution maps and long-context profiles of an analysis output folder."""
    return View(results_view_html(folder, title=title), "results")


def heatmap(attention=None, tokens=None, *, layer: int = 0, head: int = 0, pair_filter: str = "all",
            hide_special: bool = False, title: str | None = None, kind: str | None = None,
            **inputs) -> View:
    """One head's ``[query, key]`` matrix with token labels (inputs as :func:`head_view`)."""
    return _view(_maps(attention, tokens, **inputs), "heatmap", kind, layer=layer, head=head,
                 pair_filter=pair_filter, hide_special=hide_special, title=title)


def neuron_view(model, example, *, layer: int = 0, head: int = 0, query: int = 0,
                title: str | None = None, tokenizer=None) -> View:
    """Query/key vectors, their products, dot products and softmax for one head.

    ``model`` is what :func:`head_view` takes: a :class:`~attnscope.models.loading.LoadedModel`,
    a name for :func:`~attnscope.models.load_model`, or a transformers model object loaded any
    way with its ``tokenizer=``; ``example`` a text, an input dict or an :class:`Example`. Works
    for every family with query/key paths in the family table.
    """
    if isinstance(example, str):
        example = Example(text=example)

    def draw(lm) -> View:
        amap = next(iter(extract([example], lm, max_seq_len=lm.max_positions))).items[0]
        return View(neuron_view_html(amap, lm, layer=layer, head=head, query=query, title=title), "neuron")

    if isinstance(model, (LoadedModel, str)):
        return draw(as_loaded(model))
    with borrowed(model, tokenizer) as lm:  # a transformers model, loaded any way
        return draw(lm)
