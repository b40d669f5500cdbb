"""Extraction: examples in, :class:`AttentionBatch` items out."""

from attnscope.extract.runner import ExtractOptions, Extractor, ExtractStats, extract
from attnscope.extract.wordlevel import to_word_level
from attnscope.maps import AttentionBatch, AttentionMap

__all__ = ["AttentionBatch", "AttentionMap", "ExtractOptions", "ExtractStats", "Extractor",
           "extract", "to_word_level"]
