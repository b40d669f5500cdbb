"""Usage errors: one line on stderr, exit 2, no traceback, through the real console command
and the in-process entry; the help shows no ``<bool>`` for flags and has help for every option."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import one_line, says

from attnscope.cli.main import build_command, main

SRC = Path(__file__).resolve().parents[2] / "src"

# (arguments, a piece of the one line that names what is wrong)
USAGE_ERRORS = [
    pytest.param([], "no command given", id="bare"),
    pytest.param(["analyze"], "no command given (general, ", id="bare-analyze"),
    pytest.param(["nosuch"], "No such command 'nosuch'", id="wrong-subcommand"),
    pytest.param(["analyze", "nosuch"], "No such command 'nosuch'", id="wrong-analyze-subcommand"),
    pytest.param(["extract"], "Missing argument 'input'", id="missing-argument"),
    pytest.param(["extract", "{inp}"], "Missing option '--out'", id="missing-required-option"),
    pytest.param(["extract", "{inp}", "--out", "{tmp}/s", "--bogus"], "--bogus",
                 id="unknown-option"),
    pytest.param(["extract", "{inp}", "--out"], "Option '--out' requires an argument",
                 id="option-without-value"),
    pytest.param(["extract", "{inp}", "--out", "{tmp}/s", "--dtype", "float8"],
                 "Invalid value for '--dtype'", id="bad-choice"),
    pytest.param(["view", "{tmp}/s", "--view", "heads", "--out", "{tmp}/v.html"],
                 "Invalid value for '--view'", id="bad-choice-view"),
    pytest.param(["extract", "{inp}", "--out", "{tmp}/s", "--batch-size", "many"],
                 "Invalid value for '--batch-size'", id="bad-int"),
    pytest.param(["info", "a", "b"], "unexpected extra argument", id="extra-argument"),
]


def _args(args, tmp_path):
    inp = tmp_path / "in.json"
    inp.write_text('[{"text": "a b"}]')
    return [a.format(inp=inp, tmp=tmp_path) for a in args]


def _check(code, out, err, args, expect, tmp_path):
    lines = err.splitlines()
    assert code == 2, (args, code, err)
    assert len(lines) == 1, err
    # click's wording differs a little between versions (case, quotes): compare loosely
    assert lines[0].startswith("error: ") and expect.lower() in lines[0].lower(), lines[0]
    assert "Traceback" not in err + out
    assert not (tmp_path / "s").exists() and not (tmp_path / "v.html").exists()
    if args and args[-1] != "analyze":  # only a bare command prints its help (to stdout)
        assert out == ""


@pytest.mark.parametrize("args,expect", USAGE_ERRORS)
def test_usage_error_in_process(tmp_path, capsys, args, expect):
    args = _args(args, tmp_path)
    code = main(args)
    captured = capsys.readouterr()
    _check(code, captured.out, captured.err, args, expect, tmp_path)


@pytest.mark.parametrize("args,expect", USAGE_ERRORS)
def test_usage_error_console_command(tmp_path, args, expect):
    exe = shutil.which("attnscope")
    if exe is None:
        pytest.skip("the attnscope console command is not installed")
    args = _args(args, tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
               COLUMNS="100")
    r = subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=120)
    _check(r.returncode, r.stdout, r.stderr, args, expect, tmp_path)


def test_python_dash_m_is_the_same_entry(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(SRC))
    r = subprocess.run([sys.executable, "-m", "attnscope", "extract", "--bogus"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "--bogus" in r.stderr


def _commands(command, path="attnscope"):
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, f"{path} {name}")


def test_every_option_has_help_and_flags_take_no_value():
    for path, command in _commands(build_command()):
        for param in command.params:
            if getattr(param, "param_type_name", "") != "option":
                continue
            assert param.help, f"{path} {param.opts[0]} has no help text"
            if getattr(param, "is_flag", False):
                assert param.metavar == "", f"{path} {param.opts[0]}"


@pytest.mark.parametrize("cmd", [[], ["extract"], ["run"], ["info"], ["analyze", "syntax"]])
def test_help_shows_no_bool_or_python_type_placeholders(capsys, cmd):
    code = main([*cmd, "--help"])
    out = capsys.readouterr().out
    assert code == 0 and "Usage" in out
    assert "<bool>" not in out and "list[" not in out


def test_run_refuses_two_families_declaring_the_same_option():
    """All families' options share `attnscope run`'s namespace: a clash is refused when the
    command is built, naming both families and the option."""
    from attnscope.cli.run import _run_command
    from attnscope.families import FAMILIES, load_families

    families = load_families()
    longctx = FAMILIES["longctx"]
    clone = type("Clone", (longctx,), {"key": "clone", "inputs": ()})
    with pytest.raises(ValueError) as e:
        _run_command([*families, clone])
    says(e.value, "longctx", "clone", "'chunk'")
    _run_command(families)  # the registry itself has no clash


def _leading_flags(line: str) -> list[str]:
    """The option names that open a help line (``-o, --out DIR  Folder ...`` -> -o, --out),
    with any table border in front (typer's rich layout) taken off."""
    words = line.strip(" │*").replace(",", " ").replace(" / ", " ").split()
    flags = []
    for w in words:
        if not w.startswith("-"):
            break
        flags.append(w)
    return flags


@pytest.mark.parametrize("path", [p.split()[1:] for p, _ in _commands(build_command())],
                         ids=lambda p: " ".join(p) or "attnscope")
def test_help_at_80_columns_shows_every_option_name_whole(capsys, monkeypatch, path):
    """At 80 columns rich's option table cut seven names of `run --help` (`--attribution-examp…`
    stood for both --attribution-examples and --attribution-example): every option of every
    command must open one line of its help with all its names whole."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main([*path, "--help"]) == 0
    out = capsys.readouterr().out
    rows = [set(_leading_flags(line)) for line in out.splitlines()]
    command = build_command()
    for name in path:
        command = command.commands[name]
    for param in command.params:
        if getattr(param, "param_type_name", "") == "option":
            names = {*param.opts, *param.secondary_opts}
            assert any(names <= row for row in rows), f"{' '.join(path)}: {sorted(names)} not whole"
    assert max(len(line) for line in out.splitlines()) <= 80


def test_help_text_is_printed_as_written(capsys):
    """Help is not read as rich markup, which swallowed `[ray]` in the install hint."""
    assert main(["run", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "pip install 'attnscope[ray]'" in out


def test_library_errors_name_parameters_and_the_command_line_shows_its_flags(tmp_path, capsys):
    """A family option refused by the library names its field (``delimiter``); each command
    shows the flag it has for it (``--patterns-delimiter``), and the run settings likewise."""
    from attnscope.cli.main import main
    from attnscope.errors import AttnscopeError
    from attnscope.pipeline import RunConfig, check_config

    text = tmp_path / "t.txt"
    text.write_text("The cat sat on the mat.\nIt was warm.\n", encoding="utf-8")
    with pytest.raises(AttnscopeError) as e:
        check_config(RunConfig(patterns=text, delimiter=-1.0))
    says(one_line(e.value), "delimiter", "at least 0", "-1.0")
    assert e.value.params == ("delimiter",)
    for argv in (["analyze", "patterns", str(text), "--model", "debug:bert"],
                 ["run", "--patterns", str(text), "--model", "debug:bert"]):
        assert main([*argv, "--patterns-delimiter", "-1", "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1
        says(err[0], "error: ", "--patterns-delimiter", "at least 0", "-1.0")
    with pytest.raises(AttnscopeError) as e:
        check_config(RunConfig(text=text, batch_size=0))
    says(one_line(e.value), "batch_size", "at least 1", "0")
    assert e.value.params == ("batch_size",)
