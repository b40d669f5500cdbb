"""``attnscope extract``: examples in, a store out."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from attnscope.cli.common import check_writable, command_line, console, progress_bar, read_inputs
from attnscope.cli.options import (
    MODEL_HELP,
    batch_size_option,
    device_option,
    max_seq_len_option,
    quiet_option,
    ray_option,
    seed_option,
    workers_option,
)
from attnscope.cli.output import results
from attnscope.data.io import file_fingerprint
from attnscope.errors import InputError, Interrupted, StoreError
from attnscope.executor import executor
from attnscope.extract.runner import ExtractOptions
from attnscope.jobs import extract_to_store
from attnscope.models import load_model
from attnscope.models.loading import resolve_device
from attnscope.on_ray import check_ray
from attnscope.store import open_store
from attnscope.store.format import MANIFEST
from attnscope.store.writer import check_output_folder


class Dtype(str, Enum):
    float16 = "float16"
    float32 = "float32"


class FromWord(str, Enum):
    mean = "mean"
    first = "first"


def register(app: typer.Typer, analyze_app: typer.Typer) -> None:
    @app.command("extract")
    def extract_cli(
        input: Path = typer.Argument(..., help="Examples: JSON list, JSON Lines, or CoNLL-U."),
        out: Path = typer.Option(..., "--out", "-o", help="Store folder to write."),
        model: str = typer.Option("default", "--model", "-m",
                                  help=MODEL_HELP),
        debug: bool = typer.Option(False, "--debug", help="Use a tiny random BERT (like the paper code's --debug)."),
        max_seq_len: int = max_seq_len_option(128, "Longer examples are skipped (or cut with --truncate)."),
        truncate: bool = typer.Option(False, "--truncate", help="Cut over-long examples instead of skipping them."),
        batch_size: int = batch_size_option(16),
        cased: bool = typer.Option(None, "--cased/--uncased", help="Default: the tokenizer's own setting."),
        word_level: bool = typer.Option(False, "--word-level", help="Convert to words (paper section 4.1)."),
        from_word: FromWord = typer.Option(FromWord.mean, "--from-word",
                                           help="Attention FROM a split word: mean of its pieces (paper) or first piece (paper code)."),
        dtype: Dtype = typer.Option(Dtype.float16, "--dtype", help="Number type of the stored maps."),
        shard_size: int = typer.Option(128, "--shard-size", min=1, help="Examples per shard file."),
        seed: int = seed_option(0),
        device: str = device_option(),
        resume: bool = typer.Option(False, "--resume", help="Continue an interrupted store."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing store."),
        ray: bool = ray_option(),
        workers: int = workers_option(),
        quiet: bool = quiet_option(),
    ) -> None:
        """Run a model over examples and write every head's attention to a store."""
        check_ray(ray, workers)  # before anything is read or written
        resolve_device(device)  # a bad --device is refused before anything is read or written
        examples = read_inputs(input)
        check_output_folder(out, resume=resume, overwrite=overwrite)  # before the model loads
        check_writable(out, folder=True)
        options = ExtractOptions(max_seq_len=max_seq_len, batch_size=batch_size, word_level=word_level,
                                 from_word=from_word.value, truncate=truncate,
                                 casing=None if cased is None else ("cased" if cased else "uncased"),
                                 seed=seed)
        source = {"path": str(input), "file_sha256": file_fingerprint(input)}
        try:
            lm = load_model("debug" if debug else model, seed=seed, device=device)
            with progress_bar("extract", len(examples), quiet) as advance, executor(ray, workers) as ex:
                stats = extract_to_store(examples, out, lm, options=options, dtype=dtype.value,
                                         shard_size=shard_size, resume=resume, overwrite=overwrite,
                                         source=source, command=command_line(), progress=advance,
                                         executor=ex)
        except InputError as exc:
            if exc.where is None:
                raise InputError(input, str(exc)) from None
            raise
        except KeyboardInterrupt:
            raise Interrupted(interrupted_line(out)) from None
        for w in stats.warnings:
            console.print(f"[yellow]warning:[/] {w}")
        if not quiet:
            print_extract_summary(stats, out, options)


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def interrupted_line(out: Path) -> str:
    """What an interrupted extract leaves in ``out``: the examples of its whole shards (a shard
    in flight is never half written), which ``--resume`` keeps."""
    if not (out / MANIFEST).is_file():
        return f"interrupted: nothing was written to {out}"
    try:
        store = open_store(out)
    except StoreError:
        return f"interrupted: {out} is unfinished; run the same command with --resume to continue"
    kept = f"{_plural(len(store), 'example')} in {_plural(len(store.shards()), 'complete shard')}"
    if store.complete:
        return f"interrupted: {out} is complete ({kept})"
    return f"interrupted: {out} keeps {kept}; run the same command with --resume to continue"


def print_extract_summary(stats, out: Path, options) -> None:
    """The result on stdout: examples, the model's tokens, and what the store holds per example.

    ``model tokens`` are the pieces the model read (special tokens included); at word level the
    store holds fewer positions (words + special tokens), the number ``attnscope info`` shows.
    """
    skipped = stats.skipped
    stored = sum(open_store(out).lengths())
    unit = "word-level positions" if options.word_level else "token positions"
    results.print(f"[bold]{out}[/]: {stats.examples_out} examples written; the model read "
                  f"{stats.tokens:,} tokens (special tokens included); the store holds {stored:,} "
                  f"{unit}; {getattr(stats, 'elapsed_s', 0):.1f} s")
    if skipped:
        shown = ", ".join(str(s["index"]) for s in skipped[:20]) + (" ..." if len(skipped) > 20 else "")
        console.print(f"skipped {len(skipped)} examples longer than {options.max_seq_len} tokens "
                      f"(indices {shown}); use --truncate to cut them or raise --max-seq-len")
    if stats.truncated:
        console.print(f"cut {len(stats.truncated)} examples to {options.max_seq_len} tokens")
