"""Saving matplotlib figures as PNG and SVG, reproducibly and without a display."""

from __future__ import annotations

import io
from pathlib import Path

from attnscope.data.io import atomic_write_bytes


def new_figure(*args, **kwargs):
    """``plt.subplots`` on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save_figure(fig, stem: str | Path, formats=("png", "svg"), dpi: int = 150) -> list[Path]:
    """Write ``stem.png`` and ``stem.svg`` (atomically) and close the figure.

    SVG output has a fixed hash salt and no date, so the same figure gives the same bytes.
    """
    import matplotlib
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "attnscope"
    stem = Path(stem)
    paths = []
    for fmt in formats:
        buf = io.BytesIO()
        meta = {"Date": None} if fmt == "svg" else {"Software": None}
        fig.savefig(buf, format=fmt, dpi=dpi, bbox_inches="tight", metadata=meta)
        p = stem.with_suffix(f".{fmt}")
        atomic_write_bytes(p, buf.getvalue())
        paths.append(p)
    plt.close(fig)
    return paths
