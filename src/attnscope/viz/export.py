"""Export a view page to PNG / SVG from Python, with headless Chromium driven by Playwright.

The page does the drawing (the same code as its PNG/SVG buttons); this module only opens it
in a browser with every network request blocked, asks it for the SVG text and a PNG data URL,
and writes them atomically. Used by ``attnscope view ... --png/--svg``.
"""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from attnscope.data.io import atomic_write_bytes, atomic_write_text
from attnscope.errors import AttnscopeError

DEFAULT_CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run"]


def find_chromium(path: str | None = None) -> str:
    """The Chromium binary: ``path``, ``$ATTNSCOPE_CHROMIUM``, /usr/bin/chromium or on PATH. A
    ``path`` given that is no file is refused, never passed over for another."""
    if path is not None and not Path(path).is_file():
        raise AttnscopeError(f"chromium {path}: no such file (the Chromium binary, e.g. {DEFAULT_CHROMIUM})",
                             params=("chromium",))
    for cand in (path, os.environ.get("ATTNSCOPE_CHROMIUM"), DEFAULT_CHROMIUM,
                 shutil.which("chromium"), shutil.which("chromium-browser")):
        if cand and Path(cand).is_file():
            return str(cand)
    raise AttnscopeError("PNG/SVG export needs Chromium: install it ('apt-get install chromium') or "
                         "pass its path as chromium", params=("chromium",))


def is_local(url: str) -> bool:
    """Requests a view may make: its own file, inline data, and the local viewer."""
    return url.startswith(("file:", "data:", "blob:", "about:", "http://127.0.0.1",
                           "http://localhost"))


@contextmanager
def offline_page(chromium: str | None = None, blocked: list | None = None):
    """A Playwright page in headless Chromium where every non-local request is aborted and
    recorded in ``blocked``."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise AttnscopeError("PNG/SVG export needs the playwright package "
                             "(pip install playwright)") from None
    exe = find_chromium(chromium)
    blocked = blocked if blocked is not None else []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=LAUNCH_ARGS, headless=True)
        try:
            context = browser.new_context(accept_downloads=True)

            def route(r):
                if is_local(r.request.url):
                    r.continue_()
                else:
                    blocked.append(r.request.url)
                    r.abort()

            context.route("**/*", route)
            yield context.new_page()
        finally:
            browser.close()


def wait_ready(page, timeout_ms: int = 60000) -> None:
    """Wait until the view has decoded its data and drawn; raise if it failed."""
    page.wait_for_function(
        "() => ['true', 'error'].includes(document.getElementById('attnscope-root')"
        "?.getAttribute('data-ready'))", timeout=timeout_ms)
    if page.get_attribute("#attnscope-root", "data-ready") == "error":
        raise AttnscopeError("the view failed to render: "
                             + (page.text_content("#attnscope-root") or "").strip())


def export_html(html: str, *, png: Path | None = None, svg: Path | None = None, scale: float = 2.0,
                chromium: str | None = None) -> dict:
    """Render ``html`` (a view page) and write its current view to ``png`` and/or ``svg``.

    Returns ``{"png": (width, height), "svg": (width, height)}`` in pixels / SVG units.
    """
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="attnscope-view-") as tmp:
        page_path = Path(tmp) / "view.html"
        page_path.write_text(html, encoding="utf-8")
        blocked: list[str] = []
        with offline_page(chromium, blocked) as page:
            page.goto(page_path.as_uri())
            wait_ready(page)
            size = page.evaluate("() => window.attnscope.svgSize()")
            if svg is not None:
                text = page.evaluate("() => window.attnscope.exportSVG()")
                atomic_write_text(Path(svg), '<?xml version="1.0" encoding="UTF-8"?>\n' + text)
                out["svg"] = (size["width"], size["height"])
            if png is not None:
                url = page.evaluate("(s) => window.attnscope.exportPNG(s)", scale)
                data = base64.b64decode(url.split(",", 1)[1])
                atomic_write_bytes(Path(png), data)
                out["png"] = png_size(data)
        if blocked:
            raise AttnscopeError(f"the page tried to reach the network: {blocked[0]}")
    return out


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
