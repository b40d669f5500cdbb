"""The unit of a job: a family reads its inputs, runs its analyses and returns a
:class:`~attnscope.analyses.family_result.FamilyResult` (its results file, typed, and the report's section).

A family is the one plug-in path from analyses to every output. Register a subclass of
:class:`Family` with :func:`register_family` and

- ``attnscope run`` gets a switch for each of its :attr:`Family.inputs` and an option for each
  field of its :attr:`Family.Options` dataclass, and runs it whenever its first input is given;
- ``attnscope analyze <key>`` is built from the same inputs and options;
- the HTML report shows the section of the result it returns, ``results.json`` and ``--resume`` read
  its ``results/<key>.json`` through :mod:`attnscope.store.results`, and the viewer finds it
  there too.

Options are a dataclass whose fields carry their help text (and choices) as metadata, made with
:func:`option`; each field's flag is ``--<family key>-<field>`` in ``run`` and ``analyze``
alike (``--coref-window`` below; docs/families.md)::

    @dataclass
    class Options:
        window: str = option("truncate", "How documents longer than --max-seq-len are cut.",
                             choices=("truncate", "sliding"))

Shared run settings (model, seed, maximum length, batch size, progress, output folder) reach a
family through its :class:`Context`, not through its options.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from attnscope.analyses.family_result import FamilyResult
from attnscope.data.io import fingerprint
from attnscope.errors import AttnscopeError
from attnscope.executor import LocalExecutor, run_pass
from attnscope.extract.runner import ExtractOptions, Extractor, small_matrix_threads
from attnscope.jobs import extract_to_store
from attnscope.models.forward import supports_hooks
from attnscope.progress import Progress, check_stop, with_unit
from attnscope.store import Store, open_store
from attnscope.store.checkpoints import StateFile, UnitLog, unit_log_path, unit_path
from attnscope.store.results import results_path


@dataclass(frozen=True)
class Input:
    """One input of a family. ``name`` is the keyword (``deps_train``); its command-line flag is
    ``--deps-train``. The first input of a family switches it on in ``attnscope run`` and is the
    positional argument of ``attnscope analyze <key>``; the others are optional."""

    name: str
    help: str
    multiple: bool = False  # several files (e.g. --coref a.conllu --coref b.conllu)
    #: what :func:`attnscope.sources.read_source` accepts for it (``store``,
    #: ``examples``, ``trees``, ``text``); empty: the family reads it with a reader of its own
    kinds: tuple[str, ...] = ()
    argument: str | None = None  # name of the positional argument in ``attnscope analyze``
    sample: str | None = None  # a small valid input in attnscope/demo_data (the contract test runs it)
    analyze_flag: str | None = None  # flag in ``attnscope analyze`` when it differs from ``flag``
    #: what ``run_family`` may be given instead of a file, already read, for an input the family
    #: reads with a reader of its own (coref: ``Document``); inputs with ``kinds`` take an opened
    #: store or a list of examples (:func:`attnscope.sources.read_source`)
    objects: tuple[type, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def paths(self, value: Any) -> list[Path]:
        """The files given for this input: none, one, or (``multiple``) several."""
        return [v for v in self.given(value) if isinstance(v, Path)]

    def given(self, value: Any) -> list[Any]:
        """What was given for this input, one item each: the files as Paths and, from Python,
        what was read already (an opened store, a list of examples, a coreference document)."""
        if value is None:
            return []
        items = list(value) if self.multiple else [value]
        return [Path(v) if isinstance(v, (str, os.PathLike)) else v for v in items]


@dataclass(frozen=True)
class CompareTable:
    """A table of a family's results that ``attnscope compare`` sets side by side for two runs:
    ``table`` of ``results/<key>.json``, one row per ``key`` value, with each of ``values`` from
    both runs and the change (B - A), shown as ``name`` with ``caption``."""

    name: str
    table: str
    key: str
    values: tuple[str, ...]
    caption: str
    selection: str | None = "paper"  # rows with a ``selection`` column keep only this one


def option(default: Any, help: str, *, choices: tuple[str, ...] | None = None,
           minimum: float | None = None):
    """A field of a family's ``Options`` dataclass: its help text, and the choices or the
    smallest value it accepts (both checked by :func:`check_options`, naming the field). Its
    command-line flag follows from the family's key and the field's name
    (:func:`attnscope.cli.families.option_flag`)."""
    return field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum})


@dataclass
class NoOptions:
    """Options of a family that has none."""


def check_options(options: Any) -> None:
    """Refuse a value outside a field's ``choices`` or below its ``minimum``, naming the field
    (the command line shows its flag: :meth:`~attnscope.errors.AttnscopeError.for_flags`)."""
    for f in dataclasses.fields(options):
        choices, minimum = f.metadata.get("choices"), f.metadata.get("minimum")
        value = getattr(options, f.name)
        if choices and value not in choices:
            raise AttnscopeError(f"{f.name} must be one of {', '.join(choices)}, not {value!r}",
                                 params=(f.name,))
        if minimum is not None and value is not None and not value >= minimum:
            raise AttnscopeError(f"{f.name} must be at least {minimum}, not {value!r}", params=(f.name,))


@dataclass
class Context:
    """What every family gets from the job: the loaded model (None when a family runs on a store
    alone), the output folder (``tables/``, ``figures/``, ``results/`` go under it), the shared
    settings, a ``progress(step, done, total)`` callback, and the executor that runs its passes
    (:mod:`attnscope.executor`: here, or on Ray workers). Split by who uses it: the job's
    settings and the family's provenance and progress here (:meth:`made_by`, :meth:`skipped`,
    :meth:`step`, :meth:`result`); what runs the model in :attr:`passes` (a family runs its
    analyses through ``ctx.passes.run`` and ``ctx.passes.stream``, never in a loop of its own);
    the work that outlives a killed run in :attr:`units`."""

    model: Any
    out_dir: Path
    seed: int = 0
    max_seq_len: int = 128
    batch_size: int = 16
    progress: Progress | None = None
    save_maps: Path | None = None  # keep the family's maps in a store under this folder
    executor: Any = None  # attnscope.executor.LocalExecutor (None: local) or RayExecutor
    #: results of the families this one :attr:`~Family.uses` that ran in the same job, by key
    #: (read back through :class:`~attnscope.store.results.ResultsFolder`); never a file that
    #: happens to be in the output folder
    results: dict[str, dict] = field(default_factory=dict)
    #: the kind of attention an encoder-decoder store is read as ("encoder", "decoder"; None:
    #: the store's default, its encoder), see :class:`attnscope.store.reader.Store`
    attention: str | None = None
    #: the family this context runs, and the fingerprint of what decides its numbers (model,
    #: options, seed, data), set by the pipeline: the resumable steps of :meth:`Units.tasks` are kept
    #: under them
    family: str = ""
    job: str = ""

    def result(self, section: Any) -> FamilyResult:
        """What the family just made, as :meth:`Family.run` returns it: the results file it wrote
        (``results/<section.key>.json``), read back as every reader reads it, with the report's
        ``section``."""
        made = FamilyResult.read(self.out_dir, section.key, section)
        if made is None:
            raise AttnscopeError(f"{section.key}: the family wrote no readable "
                                 f"{results_path(self.out_dir, section.key)}")
        return made

    def step(self, name: str, done: int, total: int | None, unit: str | None = None) -> None:
        """Report ``done`` of ``total`` ``unit`` ("examples", "documents") of step ``name`` (and
        stop there if a stop was asked for and a library swallowed it: :func:`check_stop`)."""
        check_stop()
        if self.progress is not None:
            self.progress(with_unit(name, unit), done, total)

    def made_by(self, source: Any) -> tuple[dict[str, Any], bool]:
        """Which model made the maps of ``source`` (a store, or examples this job's model runs
        on): its description and whether it is causal, from the store's manifest or the model."""
        if isinstance(source, Store):
            made = source.manifest["model"]
            return made, bool(made.get("causal", False))
        return self.model.describe(), bool(self.model.facts.causal)

    def skipped(self, count: int, what: str = "examples") -> list[str]:
        """The findings' line for ``count`` inputs over the maximum length that a pass left out
        (none when ``count`` is 0): every family says it the same way."""
        return [f"{count} {what} longer than {self.max_seq_len} tokens were skipped"] if count else []

    @property
    def passes(self) -> "Passes":
        """What runs the model for the family (:class:`Passes`)."""
        return Passes(self)

    @property
    def units(self) -> "Units":
        """The family's resumable work (:class:`Units`)."""
        return Units(self)

    def counter(self, step: str, total: int, start: int = 0, *, unit: str = "items") -> Callable[[int], None]:
        """A ``tick(k)`` that counts ``k`` more ``unit`` done of ``total`` (from ``start``) and
        shows the progress under ``step``."""
        done = start

        def tick(k: int) -> None:
            nonlocal done
            done += k
            self.step(step, done, total, unit)
        return tick

@dataclass(frozen=True)
class Passes:
    """What runs the model for a family: its passes over examples or a store, a few maps for a
    figure, the streaming statistics, one small call, a store of its own, all on the job's
    executor with the job's options (``ctx.passes``). The pipeline and the executor are behind
    these; a family never runs the model itself."""

    ctx: Context

    def options(self, **overrides: Any):
        """The job's :class:`~attnscope.extract.runner.ExtractOptions` (maximum length, batch
        size, seed), with ``overrides`` (e.g. ``word_level=True``)."""
        return ExtractOptions(max_seq_len=self.ctx.max_seq_len, batch_size=self.ctx.batch_size, seed=self.ctx.seed,
                              **overrides)

    def run(self, source: Any, analyses: list, *, step: str, note: str | None = None,
                 **overrides: Any):
        """Feed ``analyses`` once from ``source`` (examples, run through the model with the job's
        options and ``overrides``, or a store) on the job's executor; returns a
        :class:`~attnscope.executor.PassOutcome` (:func:`attnscope.executor.run_pass`; ``note``
        goes into its error when no example fits)."""
        return run_pass(source, analyses, model=self.ctx.model, options=self.options(**overrides),
                        executor=self.ctx.executor, step=step, progress=self.ctx.progress, note=note,
                        family=self.ctx.family)

    def maps(self, examples: Sequence, indices: Sequence[int], **overrides: Any) -> list:
        """The maps of the few ``examples[i]`` for ``i`` in ``indices`` that a figure draws, made
        on the job's executor with the job's options and ``overrides``, in the order of
        ``indices``; each map's ``index`` is its ``i``. Examples over the maximum length have no
        map."""
        indices = list(indices)
        extractor = Extractor(self.ctx.model, self.options(**overrides))
        with small_matrix_threads():
            maps = [m for _, batch in (self.ctx.executor or LocalExecutor()).batches(
                extractor, [examples[i] for i in indices]) for m in batch]
        return [dataclasses.replace(m, index=indices[m.index]) for m in sorted(maps, key=lambda m: m.index)]

    def stream(self, sequences, stats, *, step: str, start: int = 0, total: int | None = None,
               unit: str = "sequences", **kwargs: Any) -> int:
        """Fold the streaming statistics of token id ``sequences`` into ``stats`` (no ``[n n]``
        maps) on the job's executor, with progress under ``step`` in ``unit`` (counting on from
        ``start`` of ``total``, for a step made of several calls); a ``plan``
        (:func:`~attnscope.engines.plan.plan`) says how, and whether it must run in this process
        whatever the executor. Returns how many workers ran it (0: here)."""
        ex = self.ctx.executor or LocalExecutor()
        return ex.stream(self.ctx.model, sequences, stats,
                         progress=self.ctx.counter(step, total or len(sequences), start, unit=unit), **kwargs)

    def encoded(self, examples: Sequence, **overrides: Any) -> list:
        """``examples`` encoded with the job's options and ``overrides`` (token ids, word
        alignment; no forward pass), those over the maximum length left out."""
        return list(Extractor(self.ctx.model, self.options(**overrides)).encode_all(examples))

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(model, *args, **kwargs)`` for one small pass (one example's maps, a timing
        probe) through the job's executor, which runs it here."""
        return (self.ctx.executor or LocalExecutor()).call(self.ctx.model, fn, *args, **kwargs)

    def save_store(self, examples: Sequence, path: Path, *, step: str, dtype: str = "float16",
                   resume: bool = False, **overrides: Any):
        """Extract ``examples`` into a store at ``path`` on the job's executor, with the job's
        options and ``overrides`` (e.g. ``word_level=True``) and progress under ``step``, and
        return it opened (:func:`attnscope.jobs.extract_to_store`). ``resume``: a store a killed
        run left at ``path`` (under :meth:`Units.scratch`) keeps its whole shards, of four batches each,
        so that a kill costs at most four batches' forward passes."""
        total = len(examples)
        extract_to_store(examples, path, self.ctx.model, options=self.options(**overrides), dtype=dtype,
                         executor=self.ctx.executor, resume=resume, shard_size=4 * self.ctx.batch_size if resume else 128,
                         progress=lambda done, tokens: self.ctx.step(step, done, total, "examples"))
        self.ctx.step(step, total, total, "examples")  # every one read (the too long ones skipped)
        return open_store(path)



@dataclass(frozen=True)
class Units:
    """A family's work that outlives a killed run (``ctx.units``): records of finished tasks and
    chunks kept under the job's fingerprint, folders and state for work in progress; the
    pipeline removes them once the family's results are written."""

    ctx: Context

    def tasks(self, step: Callable[[Any, Any], dict], items: Sequence, *, name: str, label: str,
              unit: str = "tasks") -> list[dict]:
        """``step(model, item)`` -> a JSON-able record for each item (a task, a document), run on
        the job's executor with progress under ``label`` in ``unit``; returns the records in
        item order.
        Each finished item's record is kept in ``run/<family>-<name>.jsonl`` of the output
        folder under the job's fingerprint, so a killed run picks up where it stopped (the
        pipeline removes the log once the family's results are written). ``step`` is a
        picklable callable: on Ray it runs on the workers."""
        return (self.ctx.executor or LocalExecutor()).tasks(self.ctx.model, step, items, log=self._log(name, items),
                                                        progress=self.ctx.counter(label, len(items), unit=unit))

    def chain(self, step: Callable[[Any, Any, dict | None], dict], items: Sequence, *, name: str, label: str,
              unit: str = "chunks") -> list[dict]:
        """``step(model, item, previous)`` for each item in order, each from the record of the
        one before (a training run in chunks; :meth:`attnscope.executor.LocalExecutor.chain`):
        kept and resumed as :meth:`tasks` keeps them, always in this process."""
        return (self.ctx.executor or LocalExecutor()).chain(self.ctx.model, step, items, log=self._log(name, items),
                                                        progress=self.ctx.counter(label, len(items), unit=unit))

    def finished(self, name: str, items: Sequence) -> int:
        """How many of ``items`` an earlier, killed run of this job already finished in the step
        ``name`` of :meth:`tasks` (they will not run again)."""
        return len(self._log(name, items).done)

    def scratch(self, name: str) -> Path:
        """A folder for the work in progress called ``name`` (the stores a family extracts for
        itself) that outlives a killed run of this job: ``run/<family>-<name>`` of the output
        folder, emptied first when another job left it. The pipeline removes it with the unit
        logs once the family's results are written."""
        folder = unit_path(self.ctx.out_dir, self.ctx.family or "family", name)
        stamp = folder / "job"
        if folder.exists() and not (stamp.is_file() and stamp.read_text(encoding="utf-8") == self.ctx.job):
            shutil.rmtree(folder)
        folder.mkdir(parents=True, exist_ok=True)
        stamp.write_text(self.ctx.job, encoding="utf-8")
        return folder

    def state_file(self, name: str) -> StateFile:
        """The state of this job's step ``name`` that runs in rounds (a training run's epochs),
        kept in ``run/<family>-<name>.safetensors`` until the family's results are written."""
        return StateFile(unit_path(self.ctx.out_dir, self.ctx.family or "family", f"{name}.safetensors"),
                         fingerprint(self.ctx.job, name))

    def _log(self, name: str, items: Sequence) -> UnitLog:
        return UnitLog(unit_log_path(self.ctx.out_dir, self.ctx.family, name), fingerprint(self.ctx.job, name, len(items)))


@dataclass
class Prepared:
    """A family's inputs, read and checked before anything is written. ``weight`` estimates
    the work (in examples) for the run's overall progress; ``counts`` go to the provenance."""

    data: dict[str, Any]
    weight: int = 1
    counts: dict[str, int] = field(default_factory=dict)
    #: how the family's pass will run where it chose (:class:`~attnscope.engines.plan.Plan`:
    #: engine, backend and why), which ``--explain`` prints
    plan: Any = None


class Family(ABC):
    """Base class of a family; subclasses set the class attributes and implement two methods."""

    key: ClassVar[str]  # stable name: results/<key>.json, ``attnscope analyze <key>``
    title: ClassVar[str]  # the report section's heading
    help: ClassVar[str]  # one line for ``attnscope analyze --help``
    inputs: ClassVar[tuple[Input, ...]]
    Options: ClassVar[type] = NoOptions
    default_model: ClassVar[str | None] = None  # ``analyze`` without --model on files: load this
    #: ``analyze`` without --max-seq-len: this many tokens, at most the model's positions
    default_max_seq_len: ClassVar[int] = 128
    saves_maps: ClassVar[bool] = False  # honours Context.save_maps (``--save-maps``)
    order: ClassVar[int] = 100  # position in the report and in ``attnscope run``
    demo: ClassVar[bool] = True  # ``attnscope demo`` runs it on its inputs' packaged samples
    compare_tables: ClassVar[tuple[CompareTable, ...]] = ()  # set side by side by ``compare``
    #: keys of families whose results this one reads when they run in the same job: the
    #: pipeline runs those first and hands their results in :attr:`Context.results`
    uses: ClassVar[tuple[str, ...]] = ()
    #: runs on decoder (causal) models only (the contract test gives it a tiny decoder)
    causal_only: ClassVar[bool] = False
    #: reads an encoder-decoder store as the kind of attention the job names
    #: (:attr:`Context.attention`, ``--attention``)
    reads_attention_kinds: ClassVar[bool] = False
    #: options of a quick run on the packaged samples (the contract test's), where the defaults
    #: are sized for real corpora
    sample_options: ClassVar[dict[str, Any]] = {}

    @abstractmethod
    def prepare(self, inputs: dict[str, Any], options: Any, ctx: Context) -> Prepared:
        """Read and check the inputs (``inputs[name]`` is a Path, a list of Paths for
        ``multiple``, or None); raise :class:`~attnscope.errors.InputError` naming the file and
        line. Must not write anything."""

    def explain(self, prepared: Prepared, options: Any, ctx: Context) -> list[str]:
        """How the family's pass would run on these inputs, and why (``--explain``): the lines of
        its plan, where it made one."""
        if prepared.plan is not None:
            return prepared.plan.lines()
        return ["reads the attention maps (no engine or backend to choose)"]

    @abstractmethod
    def run(self, prepared: Prepared, options: Any, ctx: Context) -> FamilyResult:
        """Run the analyses and write tables, figures and ``results/<key>.json`` under
        ``ctx.out_dir``; return what it made (:meth:`Context.result` of the report's
        :class:`~attnscope.report.section.Section`)."""

    def view(self, result: FamilyResult, source: str, problems: list[str]) -> dict:
        """The panels of the viewers that this family's ``result`` (its results file, read as a viewer
        reads it: :meth:`FamilyResult.read_all <attnscope.analyses.family_result.FamilyResult.read_all>`, named
        ``source``) fill: for the results page, any of ``profiles`` (a list of
        :func:`~attnscope.viz.results_views.profiles_from_result` items), ``sinks`` (a list of
        :func:`~attnscope.viz.results_views.sink_heatmap` items) and ``attribution`` (an
        :func:`~attnscope.viz.results_views.attribution_payload`); for the per-head panel of
        ``attnscope serve`` (:mod:`attnscope.serve.head_stats`, which shows every per-head table
        and ``[L, H]`` array by itself), ``grids`` (a list of
        :func:`~attnscope.viz.results_views.relation_grids` items) and ``scatter`` (a
        :func:`~attnscope.viz.results_views.head_scatter`). Malformed parts are named in
        ``problems``. None by default."""
        return {}

    def unavailable(self) -> str | None:
        """Why this family cannot run in this installation (a missing optional extra), or None."""
        return None

    def wants_mlm_head(self, options: Any) -> bool:
        """Whether the model should be loaded with its masked-LM head when it has one."""
        return False

    def fingerprint(self, options: Any) -> dict[str, Any]:
        """What decides this family's numbers besides the data and the model (for --resume)."""
        return dataclasses.asdict(options)


FAMILIES: dict[str, type[Family]] = {}


def hookable_decoder(lm, what: str, computes: frozenset[str], length: int) -> None:
    """Refuse, in one line naming ``--model``, a model that is not a decoder whose attention
    attnscope computes itself (the KV-cache families); ``what`` says why a decoder is needed.
    ``computes``: the mechanisms (:data:`attnscope.models.facts.MECHANISMS`) that family's own
    attention computes as the model does; a model with another is refused, naming it, but for a
    sliding window or chunk of at least ``length`` tokens (the longest sequence), which every row
    sees whole."""
    from attnscope.engines.backends import needs

    if not lm.facts.causal:
        raise AttnscopeError(f"{lm.name} is an encoder; {what} (give a decoder, e.g. --model smollm2)",
                             params=("model",))
    if not supports_hooks(lm):
        raise AttnscopeError(f"{lm.name}: attnscope cannot compute its attention itself "
                             "(its transformers code bypasses AttentionInterface)", params=("model",))
    reach = {"window": lm.facts.window, "chunk": lm.facts.chunk}
    lacks = sorted(m for m in needs(lm.facts) - computes if not (reach.get(m) or 0) >= length > 0)
    if lacks:
        sizes = "".join(f" ({m} {reach[m]} tokens, sequences of {length})" for m in lacks if reach.get(m))
        raise AttnscopeError(f"{lm.name}: {what}, and attnscope's own attention there does not compute "
                             f"this model's {', '.join(lacks)}{sizes}; analyze longctx does", params=("model",))


def register_family(cls: type[Family]) -> type[Family]:
    """Class decorator: make a family available to ``run``, ``analyze`` and the report."""
    if cls.key in FAMILIES and FAMILIES[cls.key] is not cls:
        raise ValueError(f"family {cls.key!r} registered twice")
    if not cls.inputs:
        raise ValueError(f"family {cls.key!r} declares no inputs")
    FAMILIES[cls.key] = cls
    return cls
