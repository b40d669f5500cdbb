"""The streaming engine's backends: one interface, several implementations, chosen by device and input.

A backend computes one layer of one sequence: the layer's output rows (``P V``, which go back to
the model in place of its own attention) and every per-row statistic, folded into the
:class:`~attnscope.engines.rows.RowStats` it is given. As with torch's
``scaled_dot_product_attention`` (one function; flash, memory-efficient and math kernels chosen
by device and input, the math one the reference), a caller never asks which one ran:

=========  ========================================================  ==========================
name       what                                                      chosen automatically on
=========  ========================================================  ==========================
onepass    attnscope's own Triton kernel: every statistic in one     CUDA, where Triton is
           pass, the float32 sums kept beside the row sum            installed
           (:mod:`attnscope.engines.onepass`)
flex       fused attention (``torch.nn.attention.flex_attention``):  CUDA without Triton (the
           never a row of scores; statistics from log-sum-exps       reference on a GPU)
           (:mod:`attnscope.engines.flex`)
compiled   the compiled one-call CPU kernel                          the CPU, where it built
           (:func:`attnscope.engines.native.flash`)
tiles      tiles of whole rows in torch (the compiled row kernel     anything else; every input
           where it built): the reference, any device, any input     the others do not take
=========  ========================================================  ==========================

Every backend's statistics equal those of the eager maps of the same pass (``tests/engines/test_engines.py``
runs each backend this machine has). ``flex`` and ``compiled`` take token-level sequences only
(word level needs each row's weights, summed per word); ``compiled`` no probes and no sequence of
one token either. Those go to ``tiles``. Outside CUDA, ``flex`` runs only when asked for: eager FlexAttention (off CUDA it is
not compiled) is torch's reference implementation, which holds a layer's ``[H n n]`` scores: it
proves the backend's mathematics on the CPU, it is not a fast path there.

>>> [b.name for b in BACKENDS]
['onepass', 'flex', 'compiled', 'tiles']
>>> choose("auto", "cuda", token_level=True, probe=False, usable=lambda name, device: True)
'onepass'
>>> choose("auto", "cuda", token_level=True, probe=False, usable=lambda name, device: name != "onepass")
'flex'
>>> choose("auto", "cpu", token_level=True, probe=False, usable=lambda name, device: name != "compiled")
'tiles'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnscope.engines import flex, native, onepass
from attnscope.engines.tiles import CPU_TILE_BYTES, CPU_TILE_ROWS, GPU_TILE_SHARE, tile_budget  # noqa: F401
from attnscope.errors import AttnscopeError


@dataclass(frozen=True)
class Backend:
    """What the seam knows of a backend: its ``name``, the device types on which ``choose``
    picks it by itself, and which inputs it takes (``token_level``: no word-level sequences;
    ``probes``: sequences with targets, e.g. the induction probes)."""

    name: str
    devices: tuple[str, ...]  # () = every device
    token_level: bool
    probes: bool
    min_tokens: int = 1
    reference: bool = False

    def takes(self, token_level: bool, probe: bool, tokens: int) -> bool:
        return ((token_level or not self.token_level) and (self.probes or not probe)
                and tokens >= self.min_tokens)


BACKENDS = (
    Backend("onepass", devices=("cuda",), token_level=True, probes=True),
    Backend("flex", devices=("cuda",), token_level=True, probes=True),
    Backend("compiled", devices=("cpu",), token_level=True, probes=False, min_tokens=2),
    Backend("tiles", devices=(), token_level=False, probes=True, reference=True),  # last: takes the rest
)
NAMES = ("auto", *(b.name for b in BACKENDS))


@dataclass
class LayerInput:
    """One layer of a streaming pass, as every backend sees it.

    ``site``: the forward helper's :class:`~attnscope.models.forward.Site` (queries ``[B Hq T d]``
    as the model made them, the mask, the scaling, the module); ``key`` / ``value``: its keys and
    values ``[B Hkv T d]`` in float32 (the model's own where every sequence of the batch goes to the
    one-pass kernel, which reads them as they are); ``out``: the heads' outputs ``[B T Hq d]``
    (float32; there, the forward's dtype), which a backend fills for rows ``0 .. n-1`` of the sequences it runs; ``cap``: the logit soft-capping
    (``cap tanh(s / cap)``; None: none); ``lengths``: each sequence's tokens in the batch."""

    site: Any
    stats: Any
    key: Any
    value: Any
    out: Any
    cap: float | None
    lengths: list[int]

    @property
    def causal(self) -> bool:
        return self.stats.causal


#: ``run(layer, b, seq)``: sequence ``b`` of the batch through one backend
Run = Callable[[LayerInput, int, Any], None]


def usable(name: str, device) -> bool:
    """Whether backend ``name`` can run on ``device`` on this machine at all."""
    kind = getattr(device, "type", str(device).split(":")[0])
    if name == "flex":
        return flex.available()
    if name == "compiled":
        return native.available(kind) and native.flash_kernel() is not None
    if name == "onepass":
        return onepass.available(kind)
    return name == "tiles"


def check(backend: str, device) -> None:
    """Refuse, in one line naming ``backend``, a name that is not a backend or one that cannot run
    on ``device`` here (before a pass begins)."""
    if backend not in NAMES:
        raise AttnscopeError(f"backend {backend!r}: not one of {', '.join(NAMES)}", params=("backend",))
    if backend != "auto" and not usable(backend, device):
        why = {"flex": "this torch has no torch.nn.attention.flex_attention",
               "compiled": "the compiled kernel runs on the CPU only, and only where a C compiler "
                           "built it and torch's library exports sgemm_",
               "onepass": "it needs Triton (pip install triton) and a CUDA device, or TRITON_INTERPRET=1 "
                          "to run Triton's interpreter on the CPU"}[backend]
        raise AttnscopeError(f"backend {backend}: cannot run on {device} here ({why})",
                             params=("backend",))


def choose(backend: str, device, *, token_level: bool, probe: bool, tokens: int = 2,
           usable: Callable[[str, Any], bool] = usable) -> str:
    """The backend that runs one sequence on ``device``: ``backend`` itself where it takes the
    input (``token_level``: not word level; ``probe``: a sequence with targets; ``tokens``:
    its length), else (``"auto"``) the first of :data:`BACKENDS` made for ``device``'s type that can run
    there and takes it; what none of them takes goes to the reference, ``tiles``."""
    kind = getattr(device, "type", str(device).split(":")[0])
    for b in BACKENDS:
        if not b.takes(token_level, probe, tokens):
            continue
        wanted = b.name == backend or (backend == "auto" and (not b.devices or kind in b.devices))
        if b.reference or (wanted and usable(b.name, device)):
            return b.name
    raise AssertionError("the reference backend takes every input")  # pragma: no cover
