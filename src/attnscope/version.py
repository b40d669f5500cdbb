"""attnscope's version, in a module of its own so that any layer can read it without importing
the package's public ``__init__`` (which imports most of the library)."""

__version__ = "0.1.0"
