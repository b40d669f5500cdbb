"""``attnscope prepare unlabeled|depparse``: raw inputs into example files."""

from __future__ import annotations

from pathlib import Path

import typer

from attnscope.cli.common import check_new_files, check_writable, read_depparse
from attnscope.cli.options import max_seq_len_option
from attnscope.cli.output import results
from attnscope.data.depparse import depparse_splits
from attnscope.data.io import write_examples
from attnscope.data.unlabeled import PACKINGS, UnlabeledStats, prepare_unlabeled
from attnscope.errors import AttnscopeError
from attnscope.models import load_model


def register(app: typer.Typer, analyze_app: typer.Typer) -> None:
    prepare_app = typer.Typer(help="Turn raw inputs into example files (JSON) for extract.",
                              no_args_is_help=True)
    app.add_typer(prepare_app, name="prepare")

    @prepare_app.command("unlabeled")
    def unlabeled_cli(
        file: Path = typer.Argument(..., help="Sentence-per-line text, blank lines between documents."),
        out: Path = typer.Option(..., "--out", "-o", help="Where to write the examples (JSON)."),
        model: str = typer.Option("default", "--model", help="Model whose tokenizer counts lengths."),
        max_seq_len: int = max_seq_len_option(128, "Tokens per example, special tokens included."),
        num_docs: int = typer.Option(None, "--num-docs", min=1, help="Use at most this many documents."),
        num_examples: int = typer.Option(None, "--num-examples", min=1, help="Write at most this many examples."),
        seed: int = typer.Option(0, "--seed", help="Seed for the A/B split points and the truncation side."),
        packing: str = typer.Option("bert", "--packing",
                                    help="bert: fill each example to --max-seq-len as BERT's pre-training "
                                         "data was built; greedy: pack whole sentences only while they fit "
                                         "(attnscope before 0.2)."),
        keep_unk: bool = typer.Option(False, "--keep-unk",
                                      help="Keep WikiText's '<unk>' words as text instead of mapping them "
                                           "to the tokenizer's unknown token."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out file."),
    ) -> None:
        """Build [CLS] A [SEP] B [SEP] examples (segment ids 0/1) as in BERT pre-training."""
        if packing not in PACKINGS:
            raise AttnscopeError(f"--packing must be one of {', '.join(PACKINGS)}, not {packing!r}")
        check_writable(out, folder=False)
        check_new_files([out], overwrite=overwrite)

        lm = load_model(model, seed=seed)
        stats = UnlabeledStats()
        examples = prepare_unlabeled(file, lm.tokenizer, max_seq_len=max_seq_len, seed=seed,
                                     num_docs=num_docs, num_examples=num_examples, stats=stats,
                                     packing=packing, unk_marker=None if keep_unk else "<unk>",
                                     packed_for=model)
        write_examples(examples, out)
        results.print(f"{out}: {stats.summary()}; seed {seed}", highlight=False)

    @prepare_app.command("depparse")
    def depparse_cli(
        path: Path = typer.Argument(..., help="A paper-format file (word head-relation) or CoNLL-U; "
                                              "a folder with train/dev files writes one output per split."),
        out: Path = typer.Option(..., "--out", "-o", help="Output JSON (or a folder for a split folder)."),
        limit: int = typer.Option(None, "--limit", min=1, help="Keep at most this many sentences per file."),
        overwrite: bool = typer.Option(False, "--overwrite",
                                       help="Replace existing output files (--out, or its split files)."),
    ) -> None:
        """Read dependency trees into examples with words, heads, relns and pos."""
        check_writable(out, folder=path.is_dir())
        # every file is read (and refused when bad or empty) before anything is written
        sources = depparse_splits(path) if path.is_dir() else {None: path}
        check_new_files([out if split is None else out / f"{split}.json" for split in sources],
                        overwrite=overwrite)
        read = {split: read_depparse(f, limit) for split, f in sources.items()}
        for split, examples in read.items():
            target = out if split is None else out / f"{split}.json"
            n = write_examples(examples, target)
            results.print(f"{target}: {n} sentences from {sources[split]}")
