"""Streaming, mergeable analyses. Each module registers its classes in :data:`ANALYSES`."""

from attnscope.analyses.base import ANALYSES, Analysis, Result, get_analysis, register
from attnscope.analyses.runner import check_requirements, run_analyses

__all__ = ["ANALYSES", "Analysis", "Result", "check_requirements", "get_analysis", "register",
           "run_analyses"]
