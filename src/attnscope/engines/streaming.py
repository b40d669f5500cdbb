"""The streaming engine: per-head statistics computed inside attention, without ``[n n]`` maps.

For each layer the forward helper's ``"k"`` hook sees the rotated queries ``Q`` ``[B Hq T d]``
and keys ``K`` ``[B Hkv T d]``, the mask and the scaling ``s``. The engine computes the attention
of one block of ``c`` query rows at a time, in float32 (grouped-query attention: query head ``h``
uses key head ``h // G``, ``G = Hq / Hkv``; the ``G`` heads of a group are stacked into ``G c`` rows of
one product, so the keys are never copied per query head)::

    S = s * Q[rows] K[:k1]^T              [Hq c k1]   (k1 = last row + 1 for causal models)
    S[masked] = float32 min                (causal, padding, sliding window: Site.allowed)
    P = exp(S - max S) / z                 entropy = ln z - sum P (S - max S), max P = 1 / z
    O = P V                                [Hq c d]

and folds the tile into :class:`~attnscope.analyses.longctx.LongContextStats`. One pass: the
same tile gives the layer's output rows ``O`` (float32), which go back to the model through
the forward helper's ``"attend"`` hook, so the model's own attention (torch's fused
``scaled_dot_product_attention``) does not run for the layer. On the CPU (with a C compiler and
torch's BLAS) each layer of a sequence is instead one call of a compiled kernel
(:func:`attnscope.engines.native.flash`), which works in blocks of rows and keys that stay in
the cache, with an online softmax across the key blocks, and sums each row's mass per distance
bucket rather than per distance. On CUDA each layer of a token-level sequence is fused
attention instead (:func:`attnscope.engines.flex.run_layer`: the statistics from log-sum-exps,
no row of scores held). Where the caller's memory budget holds the pass's maps, each layer's
eager map is made and folded instead (the ``maps`` backend, :mod:`attnscope.engines.eager`: the
reference, the numbers of ``output_attentions``). Which of them runs is the seam's choice, by
memory, device and input (:mod:`attnscope.engines.backends`); the tiles (:mod:`attnscope.engines.tiled`) remain for word-level sequences and probes
(which need each row's weights) and wherever neither is available. There the row work (``P``,
the entropy and largest weight, each row's mass on the keys' classes -- first token, special,
punctuation, the general family's classes -- and the tile's mass per distance) is one call of a
compiled kernel (:mod:`attnscope.engines.native`), three passes over each row while it is in the
cache. Elsewhere (a GPU, no C compiler) torch does it: its softmax, the classes as extra value
columns (``[O | M] = P [V | classes]``) and one more pass for the distances. No probabilities are
requested and the forward pass builds no ``[T T]`` mask, so the largest extra memory is one tile,
at most ``Hq * c * n`` floats (two on the torch path), instead of the ``L * Hq * n * n`` of
``output_attentions``. Each tile holds whole rows, which the statistics need (so no online
softmax over key blocks), of one block of key heads and their query heads (:func:`~attnscope.engines.tiled.auto_tile`,
sized for the device); at the smallest automatic CPU tile, 16 rows of one key head's 3 query heads, a 128k-token tile is
25 MB. Under bfloat16 autocast the attention modules run in float32
(:func:`float32_attention`), so the scores are not made of bfloat16-rounded queries and keys.

>>> from attnscope.models import load_model
>>> from attnscope.analyses.longctx import LongContextStats
>>> lm = load_model("debug:llama")
>>> stats = LongContextStats()
>>> stream_stats(lm, [lm.tokenizer("the cat sat on the mat")["input_ids"]], stats, chunk=4)
>>> stats.finalize().arrays["sink"].shape
(2, 4)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence as Seq
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np

from attnscope.engines import backends
from attnscope.engines.eager import fold_maps
from attnscope.engines.plan import Plan
from attnscope.engines.plan import plan as make_plan
from attnscope.engines.rows import (
    RowStats,
    Sequence,
    is_punct,
    sample_by_digest,
    sample_rows,
    sequence_digest,
)
from attnscope.engines.seam import LayerInput
from attnscope.models.families import module_at
from attnscope.models.forward import forward, model_device, pad_batch


def _key_masks(lm, ids: Seq[int], device, cache: dict[int, bool]) -> tuple[Any, Any]:
    import torch

    specials = set(getattr(lm.tokenizer, "all_special_ids", []) or [])
    special = torch.tensor([float(i in specials) for i in ids], device=device)
    missing = sorted({int(i) for i in ids} - cache.keys())
    if missing:
        for i, text in zip(missing, lm.tokenizer.convert_ids_to_tokens(missing)):
            cache[i] = (i not in specials) and is_punct(text or "")
    punct = torch.tensor([float(cache[int(i)]) for i in ids], device=device)
    return special, punct


def unit_sequence(lm, ids: Seq[int], units, stats: RowStats, device, cache: dict[int, bool]) -> Sequence:
    """A word-level :class:`Sequence`: ``units[t]`` is the unit (word; a special token is a unit of
    its own) of token ``t``, non-decreasing from 0. Its ``n`` counts units; a unit is special when
    its token is, punctuation when the text of its pieces is; rows sampled from the units."""
    import torch

    u = np.asarray(units, dtype=np.int64)
    if len(u) != len(ids) or (len(u) and (u[0] != 0 or (np.diff(u) < 0).any() or (np.diff(u) > 1).any())):
        raise ValueError("units must number the tokens' words 0, 1, 2, ... in order")
    U = int(u[-1]) + 1 if len(u) else 0
    specials = set(getattr(lm.tokenizer, "all_special_ids", []) or [])
    texts = [""] * U
    special = np.zeros(U, dtype=np.float32)
    for t, piece in zip(u, lm.tokenizer.convert_ids_to_tokens(list(ids))):
        texts[t] += piece or ""
    for t, i in zip(u, ids):
        special[t] = max(special[t], float(int(i) in specials))
    punct = np.array([float(not special[j] and is_punct(texts[j])) for j in range(U)], dtype=np.float32)
    starts = np.searchsorted(u, np.arange(U)).tolist()
    return Sequence(U, torch.as_tensor(special, device=device), torch.as_tensor(punct, device=device),
                    js_rows=sample_by_digest(U, sequence_digest(ids), stats.js_rows, stats.seed),
                    units=torch.as_tensor(u, device=device), token_n=len(ids), unit_start=starts,
                    unit_counts=torch.as_tensor(np.bincount(u, minlength=U).astype(np.float32), device=device))


def make_sequences(lm, sequences: Seq[Seq[int]], stats: RowStats,
                   targets: Seq[dict[str, Seq[int]] | None] | None = None, device=None,
                   extras: Seq[dict[str, Any] | None] | None = None,
                   units: Seq[Any] | None = None) -> list[Sequence]:
    """The per-sequence records the tile code needs (key masks, targets, sampled rows).

    ``extras``: per sequence, optional ``{"classes": {name: [n] 0/1}, "from": {name: [n] 0/1},
    "max_below": float}`` (see :class:`~attnscope.engines.rows.Sequence`)."""
    import torch

    cache: dict[int, bool] = {}
    out = []
    for b, ids in enumerate(sequences):
        if units is not None and units[b] is not None:
            if (targets is not None and targets[b]) or (extras is not None and extras[b]):
                raise ValueError("word-level sequences take no targets or extra classes")
            out.append(unit_sequence(lm, ids, units[b], stats, device, cache))
            continue
        special, punct = _key_masks(lm, ids, device, cache)
        tg = {}
        if targets is not None and targets[b]:
            tg = {k: torch.as_tensor(list(v), dtype=torch.long, device=device) for k, v in targets[b].items()}
        seq = Sequence(len(ids), special, punct, tg,  # a probe (targets) has no rows for distances
                       [] if tg else sample_rows(list(ids), stats.js_rows, stats.seed))
        extra = extras[b] if extras is not None else None
        if extra:
            names = tuple(extra.get("classes", {}))
            if names:
                seq.classes = torch.stack([torch.as_tensor(np.asarray(extra["classes"][k], dtype=np.float32))
                                           for k in names], 1).to(device)  # [n C]
                seq.class_names = names
            seq.from_masks = {k: torch.as_tensor(np.asarray(v, dtype=np.float32), device=device)
                              for k, v in extra.get("from", {}).items()}
            seq.max_below = extra.get("max_below")
        out.append(seq)
    return out


def attend_hook(stats: RowStats, seqs: list[Sequence], plan: Plan, chunk: int = 0,
                attention_dtype: str = "float32") -> Callable:
    """The forward helper's ``"attend"`` hook of the streaming engine: for each layer, fold the
    statistics of every sequence of the batch (begun in ``stats``) and return the heads' outputs
    ``P V`` computed with them, so the layer's own attention does not run.

    Each sequence goes through the backend ``plan`` gives it (:meth:`Plan.backend_for
    <attnscope.engines.plan.Plan.backend_for>`, decided once for the pass): where the pass's maps
    fit the caller's budget, each layer's eager map (:mod:`~attnscope.engines.eager`, the
    reference); on CUDA the one-pass kernel (:mod:`~attnscope.engines.onepass`), else
    FlexAttention (:mod:`~attnscope.engines.flex`); on the CPU a sequence of token rows that is not
    a probe is one call of the compiled kernel; the rest goes to the fallback, tiles of whole rows
    (``chunk`` query rows, 0: by the device; :mod:`~attnscope.engines.tiled`).

    ``attention_dtype="bfloat16"``: the queries, keys and values are rounded to bfloat16 first,
    as ``scaled_dot_product_attention`` rounds them under bfloat16 autocast (see
    :func:`stream_stats`).
    """
    import torch

    scratch = [None, None, None]  # a tile's scores, weights and mass per distance: kept across the layers
    chosen: list = []  # each sequence's backend, chosen on the first layer's device

    def hook(site, query):
        if attention_dtype == "bfloat16":
            site = dataclasses.replace(site, **{k: getattr(site, k).to(torch.bfloat16)
                                                for k in ("query", "key", "value")})
        # float32 sums whatever the forward pass runs in (autocast would turn matmul to bfloat16)
        with torch.autocast(device_type=query.device.type, enabled=False):
            return _layer(site, query.dtype).to(query.dtype)

    def _layer(site, dtype):
        """The statistics and, from the same computation, the heads' outputs ``[B T Hq d]``
        (``P V``, float32; rows past a sequence's end are 0) of every sequence."""
        q = site.query
        seq_len = [seq.token_n if seq.units is not None else seq.n for seq in seqs]
        if not chosen:
            chosen.extend(backends.get(plan.backend_for(token_level=seq.units is None, probe=bool(seq.targets),
                                                        tokens=seq_len[b]))
                          for b, seq in enumerate(seqs))
        # the keys and values in float32, and the output, for the backends that take them so (the
        # one-pass kernel reads the model's own and writes the output in the query's dtype)
        own = all(c.native_dtype for c in chosen)
        v = site.value if own else site.value.float()
        k = site.key if own else site.key.float()  # [B Hkv T d], read transposed by Q K^T
        cap = site.softcap
        B, H, T = q.shape[:3]
        out = v.new_zeros(B, T, H, v.shape[-1], dtype=dtype if own else torch.float32)  # [B T Hq d]
        layer = LayerInput(site, stats, k, v, out, cap, seq_len, chunk, scratch, sink_mass="sink-scale" not in plan.needs)
        for b, seq in enumerate(seqs):
            chosen[b].run(layer, b, seq)
        return out

    return hook


@contextmanager
def float32_attention(lm):
    """Within the block, under bfloat16 autocast, each layer's attention module (the parent of
    the family table's ``query`` projection: its query, key, value and, for decoders, output
    projections) runs in float32, so the scores the tiles compute in float32 are not made of
    bfloat16-rounded queries and keys, and the attention output the next layers read is not
    rounded either; the MLPs stay in bfloat16. Nothing changes without autocast, for a model
    whose weights are not float32, or for a family without a ``query`` path in the table (or
    with one module shared by all layers)."""
    import torch

    device = model_device(lm.model).type
    query = lm.family.query or ""
    mods = [module_at(lm.model, query.rsplit(".", 1)[0].format(layer=i))
            for i in range(lm.num_layers)] if "{layer}" in query else []
    if not (torch.is_autocast_enabled(device) and mods and None not in mods
            and all(w.dtype == torch.float32 for m in mods for w in m.parameters())):
        yield
        return

    def upcast(x):
        return x.float() if torch.is_tensor(x) and x.is_floating_point() else x

    def exact(call):
        def run(*args, **kwargs):
            with torch.autocast(device_type=device, enabled=False):
                return call(*map(upcast, args), **{k: upcast(v) for k, v in kwargs.items()})
        return run

    for m in mods:
        m.forward = exact(m.forward)
    try:
        yield
    finally:
        for m in mods:
            del m.forward


def forward_dtype(lm) -> str:
    """``"bfloat16"`` where the forward pass runs in bfloat16 here (bfloat16 autocast on the
    model's device, or bfloat16 weights), else ``"float32"``."""
    import torch

    device = model_device(lm.model).type
    if torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.bfloat16:
        return "bfloat16"
    return "bfloat16" if next(lm.model.parameters()).dtype == torch.bfloat16 else "float32"


def stream_stats(lm, sequences: Seq[Seq[int]], stats: RowStats, *, chunk: int = 0,
                 batch_size: int = 1, targets: Seq[dict[str, Seq[int]] | None] | None = None,
                 progress: Callable[[int], None] | None = None,
                 reference: RowStats | None = None,
                 extras: Seq[dict[str, Any] | None] | None = None,
                 units: Seq[Any] | None = None, backend: str = "auto",
                 attention_dtype: str = "auto", maps_fit: bool = False, plan: Plan | None = None) -> None:
    """Fold every layer and head of ``lm`` on token id ``sequences`` into ``stats``.

    ``chunk``: query rows per tile (0: :func:`~attnscope.engines.tiled.auto_tile` per sequence; the one-call CPU kernel
    picks its own blocks). ``targets``: per sequence, name -> key index per row (-1:
    none), e.g. from :func:`induction_sequences`. The statistics do not depend on ``chunk`` or
    ``batch_size`` (up to float32 rounding).

    ``units``: per sequence, None (token level) or the unit of each token (word level, see
    :func:`unit_sequence`): tiles then hold whole words and are folded per word.

    ``backend``: ``"auto"`` (by memory, device and input), or the one to use where it takes the
    input (``"maps"``, ``"onepass"``, ``"flex"``, ``"compiled"``, ``"tiles"``;
    :mod:`attnscope.engines.backends`); the statistics do not depend on it (up to float32
    rounding). ``maps_fit``: the caller's memory budget holds this pass's maps, so ``auto`` folds
    each layer's eager map (the ``maps`` backend). ``plan``: the pass's
    :class:`~attnscope.engines.plan.Plan` where the caller made one (a family, from its options);
    else it is made here from ``backend``, ``attention_dtype`` and ``maps_fit``, and what it
    refuses is refused before the pass.

    ``attention_dtype``: what the scores are made of. ``"auto"`` (the default): the forward pass's
    dtype (:func:`forward_dtype`: bfloat16 under bfloat16 autocast or with bfloat16 weights, else
    float32). ``"float32"``: under bfloat16 autocast the
    attention modules run in float32 (:func:`float32_attention`), so the queries and keys are
    not rounded. ``"bfloat16"``: the attention modules run as the forward pass runs them and
    the queries, keys and values (after the rotary embedding) are rounded to bfloat16, as
    ``scaled_dot_product_attention`` does under bfloat16 autocast: the statistics of the bare
    bfloat16 flash forward's own attention (products of bfloat16 values, exact in float32; sums
    in float32), which the one-pass kernel computes on a GPU's tensor cores. There it also rounds
    ``P`` to bfloat16 for the layer's output, as FlashAttention does, so from the second layer on
    its statistics differ from another backend's by that rounding.

    ``reference`` (for testing on deep models): also fold the family's eager probabilities of
    the same pass into it, so both see the very same queries and keys (the layers' output then
    comes from eager attention, not sdpa; a separate eager run would differ in the last bits
    of every layer's input, which 30 layers amplify to ~1e-5 in the statistics).
    """
    if chunk < 0:
        raise ValueError(f"chunk must be at least 1 (or 0: automatic), not {chunk}")
    device = lm.model.device  # where the statistics' tensors live: the model's device
    if plan is None:
        plan = make_plan(lm, longest=max((len(s) for s in sequences), default=2), batch_size=batch_size,
                         engine="maps" if maps_fit else "streaming", backend=backend,
                         attention_dtype=attention_dtype, token_level=units is None or all(u is None for u in units),
                         probes=bool(targets) and any(targets))
    attention_dtype = plan.attention_dtype
    if attention_dtype == "auto":
        attention_dtype = forward_dtype(lm)
    for start in range(0, len(sequences), batch_size):
        batch = [list(s) for s in sequences[start:start + batch_size]]
        tg = None if targets is None else targets[start:start + batch_size]
        ex = None if extras is None else extras[start:start + batch_size]
        un = None if units is None else units[start:start + batch_size]
        seqs = make_sequences(lm, batch, stats, tg, device, ex, un)
        for seq in seqs:
            stats.begin(lm.num_layers, lm.num_heads, seq)
        inputs = pad_batch(lm, batch)  # forward() moves it to the model's device

        hooks = {"attend": attend_hook(stats, seqs, plan, chunk, attention_dtype)}
        if reference is not None:
            ref_seqs = make_sequences(lm, batch, reference, tg, device, ex, un)
            for seq in ref_seqs:
                reference.begin(lm.num_layers, lm.num_heads, seq)

            def fold(site, probs, ref_seqs=ref_seqs):
                for b, seq in enumerate(ref_seqs):
                    n = seq.token_n if seq.units is not None else seq.n
                    fold_maps(reference, site.layer, seq, probs[b, :, :n, :n])

            hooks["attn"] = fold
        with float32_attention(lm) if attention_dtype == "float32" else nullcontext():
            forward(lm, inputs, hooks=hooks, lean_mask=True)
        for seq in seqs:
            stats.end(seq)
        if reference is not None:
            for seq in ref_seqs:
                reference.end(seq)
        if progress is not None:
            progress(len(batch))


def maps_update(lm, sequences: Seq[Seq[int]], stats: RowStats, *, batch_size: int = 1,
                targets: Seq[dict[str, Seq[int]] | None] | None = None, keep_all: bool = True,
                extras: Seq[dict[str, Any] | None] | None = None, units: Seq[Any] | None = None) -> None:
    """The same statistics from eager attention maps; the reference the streaming engine is
    tested against. ``keep_all``: request ``output_attentions`` (every layer's ``[B H T T]``
    held at once, as other tools do); otherwise each layer's map is folded by an ``"attn"``
    hook as it is made (one layer's maps in memory)."""
    for start in range(0, len(sequences), batch_size):
        batch = [list(s) for s in sequences[start:start + batch_size]]
        tg = None if targets is None else targets[start:start + batch_size]
        ex = None if extras is None else extras[start:start + batch_size]
        un = None if units is None else units[start:start + batch_size]
        seqs = make_sequences(lm, batch, stats, tg, lm.model.device, ex, un)
        for seq in seqs:
            stats.begin(lm.num_layers, lm.num_heads, seq)
        inputs = pad_batch(lm, batch)

        def fold(layer, probs, seqs=seqs):
            for b, seq in enumerate(seqs):
                n = seq.token_n if seq.units is not None else seq.n
                fold_maps(stats, layer, seq, probs[b, :, :n, :n])

        if keep_all:
            out = forward(lm, inputs, attentions=True)
            for layer, probs in enumerate(out.attentions):
                fold(layer, probs)
            del out
        else:
            forward(lm, inputs, hooks={"attn": lambda site, probs: fold(site.layer, probs)})
        for seq in seqs:
            stats.end(seq)


def induction_sequences(lm, count: int, half: int, seed: int = 0) -> tuple[list[list[int]], list[dict]]:
    """``count`` sequences ``[first] + r + r`` of ``half`` random tokens ``r`` repeated once, and
    their targets: for a row ``i`` of the second copy, ``duplicate`` is ``i - half`` (the same
    token earlier) and ``induction`` is ``i - half + 1`` (the token that followed it).

    ``first`` is the tokenizer's BOS token when it has one, else a random token. The tokens are
    drawn without replacement from the non-special vocabulary (seeded).
    """
    tok = lm.tokenizer
    specials = set(getattr(tok, "all_special_ids", []) or [])
    vocab = np.array([i for i in range(len(tok)) if i not in specials], dtype=np.int64)
    if len(vocab) < half + 1:
        raise ValueError(f"the vocabulary has fewer than {half + 1} ordinary tokens")
    rng = np.random.default_rng(seed)
    seqs, targets = [], []
    for _ in range(count):
        draw = rng.choice(vocab, size=half + 1, replace=False)
        first = tok.bos_token_id if tok.bos_token_id is not None else int(draw[-1])
        r = [int(x) for x in draw[:half]]
        ids = [int(first)] + r + r
        dup = [-1] * len(ids)
        ind = [-1] * len(ids)
        for i in range(half + 1, 2 * half + 1):
            dup[i] = i - half
            ind[i] = i - half + 1
        seqs.append(ids)
        targets.append({"duplicate": dup, "induction": ind})
    return seqs, targets
