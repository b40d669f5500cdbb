"""End-to-end: ``attnscope view --png/--svg`` drives its own headless Chromium (so it runs in
its own module, outside the other modules' browser)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from attnscope.viz.export import png_size

pytestmark = pytest.mark.browser


def test_view_command_exports_png_and_svg(tmp_path, debug_bert, chromium):
    from attnscope.cli.main import main
    from attnscope.data.io import example_from_dict
    from attnscope.jobs import extract_to_store

    store = tmp_path / "store"
    extract_to_store([example_from_dict({"text": "the cat sat"}, 0)], store, debug_bert)
    png, svg = tmp_path / "v.png", tmp_path / "v.svg"
    assert main(["view", str(store), "--view", "model", "--out", str(tmp_path / "v.html"),
                 "--png", str(png), "--svg", str(svg), "--scale", "1"]) == 0
    root = ET.fromstring(svg.read_text(encoding="utf-8"))
    assert png_size(png.read_bytes()) == (int(root.get("width")), int(root.get("height")))
