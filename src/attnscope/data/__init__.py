"""Readers for every input format, into :class:`Example` records."""

from attnscope.data.depparse import iter_depparse
from attnscope.data.io import example_from_dict, iter_examples, read_examples, write_examples
from attnscope.data.records import Example, HeadId

__all__ = ["Example", "HeadId", "example_from_dict", "iter_depparse", "iter_examples",
           "read_examples", "write_examples"]
