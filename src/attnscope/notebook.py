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

import html as _html
from pathlib import Path

import numpy as np

from attnscope.data.records import Example
from attnscope.maps import AttentionMap


class View:
    """A rendered view page: ``html`` is the complete self-contained page."""

    def __init__(self, html: str, kind: str, height: int = 640):
        self.html = html
        self.kind = kind
        self.height = height

    def _repr_html_(self) -> str:
        return (f'<iframe srcdoc="{_html.escape(self.html, quote=True)}" '
                f'style="width:100%;height:{self.height}px;border:1px solid #ddd" '
                'sandbox="allow-scripts allow-downloads"></iframe>')

    def save(self, path: str | Path) -> Path:
        """Write the page (atomically); returns the path."""
        from attnscope.data.io import atomic_write_text

        path = Path(path)
        atomic_write_text(path, self.html)
        return path

    def save_png(self, path: str | Path, scale: float = 2.0) -> tuple[int, int]:
        """Export the view as PNG with headless Chromium; returns (width, height)."""
        from attnscope.viz.export import export_html

        return export_html(self.html, png=Path(path), scale=scale)["png"]

    def save_svg(self, path: str | Path) -> tuple[int, int]:
        """Export the view as SVG with headless Chromium; returns (width, height)."""
        from attnscope.viz.export import export_html

        return export_html(self.html, svg=Path(path))["svg"]

    def __repr__(self) -> str:
        return f"<attnscope View {self.kind}, {len(self.html)} bytes of HTML>"


def as_map(attention, tokens=None, *, special=None, segment=None) -> AttentionMap:
    """An :class:`AttentionMap` from a map, or from BertViz-style ``(attention, tokens)``.

    ``attention`` is ``[L H n n]`` (numpy or torch) or a tuple of per-layer ``[1 H n n]`` /
    ``[H n n]`` tensors (what ``model(..., output_attentions=True).attentions`` gives).
    ``special`` marks special tokens (none by default); ``segment`` gives 0/1 segment ids.
    """
    if isinstance(attention, AttentionMap):
        return attention
    if tokens is None:
        raise TypeError("pass tokens with a raw attention array")
    if isinstance(attention, (tuple, list)):
        layers = [np.asarray(_to_numpy(a), dtype=np.float32) for a in attention]
        attn = np.stack([a[0] if a.ndim == 4 else a for a in layers])  # [L H n n]
    else:
        attn = np.asarray(_to_numpy(attention), dtype=np.float32)
        if attn.ndim == 5:
            attn = attn[:, 0] if attn.shape[1] == 1 else attn[0]
    n = len(tokens)
    if attn.ndim != 4 or attn.shape[-2:] != (n, n):
        raise ValueError(f"attention must be [layer, head, {n}, {n}] for {n} tokens, "
                         f"got {list(attn.shape)}")
    special = np.zeros(n, bool) if special is None else np.asarray(special, bool)
    segment = np.zeros(n, np.int64) if segment is None else np.asarray(segment, np.int64)
    word_ids = np.where(special, -1, np.cumsum(~special) - 1)
    return AttentionMap(0, attn, [str(t) for t in tokens], special, segment, word_ids, "token",
                        Example(tokens=[str(t) for t in tokens]))


def _to_numpy(a):
    if hasattr(a, "detach"):
        return a.detach().float().cpu().numpy()
    return a


def head_view(attention, tokens=None, *, layer: int = 0, heads=None, pair_filter: str = "all",
              hide_special: bool = False, title: str | None = None, offset: int | None = None,
              window: int = 256, **map_kwargs) -> View:
    """Lines from each token to what it attends to, for ``heads`` of ``layer`` (0-indexed).

    Inputs longer than 512 units show ``window`` query rows from ``offset`` (default: the last
    ones) plus the first token, and a distance-profile tab for the whole input.
    """
    from attnscope.viz.pages import view_html

    amap = as_map(attention, tokens, **map_kwargs)
    return View(view_html(amap, "head", layer=layer, heads=heads, pair_filter=pair_filter,
                          hide_special=hide_special, title=title, offset=offset, window=window), "head")


def model_view(attention, tokens=None, *, title: str | None = None, offset: int | None = None,
               window: int = 256, **map_kwargs) -> View:
    """Every layer and head as thumbnails; click one to open it in the head view (for a long
    input, the head view shows a window: see :func:`head_view`)."""
    from attnscope.viz.pages import view_html

    amap = as_map(attention, tokens, **map_kwargs)
    return View(view_html(amap, "model", title=title, offset=offset, window=window), "model")


def results_view(folder, *, title: str | None = None) -> View:
    """The attribution maps and long-context profiles of an analysis output folder."""
    from attnscope.viz.pages import results_view_html

    return View(results_view_html(folder, title=title), "results")


def heatmap(attention, tokens=None, *, layer: int = 0, head: int = 0, pair_filter: str = "all",
            hide_special: bool = False, title: str | None = None, **map_kwargs) -> View:
    """One head's ``[query, key]`` matrix with token labels."""
    from attnscope.viz.pages import view_html

    amap = as_map(attention, tokens, **map_kwargs)
    return View(view_html(amap, "heatmap", layer=layer, head=head, pair_filter=pair_filter,
                          hide_special=hide_special, title=title), "heatmap")


def neuron_view(model, example, *, layer: int = 0, head: int = 0, query: int = 0,
                title: str | None = None) -> View:
    """Query/key vectors, their products, dot products and softmax for one head.

    ``model`` is a :class:`~attnscope.models.loading.LoadedModel` or a name for
    :func:`~attnscope.models.load_model`; ``example`` a text, an input dict or an
    :class:`Example`. Works for every family with query/key paths in the family table.
    """
    from attnscope.extract.runner import extract
    from attnscope.models import load_model
    from attnscope.viz.pages import neuron_view_html

    lm = load_model(model) if isinstance(model, str) else model
    if isinstance(example, str):
        example = Example(text=example)
    amap = next(iter(extract([example], lm, max_seq_len=lm.max_positions))).items[0]
    return View(neuron_view_html(amap, lm, layer=layer, head=head, query=query, title=title),
                "neuron")
