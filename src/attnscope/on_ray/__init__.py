"""Running attnscope on more than one process.

:mod:`attnscope.on_ray.cluster` runs extraction and the analyses on a Ray cluster (the ``ray``
extra: ``pip install "attnscope[ray]"``). Importing this package does not import Ray; only
calling into :mod:`attnscope.on_ray.cluster` does. See ``docs/scale.md``.
"""
import importlib.util

from attnscope.errors import AttnscopeError

#: What to install when Ray is missing (named in the one-line error of ``--ray``).
RAY_EXTRA = "pip install 'attnscope[ray]'"


def check_ray(ray: bool, workers: int) -> None:
    """Refuse ``workers`` without ``ray``, a bad count, or ``ray`` without Ray installed
    (one line naming the extra), before anything is read or written. Ray is not imported."""
    if workers != 1 and not ray:
        raise AttnscopeError("workers needs ray", params=("workers", "ray"))
    if not isinstance(workers, int) or workers < 1:
        raise AttnscopeError(f"workers must be at least 1, not {workers!r}", params=("workers",))
    if ray and importlib.util.find_spec("ray") is None:
        raise AttnscopeError(f"ray needs Ray, which is not installed: {RAY_EXTRA}", params=("ray",))
