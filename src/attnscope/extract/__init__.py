"""Extraction: examples in, :class:`AttentionBatch` items out."""

from attnscope.extract.batch import AttentionBatch, AttentionMap
from attnscope.extract.runner import ExtractOptions, Extractor, ExtractStats, extract
from attnscope.extract.wordlevel import to_word_level

__all__ = ["AttentionBatch", "AttentionMap", "ExtractOptions", "ExtractStats", "Extractor",
           "extract", "to_word_level"]
