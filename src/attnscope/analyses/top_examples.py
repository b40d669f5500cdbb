"""Where each head does its thing: the examples with its highest per-example values.

For every statistic ``s`` of an analysis and every head, :class:`TopExamples` keeps, during the
one pass over the corpus, the ``k`` examples whose per-example value (the same number the
analysis averages) is highest, and for each of them the query unit whose own row scores
highest (``rows[s, l, h, i]``, e.g. ``a[i, i-1]`` for attention to the previous token) with
that row's ``keys`` largest weights. It also keeps a seeded sample of ``sample`` examples for
every head, from which the ``typical`` ones are chosen at the end: the sampled examples whose
value is nearest the head's mean over the whole corpus.

Both are bounded and mergeable: the top ``k`` is ordered by (value, highest first; example
index, lowest first), a total order, and the sample keeps the examples with the lowest
:func:`priority` of their index, so an accumulator fed shard by shard (on Ray workers) and
merged holds exactly what one fed everything in order holds.

>>> t = TopExamples(("previous",), k=1, keys=1, sample=0)
>>> attn = np.array([[[[1.0, 0.0], [0.9, 0.1]]]])  # [L H q k]: row 1 puts 0.9 on unit 0
>>> units = {"tokens": ["a", "b"], "text": None, "level": "token", "segment": [0, 0], "special": [False, False]}
>>> t.offer(0, units, np.array([[[0.9]]]), np.array([True]), np.array([[[[0.0, 0.9]]]]), attn)
>>> e = t.to_json({"previous": np.array([[0.9]])})["heads"]["previous"][0][0]["top"][0]
>>> (e["example"], e["query"], e["keys"], e["weights"])
(0, 1, [0], [0.9])
"""

from __future__ import annotations

import numpy as np

#: Values a heap entry starts with (never an example): below every real value.
EMPTY = -np.inf
NO_INDEX = np.iinfo(np.int64).max


def units_of(m) -> dict:
    """What a page needs of an example it names: its ``tokens`` (the model's pieces), their
    ``text`` as the tokenizer reads them (None where the pieces are their text), ``segment``
    ids and which are ``special``: enough to draw it, and to run it again."""
    return {"tokens": list(m.tokens), "text": list(m.token_text) if m.token_text else None, "level": m.level,
            "segment": np.asarray(m.segment).astype(int).tolist(),
            "special": np.asarray(m.special).astype(bool).tolist()}


def priority(index: np.ndarray | int, seed: int = 0) -> np.ndarray:
    """A seeded pseudo-random ``uint64`` per example index (splitmix64), the order of the sample.

    >>> int(priority(3)) == int(priority(3)) != int(priority(4))
    True
    """
    with np.errstate(over="ignore"):
        z = np.asarray(index, dtype=np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


class TopExamples:
    """Per statistic and head: the ``k`` highest examples (query unit and its strongest keys)
    and a seeded sample of ``sample`` examples; see the module docstring."""

    def __init__(self, stats: tuple[str, ...], *, k: int = 5, keys: int = 5, sample: int = 16,
                 seed: int = 0):
        self.stats, self.k, self.keys, self.sample, self.seed = tuple(stats), k, keys, sample, seed
        self.top: dict[str, np.ndarray] | None = None  # value/index/query [S L H k], key/weight [S L H k K]
        self.drawn: dict[str, np.ndarray] | None = None  # priority/index [m]; value/query [m S L H]; ...
        self.tokens: dict[int, dict] = {}  # the units of every example kept (:func:`units_of`)

    def params(self) -> dict:
        return {"k": self.k, "keys": self.keys, "sample": self.sample, "seed": self.seed,
                "order": "value (highest first), then example index (lowest first)",
                "typical": "of a seeded sample of examples, those nearest the head's mean"}

    # -- feeding --------------------------------------------------------------------------
    def offer(self, index: int, units: dict, values: np.ndarray, defined: np.ndarray,
              rows: np.ndarray, attn: np.ndarray) -> None:
        """One example: its position ``index`` in the input, its :func:`units_of`, its per-example
        values ``[S L H]`` with which statistics it defines ``[S]``, each statistic's value per
        query row ``[S L H q]``, and its map ``[L H q k]`` (read, never changed)."""
        S, L, H = values.shape
        val = np.where(np.asarray(defined, bool)[:, None, None], values, EMPTY)
        val = np.where(np.isnan(val), EMPTY, val)
        if self.top is None:
            self.top = self._empty((S, L, H))
        worst, last = self.top["value"][..., -1], self.top["index"][..., -1]
        enters = (val > worst) | ((val == worst) & (val > EMPTY) & (index < last))  # [S L H]
        pri = priority(index, self.seed)
        drawn = self.sample > 0 and (self.drawn is None or len(self.drawn["index"]) < self.sample
                                     or (pri, index) < max(zip(self.drawn["priority"], self.drawn["index"])))
        if not (enters.any() or drawn):
            return  # the common case once the heaps are full: nothing to draw, nothing kept
        where = np.ones_like(enters) if drawn else enters
        s, lay, hd = np.nonzero(where)
        query = np.full((S, L, H), -1)
        query[s, lay, hd] = np.asarray(rows)[s, lay, hd].argmax(-1)  # the first of equal rows
        row = attn[lay, hd, query[s, lay, hd]]  # [m n]: only the heads that keep this example
        order = np.argsort(-row, axis=-1, kind="stable")[:, :self.keys]
        weight = np.take_along_axis(row, order, -1).astype(np.float64)
        if order.shape[-1] < self.keys:  # an example shorter than ``keys`` units
            pad = self.keys - order.shape[-1]
            order = np.pad(order, [(0, 0), (0, pad)], constant_values=-1)
            weight = np.pad(weight, [(0, 0), (0, pad)], constant_values=np.nan)
        key = np.full((S, L, H, self.keys), -1)
        wts = np.full((S, L, H, self.keys), np.nan)
        key[s, lay, hd], wts[s, lay, hd] = order, weight
        entry = {"value": val, "index": np.full((S, L, H), index, np.int64), "query": query,
                 "key": key, "weight": wts}
        if enters.any():
            mine = {n: a[:, :, :, None] for n, a in entry.items()}
            mine["value"] = np.where(enters, val, EMPTY)[..., None]  # only where it may enter
            self.top = self._best(self.top, mine)
        if drawn:
            mine = {"priority": np.array([pri]), "index": np.array([index], np.int64),
                    **{n: a[None] for n, a in entry.items() if n != "index"}}
            self.drawn = mine if self.drawn is None else self._sampled(self.drawn, mine)
        self.tokens[int(index)] = units
        if len(self.tokens) > 2 * (self.k * S * L * H + self.sample):
            self._forget()

    def merge(self, other: "TopExamples") -> None:
        """Fold ``other`` (same statistics and sizes, disjoint examples) into this one."""
        if (other.stats, other.params()) != (self.stats, self.params()):
            raise ValueError("cannot merge top examples kept with different parameters")
        if other.top is not None:
            self.top = other.top if self.top is None else self._best(self.top, other.top)
        if other.drawn is not None:
            self.drawn = other.drawn if self.drawn is None else self._sampled(self.drawn, other.drawn)
        self.tokens.update(other.tokens)
        self._forget()

    # -- the two bounded sets ---------------------------------------------------------------
    def _empty(self, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
        k, K = self.k, self.keys
        return {"value": np.full(shape + (k,), EMPTY), "index": np.full(shape + (k,), NO_INDEX),
                "query": np.full(shape + (k,), -1), "key": np.full(shape + (k, K), -1),
                "weight": np.full(shape + (k, K), np.nan)}

    def _best(self, a: dict, b: dict) -> dict:
        """The ``k`` best of two heaps ``[S L H k*]``: value high first, then index low first."""
        both = {n: np.concatenate([a[n], b[n]], axis=3) for n in a}
        pick = np.lexsort((both["index"], -both["value"]), axis=-1)[..., :self.k]  # [S L H k]
        out = {}
        for n, arr in both.items():
            idx = pick if arr.ndim == 4 else pick[..., None]
            out[n] = np.take_along_axis(arr, idx, axis=3)
        return out

    def _sampled(self, a: dict, b: dict) -> dict:
        """The ``sample`` examples of lowest priority (then lowest index) among two samples."""
        both = {n: np.concatenate([a[n], b[n]]) for n in a}
        pick = np.lexsort((both["index"], both["priority"]))[:self.sample]
        return {n: arr[pick] for n, arr in both.items()}

    def _forget(self) -> None:
        """Drop the tokens of examples neither set holds any more."""
        held = set()
        if self.top is not None:
            held |= set(np.unique(self.top["index"][self.top["value"] > EMPTY]).tolist())
        if self.drawn is not None:
            held |= set(self.drawn["index"].tolist())
        self.tokens = {i: t for i, t in self.tokens.items() if i in held}

    # -- the result -------------------------------------------------------------------------
    def to_json(self, means: dict[str, np.ndarray], typical: int = 2) -> dict:
        """What was kept, JSON-able: ``params``; ``heads``: ``stat -> [L][H] -> {"top": [entry],
        "typical": [entry]}`` with an entry ``{"example", "value", "query", "keys", "weights"}``
        (``value`` to 7 significant digits; ``keys``: unit positions, strongest first, with their
        ``weights`` to 4 decimals); ``examples``: ``str(index) ->``
        :func:`units_of` every example named. ``typical``: how many sampled examples nearest ``means[stat]``
        (``[L H]``, the head's mean over the corpus) each head gets."""
        if self.top is None:
            return {}
        S, L, H, _ = self.top["value"].shape
        heads = {}
        for s, name in enumerate(self.stats):
            heads[name] = [[{"top": [e for e in (self._entry(self.top, (s, layer, head, j))
                                                  for j in range(self.k)) if e is not None],
                             "typical": self._typical(s, layer, head, means[name][layer, head], typical)}
                            for head in range(H)] for layer in range(L)]
        return {"params": self.params(), "heads": heads,
                "examples": {str(i): t for i, t in sorted(self.tokens.items())}}

    def _typical(self, s: int, layer: int, head: int, mean: float, n: int) -> list[dict]:
        if self.drawn is None or not np.isfinite(mean):
            return []
        value = self.drawn["value"][:, s, layer, head]
        ok = np.nonzero(value > EMPTY)[0]
        order = ok[np.lexsort((self.drawn["index"][ok], np.abs(value[ok] - mean)))][:n]
        return [self._entry(self.drawn, (j, s, layer, head)) for j in order]

    @staticmethod
    def _entry(src: dict, at: tuple) -> dict | None:
        value = float(src["value"][at])
        if not value > EMPTY:
            return None
        index = src["index"][at[0]] if src["index"].ndim == 1 else src["index"][at]
        keys, weights = src["key"][at], src["weight"][at]
        real = keys >= 0
        return {"example": int(index), "value": float(f"{value:.7g}"), "query": int(src["query"][at]),
                "keys": keys[real].tolist(), "weights": [round(float(w), 4) for w in weights[real]]}
