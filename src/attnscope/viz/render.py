"""Render a payload into one self-contained HTML page: jinja2 with autoescape, our own inline
CSS and JavaScript, the payload as JSON in a ``<script type="application/json">`` block.

The page loads nothing: a Content-Security-Policy forbids every request (``default-src
'none'``; images only from ``data:``/``blob:``), so it works offline and behind firewalls.
Tokens are never written into markup by Python; the page puts them in with ``textContent``.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from attnscope.version import __version__


def embed_json(obj) -> str:
    """JSON that is safe inside ``<script>``: ``<``, ``>``, ``&`` and U+2028/9 are \\u-escaped,
    so no string (``"</script>"``, ``"<!--"``) can end or alter the block."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                    ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


@cache
def static_text(name: str) -> str:
    """The text of a file in ``attnscope/viz/static`` (our own JS/CSS)."""
    return resources.files("attnscope.viz").joinpath("static", name).read_text(encoding="utf-8")


@cache
def _env():
    import jinja2

    return jinja2.Environment(loader=jinja2.PackageLoader("attnscope.viz", "templates"),
                              autoescape=True, undefined=jinja2.StrictUndefined)


def render_page(payload: dict, title: str | None = None) -> str:
    """A complete HTML page showing ``payload`` (a :func:`attnscope.viz.payload.page_payload`)."""
    from markupsafe import Markup

    css = static_text("attnscope.css")
    js = static_text("attnscope.js")
    return _env().get_template("page.html.j2").render(
        title=title or payload.get("title") or "attnscope", version=__version__, connect=Markup("'none'"),
        css=Markup(css.replace("</", "<\\/")), js=Markup(js.replace("</", "<\\/")),
        payload_json=Markup(embed_json(payload)), mount="mountKinds" if "kinds" in payload else "mount")


def render_results_page(payload: dict, title: str | None = None) -> str:
    """A complete HTML page of the results views (a :func:`attnscope.views.results_payload`):
    attribution maps, per-head profiles, sink mass. Same rules as :func:`render_page`."""
    return _render(payload, title or f"attnscope: {payload.get('folder', 'results')}",
                   "results.js", "mountResults")


def render_head_page(payload: dict, title: str | None = None) -> str:
    """A complete HTML page of one head (a :func:`attnscope.viz.head_page.head_page_payload`).
    Same rules as :func:`render_page`."""
    return _render(payload, title or payload["title"], "headpage.js", "mountHeadPage")


def render_long_page(payload: dict, *, served: bool = False) -> str:
    """A complete HTML page of one head over a long document (a
    :func:`attnscope.viz.long_page.long_page_payload`). Same rules as :func:`render_page`, except
    that a page the viewer serves (``served``) may ask its own server for rows."""
    return _render(payload, payload["title"], "longpage.js", "mountLongPage",
                   connect="'self'" if served else "'none'")


def _render(payload: dict, title: str, script: str, mount: str, connect: str = "'none'") -> str:
    from markupsafe import Markup

    css = static_text("attnscope.css")
    js = static_text("attnscope.js") + static_text(script)
    return _env().get_template("page.html.j2").render(
        title=title, version=__version__, connect=Markup(connect),
        css=Markup(css.replace("</", "<\\/")), js=Markup(js.replace("</", "<\\/")),
        payload_json=Markup(embed_json(payload)), mount=mount)
