"""DuoAttention's trained gates (Xiao et al. 2024, "DuoAttention: Efficient Long-Context LLM
Inference with Retrieval and Streaming Heads"): one gate ``a`` in [0, 1] per key/value head,
each head's attention the mix ``a * full + (1 - a) * (sink + window)`` (:class:`attnscope.engines.
duo.GateMix`), trained so that the mixed model's last hidden states match the full model's on
the answer part of synthetic multi-passkey sequences (:func:`attnscope.data.tasks.passkey_training`)
while an L1 penalty pushes the gates down. A head whose gate stays high needs its whole cache.

As ``duo_attn/train.py``: every gate starts at 1 and is clamped to [0, 1] before each step;
the loss is ``sum_t mean_d (h_full - h_mixed)^2 / |labels| + reg * sum |a|`` over the label
positions ``t``; AdamW (no weight decay) at ``lr`` with their schedule (linear warm-up over the
first fifth of the steps from 0.1 x, flat, linear decay over the last fifth to 0.1 x); one
sequence per step. The model's weights are not trained.

Training is one sequence of chunks (:class:`GateTraining`, run through
:meth:`attnscope.families.base.Context.chain`): each chunk starts from the previous one's gates
and optimiser state, so a killed run resumes at the last finished chunk with the same numbers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnscope.analyses.base import Result
from attnscope.data.io import read_text
from attnscope.data.tasks import TrainingSample
from attnscope.engines.duo import GateMix
from attnscope.errors import InputError
from attnscope.models.forward import hidden_states


def learning_rate(step: int, steps: int, lr: float) -> float:
    """DuoAttention's schedule at ``step`` (0-indexed) of ``steps``.

    >>> [round(learning_rate(s, 10, 1.0), 2) for s in (0, 1, 2, 5, 8, 9)]
    [0.5, 1.0, 1.0, 1.0, 1.0, 0.5]
    """
    fifth = max(steps // 5, 1)
    return lr * min(1.0, max((step + 1) / fifth, 0.1), max((steps - step) / fifth, 0.1))


@dataclass
class GateTraining:
    """Steps ``start .. stop - 1`` of the training (one chunk, ``chunk(lm, (start, stop), previous)``
    with ``previous`` the record of the chunk before, None for the first): the gates ``[L Hkv]``
    and AdamW's state after them, and each step's losses (plain lists)."""

    samples: Sequence[TrainingSample]
    steps: int
    sink: int
    window: int
    lr: float = 0.02
    reg: float = 0.05

    def __call__(self, lm, span: tuple[int, int], previous: dict | None) -> dict:
        import torch

        L, K = lm.num_layers, lm.num_kv_heads
        device = lm.device
        gates = torch.ones(L, K, dtype=torch.float32, device=device)
        if previous is not None:
            gates = torch.tensor(previous["gates"], dtype=torch.float32, device=device)
        gates.requires_grad_(True)
        opt = torch.optim.AdamW([gates], lr=self.lr, weight_decay=0.0)
        if previous is not None:
            a = previous["adam"]
            opt.state[gates] = {"step": torch.tensor(float(a["step"])),
                                "exp_avg": torch.tensor(a["exp_avg"], dtype=torch.float32, device=device),
                                "exp_avg_sq": torch.tensor(a["exp_avg_sq"], dtype=torch.float32, device=device)}
        mix = GateMix(gates, self.sink, self.window)
        losses = []
        t0 = time.perf_counter()
        for step in range(*span):
            sample = self.samples[step % len(self.samples)]
            ids = torch.tensor([sample.ids], device=device)
            with torch.no_grad():
                gates.clamp_(0.0, 1.0)
                target = hidden_states(lm, ids)[0, sample.labels_from:].float()
            for group in opt.param_groups:
                group["lr"] = learning_rate(step, self.steps, self.lr)
            with torch.enable_grad():
                hidden = hidden_states(lm, ids, {"attend": mix})[0, sample.labels_from:].float()
                distill = (target - hidden).pow(2).mean(-1).sum() / len(target)
                reg = gates.abs().sum()
                loss = distill + self.reg * reg
                (grad,) = torch.autograd.grad(loss, [gates])
            gates.grad = grad.to(gates.dtype)
            opt.step()
            opt.zero_grad()
            losses.append({"step": step + 1, "distill": distill.item(), "reg": reg.item(),
                           "loss": loss.item(), "lr": opt.param_groups[0]["lr"]})
        with torch.no_grad():
            gates.clamp_(0.0, 1.0)
        state = opt.state[gates]
        return {"gates": gates.detach().cpu().double().tolist(),
                "adam": {"step": float(state["step"]), "exp_avg": state["exp_avg"].cpu().tolist(),
                         "exp_avg_sq": state["exp_avg_sq"].cpu().tolist()},
                "losses": losses, "seconds": time.perf_counter() - t0}


def chunks(steps: int, size: int) -> list[tuple[int, int]]:
    """``[start, stop)`` spans of at most ``size`` steps covering ``steps``.

    >>> chunks(25, 10)
    [(0, 10), (10, 20), (20, 25)]
    """
    return [(a, min(a + size, steps)) for a in range(0, steps, size)]


#: Beside a pattern file written by ``attnscope analyze duo``: each gate's mean over training.
HELD = "held.tsv"


def read_gates(path, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray | None]:
    """The gates of a pattern file or folder (:func:`read_pattern`) and, where ``attnscope
    analyze duo`` wrote it beside them, how long each stayed open (:data:`HELD`; else None)."""
    path = Path(path)
    file = path / "full_attention_heads.tsv" if path.is_dir() else path
    held = file.parent / HELD
    return read_pattern(file, shape), (read_pattern(held, shape) if held.is_file() else None)


def read_pattern(path, shape: tuple[int, int]) -> np.ndarray:
    """A DuoAttention pattern file (``full_attention_heads.tsv``: one line per layer, one
    tab-separated value per KV head; DuoAttention's released patterns and attnscope's own) as
    ``[L Hkv]``, checked against the model's ``shape``; a folder means its
    ``full_attention_heads.tsv``. Errors name the file and line."""
    path = Path(path)
    if path.is_dir():
        path = path / "full_attention_heads.tsv"
    rows = []
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = [float(x) for x in line.split("\t") if x.strip()]
        except ValueError:
            raise InputError(path, "not tab-separated numbers", lineno) from None
        if len(row) != shape[1] or not all(np.isfinite(row)):
            raise InputError(path, f"{len(row)} values; the model has {shape[1]} key/value heads a layer"
                             if len(row) != shape[1] else "a value that is not a finite number", lineno)
        rows.append(row)
    if len(rows) != shape[0]:
        raise InputError(path, f"{len(rows)} lines; the model has {shape[0]} layers")
    return np.asarray(rows)


def order(gates: np.ndarray, held: np.ndarray | None = None) -> np.ndarray:
    """KV heads (flat ``layer * Hkv + kv_head``) from the highest gate down; gates that ended
    equal (many end clamped at exactly 0) by ``held``, how long each stayed open, then by index.

    >>> order(np.array([[0.0, 0.5], [0.0, 0.0]]), np.array([[0.1, 0.6], [0.3, 0.1]])).tolist()
    [1, 2, 0, 3]
    """
    g = gates.ravel()
    h = np.zeros_like(g) if held is None else held.ravel()
    return np.lexsort((np.arange(len(g)), -h, -g))


def summarise(snapshots: Sequence[np.ndarray], losses: list[dict], *, seconds: float, params: dict, seed: int,
              length: int, labels: int, source: str) -> Result:
    """The training's :class:`~attnscope.analyses.base.Result`: per KV head its final gate, its
    mean over the chunks' ends ``held`` (how long it stayed open: the tie-break of gates that
    ended equal) and its rank (1: the most needed, :func:`order`), each step's losses, what it
    cost, and the arrays ``gates`` and ``held`` ``[L Hkv]``."""
    gates = np.asarray(snapshots[-1], dtype=float)
    held = np.mean(np.asarray(snapshots, dtype=float), axis=0)
    L, K = gates.shape
    rank = np.empty(L * K, dtype=int)
    rank[order(gates, held)] = np.arange(1, L * K + 1)
    rows = [{"layer": layer, "kv_head": k, "gate": float(gates[layer, k]), "held": float(held[layer, k]),
             "rank": int(rank[layer * K + k])} for layer in range(L) for k in range(K)]
    res = Result("duo", params={**params, "seed": seed, "tokens_per_step": length, "label_tokens": labels,
                                "kv_head_index": "0-indexed"},
                 tables={"gates": rows, "training": losses},
                 meta={"source": source, "steps": len(losses), "seconds": seconds,
                       "seconds_per_step": seconds / max(len(losses), 1),
                       "open": int((gates >= 0.5).sum()), "kv_heads": L * K})
    res.arrays["gates"] = gates
    res.arrays["held"] = held
    return res
