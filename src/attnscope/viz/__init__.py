"""Views of attention: payload builders (plain dicts) and self-contained HTML pages.

``payload`` builds what each view shows; ``neuron`` captures query/key vectors with hooks;
``render`` and ``pages`` turn payloads into offline HTML; ``export`` rasterises a page with
headless Chromium. Nothing here imports a web server or IPython.
"""

from attnscope.viz.pages import (
    head_view_html,
    heatmap_html,
    model_view_html,
    neuron_view_html,
    view_html,
)
from attnscope.viz.payload import head_payload, heatmap_payload, model_payload, page_payload

__all__ = ["head_payload", "head_view_html", "heatmap_html", "heatmap_payload", "model_payload",
           "model_view_html", "neuron_view_html", "page_payload", "view_html"]
