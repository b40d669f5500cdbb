"""The streaming engine's backends: one registry (:data:`BACKENDS`), one choice, several implementations.

A backend computes one layer of one sequence: the layer's output rows (``P V``, which go back to
the model in place of its own attention) and every per-row statistic, folded into the
:class:`~attnscope.engines.rows.RowStats` it is given. As with torch's
``scaled_dot_product_attention`` (one function; flash, memory-efficient and math kernels chosen
by device and input, the math one the reference), a caller never asks which one ran:

=========  ========================================================  ==========================
name       what                                                      chosen automatically on
=========  ========================================================  ==========================
maps       the reference: each layer's whole ``[H n n]`` map from    any device, where the
           the family's own eager attention, folded as it is made    pass's maps fit the
           (:mod:`attnscope.engines.eager`)                          caller's budget
onepass    attnscope's own Triton kernel: every statistic in one     CUDA, where Triton is
           pass, the float32 sums kept beside the row sum            installed
           (:mod:`attnscope.engines.onepass`)
flex       fused attention (``torch.nn.attention.flex_attention``):  CUDA without Triton
           never a row of scores; statistics from log-sum-exps
           (:mod:`attnscope.engines.flex`)
compiled   the compiled one-call CPU kernel                          the CPU, where it built
           (:mod:`attnscope.engines.tiled`, ``COMPILED``)
tiles      tiles of whole rows in torch (the compiled row kernel     anything else; every input
           where it built): the fallback, any device, any input,     the others do not take
           no ``[n n]`` map (:mod:`attnscope.engines.tiled`,
           ``TILES``)
=========  ========================================================  ==========================

Every backend's statistics equal those of the eager maps of the same pass (``tests/engines/test_engines.py``
runs each backend this machine has, against maps read independently: ``output_attentions``). ``flex`` and ``compiled`` take token-level sequences only
(word level needs each row's weights, summed per word); ``compiled`` no probes and no sequence of
one token either. Those go to ``tiles``. Outside CUDA, ``flex`` runs only when asked for: eager FlexAttention (off CUDA it is
not compiled) is torch's reference implementation, which holds a layer's ``[H n n]`` scores: it
proves the backend's mathematics on the CPU, it is not a fast path there.

A backend is a :class:`~attnscope.engines.seam.Backend` (its name, devices, what it takes,
whether it can run here and why not, and ``run``) defined in a module of its own; adding one is
that module and one line in :data:`BACKENDS`. The engine chooses each sequence's backend once per
pass (:func:`choose`) and calls its ``run`` for every layer.

>>> [b.name for b in BACKENDS]
['maps', 'onepass', 'flex', 'compiled', 'tiles']
>>> choose("auto", "cuda", token_level=True, probe=False, usable=lambda name, device: True)
'onepass'
>>> choose("auto", "cuda", token_level=True, probe=False, usable=lambda name, device: name != "onepass")
'flex'
>>> choose("auto", "cpu", token_level=True, probe=False, usable=lambda name, device: name != "compiled")
'tiles'
>>> choose("auto", "cpu", token_level=True, probe=False, maps_fit=True, usable=lambda name, device: True)
'maps'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnscope.engines import eager, flex, onepass, tiled
from attnscope.engines.seam import Backend
from attnscope.engines.tiles import (  # noqa: F401
    CPU_TILE_BYTES,
    CPU_TILE_ROWS,
    GPU_TILE_SHARE,
    tile_budget,
)
from attnscope.errors import AttnscopeError

#: every backend, in the order ``choose`` tries them: the maps where they fit, the fallback (it
#: takes every input) last
BACKENDS: tuple[Backend, ...] = (
    eager.BACKEND,
    onepass.BACKEND,
    flex.BACKEND,
    tiled.COMPILED,
    tiled.TILES,
)


#: what ``--longctx-backend`` takes
NAMES = ("auto", *(b.name for b in BACKENDS))


def get(name: str) -> Backend:
    """The backend called ``name``."""
    for b in BACKENDS:
        if b.name == name:
            return b
    raise AttnscopeError(f"backend {name!r}: not one of auto, {', '.join(b.name for b in BACKENDS)}",
                         params=("backend",))


def _kind(device) -> str:
    return getattr(device, "type", str(device).split(":")[0])


def usable(name: str, device) -> bool:
    """Whether backend ``name`` can run on ``device`` on this machine at all."""
    return get(name).usable(_kind(device))


#: the mechanisms that change how a backend computes attention (the other, a hybrid's layers, is
#: the engine's business)
COMPUTED = frozenset({"sinks", "sink-scale", "value-size", "softcap", "window", "chunk", "scale", "alibi",
                      "position-bias"})


def needs(facts) -> frozenset[str]:
    """What a backend must compute for a model with these :class:`~attnscope.models.facts.ModelFacts`."""
    return frozenset(facts.mechanisms) & COMPUTED


def check(backend: str, device, needs: frozenset[str] = frozenset()) -> None:
    """Refuse, in one line naming ``backend``, a name that is not a backend, one that cannot run
    on ``device`` here, or one that does not compute a mechanism the model has (``needs``),
    before a pass begins."""
    if backend == "auto":
        return
    b = get(backend)
    if not b.usable(_kind(device)):
        raise AttnscopeError(f"backend {backend}: cannot run on {device} here ({b.why})", params=("backend",))
    if b.lacks(needs):
        raise AttnscopeError(f"backend {backend}: does not compute this model's {', '.join(b.lacks(needs))} "
                             f"(the backends that do: {', '.join(x.name for x in BACKENDS if not x.lacks(needs))})",
                             params=("backend",))


def verdicts(backend: str, device, *, token_level: bool, probe: bool, tokens: int = 2,
             maps_fit: bool = False, usable: Callable[[str, Any], bool] = usable,
             needs: frozenset[str] = frozenset(), budget: str = "") -> list[tuple[str, str, str]]:
    """What the choice of ``backend`` (a name, or ``"auto"``) makes of every backend for one
    sequence on ``device``, in the order it tries them: ``(name, verdict, reason)``, the verdict
    ``"chosen"`` for the one that runs (the first that passes), ``"declined"`` with why for each
    before it (a name asked for, by name; ``auto``, by what each is made for) and ``"not tried"``
    after it. ``token_level``: not word level; ``probe``: a sequence with targets; ``tokens``: its
    length; ``maps_fit``: the pass's maps fit the caller's memory budget (the ``maps`` backend);
    ``needs``: the model's mechanisms a backend must compute (:func:`needs`); ``budget``: what to
    say of the backend held to the memory budget (``maps``), taken or not (default: whether the
    maps fit). A backend that takes every input (``tiles``) is the last resort, whatever was asked
    for.

    >>> [v[:2] for v in verdicts("auto", "cpu", token_level=False, probe=False)][-2:]
    [('compiled', 'declined'), ('tiles', 'chosen')]
    >>> verdicts("auto", "cpu", token_level=False, probe=False)[3][2]
    'takes token-level sequences only (a word-level pass sums each row per word)'
    """
    kind = _kind(device)
    out: list[tuple[str, str, str]] = []
    chosen = None
    for b in BACKENDS:
        if chosen is not None:
            out.append((b.name, "not tried", f"{chosen} was chosen first"))
            continue
        why = b.refuses(token_level, probe, tokens)
        if why is None and b.lacks(needs) and not b.fallback:
            why = f"does not compute this model's {', '.join(b.lacks(needs))}"
        if why is None and not b.fallback:
            if backend not in ("auto", b.name):
                why = f"{backend} was asked for"
            elif backend == "auto" and b.budget and not maps_fit:
                why = budget or "the pass's maps do not fit the memory budget"
            elif backend == "auto" and not b.budget and b.devices and kind not in b.devices:
                why = f"made for {', '.join(b.devices)}, not {kind} (it runs there when asked for by name)"
            elif not usable(b.name, device):
                why = f"cannot run on {kind} here ({b.why})"
        if why is None:
            chosen = b.name
            out.append((b.name, "chosen", "the one asked for" if backend == b.name else
                        "takes every input, the last resort" if b.fallback else
                        (budget or "the pass's maps fit the memory budget") if b.budget else f"made for {kind}"))
        else:
            out.append((b.name, "declined", why))
    return out


def choose(backend: str, device, *, token_level: bool, probe: bool, tokens: int = 2,
           maps_fit: bool = False, usable: Callable[[str, Any], bool] = usable,
           needs: frozenset[str] = frozenset()) -> str:
    """The backend that runs one sequence on ``device``: ``backend`` itself where it takes the
    input (``token_level``: not word level; ``probe``: a sequence with targets; ``tokens``:
    its length), else (``"auto"``) the first of :data:`BACKENDS` that can run there, takes it and
    is made for the input: one held to a memory budget (``maps``) where the pass's maps fit the
    caller's (``maps_fit``), any other where it is made for ``device``'s type; what none of them
    takes goes to the fallback, ``tiles``. ``auto`` passes over a backend that does not compute
    one of the model's mechanisms (``needs``, :func:`needs`). Why each other one was passed over:
    :func:`verdicts`."""
    return next(name for name, verdict, _ in verdicts(backend, device, token_level=token_level, probe=probe,
                                                      tokens=tokens, maps_fit=maps_fit, usable=usable,
                                                      needs=needs) if verdict == "chosen")
