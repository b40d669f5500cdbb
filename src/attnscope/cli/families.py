"""``attnscope analyze <family>`` for every registered family, and the family switches of
``attnscope run``: both built from the registry (:mod:`attnscope.families`), so a new family
needs no CLI code.

A family's first input is the positional argument of its ``analyze`` command and the switch
that turns it on in ``run``; its other inputs and every field of its ``Options`` dataclass
become options (help text and choices from the field's metadata). A field's flag is derived
here, and only here, by :func:`option_flag`: ``--<family key>-<field>``, the same in ``run`` and
``analyze <key>``, so a flag names one thing in every command (docs/families.md).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import typing
from pathlib import Path
from typing import Any

import typer

from attnscope.cli.common import check_writable, console, step_progress
from attnscope.cli.options import (
    MODEL_HELP,
    batch_size_option,
    device_option,
    max_seq_len_option,
    quiet_option,
    ray_option,
    save_maps_option,
    seed_option,
    workers_option,
)
from attnscope.families import load_families
from attnscope.pipeline import run_family

_P = inspect.Parameter


def _param(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return _P(name, _P.KEYWORD_ONLY, default=default, annotation=annotation)


def option_flag(fam, f: dataclasses.Field) -> str:
    """The flag of field ``f`` of ``fam.Options``: the family's key, then the field's name
    (``--coref-window``, ``--longctx-dtype``), or the field's name alone when it already begins
    with the key (``syntax_ties`` -> ``--syntax-ties``). The parameter behind it keeps the
    field's name, which library errors name (``AttnscopeError.params``)."""
    name = f.name if f.name.startswith(fam.key + "_") else f"{fam.key}_{f.name}"
    return "--" + name.replace("_", "-")


def option_params(fam) -> list[inspect.Parameter]:
    """One command-line option per field of ``fam.Options``, flagged by :func:`option_flag`."""
    hints = typing.get_type_hints(fam.Options)
    out = []
    for f in dataclasses.fields(fam.Options):
        choices = f.metadata.get("choices")
        kwargs: dict[str, Any] = {"help": f.metadata.get("help", "")}
        annotation, default = hints[f.name], f.default
        if choices:  # typer shows an Enum's values as the choices
            annotation = enum.StrEnum(f"{fam.key}_{f.name}", {c: c for c in choices})
            default = annotation(f.default)
        elif annotation is bool:
            kwargs["show_default"] = False
        out.append(_param(f.name, annotation, typer.Option(default, option_flag(fam, f), **kwargs)))
    return out


def input_params(fam, *, positional: bool) -> list[inspect.Parameter]:
    """The family's inputs: the first one positional (``analyze``) or all as options (``run``)."""
    out = []
    for i, inp in enumerate(fam.inputs):
        annotation = list[Path] if inp.multiple else Path
        if positional and i == 0:
            info = typer.Argument(..., help=inp.help, metavar=(inp.argument or inp.name).upper()
                                  + ("..." if inp.multiple else ""))
            out.append(_P(inp.argument or inp.name, _P.POSITIONAL_OR_KEYWORD, default=info,
                          annotation=annotation))
            continue
        flag = (inp.analyze_flag or inp.flag) if positional else inp.flag
        metavar = "FILE" + ("..." if inp.multiple else "")
        out.append(_param(inp.name, annotation | None, typer.Option(None, flag, help=inp.help,
                                                                     metavar=metavar)))
    return out


def with_signature(fn, params: list[inspect.Parameter]):
    """Give ``fn(**values)`` the signature typer builds the command from; choices arrive as
    plain strings."""
    ordered = sorted(params, key=lambda p: p.kind)  # positional parameters first

    def command(**values):
        return fn(**{k: v.value if isinstance(v, enum.Enum) else v for k, v in values.items()})

    command.__signature__ = inspect.Signature(ordered)
    command.__annotations__ = {p.name: p.annotation for p in ordered}
    command.__doc__, command.__name__ = fn.__doc__, fn.__name__
    return command


def shared_params(*, model_default: str | None, model_help: str,
                  family_max_seq_len: int | None = None) -> list[inspect.Parameter]:
    """``family_max_seq_len``: one family's own default of --max-seq-len (``analyze``; left to
    the library, which keeps it within the model's positions); None: 128."""
    help_len = "Tokens per example, special tokens included; longer ones are skipped."
    if family_max_seq_len is not None:
        help_len += f" Default: {family_max_seq_len} (at most the model's positions)."
    return [
        _param("out_dir", Path, typer.Option(..., "--out", "-o", help="Output folder (tables/, figures/, "
                                         "results/).", metavar="DIR")),
        _param("model", str | None, typer.Option(model_default, "--model", "-m", help=model_help)),
        _param("max_seq_len", int | None, max_seq_len_option(None if family_max_seq_len else 128, help_len)),
        _param("batch_size", int, batch_size_option(16)),
        _param("seed", int, seed_option(0)),
        _param("device", str, device_option()),
    ]


QUIET = _param("quiet", bool, quiet_option())
EXPLAIN = _param("explain", bool, typer.Option(
    False, "--explain", show_default=False, help="Say how the pass would run (engine, backend, and why "
                                                  "each other backend was turned down) and stop: nothing "
                                                  "runs or is written."))
ATTENTION = _param("attention", str | None, typer.Option(
    None, "--attention", help="An encoder-decoder store (T5, BART): read it as its encoder "
                              "(default) or decoder self-attention.", metavar="KIND"))


def executor_params() -> list[inspect.Parameter]:
    """``--ray`` and ``--workers`` (the executor: :mod:`attnscope.executor`), shared by
    ``analyze <family>`` and ``run``."""
    return [_param("ray", bool, ray_option()), _param("workers", int, workers_option())]


def print_section(section, out: Path) -> None:
    """A family's findings and its first table on stdout; where the files went on stderr."""
    for line in section.findings:
        print(line)
    for t in section.tables[:1]:
        md = next((p for p in t.paths if p.suffix == ".md"), None)
        if md is not None:
            print(md.read_text(encoding="utf-8"))
    console.print(f"wrote {out}/tables, {out}/figures, {out}/results", highlight=False)


def _analyze_command(fam):
    def command(**values) -> None:
        quiet = values.pop("quiet")
        out = values.pop("out_dir")
        shared = {k: values.pop(k) for k in ("model", "max_seq_len", "batch_size", "seed", "device",
                                             "ray", "workers", "attention")}
        save_maps = out / "maps" / fam.key if values.pop("save_maps", False) else None
        check_writable(out, folder=True)
        inputs = {}
        for i, inp in enumerate(fam.inputs):
            value = values.pop(inp.argument or inp.name if i == 0 else inp.name)
            inputs[inp.name] = list(value) if inp.multiple and value is not None else value
        if values.pop("explain"):  # how the pass would run, and why; nothing runs or is written
            for line in run_family(fam.key, inputs, out, save_maps=save_maps, explain=True, **shared, **values):
                print(line)
            return
        with step_progress(quiet) as progress:
            section = run_family(fam.key, inputs, out, save_maps=save_maps, progress=progress,
                                 **shared, **values)
        if not quiet:
            print_section(section, out)

    params = [*input_params(fam, positional=True),
              *shared_params(model_default=None, model_help=(
                  MODEL_HELP[:-1] + "; " + (f"default: {fam.default_model}; " if fam.default_model else "")
                  + "not needed when every input is a store."), family_max_seq_len=fam.default_max_seq_len),
              *option_params(fam), *executor_params(), ATTENTION, EXPLAIN, QUIET]
    if fam.saves_maps:
        params.append(_param("save_maps", bool, save_maps_option()))
    command.__doc__ = fam.help
    return with_signature(command, params)


def register(app: typer.Typer, analyze_app: typer.Typer) -> None:
    for fam in load_families():
        analyze_app.command(fam.key, help=fam.help)(_analyze_command(fam))
