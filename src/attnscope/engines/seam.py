"""What a backend of the streaming engine is (:class:`Backend`) and what it is handed for one layer
(:class:`LayerInput`): the seam between the engine (:mod:`attnscope.engines.streaming`), the
registry that chooses a backend (:mod:`attnscope.engines.backends`) and the backends themselves
(each a module of its own that defines one :class:`Backend`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from attnscope.engines.rows import RowStats


@dataclass
class LayerInput:
    """One layer of a streaming pass, as every backend sees it.

    ``site``: the forward helper's :class:`~attnscope.models.forward.Site` (queries ``[B Hq T d]``
    as the model made them, the mask, the scaling, the module); ``stats``: what the statistics
    are folded into; ``key`` / ``value``: its keys and values ``[B Hkv T d]`` in float32 (the
    model's own where every sequence of the batch goes to the one-pass kernel, which reads them as
    they are); ``out``: the heads' outputs ``[B T Hq d]`` (float32; there, the forward's dtype),
    which a backend fills for rows ``0 .. n-1`` of the sequences it runs; ``cap``: the logit
    soft-capping (``cap tanh(s / cap)``; None: none); ``lengths``: each sequence's tokens in the
    batch; ``chunk``: query rows per tile asked for (0: by the device); ``scratch``: buffers a
    backend may keep from one layer to the next (the tiles' scores and weights); ``sink_mass``: see
    the field."""

    site: Any
    stats: RowStats
    key: Any
    value: Any
    out: Any
    cap: float | None
    lengths: list[int]
    chunk: int = 0
    scratch: list = field(default_factory=lambda: [None, None, None])
    #: with learned sinks (``site.sinks``): whether the rows' weights count the sink's mass (GPT-OSS)
    #: or are the plain softmax, the sink scaling only the output (Granite-SWA, ``sink-scale``)
    sink_mass: bool = True

    @property
    def causal(self) -> bool:
        return self.stats.causal


#: ``run(layer, b, seq)``: sequence ``b`` of the batch through one backend: its output rows into
#: ``layer.out``, its statistics into ``layer.stats`` (through ``layer_end``)
Run = Callable[[LayerInput, int, Any], None]


@dataclass(frozen=True)
class Backend:
    """A backend: its ``name``, the device types on which ``choose`` picks it by itself
    (``()``: every device), which inputs it takes (``token_level``: no word-level sequences;
    ``probes``: sequences with targets, e.g. the induction probes; at least ``min_tokens``
    tokens), whether it is the fallback (it takes every input: the last resort), whether ``auto``
    takes it only where the pass's maps fit the caller's memory budget (``budget``: the ``maps``
    backend, which holds a layer's ``[H n n]`` map), whether it can run on a device type here
    (``usable``) and why not (``why``, one line for the error), and ``run``, which computes one
    layer of one sequence."""

    name: str
    devices: tuple[str, ...]
    token_level: bool
    probes: bool
    run: Run
    usable: Callable[[str], bool]
    why: str = ""
    min_tokens: int = 1
    fallback: bool = False
    budget: bool = False
    #: the model mechanisms (:data:`attnscope.models.facts.MECHANISMS`) it computes as the model
    #: does; ``auto`` never gives it a model with any other, and asking for it by name is refused
    handles: frozenset[str] = frozenset()
    #: it reads the keys and values in the model's own dtype and writes the output in the
    #: query's (the one-pass kernel); the others are handed them in float32
    native_dtype: bool = False

    def lacks(self, needs) -> list[str]:
        """The mechanisms among ``needs`` that this backend does not compute."""
        return sorted(set(needs) - self.handles)

    def refuses(self, token_level: bool, probe: bool, tokens: int) -> str | None:
        """Why it does not take such a sequence (one line), or None where it does."""
        if self.token_level and not token_level:
            return "takes token-level sequences only (a word-level pass sums each row per word)"
        if probe and not self.probes:
            return "takes no sequences with targets (the induction probes)"
        if tokens < self.min_tokens:
            return f"takes sequences of {self.min_tokens} tokens or more"
        return None

    def takes(self, token_level: bool, probe: bool, tokens: int) -> bool:
        return self.refuses(token_level, probe, tokens) is None
