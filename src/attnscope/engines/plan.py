"""One plan for a pass of long-context statistics: which engine (the maps, or the streaming
engine inside attention), which backend, the scores' dtype and where it runs, decided once, with
the reason for every backend turned down -- as torch's ``scaled_dot_product_attention`` reports
why it passed over each kernel.

:func:`plan` is the one place that reads what the caller asked for (``--longctx-engine``,
``--longctx-backend``, ``--longctx-attention-dtype``, the maps budget) against the model's facts
(:class:`~attnscope.models.facts.ModelFacts`), the device and the pass's shape (its longest
sequence, its batches, word level, probes); a request that cannot work is refused there, in
one line naming the option, before any pass begins. The engine then asks the plan which backend
runs each sequence (:meth:`Plan.backend_for`: a probe or a word-level pass may go to another one),
``attnscope check`` prints it, ``--explain`` shows it before a run, and it goes into the results'
provenance (:meth:`Plan.describe`).

>>> from attnscope.models import load_model
>>> p = plan(load_model("debug:llama"), longest=64)
>>> p.engine, p.backend, [v for v in p.verdicts if v[0] == "onepass"][0][1]
('maps', 'maps', 'not tried')
>>> plan(load_model("debug:llama"), longest=64, engine="streaming").backend in ("compiled", "tiles")
True
"""

from __future__ import annotations

from dataclasses import dataclass

from attnscope.engines import backends
from attnscope.errors import AttnscopeError

ENGINES = ("auto", "streaming", "maps")
DTYPES = ("auto", "float32", "bfloat16")


def maps_bytes(lm, n: int, batch_size: int = 1, bytes_per_value: int = 4) -> int:
    """Memory the ``[L H n n]`` maps of ``batch_size`` sequences of ``n`` tokens would take."""
    return lm.num_layers * lm.num_heads * n * n * bytes_per_value * batch_size


def choose_engine(lm, n: int, batch_size: int = 1, budget_bytes: int = 2 << 30,
                  engine: str = "auto") -> str:
    """``"maps"`` when the maps fit in ``budget_bytes``, ``"streaming"`` otherwise; an explicit
    ``engine`` is returned as is."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, not {engine!r}")
    if engine != "auto":
        return engine
    return "maps" if maps_bytes(lm, n, batch_size) <= budget_bytes else "streaming"


@dataclass(frozen=True)
class Plan:
    """What a pass will do and why (see the module docstring). ``engine``: ``"maps"`` (each
    layer's eager map folded as it is made) or ``"streaming"``; ``backend``: the backend of the
    pass's main sequences (token or word level as planned, no targets); ``verdicts``: every
    backend with what the choice made of it and why (:func:`~attnscope.engines.backends.verdicts`);
    ``attention_dtype``: what the scores are made of (``"auto"``: the forward pass's dtype);
    ``here``: the pass runs in this process, not on Ray workers (``here_reason``)."""

    engine: str
    engine_reason: str
    backend: str
    requested: str
    device: str
    attention_dtype: str
    maps_fit: bool
    needs: frozenset[str]
    verdicts: tuple[tuple[str, str, str], ...]
    here: bool = False
    here_reason: str = ""
    probe_backend: str | None = None

    @classmethod
    def of(cls, backend: str = "auto", *, device="cpu", maps_fit: bool = False,
           needs: frozenset[str] = frozenset()) -> "Plan":
        """The plan of a pass with no model at hand (a layer driven by hand, as the tests do):
        ``backend`` (or ``auto``'s choice) for every sequence it takes."""
        verdicts = tuple(backends.verdicts(backend, device, token_level=True, probe=False, maps_fit=maps_fit,
                                           needs=needs))
        return cls(engine="maps" if maps_fit else "streaming", engine_reason="given", requested=backend,
                   backend=next(n for n, v, _ in verdicts if v == "chosen"), device=str(device),
                   attention_dtype="auto", maps_fit=maps_fit, needs=needs, verdicts=verdicts)

    def backend_for(self, *, token_level: bool, probe: bool, tokens: int) -> str:
        """The backend of one sequence of the pass (the same choice as the plan's, for its input)."""
        return backends.choose(self.requested, self.device, token_level=token_level, probe=probe,
                               tokens=tokens, maps_fit=self.maps_fit, needs=self.needs)

    def describe(self) -> dict:
        """The plan as JSON (the results' provenance, ``attnscope check --json``)."""
        return {"engine": self.engine, "engine_reason": self.engine_reason, "backend": self.backend,
                "requested": self.requested, "probe_backend": self.probe_backend, "device": self.device,
                "attention_dtype": self.attention_dtype, "maps_fit": self.maps_fit,
                "mechanisms": sorted(self.needs), "here": self.here, "here_reason": self.here_reason,
                "backends": [{"name": n, "verdict": v, "reason": r} for n, v, r in self.verdicts]}

    def lines(self) -> list[str]:
        """The plan as the lines ``--explain`` and ``attnscope check`` print."""
        out = [f"engine: {self.engine} ({self.engine_reason})",
               f"backend: {self.backend}" + (f"; the induction probes: {self.probe_backend}"
                                             if self.probe_backend not in (None, self.backend) else "")]
        out += [f"  {name}: {verdict}, {reason}" for name, verdict, reason in self.verdicts]
        out.append(f"scores: {self.attention_dtype}; runs "
                   + ("in this process" if self.here else "where the job's executor runs it")
                   + (f" ({self.here_reason})" if self.here_reason else ""))
        return out


def plan(lm, *, longest: int, batch_size: int = 1, budget_bytes: int = 2 << 30, engine: str = "auto",
         backend: str = "auto", attention_dtype: str = "auto", token_level: bool = True,
         probes: bool = False, autocast: bool = False) -> Plan:
    """The plan of a pass over sequences of up to ``longest`` tokens in batches of ``batch_size``
    with ``lm`` (module docstring). ``engine``, ``backend``, ``attention_dtype`` and
    ``budget_bytes`` are what the caller asked for (a refusal names them by these names, which the
    command line shows as the family's flags); ``token_level``: the sequences are tokens (not words);
    ``probes``: the pass also has sequences with targets; ``autocast``: the pass runs under
    bfloat16 autocast (eager maps there would not be the same computation).

    Refused in one line: an engine, backend or dtype that is not one; a backend that cannot run
    on the model's device here or does not compute a mechanism the model has; the streaming
    engine for a model it cannot hook (outside AttentionInterface, or an encoder-decoder's
    stacks, whose maps come out by ``output_attentions`` only); a backend or dtype asked for
    beside ``engine maps``."""
    from attnscope.models.forward import supports_hooks

    engine_opt, backend_opt, dtype_opt = "engine", "backend", "attention_dtype"
    if engine not in ENGINES:
        raise AttnscopeError(f"{engine_opt} {engine}: not one of {', '.join(ENGINES)}", params=(engine_opt,))
    if attention_dtype not in DTYPES:
        raise AttnscopeError(f"{dtype_opt} {attention_dtype}: not one of {', '.join(DTYPES)}", params=(dtype_opt,))
    device = lm.model.device
    needs = backends.needs(lm.facts)
    try:
        backends.check(backend, device, needs)
    except AttnscopeError as err:
        raise AttnscopeError(f"{backend_opt} {str(err).removeprefix('backend ')}", params=(backend_opt,)) from None
    # what only the streaming engine takes: a backend by name, scores of bfloat16 values (float32
    # scores are the maps' own)
    asked = [f"{name} {value}" for name, value, own in ((backend_opt, backend, ("auto",)),
                                                          (dtype_opt, attention_dtype, ("auto", "float32")))
             if value not in own]
    if lm.facts.encoder_decoder or not supports_hooks(lm):  # both engines read inside attention
        why = ("an encoder-decoder model: the engines read one stack of self-attention" if lm.facts.encoder_decoder
               else "its transformers code does not route attention through AttentionInterface"
               + ("; its ALiBi bias is added inside that code" if lm.facts.alibi else ""))
        raise AttnscopeError(f"{lm.name}: long-context statistics are read inside attention, and {why} "
                             "(its attention maps are available: attnscope extract)", params=(engine_opt,))
    gb, budget_gb = maps_bytes(lm, longest, batch_size) / 2 ** 30, budget_bytes / 2 ** 30
    size = (f"the maps of a batch of {batch_size} sequences of up to {longest:,} tokens take {gb:.2f} GB, "
            f"the budget {budget_gb:g} GB")
    if engine == "maps":
        if asked:
            raise AttnscopeError(f"{engine_opt} maps with {' and '.join(asked)}: those are the streaming "
                                 f"engine's; leave {engine_opt} at auto or streaming",
                                 params=(engine_opt, *(a.split()[0] for a in asked)))
        chosen, why = "maps", "asked for"
    elif engine == "streaming" or asked or autocast:
        chosen = "streaming"
        why = ("asked for" if engine == "streaming" else
               f"{' and '.join(asked)} asked for, which only it takes" if asked else
               "the pass runs under bfloat16 autocast, where eager maps are not the same computation")
    else:
        chosen = choose_engine(lm, longest, batch_size, budget_bytes)
        why = size + ("" if chosen == "maps" else ": no n x n maps")
    maps_fit = chosen == "maps"
    # what is said of the maps backend: why the maps were taken, or not
    if maps_fit:
        budget = "the maps engine was asked for" if engine == "maps" else "the pass's maps fit the memory budget"
    elif engine == "streaming":
        budget = "the streaming engine was asked for"
    else:
        budget = "the pass's maps do not fit the memory budget" if why.startswith("the maps of") else             f"the streaming engine: {why}"
    verdicts = tuple(backends.verdicts(backend, device, token_level=token_level, probe=False, tokens=max(2, longest),
                                       maps_fit=maps_fit, needs=needs, budget=budget))
    main = next(n for n, v, _ in verdicts if v == "chosen")
    probe = (backends.choose(backend, device, token_level=token_level, probe=True, tokens=max(2, longest),
                             maps_fit=maps_fit, needs=needs) if probes else None)
    here_reason = ", ".join(r for r, on in (("word level", not token_level), ("eager maps", maps_fit),
                                            (f"{backend_opt} {backend}", backend != "auto"),
                                            ("bfloat16 scores", attention_dtype == "bfloat16"),
                                            ("bfloat16 autocast", autocast)) if on)
    return Plan(engine=chosen, engine_reason=why, backend=main, requested=backend, device=str(device),
                attention_dtype=attention_dtype, maps_fit=maps_fit, needs=needs, verdicts=verdicts,
                here=bool(here_reason), here_reason=here_reason, probe_backend=probe)
