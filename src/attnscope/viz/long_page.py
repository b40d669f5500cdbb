"""A long document, one head: its profiles along the document and its whole row at chosen
queries, without ``[n n]`` maps (what :mod:`attnscope.views` computes with
:class:`~attnscope.engines.document.DocumentRows`; this module only lays out).

The page carries the document's tokens once, the head's per-row profiles pooled into at most
:data:`BINS` stretches, and per query the :func:`~attnscope.engines.document.row_summary` of its
row (its strongest keys, its mass per distance bucket and over the same stretches). Nothing
grows with ``n`` but the tokens.
"""

from __future__ import annotations

import numpy as np

from attnscope.analyses.longctx import document_roles
from attnscope.data.records import HeadId
from attnscope.engines.document import stretches

#: Stretches of the document the profiles and each row's strip are pooled into.
BINS = 1024
PAYLOAD_VERSION = 1


def pooled(values: np.ndarray, bins: int = BINS) -> tuple[list[float], list[int]]:
    """``values`` ``[n]`` as the mean over each of ``min(bins, n)`` equal stretches, and the
    stretches' edges.

    >>> pooled(np.array([1.0, 3.0, 5.0, 7.0]), 2)
    ([2.0, 6.0], [0, 2, 4])
    """
    sums, edges = stretches(values, bins)
    return [float(f"{x:.6g}") for x in sums / np.diff(edges)], edges


def long_head_payload(*, layer: int, head: int, n: int, rows: list[dict], profiles: dict[str, np.ndarray],
                 model: str | None) -> dict:
    """What the page draws of one head: its title, what it does on this document (``roles``:
    :func:`~attnscope.analyses.longctx.document_roles`), ``rows`` (one
    :func:`~attnscope.engines.document.row_summary` per query) and ``profiles`` (name -> ``[n]``
    per-row value of the head, pooled here); the served viewer swaps it in when another head is
    picked."""
    pooled_profiles, edges = {}, None
    for name, values in profiles.items():
        pooled_profiles[name], edges = pooled(values)
    return {"title": f"Head {HeadId(layer, head)} over {n:,} tokens" + (f" of {model}" if model else ""),
            "layer": layer, "head": head, "roles": document_roles(profiles), "rows": rows,
            "profiles": pooled_profiles, "profile_edges": edges}


def long_page_payload(*, labels: list[str], raw: list[str], layer: int, head: int,
                      rows: list[dict], profiles: dict[str, np.ndarray], model: str | None,
                      source: str, num_layers: int, num_heads: int, seconds: dict,
                      layer_numbers: list[int] | None = None) -> dict:
    """Everything the page draws: ``labels`` (each token as text), ``raw`` (its piece), and the
    head's part (:func:`long_head_payload`)."""
    return {
        "version": PAYLOAD_VERSION, "model": model, "source": source, "n": len(labels),
        "num_layers": num_layers, "num_heads": num_heads, "layer_numbers": layer_numbers, "labels": labels,
        "raw": raw, "seconds": seconds,
        **long_head_payload(layer=layer, head=head, n=len(labels), rows=rows, profiles=profiles, model=model),
    }
