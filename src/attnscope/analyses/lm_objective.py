"""The language-model loss that head importance, ablation and saliency differentiate or compare.

- Encoders: the masked-LM loss. Each example is masked as in BERT pre-training with a generator
  seeded by ``(seed, example index)`` (:func:`attnscope.analyses.gradients.prepare_masked`), so
  the masking does not depend on batching; the logits come from the model's own masked-LM head
  or from a head fitted on the frozen encoder (:func:`~attnscope.analyses.gradients.fit_mlm_head`).
- Causal models: the next-token loss, position ``t`` predicting token ``t + 1``. A model loaded
  without its LM head (``AutoModel``) gets the logits from its input embeddings when the config
  ties them to the output layer (GPT-2, SmolLM2), which is exactly what its LM head computes.

An example's loss is the mean cross-entropy over its predicted positions; a batch returns one
loss per example (``[B]``), so per-example gradients come out of one backward pass when the
gates are per example (:func:`attnscope.models.forward.forward` with ``gates [B L H]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnscope.analyses.gradients import prepare_masked
from attnscope.errors import ModelError
from attnscope.extract.encode import Encoder
from attnscope.models.forward import forward, pad_batch


@dataclass
class LossInput:
    """One example ready for the loss: ids fed to the model and the positions that carry a loss."""

    index: int
    input_ids: list[int]  # after masking (encoders)
    token_type_ids: list[int] | None
    positions: np.ndarray  # [k] positions whose output is scored
    targets: np.ndarray  # [k] the token ids they must predict
    tokens: list[str]
    special: np.ndarray  # [n] bool

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class LossOutput:
    """Per-example mean loss ``[B]`` (a tensor, with autograd when asked) and prediction counts."""

    loss: Any  # torch [B]
    correct: np.ndarray  # [B] predictions equal to the target
    scored: np.ndarray  # [B] positions scored
    output: Any = None  # the model's output object (hidden states when asked)


class Objective:
    """The loss of one model: ``"mlm"`` (encoders) or ``"causal"`` (decoders).

    ``head``: a :class:`~attnscope.analyses.gradients.FittedHead` for an encoder without its
    own masked-LM head.
    """

    def __init__(self, lm, *, head=None, seed: int = 0, mask_prob: float = 0.15):
        self.lm = lm
        self.head = head
        self.seed = int(seed)
        self.mask_prob = float(mask_prob)
        if lm.facts.causal:
            self.kind = "causal"
            self._tied = None
            if getattr(lm.model, "lm_head", None) is None:
                if not getattr(lm.model.config, "tie_word_embeddings", False):
                    raise ModelError(f"{lm.name}: loaded without its LM head and its output layer "
                                     "is not tied to the input embeddings; load it with its head")
                self._tied = lm.model.get_input_embeddings()
        else:
            self.kind = "mlm"
            if head is None and not lm.has_mlm_head:
                raise ModelError(f"{lm.name}: the model has no masked-LM head (load it with its head, "
                                 "or fit one on the frozen encoder with fit_mlm_head)")
            if lm.tokenizer.mask_token_id is None:
                raise ModelError(f"{lm.name}: the tokenizer has no mask token")

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"loss": "masked-LM cross-entropy" if self.kind == "mlm"
                             else "next-token cross-entropy", "per_example": "mean over scored positions"}
        if self.kind == "mlm":
            d.update(seed=self.seed, mask_prob=self.mask_prob,
                     head="fitted on the frozen encoder" if self.head is not None else "pre-trained")
            if self.head is not None:
                d["fitted_head"] = dict(self.head.report)
        elif self._tied is not None:
            d["head"] = "input embeddings (tied output layer)"
        return d

    def prepare(self, tokens: list[str], special, segment, index: int,
                input_ids: list[int] | None = None) -> LossInput:
        """One encoded example (tokens, special ``[n]``, segment ``[n]``) -> :class:`LossInput`."""
        special = np.asarray(special, dtype=bool)
        if self.kind == "mlm":
            m = prepare_masked(self.lm, list(tokens), special, np.asarray(segment), index,
                               self.seed, self.mask_prob)
            return LossInput(index, m.input_ids, m.token_type_ids, m.masked, m.targets,
                             list(tokens), special)
        ids = list(input_ids) if input_ids is not None else \
            list(self.lm.tokenizer.convert_tokens_to_ids(list(tokens)))
        n = len(ids)
        pos = np.arange(max(n - 1, 0), dtype=np.int64)
        return LossInput(index, ids, None, pos, np.asarray(ids[1:], dtype=np.int64), list(tokens), special)

    def logits(self, out, rows=None):
        """Logits ``[.. V]`` from a model output (``rows``: hidden states to score instead)."""
        if self.head is not None:
            hidden = out.last_hidden_state if rows is None else rows
            return self.head(hidden)
        if self.kind == "causal" and self._tied is not None:
            hidden = out.last_hidden_state if rows is None else rows
            return hidden @ self._tied.weight.T
        return out.logits

    def run(self, inputs: list[LossInput], *, gates=None, hooks=None, grad: bool = False,
            **model_kwargs) -> LossOutput:
        """One forward pass over ``inputs``; the per-example losses ``[B]``."""
        import torch

        batch = pad_batch(self.lm, [x.input_ids for x in inputs], [x.token_type_ids for x in inputs])
        res = forward(self.lm, batch, hooks=hooks, gates=gates, grad=grad, **model_kwargs)
        context = torch.enable_grad() if grad else torch.inference_mode()
        scored = np.asarray([x.positions.size for x in inputs], dtype=np.int64)
        index = (np.repeat(np.arange(len(inputs)), scored),  # example, position, target per scored row
                 np.concatenate([x.positions for x in inputs] + [np.zeros(0, np.int64)]),
                 np.concatenate([x.targets for x in inputs] + [np.zeros(0, np.int64)]))
        # a fitted head or tied embeddings: the scored positions alone go through the large
        # vocabulary, all the batch's in one product
        gathered = self.head is not None or (self.kind == "causal" and self._tied is not None)
        out = res.output
        with context:
            source = out.last_hidden_state if gathered else self.logits(out)  # [B T D] or [B T V]
            which, pos, tgt = (torch.as_tensor(a, dtype=torch.long, device=source.device) for a in index)
            rows = self.logits(None, rows=source[which, pos]) if gathered else source[which, pos]  # [N V]
            rows_f = rows if rows.dtype == torch.float64 else rows.float()
            each = torch.nn.functional.cross_entropy(rows_f, tgt, reduction="none")  # [N]
            # each example's mean over its positions (0 where it has none)
            loss = each.new_zeros(len(inputs)).index_add(0, which, each)
            loss = loss / torch.as_tensor(np.maximum(scored, 1), dtype=loss.dtype, device=loss.device)
            hit = (rows.argmax(-1) == tgt).to(torch.int64)
            correct = hit.new_zeros(len(inputs)).index_add_(0, which, hit).cpu().numpy()
        return LossOutput(loss, correct, scored, out)


def encode_examples(lm, examples, *, max_len: int | None = None) -> tuple[list, int]:
    """Encode examples with the model's tokenizer; returns (encoded, number dropped as too long)."""
    enc = Encoder(lm)
    limit = min(max_len or lm.max_positions, lm.max_positions)
    out, dropped = [], 0
    for i, ex in enumerate(examples):
        e = enc.encode(ex, i)
        if len(e) > limit:
            dropped += 1
            continue
        out.append(e)
    return out, dropped


def loss_inputs(objective: Objective, encoded) -> list[LossInput]:
    """:class:`LossInput` of each :class:`~attnscope.extract.encode.Encoded` example."""
    return [objective.prepare(e.tokens, e.special, e.segment, e.index, e.input_ids) for e in encoded]
