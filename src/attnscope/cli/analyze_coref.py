"""``attnscope analyze coref``: which heads find antecedents (paper Table 2)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from attnscope.cli.common import console, step_progress


class Window(StrEnum):
    truncate = "truncate"
    sliding = "sliding"


class Candidates(StrEnum):
    mentions = "mentions"
    words = "words"


def register(app: typer.Typer, analyze_app: typer.Typer) -> None:
    @analyze_app.command("coref")
    def coref_cli(
        files: list[Path] = typer.Argument(..., help="Coreference files: CoNLL-U with Entity= in MISC "
                                                     "(CorefUD, OntoGUM) or CoNLL-2012 *_conll; read as one corpus."),
        out: Path = typer.Option(..., "--out", "-o", help="Folder for tables/, figures/ and results/."),
        model: str = typer.Option("default", "--model", "-m",
                                  help="Hub id, local folder, 'default' (packaged MiniLM) or debug:<bert|roberta|gpt2>."),
        window: Window = typer.Option(Window.truncate, "--window",
                                      help="truncate: first window of each document (the paper); "
                                           "sliding: overlapping windows, every mention scored once."),
        candidates: Candidates = typer.Option(Candidates.mentions, "--candidates",
                                              help="What a head may choose: head words of preceding mentions, "
                                                   "or all preceding words."),
        max_seq_len: int = typer.Option(128, "--max-seq-len", help="Tokens per window, special tokens included."),
        batch_size: int = typer.Option(16, "--batch-size"),
        n_boot: int = typer.Option(1000, "--n-boot", help="Bootstrap resamples for the 95% intervals."),
        seed: int = typer.Option(0, "--seed"),
        quiet: bool = typer.Option(False, "--quiet", "-q"),
    ) -> None:
        """Antecedent selection accuracy of every head and three baselines (paper section 4.3)."""
        from attnscope.models import load_model
        from attnscope.report.coref import run_coref

        lm = load_model(model, seed=seed)
        with step_progress(quiet) as progress:
            section = run_coref(list(files), lm, out, window=window.value, max_seq_len=max_seq_len,
                                batch_size=batch_size, seed=seed, candidates=candidates.value,
                                n_boot=n_boot, progress=progress)
        if quiet:
            return
        for line in section.findings:
            console.print(line)
        for t in section.tables[:1]:
            md = next((p for p in t.paths if p.suffix == ".md"), None)
            if md is not None:
                console.print(md.read_text(encoding="utf-8"), markup=False, highlight=False)
        console.print(f"written under {out}")
