"""Per-head attention statistics for long inputs, computed without ``[n n]`` maps.

:class:`LongContextStats` is an accumulator (``update`` / ``merge`` / ``finalize``) of per-head
sums and counts. It is fed one tile of attention rows at a time, ``p`` ``[H c K]`` (heads,
``c`` query rows ``q0 .. q0+c-1``, keys ``0 .. K-1``), either

- from maps (``update(AttentionBatch)``, or :func:`maps_update` from eager probabilities), or
- by the streaming engine (:mod:`attnscope.engines.streaming`), which recomputes each tile
  inside attention from the rotated queries and keys and never holds a layer's ``[H n n]``.

Both paths run the same tile code, so they agree to float32 rounding.

Which rows count: query rows at positions ``i >= 1`` (row 0 can only attend to itself). For a
row ``i`` that sees ``m`` keys (``m = i + 1`` in a causal model, ``n`` in a bidirectional one) and
weights ``p_ij``:

- sink mass ``p_i0`` (the first token); special mass ``sum_{j special} p_ij``; punctuation mass;
- previous ``p_i,i-1``, current ``p_ii``; maximum ``max_j p_ij``;
- entropy ``H_i = -sum_j p_ij ln p_ij`` (nats, ``0 ln 0 = 0``), normalised ``H_i / ln m``
  (1 = uniform over what the row can see);
- distance profile: the mass at distance ``d = |i - j|`` summed per log-spaced bucket
  ``0 | 1 | 2 | 3-4 | 5-8 | ...`` (bucket ``ceil(log2 d) + 1`` for ``d >= 1``); reported as the
  mean mass per row (sums to 1 over buckets) and as the mean weight per key
  (mass / number of (row, key) pairs at those distances);
- per query-position bucket (same log buckets of ``i``): mean sink mass and entropy;
- targets: for named per-row key indices (induction: the token after the previous copy of the
  current token; duplicate: the previous copy itself), the mean weight on that key. A sequence
  that has targets is a probe (e.g. repeated random tokens): it feeds its target scores and
  nothing else, so the document statistics, counts and head distances come from the
  documents alone whether or not probes run in the same pass (they are counted apart, as
  ``target_sequences`` / ``target_tokens``);
- head-to-head Jensen-Shannon distances (paper section 6) over a seeded sample of rows per
  document, each row smoothed as in the paper's script (``s / m + (1 - s) p`` over its ``m``
  keys);
- Gu et al. 2024's per-sample sink score (causal models): per document of ``n >= 2`` units,
  ``a = (1 + sum_{i >= 1} p_i0) / n``, the mean attention on the first token over ALL rows
  (row 0 attends only to itself, weight 1), and whether ``a > sink_threshold``; reported as
  the mean of ``a`` (``sink_gu``) and the share of documents in which the head is a sink
  (``sink_rate``). Their sink ratio is the mean over documents of the share of heads whose
  ``a`` exceeds the threshold, ``sum(sink_rate) / (L H)``.

Sink heads: ``sink_metric="pooled"`` (default) labels a head whose mean sink mass over the
pooled rows ``i >= 1`` exceeds ``sink_threshold``; ``"gu2024"`` labels a head that is a sink (by
the per-sample score above) in more than half of the documents, and counts sink heads as Gu et
al. do, the mean over documents of each document's count (a fraction over several documents).

Every per-head mean is a sum over rows divided by the number of rows, only in ``finalize``;
the sample of rows for the distances is drawn from a seed and the document's own tokens, so
results do not depend on chunk size, batch size or how documents are split across runs.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from attnscope.analyses.base import MapsAnalysis, Result, register
from attnscope.analyses.clustering import cluster_heads
from attnscope.analyses.distances import js_pairs
from attnscope.data.records import HeadId
from attnscope.engines.rows import (  # noqa: F401  (the buckets and rows are read from here too)
    NUM_BUCKETS,
    Sequence,
    bucket_labels,
    bucket_of,
    diagonal_sums,
    is_punct,
    key_mass,
    pairs_per_bucket,
    sample_by_digest,
    sample_rows,
)
from attnscope.maps import AttentionBatch

#: Gu et al. 2024 ("When Attention Sink Emerges"): a sink head puts more than this on token 0.
SINK_THRESHOLD = 0.3
#: A head is called a previous-token / induction head above these mean weights.
PREVIOUS_THRESHOLD = 0.5
INDUCTION_THRESHOLD = 0.3
#: How sink heads are told: the pooled mean over rows >= 1, or Gu et al. 2024's per-sample score.
SINK_METRICS = ("pooled", "gu2024")
HEAD_SUMS = ("sink", "special", "punct", "previous", "current", "entropy", "norm_entropy", "max")


def _to_host(parts: dict[str, Any]) -> dict[str, np.ndarray]:
    """``parts`` (name -> float64 tensor ``[H ...]``, one device) on the host as numpy arrays,
    in one copy: a GPU's queue is waited for once, not once per part."""
    import torch

    names = list(parts)
    flat = torch.cat([parts[k].reshape(-1) for k in names]).cpu().numpy()
    out, at = {}, 0
    for k in names:
        size = parts[k].numel()
        out[k] = flat[at:at + size].reshape(tuple(parts[k].shape))
        at += size
    return out


@register
class LongContextStats(MapsAnalysis):
    """Per-head sink, previous/current, entropy, distance and position statistics (see module)."""

    name = "longctx-stats"
    requires = frozenset()

    def __init__(self, js_rows: int = 8, smoothing: float = 0.001, seed: int = 0,
                 sink_threshold: float = SINK_THRESHOLD, causal: bool = True, js_width: str = "row",
                 sink_metric: str = "pooled"):
        self.js_rows = int(js_rows)
        self.smoothing = float(smoothing)
        self.seed = int(seed)
        self.sink_threshold = float(sink_threshold)
        self.causal = bool(causal)
        if sink_metric not in SINK_METRICS:
            raise ValueError(f"sink_metric must be one of {SINK_METRICS}, not {sink_metric!r}")
        if sink_metric == "gu2024" and not self.causal:
            raise ValueError("sink_metric 'gu2024' needs a causal model (its row 0 attends only to "
                             "the first token; a bidirectional model's row 0 is not folded)")
        self.sink_metric = sink_metric
        if js_width not in ("row", "sequence"):
            raise ValueError(f"js_width must be 'row' or 'sequence', not {js_width!r}")
        self.js_width = js_width  # smoothing of the sampled rows over the row's keys or all n
        self.shape: tuple[int, int] | None = None
        self.rows = 0  # query rows counted (position >= 1), over all documents
        self.documents = 0
        self.tokens = 0
        self.target_sequences = 0  # probes: sequences with targets, counted apart from documents
        self.target_tokens = 0
        self.sink_samples = 0  # documents with rows, for the per-sample (Gu et al.) sink score
        self.sums: dict[str, np.ndarray] = {}
        self.targets: dict[str, list] = {}  # name -> [sums [L H], rows]
        self.js_sums: np.ndarray | None = None
        self.js_count = 0

    def params(self) -> dict[str, Any]:
        return {"js_rows": self.js_rows, "smoothing": self.smoothing, "seed": self.seed,
                "sink_threshold": self.sink_threshold, "causal": self.causal, "js_width": self.js_width,
                "sink_metric": self.sink_metric}

    # -- accumulation ---------------------------------------------------------------------
    def _ensure(self, L: int, H: int) -> None:
        if self.shape is None:
            self.shape = (L, H)
            for k in (*HEAD_SUMS, "sink_gu", "sink_gu_heads"):
                self.sums[k] = np.zeros((L, H))
            for k in ("dist_mass", "pos_sink", "pos_entropy", "pos_norm_entropy"):
                self.sums[k] = np.zeros((L, H, NUM_BUCKETS))
            self.sums["dist_pairs"] = np.zeros(NUM_BUCKETS)
            self.sums["pos_rows"] = np.zeros(NUM_BUCKETS)
        elif self.shape != (L, H):
            raise ValueError(f"{L}x{H} heads after {self.shape[0]}x{self.shape[1]}")

    def begin(self, L: int, H: int, seq: Sequence) -> None:
        """Count one sequence's rows (called once per sequence, before its tiles)."""
        self._ensure(L, H)
        n = seq.n
        if seq.targets:  # a probe: its target rows only (see the module's docstring)
            self.target_sequences += 1
            self.target_tokens += n
            for name, t in seq.targets.items():
                entry = self.targets.setdefault(name, [np.zeros((L, H)), 0])
                entry[1] += int((t[1:] >= 0).sum())
            return
        self.documents += 1
        self.tokens += n
        if n < 2:
            return
        self.rows += n - 1
        seq.sink_sum = np.zeros((L, H))
        self.sums["dist_pairs"] += pairs_per_bucket(n, self.causal)
        self.sums["pos_rows"] += np.bincount(bucket_of(np.arange(1, n)), minlength=NUM_BUCKETS)

    def tile(self, layer: int, seq: Sequence, q0: int, p, ent, top=None, masses=None,
             heads: slice = slice(None), per_d=None) -> None:
        """Fold the rows ``q0 .. q0+c-1`` (all >= 1) of one layer: ``p`` ``[H c K]`` (exactly 0
        where a key is masked), each row's entropy ``ent`` ``[H c]`` (nats) and, where the
        caller has them, each row's largest weight ``top`` ``[H c]`` (else ``p.amax(-1)``) and
        its mass on each column of :meth:`Sequence.key_classes` ``masses`` ``[H c 3+C]`` (more
        columns are ignored; else one matrix product, :func:`key_mass`). ``heads``: which of the
        layer's heads ``p`` holds (all of them unless said). ``per_d``: the tile's mass per
        distance, where the caller has it (else :func:`diagonal_sums`, one pass over ``p``).

        Its per-row values wait in the sequence's buffers, which are reduced to the per-head
        sums once per layer, by :meth:`layer_end` (else when the sequence's next layer
        begins, or at :meth:`end`)."""

        if seq.targets:  # a probe feeds its target scores only
            self._fold_targets(layer, seq, q0, p, heads)
            return
        _, c, K = p.shape
        dev = p.device
        values, _ = self.row_buffers(layer, seq, dev)  # (ends the last layer where a producer did not)
        rows = values[:, heads, q0:q0 + c]
        rows[0] = ent
        rows[1] = p.amax(-1) if top is None else top
        if masses is None:
            masses = key_mass(p, seq.key_classes(dev)[:K].to(p.dtype))
        rows[2:] = masses[..., :rows.shape[0] - 2].permute(2, 0, 1)
        if per_d is None:
            _, per_d = diagonal_sums(p, q0)  # distances q0 + c - 1 down
        e0 = seq.n - (q0 + c - 1)
        seq.dist_sums[heads, e0:e0 + per_d.shape[1]] += per_d
        for r in seq.js_rows:
            if q0 <= r < q0 + c:
                self.sampled_row(layer, seq, r, p[:, r - q0, :r + 1 if self.causal else K], heads)

    def sampled_row(self, layer: int, seq: Sequence, r: int, p, heads: slice = slice(None)) -> None:
        """Keep the weights ``p`` ``[H width]`` (the keys row ``r`` sees) of the sampled row ``r``
        (one of ``seq.js_rows``) for the head distances."""
        import torch

        if r not in seq.js_store:  # every layer's heads, allocated once (no heap of small copies)
            seq.js_store[r] = torch.zeros(*self.shape, p.shape[-1], device="cpu")  # off the accelerator
        seq.js_store[r][layer, heads] = p

    def row_buffers(self, layer: int, seq: Sequence, device) -> tuple[Any, Any]:
        """``seq``'s buffers for ``layer`` (begun here, the previous layer ended), which
        :meth:`tile` fills, or a producer that computes each row's values itself (the compiled
        one-pass kernel, :func:`attnscope.engines.native.flash`): ``[F H n]`` per row
        (entropy, largest weight, then the mass on each column of :meth:`Sequence.key_classes`) and ``[H NB+1]`` float64 per head, its mass over rows
        ``>= 1`` per distance bucket (:func:`bucket_of` of ``|i - j|``) and at distance ``+1``
        (``j = i - 1``); then the sampled rows (:meth:`sampled_row`) and :meth:`layer_end`."""
        if seq.layer != layer:
            self.layer_end(seq)
            seq.start_layer(layer, self.shape[1], device)
        return seq.row_values, seq.dist_buckets

    def layer_end(self, seq: Sequence) -> None:
        """After the last tile of a layer of ``seq``: reduce its buffered rows to the sums."""
        if seq.layer >= 0:
            self._fold_layer(seq)

    def _fold_layer(self, seq: Sequence) -> None:
        """Reduce the buffered rows ``1 .. n-1`` of ``seq``'s current layer to the per-head sums:
        every reduction on the rows' device, then one copy to the host (a GPU waits once a layer)."""
        import torch

        layer, n, s = seq.layer, seq.n, self.sums
        values = seq.row_values[:, :, 1:]  # [F H n-1]
        dev = values.device
        pos = torch.arange(1, n, device=dev)
        seen = (pos + 1) if self.causal else torch.full_like(pos, n)  # keys a row sees
        ent, top = values[0], values[1]
        norm = ent / torch.log(seen.to(ent.dtype))[None, :]
        per_d, nb = seq.dist_sums, seq.dist_buckets  # per_d: index e holds distance n - e
        table = seq.buckets(dev)
        dmass = nb[:, :NUM_BUCKETS].clone()
        dmass.index_add_(1, table[(n - torch.arange(2 * n + 1, device=dev)).abs()], per_d)
        pb = table[pos]
        parts: dict[str, Any] = {  # name -> [H ...] float64 on the device
            "totals": values.double().sum(-1).transpose(0, 1),  # [H F]
            "norm_entropy": norm.double().sum(-1),
            "current": (per_d[:, n] + nb[:, 0]).double(),
            "previous": (per_d[:, n - 1] + nb[:, NUM_BUCKETS]).double(),
            "dist_mass": dmass.double(),
        }
        for name, value in (("pos_sink", values[2]), ("pos_entropy", ent), ("pos_norm_entropy", norm)):
            acc = torch.zeros(value.shape[0], NUM_BUCKETS, dtype=torch.float64, device=dev)
            parts[name] = acc.index_add_(1, pb, value.double())
        for row_name, mask in seq.from_masks.items():
            parts[f"from {row_name}"] = (values[5:].double() * mask[1:n].to(device=dev, dtype=torch.float64)
                                         ).sum(-1).transpose(0, 1)  # [H C]
        if seq.max_below is not None:
            parts["rows_max_below"] = (top <= seq.max_below).sum(-1).double()
        host = _to_host(parts)
        totals = host.pop("totals").T  # [F H]

        def add(name, value):  # value [H] -> float64 sums
            if name not in s:  # an optional sum (extra classes): created on first use
                s[name] = np.zeros(self.shape)
            s[name][layer] += value

        add("entropy", totals[0])
        add("max", totals[1])
        add("sink", totals[2])
        seq.sink_sum[layer] += totals[2]
        add("special", totals[3])
        add("punct", totals[4])
        for ci, name in enumerate(seq.class_names):
            add(f"to_{name}", totals[5 + ci])
        for name in ("norm_entropy", "current", "previous", "rows_max_below"):
            if name in host:
                add(name, host[name])
        for name in ("dist_mass", "pos_sink", "pos_entropy", "pos_norm_entropy"):
            s[name][layer] += host[name]
        for row_name in seq.from_masks:
            part = host[f"from {row_name}"].T  # [C H]
            for ci, name in enumerate(seq.class_names):
                add(f"from_{row_name}_to_{name}", part[ci])
        seq.layer = -1

    def _fold_targets(self, layer: int, seq: Sequence, q0: int, p, heads: slice = slice(None)) -> None:
        """A probe's tile ``p`` ``[H c K]`` (of the layer's ``heads``): the weight of each row on
        its target key."""
        import torch

        c = p.shape[1]
        for name, t in seq.targets.items():
            tt = t[q0:q0 + c]
            ok = tt >= 0
            if bool(ok.any()):
                rows = torch.nonzero(ok)[:, 0]
                got = p[:, rows, tt[rows]]  # [H r]
                self.targets[name][0][layer, heads] += got.sum(1).double().cpu().numpy()

    def target_weights(self, layer: int, seq: Sequence, weights: dict[str, Any]) -> None:
        """A probe's rows' weights on their target keys, from a producer that computes them
        without whole rows: ``weights`` name -> ``[H n]``, row ``i``'s weight on key
        ``seq.targets[name][i]`` (rows ``>= 1`` with a target count, as in :meth:`tile`)."""
        for name, t in seq.targets.items():
            ok = t >= 0
            ok[:1] = False
            got = weights[name][:, ok]  # [H r]
            self.targets[name][0][layer] += got.double().sum(1).cpu().numpy()

    def end(self, seq: Sequence) -> None:
        """After every layer of a sequence: fold its last layer's rows, and its sampled rows into
        the head distances."""
        self.layer_end(seq)
        seq.row_values = seq.dist_sums = seq.dist_buckets = None
        if seq.sink_sum is not None and self.causal:  # Gu et al.'s score: every row, row 0 included
            score = (1.0 + seq.sink_sum) / seq.n
            self.sums["sink_gu"] += score
            self.sums["sink_gu_heads"] += score > self.sink_threshold
            self.sink_samples += 1
            seq.sink_sum = None
        for r in sorted(seq.js_store):
            rows = seq.js_store[r].flatten(0, 1)  # [L*H m], layer-major
            d = js_rows_matrix(rows, self.smoothing, width=seq.n if self.js_width == "sequence" else None)
            self.js_sums = d if self.js_sums is None else self.js_sums + d
            self.js_count += 1
        seq.js_store.clear()

    # -- the Analysis contract --------------------------------------------------------------
    def update(self, batch: AttentionBatch) -> None:
        """From stored or extracted maps (token level; every map ``[L H n n]``)."""
        import torch

        for m in batch:
            if not m.num_units:
                continue
            L, H, n, _ = m.attn.shape
            punct = torch.tensor([is_punct(t) for t in m.tokens], dtype=torch.float32)
            special = torch.as_tensor(np.asarray(m.special, dtype=np.float32))
            digest = hashlib.sha256("\x00".join(m.tokens).encode()).digest()
            seq = Sequence(n, special, punct,
                           js_rows=sample_by_digest(n, digest, self.js_rows, self.seed))
            self.begin(L, H, seq)
            attn = torch.as_tensor(np.asarray(m.attn, dtype=np.float32))
            for layer in range(L):
                self.layer_probs(layer, seq, attn[layer])
            self.end(seq)

    def layer_probs(self, layer: int, seq: Sequence, probs, chunk: int = 512) -> None:
        """One layer's ``[H n n]`` probabilities (rows 1 .. n-1 are folded)."""
        import torch

        n = seq.n
        for q0 in range(1, n, chunk):
            q1 = min(n, q0 + chunk)
            K = q1 if self.causal else n
            p = probs[:, q0:q1, :K].float()
            logp = torch.where(p > 0, torch.log(p.clamp(min=1e-45)), torch.zeros_like(p))
            self.tile(layer, seq, q0, p, -(p * logp).sum(-1))
        self.layer_end(seq)

    def merge(self, other: "LongContextStats") -> "LongContextStats":
        self._check_mergeable(other)
        if other.shape is None:
            return self
        if self.shape is None:
            self._ensure(*other.shape)
        elif self.shape != other.shape:
            raise ValueError("cannot merge statistics of models with different heads")
        for k, v in other.sums.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        for name, (v, c) in other.targets.items():
            entry = self.targets.setdefault(name, [np.zeros(self.shape), 0])
            entry[0] = entry[0] + v
            entry[1] += c
        if other.js_sums is not None:
            self.js_sums = other.js_sums.copy() if self.js_sums is None else self.js_sums + other.js_sums
        self.js_count += other.js_count
        self.rows += other.rows
        self.documents += other.documents
        self.tokens += other.tokens
        self.target_sequences += other.target_sequences
        self.target_tokens += other.target_tokens
        self.sink_samples += other.sink_samples
        return self

    def means(self) -> dict[str, np.ndarray]:
        """Every statistic as a mean (``[L H]``, ``[L H B]`` or ``[P P]``); no state change."""
        if self.shape is None:
            return {}
        s = self.sums
        out = {}
        if self.rows:
            out = {k: s[k] / self.rows for k in HEAD_SUMS}
            out["dist_mass"] = s["dist_mass"] / self.rows
            with np.errstate(invalid="ignore", divide="ignore"):
                out["dist_weight"] = np.where(s["dist_pairs"] > 0, s["dist_mass"] / s["dist_pairs"], np.nan)
                for k in ("pos_sink", "pos_entropy", "pos_norm_entropy"):
                    out[k] = np.where(s["pos_rows"] > 0, s[k] / s["pos_rows"], np.nan)
        if self.sink_samples:
            out["sink_gu"] = s["sink_gu"] / self.sink_samples
            out["sink_rate"] = s["sink_gu_heads"] / self.sink_samples
        for name, (v, c) in self.targets.items():
            out[f"target_{name}"] = v / c if c else np.full(self.shape, np.nan)
        if self.js_sums is not None and self.js_count:
            out["js"] = self.js_sums / self.js_count
        return out

    def finalize(self) -> Result:
        res = Result(self.name, params=self.params(),
                     meta={"documents": self.documents, "tokens": self.tokens, "rows": self.rows,
                           "target_sequences": self.target_sequences, "target_tokens": self.target_tokens,
                           "target_rows": {k: c for k, (_, c) in self.targets.items()},
                           "js_rows_used": self.js_count, "buckets": bucket_labels(),
                           "rows_counted": "query positions >= 1", "head_index": "0-indexed"})
        m = self.means()
        for k, v in m.items():
            res.arrays[k] = np.asarray(v, dtype=np.float64)
        if "sink" not in m:
            res.summary.append("no rows (every document shorter than 2 tokens)")
            return res
        L, H = self.shape
        pooled = m["sink"] > self.sink_threshold
        per_sample = m["sink_rate"] > 0.5 if "sink_rate" in m else None
        label = per_sample if self.sink_metric == "gu2024" else pooled
        rows = []
        for layer in range(L):
            for head in range(H):
                row = {"layer": layer, "head": head, "name": str(HeadId(layer, head)),
                       "sink_head": bool(label[layer, head])}
                for k in (*HEAD_SUMS, "sink_gu", "sink_rate"):
                    if k in m:
                        row[k] = float(m[k][layer, head])
                for name in self.targets:
                    v = m[f"target_{name}"][layer, head]
                    row[name] = None if not math.isfinite(v) else float(v)
                rows.append(row)
        res.tables["heads"] = rows
        res.tables["sink_heads"] = [r for r in rows if r["sink_head"]]
        res.meta["sink_heads"] = {"pooled": int(pooled.sum())}
        res.summary.append(f"{int(pooled.sum())} of {L * H} heads are sink heads (mean mass on the first "
                           f"token over rows >= 1 pooled > {self.sink_threshold})")
        if per_sample is not None:
            # Gu et al.'s count: the mean over documents of each document's number of sink heads
            res.meta["sink_heads"]["gu2024"] = float(m["sink_rate"].sum())
            res.meta["sink_samples"] = self.sink_samples
            res.summary.append(f"{m['sink_rate'].sum():g} of {L * H} heads are sink heads per document on "
                               f"average (Gu et al. 2024: each document's mean over all its rows "
                               f"> {self.sink_threshold})")
        return res


def js_rows_matrix(rows, smoothing: float, width: int | None = None):
    """``[P P]`` float64 Jensen-Shannon divergences (nats) between ``P`` rows ``[P m]``.

    Each row is first smoothed as the paper's script does, ``s / w + (1 - s) p`` with ``w`` the
    row's width ``m`` (default) or ``width``: a causal row of ``m`` keys in a sequence of
    ``n = width`` keys, smoothed over all ``n`` as the general family's maps are (the ``n - m``
    keys it cannot see hold ``s / n`` in every head, so they add nothing to JS). The same
    float32 arithmetic as :func:`attnscope.analyses.distances.js_matrix` (the paper's script):
    :func:`~attnscope.analyses.distances.js_pairs` on the rows.
    """
    P, m = rows.shape
    x = rows.detach().float().cpu().numpy()
    if smoothing:
        x = x * np.float32(1.0 - smoothing) + np.float32(smoothing / (width or m))
    return js_pairs(x.reshape(P, 1, m), zeros=not smoothing)


def head_clusters(res: Result) -> dict | None:
    """The heads placed by metric MDS of their Jensen-Shannon distances over sampled rows and
    labelled by behaviour (:func:`attnscope.analyses.clustering.cluster_heads`; entropy on the
    scale of 128 tokens), as for Figure 6; None without distances or with fewer than 3 heads."""
    a = res.arrays
    if "js" not in a or a["sink"].size < 3:
        return None
    stats = {"first": a["sink"], "previous": a["previous"], "punct": a["punct"],
             "entropy": a["norm_entropy"] * math.log(128)}  # broad: on the scale of 128 tokens
    out = cluster_heads(a["js"], stats, uniform_entropy=math.log(128))
    for r in out["rows"]:  # a decoder's first token plays the sink role of [CLS]
        if r["behaviour"] == "[CLS]":
            r["behaviour"] = "first token (sink)"
    out["labels"] = np.where(out["labels"] == "[CLS]", "first token (sink)", out["labels"])
    return out


def document_roles(profiles: dict[str, np.ndarray]) -> list[dict]:
    """What one head does on one document, from its value at every row (``profiles``, as
    :meth:`~attnscope.engines.document.DocumentRows.profiles` gives them), by the thresholds the
    family names heads with: an attention sink puts more than :data:`SINK_THRESHOLD` of a row on
    the first token, a previous-token head more than :data:`PREVIOUS_THRESHOLD` on the token
    before; each the mean over rows ``1 .. n-1`` (row 0 sees only itself).

    >>> [(r["role"], round(r["mean"], 6), r["holds"]) for r in document_roles(
    ...     {"sink": np.array([1.0, 0.9, 0.8]), "previous": np.array([0.0, 0.1, 0.2])})]
    [('attention sink', 0.85, True), ('previous-token head', 0.15, False)]
    """
    out = []
    for key, limit, role in (("sink", SINK_THRESHOLD, "attention sink"),
                             ("previous", PREVIOUS_THRESHOLD, "previous-token head")):
        v = profiles.get(key)
        if v is not None and len(v) >= 2:
            mean = float(np.mean(np.asarray(v, np.float64)[1:]))
            out.append({"role": role, "statistic": key, "mean": mean, "threshold": limit, "holds": mean > limit})
    return out
