"""The former name of :mod:`attnscope.notebook` (views from Python and in Jupyter), kept so
that ``from attnscope import show; show.head_view(...)`` goes on working."""

from attnscope.notebook import (
    View,
    as_map,
    head_page,
    head_view,
    heatmap,
    long_document,
    model_view,
    neuron_view,
    results_view,
)

__all__ = ["View", "as_map", "head_page", "head_view", "heatmap", "long_document", "model_view", "neuron_view", "results_view"]
