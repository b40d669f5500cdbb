"""attnscope: what does this transformer look at?

Capture every attention head of a Hugging Face model, measure what each head does, test heads
against syntax and coreference, and draw it.

>>> import attnscope
>>> batches = attnscope.extract([{"text": "The cat sat."}], model="debug")  # doctest: +SKIP
>>> store = attnscope.open_store("maps/")                                     # doctest: +SKIP
"""

__version__ = "0.1.0"

from attnscope.data.records import Example, HeadId  # noqa: E402
from attnscope.errors import AttnscopeError  # noqa: E402
from attnscope.extract import ExtractOptions, extract  # noqa: E402
from attnscope.families.atlas import atlas  # noqa: E402
from attnscope.maps import AttentionBatch, AttentionMap  # noqa: E402
from attnscope.models import load_model  # noqa: E402
from attnscope.store import Store, extract_to_store, open_store  # noqa: E402

__all__ = ["AttentionBatch", "AttentionMap", "AttnscopeError", "Example", "ExtractOptions", "atlas",
           "HeadId", "Store", "__version__", "extract", "extract_to_store", "load_model",
           "open_store"]
