"""Streaming, mergeable analyses, registered by name in :data:`ANALYSES`.

Every analysis module is imported here, so :data:`ANALYSES` is complete as soon as this package
is imported (whatever else was imported before). The modules import numpy only; torch is
imported inside the functions that run a model.
"""

from attnscope.analyses import (  # noqa: F401  (each module registers its analyses)
    ablation,
    agreement,
    coref,
    distances,
    entropy,
    figure_example,
    gradients,
    importance,
    longctx,
    norms,
    patterns,
    relative_position,
    special_tokens,
    streamed_general,
    syntax,
)
from attnscope.analyses.base import (
    ANALYSES,
    Analysis,
    EncodedAnalysis,
    MapsAnalysis,
    Result,
    get_analysis,
    register,
)
from attnscope.analyses.runner import check_requirements, run_analyses

__all__ = ["ANALYSES", "Analysis", "EncodedAnalysis", "MapsAnalysis", "Result", "check_requirements",
           "get_analysis", "register", "run_analyses"]
