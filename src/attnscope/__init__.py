"""attnscope: what does this transformer look at?

Capture every attention head of a Hugging Face model, measure what each head does, test heads
against syntax and coreference, and draw it.

>>> import attnscope
>>> batches = attnscope.extract([{"text": "The cat sat."}], model="debug")  # doctest: +SKIP
>>> store = attnscope.open_store("maps/")                                     # doctest: +SKIP
>>> section = attnscope.run_family("coref", {"coref": ["dev.conllu"]}, "out/")  # doctest: +SKIP
>>> attnscope.check("debug:qwen3").ok  # every engine against transformers' eager attention
True
"""

from attnscope.data.records import Example, HeadId
from attnscope.errors import AttnscopeError
from attnscope.extract import ExtractOptions, extract
from attnscope.jobs import extract_to_store
from attnscope.maps import AttentionBatch, AttentionMap
from attnscope.models import load_model
from attnscope.pipeline import atlas, run_family
from attnscope.pipeline.check import check
from attnscope.store import Store, open_store
from attnscope.version import __version__

__all__ = ["AttentionBatch", "AttentionMap", "AttnscopeError", "Example", "ExtractOptions", "atlas",
           "check", "HeadId", "Store", "__version__", "extract", "extract_to_store", "load_model",
           "open_store", "run_family"]
