"""Rooms named for what they do (``docs/architecture.md``): a report module only lays out what its
family computed. It imports no engine, executor, extractor, Ray runner, store-writing job, model
loader or forward pass, and calls no ``finalize``, bootstrap or pass, and no callback that fetches
maps. A planted call in a copied tree fails the check."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "attnscope"
#: what a report may not import (modules, and the packages under them)
COMPUTES = ("attnscope.engines", "attnscope.executor", "attnscope.extract", "attnscope.on_ray",
            "attnscope.jobs", "attnscope.models.loading", "attnscope.models.forward",
            "attnscope.models.generation", "attnscope.models.capture", "attnscope.pipeline")
#: calls that compute: by name, or any name with "bootstrap" in it
CALLS = {"finalize", "run_pass", "maps_of", "get_maps", "table1_rows", "syntax_tables", "figure5_picks",
         "best_head_examples", "head_choices", "score_map"}


def computing(root: Path) -> list[str]:
    out = []
    for path in sorted((root / "report").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                if any(n == c or n.startswith(c + ".") for n in names for c in COMPUTES):
                    out.append(f"{rel}:{node.lineno}: imports {node.module}")
            elif isinstance(node, ast.Import):
                out += [f"{rel}:{node.lineno}: imports {a.name}" for a in node.names
                        if any(a.name == c or a.name.startswith(c + ".") for c in COMPUTES)]
            elif isinstance(node, ast.Call):
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
                if name in CALLS or "bootstrap" in name:
                    out.append(f"{rel}:{node.lineno}: calls {name}")
    return out


def test_no_report_module_computes():
    assert computing(SRC) == []


@pytest.mark.parametrize("plant, said", [
    ("from attnscope.engines.streaming import maps_bytes\n", "imports attnscope.engines.streaming"),
    ("from attnscope import executor\n", "imports attnscope"),
    ("\n\ndef _p(a):\n    return a.finalize()\n", "calls finalize"),
    ("\n\ndef _p(k, n):\n    from attnscope.analyses.syntax import binary_bootstrap_ci\n\n"
     "    return binary_bootstrap_ci(k, n)\n", "calls binary_bootstrap_ci"),
])
def test_a_planted_computation_in_a_report_is_found(tmp_path, plant, said):
    tree = tmp_path / "attnscope"
    shutil.copytree(SRC, tree, ignore=shutil.ignore_patterns("__pycache__", "*.c", "*.so"))
    with open(tree / "report" / "general.py", "a", encoding="utf-8") as f:
        f.write(plant)
    found = computing(tree)
    assert len(found) == 1 and found[0].startswith("report/general.py:") and said in found[0], found
