"""Complete self-contained HTML pages for one example: what the report and the CLI embed.

>>> html = head_view_html(amap, layer=7, heads=[9])          # doctest: +SKIP
>>> Path("head.html").write_text(html)                      # doctest: +SKIP

Every page carries all layers and heads of the example, so its tabs (head, model, heatmap;
neuron when query/key vectors were captured) switch views without a server.
"""

from __future__ import annotations

from attnscope.errors import AttnscopeError
from attnscope.maps import AttentionMap
from attnscope.viz.neuron import capture_qk, neuron_payload
from attnscope.viz.payload import LONG_INPUT, WINDOW, Windowed, kinds_payload, page_payload
from attnscope.viz.render import render_page


def view_html(amap: AttentionMap, view: str = "head", *, layer: int = 0, heads=None,
              head: int | None = None, pair_filter: str = "all", hide_special: bool = False,
              title: str | None = None, neuron: dict | None = None, model: str | None = None,
              offset: int | None = None, window: int = WINDOW, long_input: int = LONG_INPUT) -> str:
    """A page opening on ``view`` ("head", "model", "heatmap" or "neuron").

    An input longer than :data:`~attnscope.viz.payload.LONG_INPUT` units shows ``window`` query
    rows from ``offset`` (default: the last ones) plus the first token; see
    :func:`~attnscope.viz.payload.page_payload`.
    """
    payload = page_payload(amap, view, layer=layer, heads=heads, head=head, pair_filter=pair_filter,
                           hide_special=hide_special, title=title, neuron=neuron, model=model,
                           offset=offset, window=window, long_input=long_input)
    return render_page(payload)


def kinds_html(maps: dict[str, AttentionMap], kind: str = "encoder", view: str = "head", *,
               layer: int = 0, heads=None, title: str | None = None, model: str | None = None,
               **kwargs) -> str:
    """A page over an encoder-decoder model's three kinds of attention (``{"encoder": map,
    "decoder": map, "cross": map}``), opening on ``kind`` and ``view``; a switch on the page
    changes the kind, as BertViz's does (see :func:`~attnscope.viz.payload.kinds_payload`)."""
    return render_page(kinds_payload(maps, kind, view=view, layer=layer, heads=heads, title=title,
                                     model=model, **kwargs))


def maps_html(maps, view: str = "head", *, kind: str | None = None, **kwargs) -> str:
    """The page of what a view shows: a map (:func:`view_html`), a long input already cut to
    its window (:class:`~attnscope.viz.payload.Windowed`), or an encoder-decoder model's
    ``{kind: map}`` (:func:`kinds_html`, opening on ``kind``)."""
    if isinstance(maps, dict):
        return kinds_html(maps, kind or next(iter(maps)), view, **kwargs)
    if kind is not None:
        raise AttnscopeError(f"kind {kind}: these maps have one kind of attention (not an "
                             "encoder-decoder model's)", params=("kind",))
    if isinstance(maps, Windowed):
        kwargs["offset"] = None  # the window was cut where the model ran
    return view_html(maps, view, **kwargs)


def head_view_html(amap: AttentionMap, *, layer: int = 0, heads=None, title: str | None = None,
                   **kwargs) -> str:
    """The head view of ``layer`` (0-indexed) for ``heads`` (all by default)."""
    return view_html(amap, "head", layer=layer, heads=heads, title=title, **kwargs)


def model_view_html(amap: AttentionMap, *, title: str | None = None, **kwargs) -> str:
    """The grid of every layer and head; clicking a thumbnail opens it in the head view."""
    return view_html(amap, "model", title=title, **kwargs)


def heatmap_html(amap: AttentionMap, *, layer: int = 0, head: int = 0, title: str | None = None,
                 **kwargs) -> str:
    """One head's matrix with token labels."""
    return view_html(amap, "heatmap", layer=layer, head=head, title=title, **kwargs)


def neuron_view_html(amap: AttentionMap, lm, *, layer: int = 0, head: int = 0, query: int = 0,
                     title: str | None = None, **kwargs) -> str:
    """The neuron view of ``layer``: runs ``lm`` on the map's example to capture q and k."""
    qk = capture_qk(lm, amap.example, layer, index=amap.index)
    neuron = neuron_payload(qk, head=head, query=query)
    return view_html(amap, "neuron", layer=layer, head=head, title=title, neuron=neuron,
                     model=kwargs.pop("model", lm.display_name), **kwargs)
