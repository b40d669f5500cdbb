"""The executor is the only road to the model (issue 37): no family module runs a forward pass,
loads a model, generates, extracts or streams by itself; it hands the work to its Context
(run_pass, stream, tasks, call, save_store, maps), which hands it to the executor."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

FAMILIES = Path(__file__).resolve().parents[2] / "src" / "attnscope" / "families"
#: What runs a model or a corpus: the forward helper, the loaders, generation, the extractor,
#: the store writer, the streaming and eager-maps folds, the atlas's press passes.
ROAD_ONLY = {"forward", "pad_batch", "hooked", "load_model", "causal_lm_for", "greedy_continue",
             "generate", "Extractor", "run_batch", "extract", "extract_to_store", "stream_stats",
             "maps_update", "prefill", "answer", "run_pass", "extract_on_ray"}


def _calls_and_imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
            if name in ROAD_ONLY and owner not in ("ctx", "self"):
                found.append((node.lineno, f"calls {name}"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attnscope"):
            bad = [a.name for a in node.names if a.name in ROAD_ONLY]
            if bad or node.module in ("attnscope.executor", "attnscope.jobs", "attnscope.models.forward"):
                if node.module == "attnscope.models.forward" and all(a.name == "supports_hooks" for a in node.names):
                    continue  # asks what the model allows, runs nothing
                found.append((node.lineno, f"imports {node.module}: {', '.join(a.name for a in node.names)}"))
    return found


@pytest.mark.parametrize("path", sorted(p for p in FAMILIES.glob("*.py") if p.name != "base.py"),
                         ids=lambda p: p.name)
def test_a_family_never_runs_the_model_itself(path):
    assert _calls_and_imports(path) == []


def test_the_check_finds_a_family_that_runs_the_model(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from attnscope.models.forward import forward, pad_batch\n\n"
                   "def run(lm, ids):\n    return forward(lm, pad_batch(lm, [ids]))\n")
    assert [what for _, what in _calls_and_imports(bad)] == [
        "imports attnscope.models.forward: forward, pad_batch", "calls forward", "calls pad_batch"]


def _builds_a_context(path: Path) -> list[int]:
    return [node.lineno for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Context"]


def test_only_the_pipeline_builds_a_context():
    """One entry per family (``run_pipeline``, ``run_family``): nothing else in the package makes a
    job's Context by hand (a Context made elsewhere would bypass the job's fingerprint, resume,
    executor and out-of-memory line)."""
    src = FAMILIES.parent
    builders = {str(p.relative_to(src)): lines for p in sorted(src.rglob("*.py")) if (lines := _builds_a_context(p))}
    assert list(builders) == ["pipeline/run.py"], builders


def test_the_check_finds_a_context_built_by_hand(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from attnscope.families import base\n\nctx = base.Context(model=None, out_dir='o')\n")
    assert _builds_a_context(bad) == [3]
