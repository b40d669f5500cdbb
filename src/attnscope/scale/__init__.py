"""Running attnscope on more than one process.

:mod:`attnscope.scale.ray` runs extraction and the analyses on a Ray cluster (the ``ray``
extra: ``pip install "attnscope[ray]"``). Importing this package does not import Ray; only
calling into :mod:`attnscope.scale.ray` does. See ``docs/scale.md``.
"""

#: What to install when Ray is missing (named in the one-line error of ``--ray``).
RAY_EXTRA = "pip install 'attnscope[ray]'"
