"""The ``attnscope`` command: one Typer app, one module per command.

Each command module has ``register(app, analyze_app)`` that adds its commands; each command
only parses arguments and calls a library function. User errors print one line and exit 2.
"""

from __future__ import annotations

import importlib
import sys

import typer

app = typer.Typer(help="attnscope: what does this transformer look at?", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
analyze_app = typer.Typer(help="Run analyses on a store or straight from a model.",
                          no_args_is_help=True)
app.add_typer(analyze_app, name="analyze")

#: Command modules in ``attnscope.cli``, registered in this order.
COMMANDS = ("prepare", "extract", "store_cmds", "families", "view", "serve", "run", "demo", "compare")


def _register_all() -> None:
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"attnscope.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"attnscope.cli.{name}":
                continue  # that command is not part of this installation
            raise
        module.register(app, analyze_app)


_register_all()


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app, turning user errors into one line on stderr and exit 2."""
    from attnscope.errors import AttnscopeError

    try:
        app(args=argv, standalone_mode=False)
    except AttnscopeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:
        return int(exc.code or 0)
    except Exception as exc:  # click usage errors (typer may bundle its own copy of click)
        for module in _click_modules():
            if isinstance(exc, module.exceptions.ClickException):
                exc.show()
                return exc.exit_code
            if isinstance(exc, getattr(module.exceptions, "Abort", ())):
                return 1
        raise
    return 0


def _click_modules() -> list:
    import click

    modules = [click]
    try:
        from typer import _click as bundled
    except ImportError:
        return modules
    return [*modules, bundled]


def entry() -> None:
    sys.exit(main())
