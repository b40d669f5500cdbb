"""``attnscope run``: raw inputs in, every analysis they allow, one HTML report out.

Its family switches (``--text``, ``--deps``, ``--coref``, ...) and family options
(``--general-gradients``, ``--coref-window``, ...) come from the families registry.
"""

from __future__ import annotations

from pathlib import Path

import typer

from attnscope.cli.common import check_writable, command_line, console, step_progress
from attnscope.cli.families import (
    EXPLAIN,
    QUIET,
    _param,
    executor_params,
    input_params,
    option_params,
    shared_params,
    with_signature,
)
from attnscope.cli.options import MODEL_HELP, save_maps_option
from attnscope.families import load_families
from attnscope.pipeline import RunConfig, run_pipeline


def print_outcome(outcome, quiet: bool) -> None:
    """The report's path on stdout (for scripts); a short summary on stderr unless quiet."""
    if not quiet:
        for n in outcome.notes:
            console.print(f"[yellow]note:[/] {n['title']}: {n['message']}")
        done = ", ".join(f"{k} ({v})" for k, v in outcome.status.items())
        console.print(f"analyses: {done or 'none'}; {outcome.elapsed_s:.1f} s")
        console.print(f"results: {outcome.results}")
    print(outcome.report)


def _run_command(families):
    def run_cli(**values) -> None:
        quiet, out = values.pop("quiet"), values.pop("out_dir")
        resume, overwrite = values.pop("resume"), values.pop("overwrite")
        check_writable(out, folder=True)
        where = {"ray": values.pop("ray"), "workers": values.pop("workers")}  # the executor
        for inp in (i for fam in families for i in fam.inputs if i.multiple):
            values[inp.name] = list(values[inp.name] or [])
        explain = values.pop("explain")
        cfg = RunConfig(families=families, **values)
        if explain:  # how each family's pass would run, and why; nothing runs or is written
            for key, lines in run_pipeline(cfg, out, resume=resume, overwrite=overwrite, explain=True,
                                           **where).items():
                for line in lines:
                    print(f"{key}: {line}")
            return
        with step_progress(quiet, overall=True) as progress:
            outcome = run_pipeline(cfg, out, resume=resume, overwrite=overwrite, progress=progress,
                                   command=command_line(), **where)
        print_outcome(outcome, quiet)

    params = shared_params(model_default="default", model_help=MODEL_HELP)
    params[0] = _param("out_dir", Path, typer.Option(..., "--out", "-o", metavar="DIR", help=(
        "Folder for the report, tables, figures and results.")))
    seen: dict[str, str] = {}
    for fam in families:
        for p in [*input_params(fam, positional=False), *option_params(fam)]:
            if p.name in seen:
                raise ValueError(f"families {seen[p.name]} and {fam.key} both declare {p.name!r}")
            seen[p.name] = fam.key
            params.append(p)
    params += [
        _param("save_maps", bool, save_maps_option()),
        _param("resume", bool, typer.Option(False, "--resume", show_default=False,
                                            help="Continue an interrupted run in OUT.")),
        _param("overwrite", bool, typer.Option(False, "--overwrite", show_default=False,
                                               help="Replace a run already in OUT.")),
        *executor_params(),
        EXPLAIN,
        QUIET,
    ]
    run_cli.__doc__ = "Run every analysis the inputs allow and write OUT/report.html."
    return with_signature(run_cli, params)


def register(app: typer.Typer, analyze_app: typer.Typer) -> None:
    app.command("run")(_run_command(load_families()))
