"""The layers of docs/architecture.md hold (import-linter's contracts in pyproject.toml): each
layer imports only from the layers below it, no circle anywhere, and a new back-arrow fails."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("importlinter", reason="import-linter is not installed (the test extra)")


def _lint(src: Path, config: Path = ROOT / "pyproject.toml") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; "
           "sys.exit(c())", "--config", str(config), "--no-cache"]
    return subprocess.run(cmd, cwd=src.parent, env={"PYTHONPATH": str(src), "PATH": ""},
                          capture_output=True, text=True, timeout=300)


def test_the_layers_hold_and_nothing_imports_in_a_circle():
    res = _lint(ROOT / "src")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 kept, 0 broken" in res.stdout


def test_the_documented_layers_are_the_checked_ones():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    doc = (ROOT / "docs" / "architecture.md").read_text()
    names = [layer.strip("()") for line in layers for layer in line.split(" | ")]
    # the doc's table lists them top to bottom in the same order
    rows = [doc.find(f"| `{name}`") for name in names]
    assert -1 not in rows, [n for n, r in zip(names, rows) if r == -1]
    assert rows == sorted(rows), list(zip(names, rows))


def test_a_new_back_arrow_fails(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "attnscope", src / "attnscope",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    records = src / "attnscope" / "data" / "records.py"
    records.write_text(records.read_text() + "\n\ndef _late():\n    from attnscope.cli import main  # noqa\n")
    res = _lint(src)
    assert res.returncode != 0
    assert "attnscope.data is not allowed to import attnscope.cli" in res.stdout


def test_import_attnscope_stays_light():
    """``import attnscope`` (and the command line's module) imports none of the libraries that take
    seconds to load or are optional: they are imported where they are used (docs/architecture.md)."""
    heavy = ["torch", "transformers", "matplotlib", "ray", "playwright", "flask", "IPython", "sklearn", "scipy"]
    code = ("import sys, attnscope, attnscope.cli.main\n"
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": ""})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_the_tests_sit_in_the_room_of_what_they_test():
    """``tests/<room>/`` mirrors ``src/attnscope/<room>``: a reader finds a module's tests in the
    folder of its package (``tests/README.md``); ``project/`` holds the checks of the house itself
    and ``benchmarks/`` the plumbing of the repository's ``benchmarks/`` scripts."""
    src = ROOT / "src" / "attnscope"
    rooms = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert (ROOT / "benchmarks").is_dir()
    assert rooms - {"project", "benchmarks"} <= {p.stem for p in src.iterdir() if p.is_dir() or p.suffix == ".py"}
    assert not list((ROOT / "tests").glob("test_*.py"))  # none left outside a room
    readme = (ROOT / "tests" / "README.md").read_text()
    assert all(f"`{room}/`" in readme for room in rooms), sorted(r for r in rooms if f"`{r}/`" not in readme)
