"""``attnscope info|export|import``: look into a store, write or read the paper's pickle."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

import typer

from attnscope.cli.common import check_writable
from attnscope.cli.output import results
from attnscope.errors import StoreError
from attnscope.store import open_store
from attnscope.store.paper_pickle import export_paper_pickle, import_paper_pickle

#: Table labels that say what a number counts (``info``).
LABELS = {
    "model_tokens": "model tokens (pieces the model read, special tokens included)",
    "stored_positions": "stored positions (per example: {unit}; summed)",
}


def _shown(value) -> str:
    """A summary value for the table: floats to 2 decimals (``--json`` keeps every digit)."""
    if value is None:
        return "–"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _is_model(given: Path) -> bool:
    """A model name or folder rather than a store (a store has a manifest)."""
    if (given / "manifest.json").exists():
        return False
    name = str(given)
    return name in ("default", "smollm2") or name.startswith("debug") or (given / "config.json").is_file() \
        or name.endswith(".gguf")


def _model_summary(name: str) -> dict:
    from attnscope.models import load_model
    from attnscope.models.gguf import resolve_gguf
    from attnscope.models.loading import DEFAULT_MODEL, packaged_model_dir

    lm = load_model(name)
    folder = packaged_model_dir() if name == DEFAULT_MODEL else resolve_gguf(name) or \
        (Path(name) if Path(name).is_dir() else None)
    f = lm.facts
    return {"model": lm.display_name, "files": str(folder.resolve()) if folder else lm.source,
            "model class": type(lm.model).__name__, "kind": f.kind,
            "layers with attention": f"{len(f.attention_layers)} of {f.layers}", "heads": f.heads,
            "key/value heads": f.kv_heads, "head size (q/k, v)": f"{f.qk_size}, {f.v_size}",
            "mechanisms": ", ".join(f.mechanisms) or "none", "max positions": lm.max_positions,
            "weights sha256": lm.weights_hash}


class ExportFormat(str, Enum):
    paper_pickle = "paper-pickle"


def register(app: typer.Typer, analyze_app: typer.Typer) -> None:
    @app.command("info")
    def info_cli(
        store: Path = typer.Argument(..., help="Store folder, or a model (default, smollm2, debug:<type>, "
                                     "a model folder): where it is and what it is."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
        verify: bool = typer.Option(False, "--verify", help="Also check every shard's checksum "
                                    "(reads every byte; sizes are always checked)."),
    ) -> None:
        """Print what a store holds; a shard missing, cut short or (with --verify) changed is an
        error naming it. Given a model instead, print where its files are and what it is."""
        if _is_model(store):
            summary = _model_summary(str(store))
        else:
            s = open_store(store)
            s.check_shards()  # sizes, always: a cut shard is an error, not "status: complete"
            summary = s.summary()
        if verify and not _is_model(store):
            problems = s.verify()
            if problems:
                more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
                raise StoreError(f"{problems[0]}{more}")
            summary["verify"] = "ok"
        if as_json:
            print(json.dumps(summary, indent=1))
        else:
            from rich.table import Table

            unit = "words + special tokens" if summary.get("level") == "word" else "tokens"
            rows = [(LABELS.get(k, k).format(unit=unit), _shown(v)) for k, v in summary.items()]
            if not results.is_terminal:  # piped: plain "label: value" lines, never wrapped
                for label, value in rows:
                    print(f"{label}: {value}")
            else:
                t = Table(show_header=False, title=str(store))
                for label, value in rows:
                    t.add_row(label, value)
                results.print(t)

    @app.command("export")
    def export_cli(
        store: Path = typer.Argument(..., help="Store folder."),
        format: ExportFormat = typer.Option(ExportFormat.paper_pickle, "--format",
                                            help="Output layout (the paper code's pickle)."),
        out: Path = typer.Option(None, "--out", "-o", help="Default: <store name>_attn.pkl beside the store."),
    ) -> None:
        """Write the paper code's <name>_attn.pkl (list of dicts with tokens and float16 attns)."""
        target = out or store.parent / f"{store.name}_attn.pkl"
        check_writable(target, folder=False)
        s = open_store(store)
        n = export_paper_pickle(s, target)
        results.print(f"{target}: {n} examples in the paper code's pickle layout")

    @app.command("import")
    def import_cli(
        file: Path = typer.Argument(..., help="A paper-code *_attn.pkl file."),
        out: Path = typer.Option(..., "--out", "-o", help="Store folder to write."),
        allow_pickle: bool = typer.Option(False, "--allow-pickle",
                                          help="Needed: loading a pickle can run code. Only for files you trust."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing store."),
    ) -> None:
        """Read a paper-code pickle into a store (refused without --allow-pickle)."""
        check_writable(out, folder=True)
        n = import_paper_pickle(file, out, allow_pickle=allow_pickle, overwrite=overwrite)
        results.print(f"{out}: {n} examples imported from {file}")
