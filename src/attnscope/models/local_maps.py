"""Local attention's weights laid out as maps over the tokens.

Two of transformers' families report local attention in a layout of their own, not as the
``[B H n n]`` maps every other model returns as ``output_attentions``:

- ``window``: Longformer and LED's encoder (sliding-window attention, ``LongformerSelfAttention``)
  report ``[B H n 2r+1]``, a row per query and a column per offset: column ``c`` of query ``i``
  holds key ``i + c - r``. (With global tokens their columns come first; attnscope marks none.)
- ``blocks``: LongT5's local attention reports ``[B blocks H b 3b]``: the sequence is cut into
  blocks of ``b`` queries, each reading its own block and the blocks on either side, so column
  ``c`` of query ``q`` of block ``k`` holds key ``(k - 1) b + c``.

:func:`layout_of` tells which from one probe's shapes (:func:`attnscope.models.facts.read_facts`
keeps it as :attr:`ModelFacts.local`), and :func:`token_maps` lays either out as ``[B H n n]``:
each weight moves to its key's column unchanged (exactly), and keys outside the window get 0, the
probability the model's mask gives them. Every analysis, store and view then reads these models'
maps as it reads any other's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnscope.errors import ModelError

_GLOBAL = ("{name}: its local attention also reads keys that summarise blocks of tokens (transient-global "
           "attention), which are no tokens; attnscope reads attention over the tokens")


def _windows(config, layers: int) -> list[int]:
    w = getattr(config, "attention_window", None)
    if isinstance(w, int):
        return [w] * layers
    return [int(x) for x in w] if isinstance(w, (list, tuple)) else []


def layout_of(maps: Sequence[Any], n: int, config, name: str) -> str:
    """``window``, ``blocks`` or ``""`` (maps over the tokens already) for the ``output_attentions``
    of one probe over ``n`` tokens (``maps``, one tensor per layer), read from their shapes and the
    config's ``attention_window``. LongT5's transient-global attention (its keys include one
    summary per block of tokens, which is no token) is refused."""
    shapes = [tuple(m.shape) for m in maps]
    if any(len(s) == 5 for s in shapes):
        # (a probe shorter than LongT5's global blocks has no summaries yet: its config says so)
        if getattr(config, "encoder_attention_type", "local") != "local" or \
                not all(len(s) == 5 and s[-1] == 3 * s[-2] for s in shapes):
            raise ModelError(_GLOBAL.format(name=name))
        return "blocks"
    windows = _windows(config, len(shapes))
    if windows and all(len(s) == 4 and s[-2] == n and s[-1] != n for s in shapes) and \
            all(s[-1] == w + 1 for s, w in zip(shapes, windows)):
        return "window"
    return ""


def token_maps(maps: Sequence[Any], layout: str, n: int) -> list[Any]:
    """``maps`` (one tensor per layer, in ``layout``) as ``[B H q n]`` maps over ``n`` keys, ``q``
    the queries the model reported, at most ``n``; unchanged where ``layout`` is ``""``."""
    if not layout:
        return list(maps)
    return [_window(m, n) if layout == "window" else _blocks(m, n) for m in maps]


def _place(rows, keys, width: int):
    """``rows`` ``[.. q c]`` scattered along its last axis to the columns ``keys`` ``[q c]`` of
    ``width`` columns; a column outside ``[0, width)`` is dropped (the model gave it 0)."""
    import torch

    inside = (keys >= 0) & (keys < width)
    index = keys.clamp(0, width - 1).expand(rows.shape)
    zeros = rows.new_zeros((*rows.shape[:-1], width))
    # (each key of a row gets one weight; the dropped columns add an exact 0.0 to column 0 or
    # width - 1)
    return zeros.scatter_add(-1, index, torch.where(inside, rows, torch.zeros_like(rows)))


def _window(m, n: int):
    import torch

    q, w = m.shape[-2], m.shape[-1]
    r = (w - 1) // 2
    keys = torch.arange(q, device=m.device)[:, None] + torch.arange(w, device=m.device)[None, :] - r
    return _place(m, keys, n)


def _blocks(m, n: int):
    import torch

    b, blocks, heads, size, keys = m.shape
    if keys != 3 * size:
        raise ModelError(_GLOBAL.format(name="the model"))
    rows = m.permute(0, 2, 1, 3, 4).reshape(b, heads, blocks * size, 3 * size)  # [B H blocks*b 3b]
    query = torch.arange(blocks * size, device=m.device)[:, None]
    keys = (query // size - 1) * size + torch.arange(3 * size, device=m.device)[None, :]
    return _place(rows, keys, n)[..., :n, :]
