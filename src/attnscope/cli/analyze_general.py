"""``attnscope analyze general``: the paper's general analyses (sections 3 and 6)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from attnscope.cli.common import console, read_inputs, step_progress


class Gradients(str, Enum):
    auto = "auto"
    off = "off"
    on = "on"
    fit_head = "fit-head"


def register(app: typer.Typer, analyze_app: typer.Typer) -> None:
    @analyze_app.command("general")
    def general_cli(
        input: Path = typer.Argument(..., help="Examples (JSON / JSON Lines, e.g. from 'attnscope "
                                               "prepare unlabeled') or a store folder."),
        out: Path = typer.Option(..., "--out", "-o", help="Folder for tables/, figures/ and results/."),
        model: str = typer.Option(None, "--model", "-m",
                                  help="Model to run on examples ('default', a folder, a Hub id, "
                                       "debug:<family>); optional for a store (gradients need it)."),
        max_seq_len: int = typer.Option(128, "--max-seq-len", help="Longer examples are skipped."),
        batch_size: int = typer.Option(16, "--batch-size"),
        seed: int = typer.Option(0, "--seed", help="Seeds masking, head fitting and MDS."),
        gradients: Gradients = typer.Option(Gradients.auto, "--gradients",
                                            help="Figure 3: auto = only with a masked-LM head."),
        fit_mlm_head: bool = typer.Option(False, "--fit-mlm-head",
                                          help="Same as --gradients fit-head: train an output layer "
                                               "on the frozen encoder when the model has no head."),
        save_maps: Path = typer.Option(None, "--save-maps", help="Also write the maps to this store folder."),
        quiet: bool = typer.Option(False, "--quiet", "-q"),
    ) -> None:
        """Relative position, special tokens, entropy, gradients, head distances and clusters."""
        from attnscope.report.general import run_general

        mode = "fit-head" if fit_mlm_head else gradients.value
        source, lm = load_general_inputs(input, model, mode, seed)
        with step_progress(quiet) as progress:
            section = run_general(source, lm, out, max_seq_len=max_seq_len, batch_size=batch_size,
                                  seed=seed, gradients=mode, progress=progress, save_maps=save_maps)
        if not quiet:
            for line in section.findings:
                console.print(line, highlight=False, markup=False)
            console.print(f"wrote {out}/tables, {out}/figures, {out}/results/general.json", highlight=False)


def load_general_inputs(input: Path, model: str | None, gradients: str, seed: int):
    """A store or a list of examples, and the model (loaded with its masked-LM head when it has one
    and gradients may be wanted)."""
    from attnscope.errors import AttnscopeError, ModelError
    from attnscope.models import load_model

    if input.is_dir():
        from attnscope.store import open_store

        source = open_store(input)
    else:
        source = read_inputs(input)
        if model is None:
            raise AttnscopeError(f"{input}: examples need --model (or give a store folder)")
    if model is None:
        return source, None
    if gradients in ("auto", "on", "fit-head"):
        import transformers

        level = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # the probe's load report is not for the user
        try:
            return source, load_model(model, mlm_head=True, seed=seed)
        except ModelError:
            pass  # no head in the weights, or a causal family: load the plain model
        finally:
            transformers.logging.set_verbosity(level)
    return source, load_model(model, seed=seed)
