"""Compact, JSON-safe encodings for the arrays a page embeds.

A view page carries every layer and head of one example. As JSON numbers, 12 x 12 heads at
512 tokens would be ~40 million numbers (hundreds of MB), so large arrays travel as blobs:

- ``u8``: attention weights in [0, 1] quantised to 1/255 (``round(a * 255)``), zlib-deflated,
  base64. Attention is mostly near zero, so deflate shrinks it many times. The page inflates it
  with the browser's built-in ``DecompressionStream("deflate")`` (no library, no network).
- ``f32``: float32 little-endian, zlib-deflated, base64 (query/key vectors of the neuron view).

A blob is a plain dict ``{"dtype", "shape", "data"}``, so a payload stays a JSON-able dict.

>>> b = encode_u8(np.array([[0.0, 1.0]])); decode(b).tolist()
[[0.0, 1.0]]
"""

from __future__ import annotations

import base64
import zlib

import numpy as np

#: Quantisation step of ``u8`` blobs: weights are stored to within half of 1/255.
U8_SCALE = 255


def encode_u8(a: np.ndarray) -> dict:
    """Weights in [0, 1] (any shape) -> a ``u8`` blob; values are clipped to [0, 1]."""
    q = np.rint(np.clip(np.asarray(a, dtype=np.float32), 0.0, 1.0) * U8_SCALE).astype(np.uint8)
    return {"dtype": "u8", "shape": list(q.shape),
            "data": base64.b64encode(zlib.compress(q.tobytes(), 6)).decode("ascii")}


def encode_f32(a: np.ndarray) -> dict:
    """Any float array -> an ``f32`` blob (little-endian float32, exact for float32 input)."""
    x = np.ascontiguousarray(np.asarray(a, dtype="<f4"))
    return {"dtype": "f32", "shape": list(x.shape),
            "data": base64.b64encode(zlib.compress(x.tobytes(), 6)).decode("ascii")}


def decode(blob: dict) -> np.ndarray:
    """A blob back to a float32 array (``u8`` blobs come back divided by 255)."""
    raw = zlib.decompress(base64.b64decode(blob["data"]))
    shape = tuple(blob["shape"])
    if blob["dtype"] == "u8":
        return (np.frombuffer(raw, dtype=np.uint8).reshape(shape) / U8_SCALE).astype(np.float32)
    if blob["dtype"] == "f32":
        return np.frombuffer(raw, dtype="<f4").reshape(shape).astype(np.float32)
    raise ValueError(f"unknown blob dtype {blob['dtype']!r}")
