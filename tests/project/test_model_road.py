"""One road to the model (``docs/architecture.md``, "One road to the model"), read from the code.

The walk parses every module of ``src/attnscope`` and finds:

- *raw* calls: a model called (``lm.model(...)``, ``model(...)``, ``decoder(...)``, a call with
  ``input_ids=`` / ``inputs_embeds=`` / ``decoder_input_ids=``), ``.generate(...)``, or a module
  hook registered (``register_forward_hook`` and its kin): only in :data:`RAW`;
- *running* calls: the forward helper, the hook points, generation and the head fit
  (:data:`RUNNING`, by the name they are imported as or called through), and a step's
  ``.decoder(lm)``: only in :data:`RUNS` (the executor, the extractor and the engines, and the
  analyses and steps they run); a view (:data:`VIEWS`) may ask ``models/`` for what it draws
  through :data:`VIEW_ASKS` only.

A copied tree with one planted call in each of a report, a family and a view fails the walk.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "attnscope"

#: modules that may call a model, its ``generate`` or hook its modules
RAW = ("models/forward.py", "models/capture.py", "models/generation.py", "engines/press.py")
#: what runs a model, as imported from attnscope (module -> names)
RUNNING = {
    "attnscope.models.forward": {"forward", "hooked", "hidden_states"},
    "attnscope.models.generation": {"causal_lm_for", "greedy_continue", "continuation", "seq2seq_greedy"},
    "attnscope.models.capture": {"attention", "query_key", "seq2seq_attention", "document_queries_keys"},
    "attnscope.analyses.gradients": {"fit_mlm_head"},
}
#: rooms whose modules may call what runs a model: the executor, the extractor and the engines,
#: and the analyses and per-item steps they run on their batches
RUNS = ("models/", "engines/", "extract/", "executor.py", "on_ray/", "analyses/")
#: rooms that draw: they ask ``models/`` for what they draw through these functions only
VIEWS = ("viz/", "serve/", "notebook.py", "views.py", "show.py")
VIEW_ASKS = {"attention", "query_key", "continuation", "document_queries_keys"}
HOOKS = {"register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
         "register_full_backward_pre_hook", "generate"}
MODEL_NAMES = {"model", "decoder", "wrapper"}
MODEL_KWARGS = {"input_ids", "inputs_embeds", "decoder_input_ids"}


def _in(rel: str, rooms: tuple[str, ...]) -> bool:
    return any(rel == r or (r.endswith("/") and rel.startswith(r)) for r in rooms)


def _running_names(tree: ast.Module) -> tuple[dict[str, str], set[str]]:
    """Names bound to what runs a model (``name -> what``), and aliases of those modules."""
    names: dict[str, str] = {}
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                if a.name in RUNNING.get(node.module, ()):
                    names[a.asname or a.name] = a.name
                elif f"{node.module}.{a.name}" in RUNNING:
                    modules.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in RUNNING and a.asname:
                    modules.add(a.asname)
    return names, modules


def violations(root: Path) -> list[str]:
    """``path:line: what`` for every call off the road in the package at ``root``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names, modules = _running_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            attr = fn.attr if isinstance(fn, ast.Attribute) else None
            name = fn.id if isinstance(fn, ast.Name) else None
            raw = (attr in HOOKS or attr == "model" or name in MODEL_NAMES
                   or (isinstance(fn, ast.Call) and isinstance(fn.func, ast.Attribute) and fn.func.attr == "decoder")
                   or ({k.arg for k in node.keywords} & MODEL_KWARGS and not (name or attr or "x")[0].isupper()
                       and attr not in ("tokenizer", "encode", "pad_batch") and name != "pad_batch"))
            if raw and not _in(rel, RAW):
                out.append(f"{rel}:{node.lineno}: calls the model ({ast.unparse(fn)})")
                continue
            running = names.get(name) if name else (
                attr if attr and isinstance(fn.value, ast.Name) and fn.value.id in modules else None)
            if attr == "decoder":
                running = "decoder"
            if running and not _in(rel, RUNS) and not (_in(rel, VIEWS) and running in VIEW_ASKS):
                out.append(f"{rel}:{node.lineno}: runs the model ({running})")
    return out + _views_through_runners(root)


#: rooms whose modules a view may not import where they run a model: they compute (the engines,
#: the analyses) or schedule (the executor, Ray), while a view draws the maps the extractor
#: gives it (``extract.runner.extract``) or what it asks ``models/`` for
COMPUTE = ("engines/", "analyses/", "executor.py", "on_ray/")


def _runners(root: Path) -> set[str]:
    """The modules of :data:`COMPUTE` that run a model (call what :data:`RUNNING` names)."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if not _in(rel, COMPUTE):
            continue
        names, modules = _running_names(ast.parse(path.read_text(encoding="utf-8")))
        if names or modules:
            found.add("attnscope." + rel.removesuffix(".py").removesuffix("/__init__").replace("/", "."))
    return found


def _views_through_runners(root: Path) -> list[str]:
    """A view importing a module of the engines (or the executor, an analysis ...) that runs a
    model: it would reach the model off the road, through that module (the long-document view
    once had the document engine run the pass; it asks ``models.capture`` now)."""
    runners, out = _runners(root), []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if not _in(rel, VIEWS):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module in runners:
                out.append(f"{rel}:{node.lineno}: imports {node.module}, which runs the model")
    return out


def test_every_forward_generation_hook_and_head_fit_goes_the_one_road():
    assert violations(SRC) == []


PLANTS = {
    "report/general.py": "\n\ndef _planted(lm, batch):\n    return lm.model(input_ids=batch)\n",
    "families/patterns.py": ("\n\ndef _planted(lm, batch):\n    from attnscope.models.forward import forward\n\n"
                             "    return forward(lm, batch)\n"),
    "viz/payload.py": ("\n\ndef _planted(lm, m):\n    return m.get_input_embeddings()"
                       ".register_forward_hook(print)\n"),
    "serve/app.py": ("\n\ndef _planted(lm, ids):\n    from attnscope.models import generation as g\n\n"
                     "    return g.greedy_continue(lm, ids, 3)\n"),
    "families/atlas.py": "\n\ndef _planted(step, lm):\n    return step.decoder(lm)\n",
    "views.py": "\n\ndef _planted(lm, ids):\n    from attnscope.engines.streaming import stream_stats\n\n"
                "    return stream_stats(lm, [ids], None)\n",
}


@pytest.mark.parametrize("where", list(PLANTS))
def test_one_planted_call_in_a_copied_tree_is_found(tmp_path, where):
    tree = tmp_path / "attnscope"
    shutil.copytree(SRC, tree, ignore=shutil.ignore_patterns("__pycache__", "*.c", "*.so"))
    with open(tree / where, "a", encoding="utf-8") as f:
        f.write(PLANTS[where])
    found = violations(tree)
    assert len(found) == 1 and found[0].startswith(f"{where}:"), found


def test_a_view_asks_models_through_its_functions_only(tmp_path):
    """What a view may ask (``continuation``) passes; the same module calling the helper fails."""
    tree = tmp_path / "attnscope"
    shutil.copytree(SRC, tree, ignore=shutil.ignore_patterns("__pycache__", "*.c", "*.so"))
    path = tree / "viz" / "payload.py"
    base = path.read_text(encoding="utf-8")
    path.write_text(base + "\n\ndef _asks(lm, ids):\n    from attnscope.models.generation import continuation\n\n"
                    "    return continuation(lm, ids, 3)\n", encoding="utf-8")
    assert violations(tree) == []
    path.write_text(base + "\n\ndef _runs(lm, ids):\n    from attnscope.models.generation import causal_lm_for\n\n"
                    "    return causal_lm_for(lm)\n", encoding="utf-8")
    assert [v.split(": ", 1)[1] for v in violations(tree)] == ["runs the model (causal_lm_for)"]
