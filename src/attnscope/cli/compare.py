"""``attnscope compare``: two models head by head (two stores, two run folders, or two models
plus inputs)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from attnscope.cli.common import check_writable, command_line, console, step_progress
from attnscope.cli.options import max_seq_len_option
from attnscope.compare import compare, compare_models
from attnscope.compare.report import findings
from attnscope.errors import AttnscopeError


class Level(str, Enum):
    auto = "auto"
    token = "token"
    word = "word"


def register(app: typer.Typer, analyze_app: typer.Typer) -> None:
    @app.command("compare")
    def compare_cli(
        a: Path = typer.Argument(None, help="Store or run folder (made with --save-maps) of model A; or an "
                                            "output folder without maps (then only the families' tables)."),
        b: Path = typer.Argument(None, help="Store or run folder of model B, of the same inputs."),
        out_dir: Path = typer.Option(..., "--out", "-o", help="Folder for the report, tables and figures."),
        model_a: str = typer.Option(None, "--model-a", help="Run this model as A (with --model-b and --inputs)."),
        model_b: str = typer.Option(None, "--model-b", help="Run this model as B."),
        inputs: Path = typer.Option(None, "--inputs", help="Examples for --model-a/--model-b: JSON, JSON Lines or CoNLL-U."),
        which: str = typer.Option(None, "--maps", help="Which saved maps of two run folders (e.g. general, syntax/dev)."),
        level: Level = typer.Option(Level.auto, "--level", help="auto: tokens when both tokenize alike, else words."),
        n_boot: int = typer.Option(1000, "--n-boot", help="Bootstrap resamples for the intervals."),
        seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap (and of model loading)."),
        max_seq_len: int = max_seq_len_option(128, "With --model-a/-b: longer examples are skipped."),
        batch_size: int = typer.Option(16, "--batch-size"),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace an earlier comparison in --out."),
        quiet: bool = typer.Option(False, "--quiet", "-q"),
    ) -> None:
        """Compare two models head by head: per-head changes with paired bootstrap intervals,
        layer-by-layer divergence, and the matching of A's heads to B's heads."""
        with_models = model_a is not None or model_b is not None or inputs is not None
        if with_models:
            if a is not None or b is not None:
                raise AttnscopeError("give either A and B or --model-a/--model-b with --inputs, not both")
            missing = [f for f, v in (("--model-a", model_a), ("--model-b", model_b), ("--inputs", inputs))
                       if v is None]
            if missing:
                raise AttnscopeError(f"{', '.join(missing)} missing (comparing two models needs all three)")
            if level != Level.auto:
                raise AttnscopeError("--level: two models run here are always compared at word level")
        elif a is None or b is None:
            raise AttnscopeError("give two stores or run folders (A B), or --model-a, --model-b and --inputs")
        elif max_seq_len != 128 or batch_size != 16:
            raise AttnscopeError("--max-seq-len/--batch-size are for --model-a/--model-b only")
        check_writable(out_dir, folder=True)
        with step_progress(quiet) as progress:
            if with_models:
                cmp = compare_models(model_a, model_b, inputs, out_dir, max_seq_len=max_seq_len,
                                     batch_size=batch_size, n_boot=n_boot, seed=seed,
                                     overwrite=overwrite, progress=progress, command=command_line())
            else:
                cmp = compare(a, b, out_dir, which=which, level=level.value, n_boot=n_boot, seed=seed,
                              overwrite=overwrite, progress=progress, command=command_line())
        if not quiet and not hasattr(cmp, "pairing"):  # two output folders without maps: tables only
            console.print(f"compared the tables {', '.join(k for k, v in cmp.run_tables.items() if v)}")
        elif not quiet:
            console.print(f"compared {len(cmp.pairing.indices)} examples at {cmp.pairing.level} level "
                          f"({cmp.pairing.layout})")
            for f in findings(cmp)[1:4]:
                console.print(f"  {f}")
        print(out_dir / "report.html")  # on stdout, also with --quiet (as run): scripts pick it up
