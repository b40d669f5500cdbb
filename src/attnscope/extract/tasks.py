"""A task (:class:`attnscope.data.tasks.Task`) in token ids: the context, the question, the
needle's token positions and the answer's length (:func:`encode_task`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnscope.data.tasks import Task


@dataclass
class Encoded:
    """A task in token ids: the context (special tokens as the tokenizer adds them), the
    question, the needle positions of the context, and the answer's token count."""

    task: Task
    context: list[int]
    question: list[int]
    needle: np.ndarray  # bool [n]: context tokens inside a needle span
    answer_tokens: int

    @property
    def max_new(self) -> int:
        """Tokens generated: the answer's, plus 2 per answer string and 2 more."""
        return self.answer_tokens + 2 * len(self.task.answer) + 2


def encode_task(tokenizer, task: Task) -> Encoded:
    enc = tokenizer(task.context, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    needle = np.zeros(len(enc["input_ids"]), dtype=bool)
    for s, e in task.needles:
        for t, (a, b) in enumerate(offsets):
            if b > a and a < e and b > s:
                needle[t] = True
    q = tokenizer(task.question, add_special_tokens=False)["input_ids"]
    n_ans = sum(len(tokenizer(" " + a, add_special_tokens=False)["input_ids"]) for a in task.answer)
    return Encoded(task, list(enc["input_ids"]), list(q), needle, n_ans)
