"""The ``attnscope`` command: one Typer app, one module per command.

Each command module has ``register(app, analyze_app)`` that adds its commands; each command
only parses arguments and calls a library function. User errors print one line and exit 2.
"""

from __future__ import annotations

import functools
import importlib
import signal
import sys
from contextlib import contextmanager

import typer

from attnscope.cli.options import polish_help
from attnscope.errors import AttnscopeError, Interrupted
from attnscope.models.threads import fair_share
from attnscope.progress import request_stop

app = typer.Typer(help="attnscope: what does this transformer look at?", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
analyze_app = typer.Typer(help="Run analyses on a store or straight from a model.",
                          no_args_is_help=True)
app.add_typer(analyze_app, name="analyze")

#: Command modules in ``attnscope.cli``, registered in this order.
COMMANDS = ("prepare", "extract", "store_cmds", "families", "view", "serve", "run", "demo", "compare", "check")


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


def _click_error_types() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """The usage-error and abort classes of every click that the installed typer may use.

    Typer up to 0.2x raised the exceptions of the separate ``click`` package; newer versions
    raise those of their bundled copy (``typer._click``), which are not subclasses of
    click's. Both are collected, so any typer that the project's pins allow is handled.
    """
    errors: list[type] = []
    aborts: list[type] = []
    for module_name in ("click.exceptions", "typer._click.exceptions", "typer.exceptions"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name, bucket in (("ClickException", errors), ("Abort", aborts)):
            cls = getattr(module, name, None)
            if isinstance(cls, type) and cls not in bucket:
                bucket.append(cls)
    return tuple(errors), tuple(aborts)


def _command_path(exc: BaseException) -> str:
    ctx = getattr(exc, "ctx", None)
    path = getattr(ctx, "command_path", None) if ctx is not None else None
    return path or "attnscope"


def usage_line(exc: BaseException) -> str:
    """One line for a click usage error: what is wrong and where to look for help."""
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError":
        commands = getattr(getattr(ctx, "command", None), "commands", None) or {}
        listed = f" ({', '.join(commands)})" if commands else ""
        message = f"no command given{listed}"
    else:
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    message = " ".join(str(message).split()).rstrip(".")  # click's may hold line breaks
    message = message.replace("Value error, ", "")  # typer's wording of a bad choice
    return f"error: {message}; see '{_command_path(exc)} --help'"


def build_command():
    """The click command tree of :data:`app`, with the help polish of ``cli.options``."""
    import typer.main

    command = typer.main.get_command(app)
    polish_help(command)
    say_interrupts(command)
    return command


def say_interrupts(command) -> None:
    """Typer turns Ctrl-C inside a command into exit 130 with no word: wrap every command's
    callback so that the line a job's :class:`~attnscope.errors.Interrupted` carries (what it
    kept, how to go on) is printed first."""
    callback = getattr(command, "callback", None)
    if callback is not None and not getattr(callback, "_attnscope_says", False):
        @functools.wraps(callback)
        def saying(*args, _callback=callback, **kwargs):
            try:
                return _callback(*args, **kwargs)
            except KeyboardInterrupt as exc:
                print(str(exc) if isinstance(exc, Interrupted) else "interrupted", file=sys.stderr)
                raise

        saying._attnscope_says = True
        command.callback = saying
    for sub in (getattr(command, "commands", None) or {}).values():
        say_interrupts(sub)


def command_flags(command, argv: list[str]) -> dict[str, str]:
    """``parameter name -> its long flag`` of the (sub)command that ``argv`` invokes (typer may
    bring its own copy of click, so the command tree is read by its attributes)."""
    for word in argv:
        if word not in (getattr(command, "commands", None) or {}):
            break
        command = command.commands[word]
    return {p.name: max(p.opts, key=len) for p in command.params
            if getattr(p, "param_type_name", "") == "option" and p.name}


@contextmanager
def signals_stop():
    """Ctrl-C (SIGINT) and SIGTERM (a scheduler's stop, ``kill``) stop a command: KeyboardInterrupt
    at once, and again at the job's next finished unit should a library swallow the first
    (:func:`attnscope.progress.check_stop`); the job says what it kept and exits 130. Only the main
    thread can set a signal handler; elsewhere nothing changes."""
    def stop(signum, frame):
        request_stop()
        raise KeyboardInterrupt

    request_stop(False)
    try:
        previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        request_stop(False)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app; user and usage errors print one line on stderr and exit 2."""
    if "torch" not in sys.modules:  # a fair share of a shared machine, read when torch starts
        fair_share()
    usage_errors, aborts = _click_error_types()
    command = build_command()
    try:
        with signals_stop():
            result = command.main(args=argv, prog_name="attnscope", standalone_mode=False)
    except AttnscopeError as exc:
        # parameters as this command's flags; one line, even if a message quotes a line break
        message = exc.for_flags(command_flags(command, sys.argv[1:] if argv is None else argv))
        message = message.replace("\r", "\\r").replace("\n", "\\n")
        print(f"error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        # a job's own line says what it kept and how to go on (attnscope.errors.Interrupted)
        print(str(exc) if isinstance(exc, Interrupted) else "interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except usage_errors as exc:
        code = getattr(exc, "exit_code", 2)
        if type(exc).__name__ == "NoArgsIsHelpError" or code == 2:
            print(usage_line(exc), file=sys.stderr)
            return 2
        print(f"error: {' '.join(exc.format_message().split())}", file=sys.stderr)
        return code
    except aborts:
        print("aborted", file=sys.stderr)
        return 1
    # click returns the exit code of typer.Exit / click.exceptions.Exit in non-standalone mode
    return result if isinstance(result, int) else 0


def entry() -> None:
    sys.exit(main())
