"""Options that many commands share, and the help polish applied to every command.

Two ways to use it:

- declare a shared option with one of the factories (``quiet_option()``,
  ``batch_size_option(16)``, ``seed_option()``), so its flags and help text are the same in
  every command;
- :func:`polish_help` walks the built click command tree once (``cli.main`` does it) and fixes
  what the declarations leave to Typer: boolean flags get no ``<bool>`` value placeholder,
  repeatable options say so instead of ``<list[Path]>``, a shared option declared
  without help gets the help text from :data:`SHARED_HELP`, and the help is click's plain
  layout (see :func:`polish_help`).
"""

from __future__ import annotations

from functools import partial

import typer

from attnscope.errors import AttnscopeError
from attnscope.pipeline import MIN_MAX_SEQ_LEN
from attnscope.views import LongDocumentView

#: Help for options that several commands declare, keyed by their long flag. Used by the
#: factories below and, by :func:`polish_help`, for a declaration that has no help of its own.
#: What ``--model`` takes, said the same way by every command.
MODEL_HELP = ("'default' (the packaged MiniLM), 'smollm2' (the packaged SmolLM2-135M decoder), a local "
              "folder, a .gguf file, a Hub id, or debug:<bert|roberta|gpt2|llama|qwen2|gemma> (tiny "
              "random models).")

SHARED_HELP: dict[str, str] = {
    "--quiet": "No progress display or summary on stderr; results and errors still print.",
    "--batch-size": "Examples per forward pass (larger is faster and needs more memory).",
    "--seed": "Random seed (model initialisation for debug models, sampling, probes).",
    "--max-seq-len": "Longest example in tokens; longer ones are skipped.",
    "--dtype": "Number type of the stored maps.",
    "--format": "Output layout.",
    "--overwrite": "Replace an existing output.",
    "--port": "TCP port to listen on (0 picks a free one).",
    "--ray": "Run on Ray (the forward passes; and the general and syntax analyses): the cluster at "
             "RAY_ADDRESS or one running here, else a local one (pip install 'attnscope[ray]'; "
             "docs/scale.md).",
    "--save-maps": "Also keep the attention maps as stores under OUT/maps/<family>/.",
    "--workers": "Ray workers with --ray, each holding one copy of the model.",
    "--device": "Where the model runs: cpu, auto (CUDA when torch sees a GPU, else cpu), cuda, "
                "cuda:N or mps. The GPU path has not been run on a GPU in this project yet.",
}


def max_seq_len_option(default: int = 128, help: str = SHARED_HELP["--max-seq-len"],
                       panel: str | None = None) -> int:
    """``--max-seq-len``, checked the same way by every command (a value below
    :data:`attnscope.pipeline.MIN_MAX_SEQ_LEN`, the library's own bound, is a usage error,
    before anything is read)."""
    return typer.Option(default, "--max-seq-len", min=MIN_MAX_SEQ_LEN, help=help, rich_help_panel=panel)


def quiet_option() -> bool:
    return typer.Option(False, "--quiet", "-q", help=SHARED_HELP["--quiet"])


def batch_size_option(default: int = 16) -> int:
    return typer.Option(default, "--batch-size", min=1, help=SHARED_HELP["--batch-size"])


def device_option(default: str = "cpu") -> str:
    return typer.Option(default, "--device", help=SHARED_HELP["--device"], metavar="DEVICE")


def seed_option(default: int = 0) -> int:
    return typer.Option(default, "--seed", help=SHARED_HELP["--seed"])


def ray_option() -> bool:
    return typer.Option(False, "--ray", show_default=False, help=SHARED_HELP["--ray"])


def save_maps_option() -> bool:
    return typer.Option(False, "--save-maps", show_default=False, help=SHARED_HELP["--save-maps"])


def workers_option() -> int:
    return typer.Option(1, "--workers", help=SHARED_HELP["--workers"])


def _type_name(param) -> str:
    """A short lower-case name of a parameter's value type: ``path``, ``int``, ``text``."""
    name = getattr(getattr(param, "type", None), "name", None)  # click's ParamType
    descriptor = getattr(param, "type_descriptor", None)  # typer's own parameters (0.2x)
    if name is None and descriptor is not None:
        annotation = descriptor.annotation
        args = getattr(annotation, "__args__", None) or (annotation,)
        name = getattr(args[0], "__name__", None)
    name = name or "value"
    return {"string": "text", "integer": "int"}.get(str(name).lower(), str(name).lower())


def polish_param(param) -> None:
    """Fix one click parameter's help presentation in place (see the module docstring)."""
    if getattr(param, "param_type_name", "") != "option":
        return
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        if param.metavar is None:
            param.metavar = ""  # a flag takes no value: no "<bool>" placeholder
    elif getattr(param, "multiple", False) and param.metavar is None:
        param.metavar = f"<{_type_name(param)}> (repeatable)"
    elif param.metavar is None and getattr(getattr(param, "type_descriptor", None), "is_ranged", False):
        param.metavar = f"<{_type_name(param)}>"  # "<int>" (the range is shown beside it)
    if not getattr(param, "help", None):
        for opt in param.opts:
            if opt in SHARED_HELP:
                param.help = SHARED_HELP[opt]
                break


def _grouped_options(command, ctx, formatter) -> None:
    """A command's options under the named groups their ``rich_help_panel`` gives (in the order
    the options come; the ungrouped first, as "Options"), in click's plain layout."""
    sections: dict[str, list] = {}
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is not None:
            name = "Arguments" if param.param_type_name == "argument" else \
                getattr(param, "rich_help_panel", None) or "Options"
            sections.setdefault(name, []).append(record)
    for name in sorted(sections, key=lambda k: (k != "Arguments", k != "Options")):
        with formatter.section(name):
            formatter.write_dl(sections[name])


def polish_help(command) -> None:
    """Apply :func:`polish_param` to every parameter of ``command`` and its subcommands, and
    render their help in click's plain layout.

    Typer's rich layout sets the options out as a table whose columns rich shrinks to fit
    the terminal: at 80 columns it cut long option names (``--attribution-examp…`` stood for
    two options), and it reads help text as rich markup, which swallowed ``[ray]`` in
    ``pip install 'attnscope[ray]'``. Click's layout writes every option name whole (the help
    moves to the next line when a name is long) and prints help text as written. A command's
    line in its group's list is its help's first paragraph, wrapped rather than cut short.
    """
    if hasattr(command, "rich_markup_mode"):
        command.rich_markup_mode = None
    if any(getattr(p, "rich_help_panel", None) for p in getattr(command, "params", ())):
        command.format_options = partial(_grouped_options, command)
    if getattr(command, "help", None) and not getattr(command, "short_help", None):
        command.short_help = " ".join(command.help.split("\n\n")[0].split())
    for param in getattr(command, "params", ()):
        polish_param(param)
    original = getattr(command, "get_help_option", None)
    if original is not None and not getattr(original, "_attnscope_polished", False):
        # click builds the --help option lazily, outside ``params``: polish it when built.
        def get_help_option(ctx, _original=original):
            option = _original(ctx)
            if option is not None:
                polish_param(option)
            return option

        get_help_option._attnscope_polished = True
        command.get_help_option = get_help_option
    for sub in getattr(command, "commands", {}).values():
        polish_help(sub)


LONG_HELP = ("A long document (text, blank lines between documents, joined up to --max-seq-len "
             "tokens; or JSON Lines with 'text'): one head (--layer, --head) over it, with its whole "
             "row at each of --queries, run with --model; no n x n map is made.")
QUERIES_HELP = ("With --long: token positions (from 0) whose rows the page carries, e.g. 100,2000 "
                "(default: the last).")
LONG_MAX_SEQ_LEN_HELP = "With --long: the document's length in tokens, at most."


def long_document(long, *, model: str | None, layer: int, head: int | None, queries: str | None,
                  max_seq_len: int):
    """The :class:`~attnscope.views.LongDocumentView` of ``--long`` (``view`` and ``serve``):
    the flags checked (``--model``, ``--head``; ``--queries`` as comma-separated positions),
    then the document read once."""
    if model is None or head is None:
        raise AttnscopeError("--long needs --model (the model to run over the document) and "
                             "--head (with --layer), 1-indexed as the pages show heads")
    try:
        picks = [int(q) for q in queries.split(",")] if queries else None
    except ValueError:
        raise AttnscopeError(f"--queries {queries!r}: token positions separated by commas, "
                             "e.g. 100,2000") from None
    return LongDocumentView(long, model=model, layer=layer - 1, head=head - 1, queries=picks,
                            max_seq_len=max_seq_len)


#: Layers and heads are typed as the pages show them: 1-indexed, ``--layer 8 --head 10`` is 8-10.
NUMBERING = "1-indexed, as the pages show it: --layer 8 --head 10 is head 8-10"
LAYER_HELP = f"Layer ({NUMBERING})."
HEAD_HELP = "Heatmap/neuron view and --long: the head, 1-indexed as the pages show it."
