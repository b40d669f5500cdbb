"""The self-contained HTML report: sections in, one offline page out.

The report is built in two steps, the way displaCy does it: :func:`build_context` turns the
:class:`~attnscope.report.section.Section` objects of every analysis family and the run's
provenance into a plain dict (what tests check), and :func:`render_report` fills the jinja2
template ``templates/report.html.j2`` (autoescaped, so every token and caption is text).

Everything the page shows is inside the file: figures are inlined as base64 PNG data URIs
(SVG when no PNG was written), tables are HTML tables, styles are inline, and there is no
script. The only links are relative ones to files next to the report (the CSV/Markdown/LaTeX
copies of each table, the SVG of each figure, and the head views under ``views/``), so the
folder can be zipped and opened anywhere, offline.

>>> ctx = build_context([section], out_dir=Path("run"), provenance={})   # doctest: +SKIP
>>> html = render_report(ctx)                                            # doctest: +SKIP
"""

from __future__ import annotations

import base64
import csv
import io
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnscope.data.io import atomic_write_text
from attnscope.data.records import HeadId
from attnscope.models.loaded import display_name as model_display_name
from attnscope.models.pieces import readable, running_text, visible
from attnscope.report.figures import new_figure
from attnscope.report.section import Section

TEMPLATE = "report.html.j2"
#: How many findings of each section the summary at the top repeats.
SUMMARY_PER_SECTION = 4
#: The sections (family keys) that together run every analysis of Clark et al. (2019).
PAPER_FAMILIES = frozenset({"general", "syntax", "coref"})
_IMAGE_TYPES = {".png": "image/png", ".svg": "image/svg+xml"}


def format_value(v: Any, digits: int = 3) -> str:
    """A table cell as text: floats with ``digits`` decimals, None as an en dash.

    >>> format_value(0.12345), format_value(None), format_value(7), format_value(True)
    ('0.123', '–', '7', 'yes')
    """
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float) or type(v).__module__ == "numpy" and hasattr(v, "dtype") and v.dtype.kind == "f":
        x = float(v)
        if math.isnan(x):
            return "n/a"
        if math.isinf(x):
            return "∞" if x > 0 else "-∞"
        return f"{x:.{digits}f}"
    if isinstance(v, (list, tuple)):
        return ", ".join(format_value(x, digits) for x in v)
    return str(v)


def slug(text: str) -> str:
    """A file-name-safe, lower-case version of ``text`` (``"det (8-11)"`` -> ``"det-8-11"``)."""
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s[:60] or "x"


_ATTR_REF = re.compile(r"""\b(?:src|href|action|formaction|srcset|poster|background|xlink:href|data)\s*=\s*(["']?)\s*([^"'\s>]+)""", re.I)
_CSS_REF = re.compile(r"""(?:url\(\s*["']?|@import\s+["'])\s*([^"')\s]+)""", re.I)
_LITERAL_REF = re.compile(r"""(xmlns(?::\w+)?\s*=\s*|rdf:resource\s*=\s*)?["']((?:[a-z][a-z0-9+.-]*:)?//[^"'\s]*)["']""", re.I)
_NETWORK_VALUE = re.compile(r"^(?:(?:https?|ftp|wss?):|//)", re.I)
#: Namespace names that look like addresses but are never fetched (SVG, XLink, XHTML).
_NAMESPACE_HOSTS = ("//www.w3.org/",)


def network_references(text: str) -> list[str]:
    """Every place in an HTML/SVG/CSS/JS text that would make a browser reach the network.

    Looks at URL-valued attributes (``src``, ``href``, ...), CSS ``url()``/``@import``, and
    quoted ``scheme://`` or ``//host`` literals (e.g. a ``fetch`` in a script). Relative
    paths, ``#anchors`` and ``data:`` URIs are local; XML namespace names (``xmlns=...``,
    ``rdf:resource=...``, ``http://www.w3.org/...``) are identifiers, never fetched.

    >>> network_references('<img src="https://example.org/x.png"><a href="views/a.html">')
    ['https://example.org/x.png']
    """
    found = []
    for m in _ATTR_REF.finditer(text):
        if _NETWORK_VALUE.match(m.group(2)):
            found.append(m.group(2))
    for m in _CSS_REF.finditer(text):
        if _NETWORK_VALUE.match(m.group(1)):
            found.append(m.group(1))
    for m in _LITERAL_REF.finditer(text):
        value = m.group(2)
        if m.group(1) or any(h in value for h in _NAMESPACE_HOSTS) or value.lower().startswith("file:"):
            continue
        if value not in found:
            found.append(value)
    return found


def _relative(path: Path, out_dir: Path) -> str | None:
    """``path`` relative to the report's folder (POSIX form), or None when it lies outside."""
    try:
        return Path(path).resolve().relative_to(Path(out_dir).resolve()).as_posix()
    except ValueError:
        return None


def inline_image(paths: Sequence[Path]) -> str | None:
    """A ``data:`` URI of the figure: its PNG if written, else its SVG; None if neither exists."""
    by_ext = {Path(p).suffix.lower(): Path(p) for p in paths}
    for ext in (".png", ".svg"):
        p = by_ext.get(ext)
        if p is not None and p.is_file():
            data = base64.b64encode(p.read_bytes()).decode("ascii")
            return f"data:{_IMAGE_TYPES[ext]};base64,{data}"
    return None


def _downloads(paths: Sequence[Path], out_dir: Path) -> list[dict[str, str]]:
    out = []
    for p in paths:
        rel = _relative(Path(p), out_dir)
        if rel is not None and Path(p).is_file():
            out.append({"format": Path(p).suffix.lstrip(".").upper(), "href": rel})
    return out


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) or (
        type(v).__module__ == "numpy" and getattr(v, "dtype", None) is not None and v.dtype.kind in "iuf")


def _rows_in_file(paths: Sequence[Path]) -> int | None:
    """Rows of a table's CSV copy (header excluded), or None without one."""
    for p in paths:
        p = Path(p)
        if p.suffix.lower() == ".csv" and p.is_file():
            with open(p, newline="", encoding="utf-8") as f:
                return max(0, sum(1 for _ in csv.reader(f)) - 1)
    return None


def _table_context(t, out_dir: Path) -> dict[str, Any]:
    """One table: formatted cells (``[[{"text", "num"}]]``), or, when the section passed no
    rows (a table too long to show, e.g. every pair of heads), the row count of its files."""
    columns = list(t.columns) or (list(t.rows[0].keys()) if t.rows else [])
    rows = [[{"text": format_value(r.get(c)), "num": _is_number(r.get(c))} for c in columns]
            for r in t.rows]
    downloads = _downloads(t.paths, out_dir)
    in_file = _rows_in_file(t.paths) if not rows else None
    return {"name": t.name, "caption": t.caption, "columns": columns, "rows": rows,
            "downloads": downloads, "rows_in_file": in_file,
            "shown": bool(rows) or not downloads}


def _figure_context(f, out_dir: Path) -> dict[str, Any]:
    src = inline_image(f.paths)
    return {"name": f.name, "caption": f.caption, "src": src, "missing": src is None,
            "downloads": _downloads(f.paths, out_dir)}


def _short_number(v: Any) -> str:
    """Three significant figures for the paper-vs-ours rows (94.3, 3.89, 0.512)."""
    if isinstance(v, float) and math.isfinite(v) and abs(v) < 1000:
        return f"{v:.3g}"
    return format_value(v)


def _paper_rows(rows: Sequence[Mapping]) -> list[dict[str, str]]:
    return [{"what": str(r.get("what", "")), "paper": _short_number(r.get("paper")),
             "ours": _short_number(r.get("ours"))} for r in rows]


def build_context(sections: Sequence[Section], *, out_dir: str | Path, provenance: Mapping[str, Any],
                  links: Mapping[str, Sequence[Mapping]] | None = None,
                  notes: Sequence[Mapping[str, str]] | None = None,
                  title: str | None = None, intro: str | None = None) -> dict[str, Any]:
    """Everything the report page shows, as a plain dict.

    ``links``: section key -> ``[{"label", "head", "href"}]`` head-view links (relative to
    ``out_dir``). ``notes``: ``[{"key", "title", "message"}]`` for analysis families that did
    not run (not installed, or no input for them). ``provenance``: the run's record (see
    :func:`attnscope.pipeline.run_pipeline`); its ``model`` entry names the model.
    """
    out_dir = Path(out_dir)
    links = links or {}
    model_name = model_display_name(provenance.get("model") or {})
    secs = []
    summary = []
    for s in sections:
        anchor = f"sec-{slug(s.key)}"
        secs.append({
            "key": s.key, "anchor": anchor, "title": s.title,
            # the first findings are in the summary at the top; the section goes on from there
            "findings": [str(x) for x in s.findings[SUMMARY_PER_SECTION:]],
            "summarised": min(len(s.findings), SUMMARY_PER_SECTION),
            "paper": _paper_rows(s.paper),
            "tables": [_table_context(t, out_dir) for t in s.tables],
            "figures": [_figure_context(f, out_dir) for f in s.figures],
            "methods": [str(m) for m in s.methods],
            "views": [dict(v) for v in links.get(s.key, [])],
        })
        if s.findings:
            summary.append({"title": s.title, "anchor": anchor,
                            "findings": [str(x) for x in s.findings[:SUMMARY_PER_SECTION]]})
    if intro is None:  # say what ran
        keys = {s.key for s in sections}
        intro = (f'An attnscope report: every analysis of Clark et al. (2019), "What Does BERT Look At?", '
                 f"run on {model_name}." if PAPER_FAMILIES <= keys else
                 f"An attnscope report on {model_name}" + "".join(
                     (": " if i == 0 else "; ") + s.title for i, s in enumerate(sections)) + ".")
    return {
        "title": title or f"What does {model_name} look at?",
        "intro": intro,
        "model_name": model_name,
        "summary": summary,
        "sections": secs,
        "notes": [dict(n) for n in (notes or [])],
        "provenance": _provenance_rows(provenance),
        "data_files": list(provenance.get("data") or []),
    }


def _provenance_rows(prov: Mapping[str, Any]) -> list[dict[str, str]]:
    """The provenance block as ``[{"name", "value"}]`` rows, in a fixed order."""
    rows: list[dict[str, str]] = []
    model = prov.get("model") or {}
    for key, name in (("name", "model"), ("source", "model source"), ("weights_sha256", "weights sha256"),
                      ("family", "model family"), ("num_layers", "layers"), ("num_heads", "heads per layer")):
        if key in model:
            rows.append({"name": name, "value": format_value(model[key])})
    if "seeds" in prov:
        rows.append({"name": "seeds", "value": "; ".join(f"{k}: {v}" for k, v in prov["seeds"].items())})
    for what, n in (prov.get("counts") or {}).items():
        rows.append({"name": what, "value": str(n)})
    if "arguments" in prov:
        args = prov["arguments"]
        # input files have their own rows (data); an option left unset shows as "default"
        files = {d.get("role", "").replace("-", "_") for d in prov.get("data") or []}
        shown = ", ".join(f"{k}={'default' if v is None else format_value(v)}" for k, v in args.items()
                          if k not in files | set(prov.get("inputs") or ()) | {"model"})
        rows.append({"name": "arguments", "value": shown})
    for key, name in (("command", "command line"), ("started", "started (UTC)"),
                      ("elapsed_s", "run time of this invocation (s)"),
                      ("analysis_time_s", "time in the analyses, resumed ones included (s)")):
        if key in prov:
            v = prov[key]
            rows.append({"name": name, "value": f"{v:.1f}" if isinstance(v, float) else str(v)})
    for fam, secs in (prov.get("family_times_s") or {}).items():
        rows.append({"name": f"time for {fam} (s)",
                     "value": f"{secs:.1f}" if isinstance(secs, (int, float)) else str(secs)})
    for pkg, ver in (prov.get("versions") or {}).items():
        rows.append({"name": f"version of {pkg}", "value": str(ver)})
    return rows


def breakable(name: str):
    """A column name, escaped, that may wrap after its underscores (``sep_to_sep``), so a table
    of many columns fits the page.

    >>> str(breakable("sep_to_<sep>"))
    'sep_<wbr>to_<wbr>&lt;sep&gt;'
    """
    from markupsafe import Markup, escape

    return Markup(str(escape(name)).replace("_", "_<wbr>"))


def _environment():
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("attnscope.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["breakable"] = breakable
    return env


def render_report(context: Mapping[str, Any]) -> str:
    """The report page for ``context`` (from :func:`build_context`)."""
    return _environment().get_template(TEMPLATE).render(**context)


def write_report(sections: Sequence[Section], out_dir: str | Path, *, provenance: Mapping[str, Any],
                 links: Mapping[str, Sequence[Mapping]] | None = None,
                 notes: Sequence[Mapping[str, str]] | None = None, title: str | None = None,
                 intro: str | None = None) -> Path:
    """Write ``out_dir/report.html`` atomically and return its path."""
    out_dir = Path(out_dir)
    ctx = build_context(sections, out_dir=out_dir, provenance=provenance, links=links, notes=notes,
                        title=title, intro=intro)
    path = out_dir / "report.html"
    atomic_write_text(path, render_report(ctx))
    return path


# ---------------------------------------------------------------------------------------------
# Head views for the best heads


def view_file_name(section_key: str, label: str, layer: int, head: int) -> str:
    """``views/<section>-<label>-<L>-<H>.html`` with the paper's 1-indexed head name."""
    return f"views/{slug(section_key)}-{slug(label)}-{HeadId(layer, head)}.html"


def write_head_views(section: Section, out_dir: str | Path) -> list[dict[str, str]]:
    """Write one head-view page per entry of ``section.best_heads``; return the links.

    Each link is ``{"label", "head", "href", "example"}`` with ``href`` relative to
    ``out_dir``. The page comes from :func:`attnscope.viz.pages.head_view_html` when the views
    are installed, else from :func:`heatmap_page` (a static heatmap of the same head). Entries
    whose example has no map in ``section.maps`` are left out.
    """
    out_dir = Path(out_dir)
    try:
        from attnscope.viz.pages import head_view_html
    except ImportError:
        head_view_html = None
    links = []
    seen = set()
    for layer, head, example, label in section.best_heads:
        amap = section.maps.get(example)
        if amap is None:
            continue
        href = view_file_name(section.key, label, layer, head)
        if href in seen:
            continue
        seen.add(href)
        title = f"{label}: head {HeadId(layer, head)} (example {example})"
        if head_view_html is not None:
            page = head_view_html(amap, layer=layer, heads=[head], title=title)
        else:
            page = heatmap_page(amap, layer=layer, head=head, title=title)
        atomic_write_text(out_dir / href, page)
        links.append({"label": str(label), "head": f"{HeadId(layer, head)}", "href": href,
                      "example": str(example)})
    return links


def heatmap_page(amap, *, layer: int, head: int, title: str) -> str:
    """A small self-contained page with one head's attention as a heatmap (inline PNG).

    The fallback head view when :mod:`attnscope.viz.pages` is not installed.
    """
    import jinja2

    attn = amap.attn[layer, head]  # [q k]
    n = attn.shape[0]
    size = max(3.0, min(14.0, 0.22 * n + 1.5))
    fig, ax = new_figure(figsize=(size, size))
    ax.imshow(attn, cmap="Blues", vmin=0.0, vmax=max(float(attn.max()), 1e-9))
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))

    shown = [visible(t) for t in readable(amap.tokens, amap.special, amap.token_text, amap.level)]
    ax.set_xticklabels(shown, rotation=90, fontsize=9)
    ax.set_yticklabels(shown, fontsize=9)
    ax.set_xlabel("attended to (key)")
    ax.set_ylabel("attending (query)")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    src = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
    tmpl = jinja2.Environment(autoescape=True).from_string(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{{ title }}</title>"
        "<style>body{font-family:sans-serif;margin:1.5em}</style></head><body>"
        "<h1>{{ title }}</h1><p>Rows attend to columns; each row sums to 1. "
        "Tokens: {{ tokens }}</p><img id=\"heatmap\" alt=\"{{ title }}\" src=\"{{ src }}\">"
        "<p><a href=\"../report.html\">back to the report</a></p></body></html>\n")
    line = "".join((" " if space else "") + visible(t)
                   for t, space in running_text(amap.tokens, amap.special, amap.token_text, amap.level))
    return tmpl.render(title=title, tokens=line, src=src)
