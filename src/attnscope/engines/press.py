"""The press: a decoder's attention with some key/value heads cut to sink + window, computed
inside attention through the forward helper's ``"attend"`` hook (:class:`Press`), and the two
passes of kvpress's protocol that use it: one full-attention prefill of a task's context
(:func:`prefill`) and greedy answers of many compressed-cache rows on that one prefill
(:func:`answer`), or their teacher-forced scores (:func:`score`). The evicted entries are
masked out of the softmax, which is exactly eviction: positions are those of the full context,
as in kvpress. :class:`Recorder` folds what the
atlas's scores need from a full-cache run (docs/atlas.md).

Two ways to compute the same numbers (``fused``; by default fused on CUDA, torch elsewhere):

- torch: the recorded prefill in tiles of ``chunk`` rows, the rows after the context as one
  ``[rows x n]`` product per KV head;
- fused (:mod:`attnscope.engines.flex`, FlexAttention): no row of scores is held. The recorded
  prefill is one call for the output and each row's log-sum-exp ``L_i``; the first and previous
  keys' weights are ``exp(s_ij - L_i)`` (``O(n d)``) and the sink + window mass is the sink keys'
  weights plus ``exp(L_i^band - L_i)`` of a call restricted to distances ``0 .. window - 1``. The
  rows after the context (a row batch of ``B`` rows of ``T`` tokens) are ``B T`` query rows of
  one call over the shared context keys, whose mask keeps a KV head's whole context in the rows
  that keep it and only sink + window in the others (a per-row, per-head mask, no copy of the
  keys); their few keys after the context are one small product, and the two parts meet through
  their log-sum-exps: ``L = logaddexp(L_ctx, L_new)``, ``out = e^(L_ctx - L) out_ctx + e^(L_new - L) out_new``.
  A recorded answer (calibration, one row) stays in torch: it needs whole rows (SnapKV's mass,
  the arg-max key), ``O(T n)``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from attnscope.engines import flex
from attnscope.extract.tasks import Encoded
from attnscope.models.forward import hooked

#: the model mechanisms (:data:`attnscope.models.facts.MECHANISMS`) the press computes as the model
#: does (its masks are its own: full causal attention with the evicted keys out; no sinks, no ALiBi)
COMPUTES = frozenset({"softcap", "scale", "value-size"})


@dataclass
class Recorder:
    """What one full-cache run of a task (batch of 1) leaves for the scores: per layer, the
    streaming, first-token and previous-token mass summed over the context rows ``i >= sink +
    window`` (``rows`` of them), the question rows' mass outside sink + window (``snapkv``,
    mean over the question's rows), and each later call's arg-max key per head (``top``)."""

    L: int
    H: int
    streaming: np.ndarray = None
    sink_mass: np.ndarray = None
    previous: np.ndarray = None
    rows: int = 0
    snapkv: np.ndarray = None
    top: list = field(default_factory=list)  # per call after the prefill: [L H] arg-max key

    def __post_init__(self):
        z = lambda: np.zeros((self.L, self.H))  # noqa: E731
        self.streaming, self.sink_mass, self.previous, self.snapkv = z(), z(), z(), z()


class Press:
    """The ``"attend"`` hook that computes each layer's attention itself, in float32.

    During the prefill (``context`` None) the rows are the context's own, causal, computed in
    tiles of ``chunk`` rows (only when a ``recorder`` folds their statistics; a plain prefill
    is the model's fused attention). Afterwards ``context`` holds each layer's prefilled keys
    and values (``[1 Hkv n d]``, shared by every batch row, never copied) and the model runs
    without a cache: the hook keeps each row's later keys and values (question, answer)
    itself and attends over context + those. ``full``: bool ``[B L Hkv]``, the KV heads of
    each row that keep their whole context (None: all); any other KV head sees only context
    keys ``j < sink`` or ``j >= n - window``, and every key after the context.

    Grouped-query heads are computed without copying keys: the ``g`` query heads of KV head
    ``k`` are the rows of one ``[g*T d] x [d K]`` product (query head ``h`` uses KV head
    ``h // g``, as transformers' ``repeat_kv``).
    """

    def __init__(self, layers: int, n: int, sink: int, window: int, *, context: list | None = None,
                 full: np.ndarray | None = None, recorder: Recorder | None = None, chunk: int = 128,
                 fused: bool = False):
        self.layers, self.n, self.sink, self.window, self.chunk = layers, n, sink, window, chunk
        self.context, self.full, self.recorder, self.fused = context, full, recorder, fused
        self.new: list = [None] * layers  # per layer: keys, values [B Hkv t d] after the context
        self.calls = 0  # forward calls finished since the prefill

    def __call__(self, site, query):
        import torch

        if self.context is None and self.recorder is None:
            return None  # a plain prefill: the model's own fused attention
        with torch.autocast(device_type=query.device.type, enabled=False):
            q = query.float()
            if self.context is None:
                out = self._prefill_fused(site, q) if self.fused else self._prefill(site, q)
            else:
                out = self._decode_fused(site, q) if self.fused and self.recorder is None else self._decode(site, q)
        if site.layer == self.layers - 1:
            self.calls += 1
        return out.to(query.dtype)

    @staticmethod
    def _capping(site) -> float | None:
        """The family's logit soft-capping ``c`` (Gemma 2), or None."""
        return getattr(getattr(site.module, "config", None), "attn_logit_softcapping", None)

    @classmethod
    def _cap(cls, site, s):
        """Scores soft-capped as the family does (Gemma 2: ``c tanh(s / c)``), else as they are."""
        import torch

        cap = cls._capping(site)
        return torch.tanh(s / cap) * cap if cap else s

    def _prefill(self, site, q):
        import torch

        B, Hq, T, _ = q.shape
        k, v = site.key.float(), site.value.float()
        Hkv, g = k.shape[1], Hq // k.shape[1]
        out = q.new_zeros(B, Hkv, g, T, v.shape[-1])
        for t0 in range(0, T, max(1, self.chunk)):
            t1 = min(T, t0 + self.chunk)
            rows = (q[:, :, t0:t1] * site.scaling).reshape(B, Hkv, g * (t1 - t0), -1)
            s = self._cap(site, torch.matmul(rows, k[:, :, :t1].transpose(-1, -2)))
            s = s.view(B, Hkv, g, t1 - t0, t1)
            pos = torch.arange(t0, t1, device=q.device)
            s.masked_fill_(torch.arange(t1, device=q.device)[None, :] > pos[:, None], float("-inf"))
            p = torch.softmax(s, dim=-1)
            out[:, :, :, t0:t1] = torch.matmul(p, v[:, :, None, :t1])
            self._record_rows(site.layer, p[0].reshape(Hq, t1 - t0, t1), pos)
        return out.view(B, Hq, T, -1).transpose(1, 2)

    def _prefill_fused(self, site, q):
        """:meth:`_prefill` without a row of scores: FlexAttention's output and log-sum-exps (one
        sequence: the task's context; a prefill without a recorder is the model's own attention)."""
        import torch

        k, v, cap, scale = site.key.float(), site.value.float(), self._capping(site), site.scaling
        n = q.shape[2]
        mask = flex.Mask(n, causal=True)
        out, lse, _ = flex.attend(q, k, v, mask, scale, flex.score_mod(cap))
        rec, sink, w = self.recorder, self.sink, self.window
        if n > sink + w:  # rows past sink + window to fold
            L, i = lse[0], torch.arange(n, device=q.device)  # [Hq n]

            def weight(j):  # every row's weight on key j[i]
                return flex.key_weight(q, k, L, mask, j, scale, cap)

            _, band, _ = flex.attend(q, k, v[..., :1], mask.band(0, w - 1), scale, flex.score_mod(cap),
                                     kind="band")
            local = torch.exp(band[0] - L) + sum(weight(torch.full_like(i, j)) for j in range(sink))
            rows = slice(sink + w, n)
            layer = site.layer
            rec.streaming[layer] += local[:, rows].sum(-1).double().cpu().numpy()
            rec.sink_mass[layer] += weight(torch.zeros_like(i))[:, rows].sum(-1).double().cpu().numpy()
            rec.previous[layer] += weight(i - 1)[:, rows].sum(-1).double().cpu().numpy()
            if layer == 0:
                rec.rows += n - sink - w
        return out.transpose(1, 2)

    def _decode_fused(self, site, q):
        """:meth:`_decode` without a row of scores over the context: the ``B T`` rows are the
        query rows of one FlexAttention call over the shared context keys (row ``b T + t``), masked
        per row and KV head; the keys after the context are one small product; the two parts are
        joined through their log-sum-exps."""
        import torch

        B, Hq, T, d = q.shape
        kc, vc = (x.float() for x in self.context[site.layer])  # [1 Hkv n d]
        kn, vn = site.key.float(), site.value.float()
        if self.new[site.layer] is not None:
            kn = torch.cat([self.new[site.layer][0], kn], 2)
            vn = torch.cat([self.new[site.layer][1], vn], 2)
        self.new[site.layer] = (kn, vn)
        Hkv, n, t = kc.shape[1], kc.shape[2], kn.shape[2]
        g, cap, scale = Hq // Hkv, self._capping(site), site.scaling
        rows = q.transpose(0, 1).reshape(1, Hq, B * T, d)
        mod = None  # every row sees the whole context
        if self.full is not None and not self.full[:, site.layer].all():
            keep = torch.as_tensor(self.full[:, site.layer].copy(), device=q.device)  # [B Hkv]
            # the constants as tensors: one compiled kernel whatever the lengths
            per, heads = torch.tensor(T, device=q.device), torch.tensor(g, device=q.device)
            sink, edge = torch.tensor(self.sink, device=q.device), torch.tensor(n - self.window, device=q.device)

            def mod(b, h, qi, kj):
                return keep[qi // per, h // heads] | (kj < sink) | (kj >= edge)

        oc, lc, _ = flex.attend(rows, kc, vc, None, scale, flex.score_mod(cap),
                                blocks=self._every_block(B * T, n, q.device, mod))
        oc = oc[0].view(Hq, B, T, d).transpose(0, 1)  # [B Hq T d]
        lc = lc[0].view(Hq, B, T).transpose(0, 1)
        sn = torch.matmul((q * scale).reshape(B, Hkv, g * T, d), kn.transpose(-1, -2))
        sn = self._cap(site, sn).view(B, Hkv, g, T, t)
        later = torch.arange(t, device=q.device)[None, :] > torch.arange(t - T, t, device=q.device)[:, None]
        sn = sn.masked_fill(later, float("-inf")).view(B, Hq, T, t)
        ln = torch.logsumexp(sn, -1)
        on = torch.matmul(torch.softmax(sn, -1).view(B, Hkv, g * T, t), vn).view(B, Hq, T, d)
        L = torch.logaddexp(lc, ln)
        out = torch.exp(lc - L)[..., None] * oc + torch.exp(ln - L)[..., None] * on
        return out.transpose(1, 2)

    @staticmethod
    def _every_block(m: int, n: int, device, mod=None):
        """FlexAttention's block mask over every block of ``m`` rows and ``n`` keys: partial
        (``mod(b, h, q, k)`` decides each entry) or, without ``mod``, full."""
        import torch
        from torch.nn.attention.flex_attention import BlockMask

        nq, nk = -(-m // flex.BLOCK), -(-n // flex.BLOCK)
        idx = torch.arange(nk, device=device, dtype=torch.int32).expand(1, 1, nq, nk).contiguous()
        every, none = (torch.full((1, 1, nq), c, dtype=torch.int32, device=device) for c in (nk, 0))
        if mod is None:
            return BlockMask.from_kv_blocks(none, idx, every, idx, BLOCK_SIZE=flex.BLOCK,
                                            seq_lengths=(m, n), compute_q_blocks=False)
        return BlockMask.from_kv_blocks(every, idx, BLOCK_SIZE=flex.BLOCK, mask_mod=mod,
                                        seq_lengths=(m, n), compute_q_blocks=False)

    def _decode(self, site, q):
        """Rows after the context: ``softmax([s_ctx, s_new]) [V_ctx; V_new]`` in two parts
        sharing one normaliser, the context's part with the KV heads leading the batch so that
        its keys and values are never copied per row."""
        import torch

        B, Hq, T, d = q.shape
        kc, vc = (x[0].float() for x in self.context[site.layer])  # [Hkv n d]
        kn, vn = site.key.float(), site.value.float()  # this call's rows [B Hkv T d]
        if self.new[site.layer] is not None:
            kn = torch.cat([self.new[site.layer][0], kn], 2)
            vn = torch.cat([self.new[site.layer][1], vn], 2)
        self.new[site.layer] = (kn, vn)
        Hkv, n, t = kc.shape[0], kc.shape[1], kn.shape[2]
        g = Hq // Hkv
        qs = (q * site.scaling).reshape(B, Hkv, g * T, d)
        sc = torch.matmul(qs.transpose(0, 1).reshape(Hkv, B * g * T, d), kc.transpose(-1, -2))
        sc = self._cap(site, sc).view(Hkv, B, g * T, n)
        if self.full is not None and not self.full[:, site.layer].all():
            j = torch.arange(n, device=q.device)
            window = (j < self.sink) | (j >= n - self.window)
            full = torch.as_tensor(self.full[:, site.layer].T.copy(), device=q.device)  # [Hkv B]
            sc.masked_fill_(~(full[:, :, None, None] | window), float("-inf"))
        sn = self._cap(site, torch.matmul(qs, kn.transpose(-1, -2))).view(B, Hkv, g, T, t)
        rows = torch.arange(t - T, t, device=q.device)  # the rows among the keys after the context
        sn = sn.masked_fill(torch.arange(t, device=q.device)[None, :] > rows[:, None], float("-inf"))
        sn = sn.view(B, Hkv, g * T, t).transpose(0, 1)  # [Hkv B gT t]
        m = torch.maximum(sc.amax(-1, keepdim=True), sn.amax(-1, keepdim=True))
        ec, en = torch.exp(sc - m), torch.exp(sn - m)
        z = ec.sum(-1, keepdim=True) + en.sum(-1, keepdim=True)
        out = torch.matmul(ec.view(Hkv, B * g * T, n), vc).view(Hkv, B, g * T, d)
        out = (out + torch.matmul(en, vn.transpose(0, 1))) / z  # [Hkv B gT d]
        if self.recorder is not None:
            p = torch.cat([ec[:, 0], en[:, 0]], -1) / z[:, 0]  # [Hkv gT n+t]
            self._record_answer(site.layer, p.reshape(Hq, T, n + t))
        return out.transpose(0, 1).reshape(B, Hq, T, d).transpose(1, 2)

    def _record_rows(self, layer: int, p, pos) -> None:
        """Fold context rows ``pos`` (``>= sink + window`` only) of one layer's ``p`` ``[Hq c k1]``."""
        import torch

        rec, sink, w = self.recorder, self.sink, self.window
        use = pos >= sink + w
        if rec is None or not bool(use.any()):
            return
        p, pos = p[:, use], pos[use]
        cols = torch.arange(p.shape[-1], device=p.device)[None, :]
        local = (cols < sink) | ((cols > pos[:, None] - w) & (cols <= pos[:, None]))
        rec.streaming[layer] += (p * local).sum((-1, -2)).double().cpu().numpy()
        rec.sink_mass[layer] += p[:, :, 0].sum(-1).double().cpu().numpy()
        prev = p.gather(2, (pos - 1)[None, :, None].expand(p.shape[0], -1, 1))
        rec.previous[layer] += prev.sum((-1, -2)).double().cpu().numpy()
        if layer == 0:
            rec.rows += int(use.sum())

    def _record_answer(self, layer: int, p) -> None:
        """The question's rows (the first call): SnapKV's observation window, its mass on the
        context outside sink + window; every call: each head's arg-max key of the last row."""
        rec, n = self.recorder, self.n
        if self.calls == 0:
            middle = p[:, :, self.sink:max(self.sink, n - self.window)].sum(-1)  # [Hq T]
            rec.snapkv[layer] = middle.mean(-1).double().cpu().numpy()
        if layer == 0:
            rec.top.append(np.zeros((rec.L, rec.H), dtype=np.int64))
        rec.top[-1][layer] = p[:, -1].argmax(-1).cpu().numpy()


def fused_on(model, fused: bool | None = None) -> bool:
    """Whether the press runs fused (:class:`Press`): as asked, else on CUDA when this torch has
    FlexAttention."""
    return fused if fused is not None else model.device.type == "cuda" and flex.available()


def prefill(lm, model, enc: Encoded, recorder: Recorder | None = None, *, sink: int = 4,
            window: int = 64, fused: bool | None = None) -> list:
    """Each layer's keys and values ``[1 Hkv n d]`` of the context after one full-attention
    pass (``recorder``: its rows' statistics too; ``fused``: :func:`fused_on`)."""
    import torch

    press = Press(lm.num_layers, len(enc.context), sink, window, recorder=recorder,
                  fused=fused_on(model, fused))
    with torch.no_grad(), hooked(lm, {"attend": press}):
        out = model(input_ids=torch.tensor([enc.context], device=model.device), use_cache=True)
    return [(lay.keys, lay.values) for lay in out.cache.layers]


def answer(lm, model, context: list, enc: Encoded, full: np.ndarray | None, *, sink: int,
           window: int, recorder: Recorder | None = None, eos: frozenset[int] = frozenset(),
           fused: bool | None = None) -> list[list[int]]:
    """Read the question and generate greedily after the prefilled ``context`` (from
    :func:`prefill`, unchanged) for each row of ``full`` (``[B L Hkv]``; None: one row with the
    whole context). A row stops at an end-of-sequence id (kept) or after ``enc.max_new``
    tokens."""
    import torch

    B = 1 if full is None else len(full)
    n = len(enc.context)
    press = Press(lm.num_layers, n, sink, window, context=context, full=full, recorder=recorder,
                  fused=fused_on(model, fused))
    outs: list[list[int]] = [[] for _ in range(B)]
    done = np.zeros(B, dtype=bool)
    ids = torch.tensor([enc.question] * B, device=model.device)
    at = n
    with torch.no_grad(), hooked(lm, {"attend": press}):
        for _ in range(enc.max_new):
            pos = torch.arange(at, at + ids.shape[1], device=model.device).expand(B, -1)
            logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits[:, -1]
            at += ids.shape[1]
            nxt = logits.argmax(-1).tolist()
            for b, tok in enumerate(nxt):
                if not done[b]:
                    outs[b].append(int(tok))
                    done[b] = int(tok) in eos
            if done.all():
                break
            ids = torch.tensor(nxt, device=model.device)[:, None]
    return outs


def score(lm, model, context: list, enc: Encoded, full: np.ndarray, gold: Sequence[int], *, sink: int,
          window: int, fused: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Teacher-forced, for each row of ``full`` (``[B L Hkv]``) after the prefilled ``context``:
    whether every token of ``gold`` is the arg-max given the question and the gold tokens before
    it (what greedy decoding would produce first), and ``gold``'s mean log-probability. One
    forward call per row batch, no generation loop."""
    import torch

    B, n, q = len(full), len(enc.context), len(enc.question)
    press = Press(lm.num_layers, n, sink, window, context=context, full=full, fused=fused_on(model, fused))
    ids = torch.tensor([list(enc.question) + list(gold[:-1])] * B, device=model.device)
    pos = torch.arange(n, n + ids.shape[1], device=model.device).expand(B, -1)
    with torch.no_grad(), hooked(lm, {"attend": press}):
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits[:, q - 1:].float()
    target = torch.tensor(list(gold), device=logits.device)
    logp = torch.log_softmax(logits, -1)[:, torch.arange(len(gold), device=logits.device), target]  # [B G]
    exact = (logits.argmax(-1) == target).all(-1)
    return exact.cpu().numpy(), logp.mean(-1).double().cpu().numpy()


class Prefills:
    """Prefilled contexts kept in this process (a greedy search answers the same tasks again
    and again), the oldest dropped beyond ``budget`` bytes; one per loaded model
    (:meth:`of`)."""

    @classmethod
    def of(cls, lm) -> "Prefills":
        """The prefills this process keeps for the loaded model ``lm`` (in ``lm.kept``)."""
        return lm.kept.setdefault("prefills", cls())

    def __init__(self, budget: int = 4 << 30):
        self.budget, self.kept = budget, OrderedDict()

    def get(self, lm, model, enc: Encoded, *, sink: int, window: int) -> list:
        key = (id(lm.model), len(enc.context), hash(tuple(enc.context)))
        if key in self.kept:
            self.kept.move_to_end(key)
            return self.kept[key]
        ctx = self.kept[key] = prefill(lm, model, enc, sink=sink, window=window)
        size = lambda c: sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in c)  # noqa: E731
        while len(self.kept) > 1 and sum(size(c) for c in self.kept.values()) > self.budget:
            self.kept.popitem(last=False)
        return ctx
