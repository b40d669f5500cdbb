"""A run's configuration: the models, inputs and options of ``attnscope run``
(:class:`RunConfig`), checked before anything is written (:func:`check_config`), the data files
it reads with their sha256 (:func:`data_files`), and what a run returns (:class:`RunOutcome`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnscope.data.io import file_fingerprint, to_plain
from attnscope.errors import AttnscopeError, InputError
from attnscope.families import Family, check_options, load_families

#: The shortest maximum length accepted: room for the special tokens and a few words.
MIN_MAX_SEQ_LEN = 8


#: Settings every family shares (they reach a family through its Context).
SHARED = {"model": "default", "max_seq_len": 128, "batch_size": 16, "seed": 0, "save_maps": False,
          "device": "cpu"}


class RunConfig:
    """Every argument that decides what a run computes.

    The shared settings (``model``, ``max_seq_len``, ``batch_size``, ``seed``, ``save_maps``)
    plus, by name, each registered family's inputs (``text``, ``deps``, ``deps_train``,
    ``coref``, ...) and options (``gradients``, ``window``, ``glove``, ``min_count``, ...); see
    ``attnscope run --help``. An unknown name is refused.

    >>> RunConfig(text="wiki.txt", window="sliding").options["coref"].window
    'sliding'
    """

    def __init__(self, model: str = "default", *, max_seq_len: int = 128, batch_size: int = 16,
                 seed: int = 0, save_maps: bool = False, families: Sequence[type[Family]] | None = None,
                 device: str = "cpu", **named: Any):
        self.model, self.max_seq_len, self.batch_size = model, max_seq_len, batch_size
        self.device = device  # where the model runs ("auto": CUDA when present); see load_model
        self.seed, self.save_maps = seed, save_maps
        self.families = list(families) if families is not None else load_families()
        self.inputs: dict[str, Any] = {}
        self.options: dict[str, Any] = {}
        known: set[str] = set()
        for fam in self.families:
            for inp in fam.inputs:
                value = named.pop(inp.name, None)
                if inp.multiple:
                    value = [Path(p) for p in (value or [])]
                elif value is not None:
                    value = Path(value)
                self.inputs[inp.name] = value
                known.add(inp.name)
            fields = {f.name for f in dataclasses.fields(fam.Options)}
            self.options[fam.key] = fam.Options(**{k: named.pop(k) for k in list(named) if k in fields})
            known |= fields
        if named:
            raise AttnscopeError(f"unknown run argument(s) {', '.join(sorted(named))}; known: "
                                 f"{', '.join(sorted(known | set(SHARED)))}")

    def selected(self) -> list[type[Family]]:
        """The families whose first input is given, in report order."""
        return [f for f in self.families if self.inputs.get(f.inputs[0].name)]

    def paths(self) -> list[tuple[str, Path]]:
        """Every input file and every path-valued option, as ``(role, path)``."""
        out: list[tuple[str, Path]] = []
        for fam in self.families:
            for inp in fam.inputs:
                out += [(inp.name.replace("_", "-"), p) for p in inp.paths(self.inputs.get(inp.name))]
            for f in dataclasses.fields(fam.Options):
                value = getattr(self.options[fam.key], f.name)
                if isinstance(value, Path):
                    out.append((f.name.replace("_", "-"), value))
        return out

    def as_dict(self) -> dict[str, Any]:
        """The arguments that decide what this run computes: the shared settings, and the
        inputs and options of the families it runs (:meth:`selected`); another family's
        options change nothing, so they are neither recorded nor fingerprinted.

        >>> args = RunConfig(text="wiki.txt", window="sliding").as_dict()  # window: coref's
        >>> "text" in args, "gradients" in args, "window" in args, "deps" in args
        (True, True, False, False)
        """
        d: dict[str, Any] = {"model": self.model, "max_seq_len": self.max_seq_len,
                             "batch_size": self.batch_size, "seed": self.seed, "save_maps": self.save_maps,
                             "device": self.device}
        for fam in self.selected():
            for inp in fam.inputs:
                value = self.inputs[inp.name]
                d[inp.name] = [str(p) for p in value] if isinstance(value, list) else (
                    None if value is None else str(value))
            d.update(to_plain(dataclasses.asdict(self.options[fam.key])))
        return d


@dataclass
class RunOutcome:
    """What a run produced: paths, the status of each family, and how long it took."""

    out_dir: Path
    report: Path
    results: Path
    status: dict[str, str]  # family -> "done" | "resumed" | "unavailable"
    notes: list[dict[str, str]]
    elapsed_s: float
    results_json: dict[str, Any] = field(default_factory=dict)


def check_config(cfg: RunConfig) -> None:
    """Refuse arguments that cannot work, with one line naming the argument or file."""
    for fam in cfg.families:
        first = fam.inputs[0]
        for inp in fam.inputs[1:]:
            if cfg.inputs.get(inp.name) and not cfg.inputs.get(first.name):
                raise AttnscopeError(f"{inp.name} needs {first.name}", params=(inp.name, first.name))
    if not cfg.selected():
        flags = ", ".join(f.inputs[0].flag for f in cfg.families)
        raise AttnscopeError(f"nothing to do: give at least one of {flags}")
    for fam in cfg.families:  # a bad value is refused even for a family that will not run
        check_options(cfg.options[fam.key])
    if cfg.max_seq_len < MIN_MAX_SEQ_LEN:
        raise AttnscopeError(f"max_seq_len must be at least {MIN_MAX_SEQ_LEN}, not {cfg.max_seq_len}",
                             params=("max_seq_len",))
    if cfg.batch_size < 1:
        raise AttnscopeError(f"batch_size must be at least 1, not {cfg.batch_size}", params=("batch_size",))
    for _role, p in cfg.paths():
        if not p.exists():
            raise InputError(p, "no such file")


def data_files(cfg: RunConfig) -> list[dict[str, Any]]:
    """Provenance of every input file: role, path, sha256 and size (a store folder: its
    manifest's)."""
    out = []
    for role, p in cfg.paths():
        target = p / "manifest.json" if p.is_dir() else p
        if target.is_file():
            out.append({"role": role, "path": str(p), "sha256": file_fingerprint(target),
                        "bytes": target.stat().st_size})
    return out
