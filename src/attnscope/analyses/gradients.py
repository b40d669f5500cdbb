"""Gradient-based importance of attention (paper section 3.2, Figure 3; code never released).

For each example, tokens are masked as in BERT pre-training (15% of the non-special tokens,
at least one; of those 80% become the mask token, 10% a random vocabulary token, 10% stay),
with a generator seeded by ``(seed, example index)`` so the masking does not depend on the
batching. The loss is the example's mean cross-entropy over its masked tokens. Its gradient
with respect to every attention weight ``alpha[l, h, i, j]`` (the softmax output that multiplies
the values) is taken with autograd, and

    importance[l, c] = mean over heads h, rows i and key columns j of class c of |dL / d alpha[l, h, i, j]|

for the classes separator, period/comma (``punct``), first special token and other, pooled
over all examples (sums of magnitudes and counts of entries; divided in ``finalize``).

The model needs a masked-LM head. For an encoder without one, :func:`fit_mlm_head` trains
only an output layer (dense + GELU + LayerNorm transform, decoder tied to the frozen input
embeddings, a bias) on the frozen encoder, seeded, and reports its masked-token accuracy on
held-out tokens; the importance is then that of the fitted head's loss, which the report says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnscope.analyses.base import EncodedAnalysis, Result, register
from attnscope.analyses.token_classes import TokenClasser
from attnscope.data.records import layer_number
from attnscope.errors import ModelError
from attnscope.extract.encode import Encoder
from attnscope.models.forward import batches, forward, pad_batch
from attnscope.progress import Step
from attnscope.store import Store

#: Key classes of Figure 3 (the first special token is kept apart, not hidden in "other").
GRAD_CLASSES = ("separator", "punct", "first", "other")


@dataclass
class MaskedInput:
    """One example ready for a masked-LM pass: ids after masking, targets, classes."""

    index: int
    input_ids: list[int]
    token_type_ids: list[int] | None
    masked: np.ndarray  # [k] positions that carry a loss
    targets: np.ndarray  # [k] original ids at those positions
    tokens: list[str]
    special: np.ndarray  # [n] bool


def mask_like_bert(ids: list[int], special: np.ndarray, rng: np.random.Generator, *, mask_id: int,
                   vocab_size: int, avoid: set[int], prob: float = 0.15) -> tuple[list[int], np.ndarray]:
    """BERT's masking of one example: returns (new ids, masked positions ``[k]`` sorted).

    Chooses ``max(1, round(prob * candidates))`` non-special positions; each becomes
    ``mask_id`` with probability 0.8, a random id (not in ``avoid``) with 0.1, else stays.
    """
    cand = np.nonzero(~np.asarray(special, dtype=bool))[0]
    if cand.size == 0:
        return list(ids), np.zeros(0, dtype=np.int64)
    k = max(1, int(round(prob * cand.size)))
    chosen = np.sort(rng.choice(cand, size=k, replace=False))
    out = list(ids)
    for pos in chosen:
        r = rng.random()
        if r < 0.8:
            out[pos] = mask_id
        elif r < 0.9:
            while True:
                rid = int(rng.integers(0, vocab_size))
                if rid not in avoid:
                    break
            out[pos] = rid
    return out, chosen.astype(np.int64)


class MlmScorer:
    """Masked-LM logits and attention probabilities (with autograd) for one model.

    ``head``: None when ``lm.model`` has its own masked-LM head (``lm.has_mlm_head``); else a
    fitted :class:`FittedHead` applied to the encoder's last hidden states.
    """

    def __init__(self, lm, head: "FittedHead | None" = None):
        if lm.facts.causal:
            raise ModelError(f"{lm.name}: a causal model has no masked-LM objective; "
                             "gradient importance needs a masked-LM encoder")
        if head is None and not lm.has_mlm_head:
            raise ModelError(f"{lm.name}: the model has no masked-LM head (load it with its head, "
                             "or fit one on the frozen encoder with fit_mlm_head)")
        self.lm = lm
        self.head = head

    @property
    def kind(self) -> str:
        return "fitted" if self.head is not None else "pretrained"

    def forward(self, inputs):
        """A padded batch (:class:`~attnscope.models.forward.ModelInputs`) -> (logits ``[B T V]``,
        attentions, each ``[B H T T]`` with autograd)."""
        run = forward(self.lm, inputs, attentions=True, grad=True)
        if self.head is None:
            return run.output.logits, run.attentions
        return self.head(run.output.last_hidden_state), run.attentions

    def describe(self) -> dict[str, Any]:
        d = {"model": self.lm.name, "head": self.kind}
        if self.head is not None:
            d["fitted_head"] = dict(self.head.report)
        return d


def _fitted_head_class():
    import torch
    from torch import nn

    class _Head(nn.Module):
        def __init__(self, embeddings: torch.Tensor, eps: float):
            super().__init__()
            d = embeddings.shape[1]
            self.dense = nn.Linear(d, d)
            self.norm = nn.LayerNorm(d, eps=eps)
            self.register_buffer("embeddings", embeddings.detach().clone())  # [V d], frozen
            self.bias = nn.Parameter(torch.zeros(embeddings.shape[0]))

        def forward(self, h):  # [.. d] -> [.. V]
            return self.norm(nn.functional.gelu(self.dense(h))) @ self.embeddings.T + self.bias

    return _Head


class FittedHead:
    """A masked-LM output layer trained on a frozen encoder; ``report`` says how well it does."""

    def __init__(self, module, report: dict[str, Any]):
        self.module = module
        self.report = report

    def __call__(self, hidden):
        return self.module(hidden)


def prepare_masked(lm, tokens: list[str], special: np.ndarray, segment: np.ndarray, index: int,
                   seed: int, prob: float) -> MaskedInput:
    """Ids, seeded BERT masking and targets for one example given by its tokens."""
    tok = lm.tokenizer
    ids = tok.convert_tokens_to_ids(list(tokens))
    avoid = set(tok.all_special_ids)
    rng = np.random.default_rng([seed, index])
    new_ids, masked = mask_like_bert(ids, special, rng, mask_id=tok.mask_token_id,
                                     vocab_size=lm.model.config.vocab_size, avoid=avoid, prob=prob)
    types = [int(s) for s in segment] if lm.family.token_types else None
    return MaskedInput(index=index, input_ids=new_ids, token_type_ids=types, masked=masked,
                       targets=np.asarray([ids[p] for p in masked], dtype=np.int64),
                       tokens=list(tokens), special=np.asarray(special, dtype=bool))


def _pad(lm, inputs: list[MaskedInput]):
    return pad_batch(lm, [x.input_ids for x in inputs], [x.token_type_ids for x in inputs])


def attention_gradients(scorer: MlmScorer, inputs: list[MaskedInput]) -> list[np.ndarray]:
    """``|dL/d alpha|``-ready gradients: one ``[L H n n]`` float32 array per input.

    ``L`` is the sum over examples of each example's mean masked-token cross-entropy, so an
    example's gradient depends only on that example.
    """
    import torch

    with torch.enable_grad():
        logits, attentions = scorer.forward(_pad(scorer.lm, inputs))  # [B T V], L x [B H T T]
        logp = torch.log_softmax(logits.float(), dim=-1)
        loss = logits.new_zeros((), dtype=torch.float32)
        for b, x in enumerate(inputs):
            if x.masked.size:
                pos = torch.as_tensor(x.masked, device=logp.device)
                tgt = torch.as_tensor(x.targets, device=logp.device)
                loss = loss - logp[b, pos, tgt].mean()
        grads = torch.autograd.grad(loss, list(attentions), allow_unused=True)
    out = []
    stacked = torch.stack([g if g is not None else torch.zeros_like(a)
                           for g, a in zip(grads, attentions)], dim=1)  # [B L H T T]
    arr = stacked.detach().float().cpu().numpy()
    for b, x in enumerate(inputs):
        n = len(x.input_ids)
        out.append(np.ascontiguousarray(arr[b, :, :, :n, :n]))
    return out


@register
class GradientImportance(EncodedAnalysis):
    """Per layer (and head): mean |dL/d attention| to separators, punctuation, first, other."""

    name = "gradient-importance"
    summed = ("sums", "counts", "examples", "masked_tokens", "skipped_word_level")
    requires = frozenset({"model"})

    @classmethod
    def for_model(cls, model, *, seed: int = 0) -> "GradientImportance":
        """Needs a model loaded with its masked-LM head."""
        return cls(MlmScorer(model), seed=seed)

    def __init__(self, scorer: MlmScorer, *, seed: int = 0, mask_prob: float = 0.15,
                 classer: TokenClasser | None = None, batch_size: int = 8):
        self.scorer = scorer
        self.seed = int(seed)
        self.mask_prob = float(mask_prob)
        self.classer = classer or TokenClasser.from_tokenizer(scorer.lm.tokenizer)
        self.batch_size = int(batch_size)
        self.sums: np.ndarray | None = None  # [C L H] float64, sum of |grad|
        self.counts = np.zeros(len(GRAD_CLASSES), dtype=np.int64)  # [C] entries per head
        self.examples = 0
        self.masked_tokens = 0
        self.skipped_word_level = 0

    def params(self) -> dict[str, Any]:
        return {"seed": self.seed, "mask_prob": self.mask_prob, "scorer": self.scorer.describe(),
                "token_classes": self.classer.params(), "loss": "mean masked-token cross-entropy per example",
                "average": "pooled over heads' (row, key) entries of each class"}

    def _inputs(self, batch: list) -> list[MaskedInput]:
        """Masked inputs of a batch of encoded examples (the model's own tokens, also for
        word-level maps); examples longer than the model's positions are counted, not run."""
        out = []
        for e in batch:
            if len(e) > self.scorer.lm.max_positions:
                self.skipped_word_level += 1
                continue
            out.append(prepare_masked(self.scorer.lm, e.tokens, np.asarray(e.special, dtype=bool),
                                      np.asarray(e.segment), e.index, self.seed, self.mask_prob))
        return out

    def add_gradients(self, x: MaskedInput, grad: np.ndarray) -> None:
        """Accumulate one example's gradient ``[L H n n]``."""
        k = self.classer.classify(x.tokens, x.special)
        cols = np.stack([k.separator, k.punct, k.first, k.other]).astype(np.float32)  # [C n]
        mag = np.abs(grad).sum(-2)  # [L H k]: summed over rows
        sums = np.moveaxis(mag @ cols.T, -1, 0).astype(np.float64)  # [C L H]
        n = grad.shape[-1]
        if self.sums is None:
            self.sums = np.zeros_like(sums)
        self.sums += sums
        self.counts += (cols.sum(-1) * n).astype(np.int64)
        self.examples += 1
        self.masked_tokens += int(x.masked.size)

    def update(self, batch: list) -> None:
        inputs = self._inputs(batch)
        for chunk in batches(self.scorer.lm, inputs, self.batch_size):
            for x, g in zip(chunk, attention_gradients(self.scorer, chunk)):
                self.add_gradients(x, g)

    def finalize(self) -> Result:
        res = Result(self.name, params=self.params(),
                     meta={"examples": self.examples, "masked_tokens": self.masked_tokens,
                           "entries_per_head": dict(zip(GRAD_CLASSES, self.counts.tolist())),
                           "skipped": self.skipped_word_level})
        if self.sums is None:
            res.summary.append("no examples")
            return res
        with np.errstate(invalid="ignore", divide="ignore"):
            per_head = self.sums / np.where(self.counts > 0, self.counts, np.nan)[:, None, None]
        per_layer = per_head.mean(-1)  # [C L]: every head has the same entry count
        for c, name in enumerate(GRAD_CLASSES):
            res.arrays[f"head_{name}"] = per_head[c]
            res.arrays[f"layer_{name}"] = per_layer[c]
        res.tables["gradient_importance"] = [
            {"layer": layer, "name": str(layer_number(layer)),
             **{name: float(per_layer[c, layer]) for c, name in enumerate(GRAD_CLASSES)}}
            for layer in range(per_layer.shape[1])]
        sep, other = per_layer[0], per_layer[3]
        if np.isfinite(sep).any():
            low = [i + 1 for i in np.nonzero(sep < other)[0]]
            res.summary.append("layers where attention to separators matters less to the loss than "
                               "attention to other tokens (1-indexed): "
                               + (", ".join(map(str, low)) if low else "none"))
        if self.scorer.head is not None:
            rep = self.scorer.head.report
            res.summary.append(f"gradients are those of a fitted masked-LM head (held-out masked-token "
                               f"accuracy {rep.get('heldout_accuracy', float('nan')):.3f}), not of a "
                               "pre-trained one")
        return res


@dataclass
class FitOptions:
    """How :func:`fit_mlm_head` trains: few hundred steps by default, seeded."""

    steps: int = 300
    batch_tokens: int = 128
    lr: float = 2e-3
    heldout: float = 0.1
    max_examples: int = 512
    mask_prob: float = 0.15
    seed: int = 0
    extra: dict = field(default_factory=dict)


def fit_inputs(source, model, max_seq_len: int, limit: int):
    """A builder of :func:`fit_mlm_head`'s inputs, ``(tokens, special, segment, index)`` of the
    first ``limit`` token-level examples of ``source`` (examples, encoded with ``model`` and
    kept when at most ``max_seq_len`` tokens, or an opened store); called only when a head is
    fitted."""
    def build():
        out = []
        if isinstance(source, Store):
            for m in source:
                if m.level == "token":
                    out.append((m.tokens, m.special, m.segment, m.index))
                if len(out) >= limit:
                    break
            return out
        enc = Encoder(model)
        for i, ex in enumerate(source):
            e = enc.encode(ex, i)
            if len(e) <= max_seq_len:
                out.append((e.tokens, np.asarray(e.special), np.asarray(e.segment), i))
            if len(out) >= limit:
                break
        return out

    return build


def fit_mlm_head(lm, encoded: list[tuple[list[str], np.ndarray, np.ndarray, int]],
                 options: FitOptions | None = None, progress=None) -> FittedHead:
    """Train a masked-LM output layer on the frozen encoder of ``lm``.

    ``encoded``: ``(tokens, special [n], segment [n], index)`` per example (token level). Masks
    each example as in BERT (seeded), collects the encoder's hidden states at the masked
    positions with gradients off, then trains only the head on them with Adam; a seeded
    ``heldout`` share of the masked tokens measures accuracy.
    """
    import torch

    opts = options or FitOptions()
    if lm.tokenizer.mask_token_id is None:
        raise ModelError(f"{lm.name}: the tokenizer has no mask token; cannot fit a masked-LM head")
    if lm.facts.causal:
        raise ModelError(f"{lm.name}: a causal model has no masked-LM objective")
    chosen = encoded[: opts.max_examples]
    feats, targets = [], []
    inputs = [prepare_masked(lm, t, s, g, i, opts.seed + 1, opts.mask_prob) for t, s, g, i in chosen]
    done = 0
    for chunk in batches(lm, inputs, 16):
        done += len(chunk)
        hidden = forward(lm, _pad(lm, chunk)).output.last_hidden_state  # [B T d]
        for b, x in enumerate(chunk):
            if x.masked.size:
                # the head is fitted on the CPU (the same numbers whatever the model's device)
                feats.append(hidden[b, torch.as_tensor(x.masked, device=hidden.device)].cpu().clone())
                targets.append(torch.as_tensor(x.targets))
        if progress is not None:
            progress(Step("fit-mlm-head: encode", "examples"), done, len(inputs))
    if not feats:
        raise ModelError("no maskable tokens to fit a masked-LM head on")
    X = torch.cat(feats).float()  # [N d]
    Y = torch.cat(targets)  # [N]
    gen = torch.Generator().manual_seed(opts.seed)
    perm = torch.randperm(X.shape[0], generator=gen)
    n_held = max(1, int(round(opts.heldout * X.shape[0]))) if X.shape[0] > 1 else 0
    held, train = perm[:n_held], perm[n_held:]
    if train.numel() == 0:
        train = held
    torch.manual_seed(opts.seed)
    emb = lm.model.get_input_embeddings().weight.detach().float().cpu()
    eps = getattr(lm.model.config, "layer_norm_eps", 1e-12)
    module = _fitted_head_class()(emb, eps)
    optim = torch.optim.Adam(module.parameters(), lr=opts.lr)
    losses = []
    with torch.enable_grad():
        for step in range(opts.steps):
            idx = train[torch.randint(0, train.numel(), (min(opts.batch_tokens, train.numel()),),
                                      generator=gen)]
            loss = torch.nn.functional.cross_entropy(module(X[idx]), Y[idx])
            optim.zero_grad()
            loss.backward()
            optim.step()
            losses.append(loss.item())
            if progress is not None and ((step + 1) % 25 == 0 or step + 1 == opts.steps):
                progress(Step("fit-mlm-head: train", "steps"), step + 1, opts.steps)
    module.eval()
    for p in module.parameters():
        p.requires_grad_(False)
    with torch.inference_mode():
        acc_held = float((module(X[held]).argmax(-1) == Y[held]).float().mean()) if n_held else float("nan")
        acc_train = float((module(X[train]).argmax(-1) == Y[train]).float().mean())
    report = {"steps": opts.steps, "batch_tokens": opts.batch_tokens, "lr": opts.lr,
              "seed": opts.seed, "examples": len(chosen), "masked_tokens": int(X.shape[0]),
              "heldout_tokens": int(n_held), "heldout_accuracy": acc_held, "train_accuracy": acc_train,
              "final_loss": float(np.mean(losses[-20:])) if losses else float("nan"),
              "architecture": "dense+GELU+LayerNorm, decoder tied to the frozen input embeddings, bias"}
    return FittedHead(module.to(lm.device), report)  # then it runs where the hidden states are
