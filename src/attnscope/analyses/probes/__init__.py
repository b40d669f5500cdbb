"""Attention-based probing classifiers for dependency parsing (paper section 5, Table 3).

- :mod:`.features`: word-level maps to probe inputs (ROOT as unit 0), streamed from a store;
- :mod:`.models`: the attention-only probe, the attention + word vectors probe, the
  distance + word vectors MLP baseline, and the right-branching baseline;
- :mod:`.random_init`: the same architecture with random weights and pretrained embeddings;
- :mod:`.training`: seeded minibatch Adam, early stopping on dev UAS.

torch is imported only by :mod:`.models` and :mod:`.training`.
"""

from attnscope.analyses.probes.features import (
                                                ProbeSentence,
                                                SentenceSource,
                                                collate,
                                                probe_sentence,
                                                punctuation_mask,
                                                sentences_from_maps,
)

__all__ = ["ProbeSentence", "SentenceSource", "collate", "probe_sentence", "punctuation_mask",
           "sentences_from_maps"]
