"""Training and scoring the probes: seeded minibatch Adam with early stopping on dev UAS.

Several probes that read the same sentences are trained in ONE pass over the stream per
epoch (each with its own optimiser and its own early stopping), so a store is read once per
epoch however many probes use it.

UAS = share of scored (non-punctuation) dependents whose highest-scoring candidate is the
gold head; each dependent picks its head independently (no tree decoding), as in the paper.
A dependent whose top score is shared by several candidates (e.g. an untrained probe, whose
scores are all 0) gets no prediction and counts as wrong, the rule of
:func:`attnscope.analyses.units.predict`.

Speed: the features of each sentence are built once (:class:`SentenceSource` caches them,
in memory or in a temporary file), minibatches hold sentences of similar length (padding
costs quadratically), the dev set is scored for all probes in one pass per epoch, in
batches sorted by length, and the attention + word vectors probe never builds its
``[B j i 2K]`` pair tensor. Together about 5x faster than attnscope 0.1 on EWT with the
same UAS within seed noise (``benchmarks/probes.py``).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from attnscope.analyses.probes.features import SentenceSource, collate
from attnscope.analyses.probes.models import right_branching
from attnscope.progress import Step
from attnscope.store.checkpoints import StateFile


@dataclass
class TrainConfig:
    """Training parameters (recorded in results)."""

    epochs: int = 10
    patience: int = 2  # epochs without dev improvement before stopping
    batch_size: int = 32  # sentences per minibatch
    lr: float = 0.01
    # the attention-only probe has only 2K weights on features in [0, 1]; at lr 0.01 it was
    # still gaining a point per epoch after 6 epochs on 2,000 EWT sentences, at 0.05 it
    # levels off by epoch 4 (docs/analyses-syntax.md). None: ``lr``.
    attn_lr: float | None = 0.05
    seed: int = 0
    buffer_chunks: int = 8  # shuffle window, in store shards
    eval_batch_size: int = 64  # sentences per dev batch (no gradients)
    by_length: bool = True  # minibatches of sentences of similar length

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class ProbeRun:
    """What training one probe produced."""

    name: str
    uas: float = float("nan")
    correct: int = 0
    total: int = 0
    best_epoch: int = 0
    epochs_run: int = 0
    history: list[dict] = field(default_factory=list)  # per epoch: loss, dev_uas, seconds
    seconds_per_epoch: float = float("nan")
    parameters: int = 0


def masked_scores(module, batch):
    """Scores with impossible candidates (padding, the word itself) at -inf: ``[B j i]``."""

    s = module(batch)
    return s.masked_fill(~batch.candidates, float("-inf"))


def predict_heads(scores):
    """``[B j]`` the highest-scoring candidate of each dependent, -1 where the top is shared
    or no candidate is allowed (``scores`` masked with -inf)."""
    import torch

    top = scores.max(-1, keepdim=True).values
    unique = (scores == top).sum(-1) == 1
    ok = unique & torch.isfinite(top[..., 0])
    return torch.where(ok, scores.argmax(-1), torch.full_like(scores[..., 0], -1, dtype=torch.long))


def evaluate(module, source: SentenceSource, batch_size: int = 64) -> tuple[int, int]:
    """``(correct, total)`` over the scored dependents of ``source``."""
    return evaluate_all({"m": module}, source, batch_size)["m"]


def evaluate_all(modules: dict, source: SentenceSource, batch_size: int = 64) -> dict[str, tuple[int, int]]:
    """``(correct, total)`` of every module, in one pass over ``source`` (batches sorted by length)."""
    import torch

    for m in modules.values():
        m.eval()
    out = {n: [0, 0] for n in modules}
    needs_attn = any(_needs_attn(m) for m in modules.values())
    with torch.no_grad():
        for sents in source.ordered_batches(batch_size, by_length=True):
            b = collate(sents, with_attn=needs_attn)
            mask = b.scored
            for n, m in modules.items():
                pred = predict_heads(masked_scores(m, b))  # [B j]
                out[n][0] += int(((pred == b.heads) & mask).sum())
                out[n][1] += int(mask.sum())
    return {n: (c, t) for n, (c, t) in out.items()}


def _needs_attn(module) -> bool:
    return getattr(module, "name", "") != "distance+glove"


def train_probes(modules: dict, train: SentenceSource, dev: SentenceSource, config: TrainConfig,
                 progress: Callable[[str, int, int | None], None] | None = None,
                 state: StateFile | None = None, label: str = "probes") -> dict[str, ProbeRun]:
    """Train every module in ``modules`` (name -> nn.Module) on ``train``; keep the state with
    the best dev UAS; stop a module after ``patience`` epochs without improvement.

    ``state``: where the training keeps everything it needs after each finished epoch (the
    probes' and optimisers' trained tensors, the best states, the shuffling generator, the
    histories), and from which a killed run goes on at the next epoch with the same numbers.
    ``label``: the progress steps' name ("<label> epoch <k>")."""
    import torch

    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    opts = {n: torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=_lr(m, config))
            for n, m in modules.items()}
    runs = {n: ProbeRun(n, parameters=sum(p.numel() for p in m.parameters() if p.requires_grad))
            for n, m in modules.items()}
    best_state = {n: copy.deepcopy(m.state_dict()) for n, m in modules.items()}
    best = {n: -1.0 for n in modules}
    waited = {n: 0 for n in modules}
    active = set(modules)
    needs_attn = any(_needs_attn(m) for m in modules.values())
    seen_sents = seen_deps = 0  # running count of training sentences and dependents
    first = 1
    kept = state.load() if state is not None else None
    if kept is not None:
        record, arrays = kept
        _restore(record, arrays, modules, opts, best_state)
        rng.bit_generator.state = record["rng"]
        runs = {n: ProbeRun(**d) for n, d in record["runs"].items()}
        best, waited, active = record["best"], record["waited"], set(record["active"])
        seen_sents, seen_deps, first = record["seen_sents"], record["seen_deps"], record["epoch"] + 1
        # what the killed run counted of train, for a run that redoes no epoch (never reads it)
        train.num_sentences, train.skipped = record.get("train_counts", (train.num_sentences, train.skipped))
    for epoch in range(first, config.epochs + 1):
        if not active:
            break
        own = {n: 0.0 for n in active}  # each probe's own training time (batches are shared)
        losses = {n: 0.0 for n in active}
        counts = {n: 0 for n in active}
        for m in (modules[n] for n in active):
            m.train()
        # the epoch's sentences: known after the first pass, expected from the store before
        name, total, done = Step(f"{label} epoch {epoch}", "sentences"), train.size, 0
        for sents in train.shuffled_batches(config.batch_size, rng, config.buffer_chunks, config.by_length):
            b = collate(sents, with_attn=needs_attn)
            target = b.heads.clone()  # [B j]; ROOT and padding rows are ignored (-1)
            seen_sents += len(sents)
            seen_deps += int((target >= 0).sum())
            # with length buckets a batch of long sentences holds many more dependents than
            # one of short sentences; dividing the summed loss by the dependents of an
            # average batch (not of this batch) keeps every dependent's weight the same, as
            # random batches give on average
            per_batch = config.batch_size * seen_deps / seen_sents
            for n in sorted(active):
                t0 = time.perf_counter()
                s = masked_scores(modules[n], b)  # [B j i]
                s = s.masked_fill(target[..., None] < 0, 0.0)  # rows ignored below: keep finite
                flat_s, flat_t = s.reshape(-1, s.shape[-1]), target.reshape(-1)
                if config.by_length:
                    loss = torch.nn.functional.cross_entropy(flat_s, flat_t, ignore_index=-1,
                                                             reduction="sum") / per_batch
                else:
                    loss = torch.nn.functional.cross_entropy(flat_s, flat_t, ignore_index=-1)
                opts[n].zero_grad()
                loss.backward()
                opts[n].step()
                losses[n] += loss.item() * len(sents)
                counts[n] += len(sents)
                own[n] += time.perf_counter() - t0
            done += len(sents)
            if progress is not None:
                progress(name, done, max(total, done) if total is not None else None)
        if progress is not None:  # the whole epoch: every sentence of train
            progress(name, done, done)
        scores = evaluate_all({n: modules[n] for n in sorted(active)}, dev, config.eval_batch_size)
        for n in sorted(active):
            c, t = scores[n]
            uas = c / t if t else float("nan")
            run = runs[n]
            run.history.append({"epoch": epoch, "loss": losses[n] / max(counts[n], 1), "dev_uas": uas,
                                "seconds": own[n]})
            run.epochs_run = epoch
            if uas > best[n]:
                best[n], waited[n] = uas, 0
                best_state[n] = copy.deepcopy(modules[n].state_dict())
                run.best_epoch, run.correct, run.total, run.uas = epoch, c, t, uas
            else:
                waited[n] += 1
                if waited[n] >= config.patience:
                    active.discard(n)
        if state is not None:
            record = {"epoch": epoch, "rng": rng.bit_generator.state, "best": best, "waited": waited,
                      "active": sorted(active), "seen_sents": seen_sents, "seen_deps": seen_deps,
                      "train_counts": [train.num_sentences, train.skipped],
                      "runs": {n: dataclasses.asdict(r) for n, r in runs.items()}}
            state.save(*_kept(record, modules, opts, best_state))
    for n, m in modules.items():
        m.load_state_dict(best_state[n])
        secs = [h["seconds"] for h in runs[n].history]
        runs[n].seconds_per_epoch = float(np.mean(secs)) if secs else float("nan")
    return runs


def _trained(module) -> set[str]:
    """The names in ``module.state_dict()`` that training changes (not frozen word vectors)."""
    return {k for k, p in module.named_parameters() if p.requires_grad}


def _kept(record: dict, modules: dict, opts: dict, best_state: dict) -> tuple[dict, dict]:
    """``record`` and the arrays of an epoch's state: each probe's trained tensors now and at
    its best epoch, and its optimiser's state (its ``param_groups`` go into the record)."""
    arrays: dict = {}
    record = {**record, "optimizers": {}}
    for n, m in modules.items():
        for k in _trained(m):
            arrays[f"now/{n}/{k}"] = m.state_dict()[k].detach().numpy()
            arrays[f"best/{n}/{k}"] = best_state[n][k].detach().numpy()
        sd = opts[n].state_dict()
        record["optimizers"][n] = {"param_groups": sd["param_groups"],
                                   "state": {str(i): sorted(st) for i, st in sd["state"].items()}}
        for i, st in sd["state"].items():
            for k, v in st.items():
                arrays[f"opt/{n}/{i}/{k}"] = v.detach().numpy()
    return record, arrays


def _restore(record: dict, arrays: dict, modules: dict, opts: dict, best_state: dict) -> None:
    """Put the tensors of :func:`_kept` back into the probes, their best states and optimisers."""
    import torch

    def tensor(key: str):
        return torch.from_numpy(np.array(arrays[key]))  # a writable copy

    for n, m in modules.items():
        trained = _trained(m)
        m.load_state_dict({k: tensor(f"now/{n}/{k}") for k in trained}, strict=False)
        best_state[n] = {**best_state[n], **{k: tensor(f"best/{n}/{k}") for k in trained}}
        kept = record["optimizers"][n]
        opts[n].load_state_dict({
            "param_groups": kept["param_groups"],
            "state": {int(i): {k: tensor(f"opt/{n}/{i}/{k}") for k in keys}
                      for i, keys in kept["state"].items()}})


def _lr(module, config: TrainConfig) -> float:
    if getattr(module, "name", "") == "attn" and config.attn_lr is not None:
        return config.attn_lr
    return config.lr


def right_branching_uas(dev: SentenceSource) -> ProbeRun:
    """The right-branching baseline scored like the probes."""
    correct = total = 0
    for chunk in dev.chunks():
        for s in chunk:
            pred = right_branching(s.num_words)
            correct += int(((pred == s.heads) & s.scored).sum())
            total += int(s.scored.sum())
    return ProbeRun("right-branching", uas=correct / total if total else float("nan"),
                    correct=correct, total=total)
