"""``--device``: where the model runs.

This machine has no GPU, so the CUDA path is checked by construction here: the CPU results
must not change with ``--device cpu`` / ``auto``; an unavailable or malformed device is one
line naming ``--device`` (exit 2, nothing written); :func:`forward` moves CPU inputs and gates
to whatever device the model reports; and two source checks keep every tensor constructor of
the model-facing analyses on the model's device and every ``.numpy()`` behind a ``.cpu()``.
The last test compares CUDA with CPU and runs only where torch sees a GPU.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import one_line, says

from attnscope.cli.main import main
from attnscope.errors import ModelError
from attnscope.models import load_model
from attnscope.models.loading import resolve_device

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "attnscope"
DEMO = SRC / "demo_data" / "text.txt"
NO_CUDA = not torch.cuda.is_available()


def _store_arrays(folder: Path) -> list[np.ndarray]:
    from attnscope.store import open_store

    return [np.asarray(m.attn) for m in open_store(folder)]


def _examples(tmp_path: Path) -> Path:
    """The demo text's first sentences as an ``extract`` input (a JSON list of ``text``)."""
    lines = [ln for ln in DEMO.read_text(encoding="utf-8").splitlines() if ln.strip()][:12]
    path = tmp_path / "examples.json"
    path.write_text(json.dumps([{"text": ln} for ln in lines]), encoding="utf-8")
    return path


def _json(path: Path):
    return json.loads(path.read_text())


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert "Traceback" not in err
    return lines[0]


# -- resolving the device -----------------------------------------------------------------------
def test_resolve_device_on_a_machine_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("CPU") == "cpu"
    assert resolve_device("auto") == "cpu"
    for bad in ("cuda", "cuda:0", "bogus", "cuda:x", "cpu:0", "", "gpu"):
        with pytest.raises(ModelError, match=r"^device "):  # the parameter (the CLI: --device)
            resolve_device(bad)


def test_resolve_device_with_two_cuda_devices(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(ModelError) as e:
        resolve_device("cuda:2")
    says(one_line(e.value), "device cuda:2", "2 CUDA GPU")


@pytest.mark.parametrize("name", ["debug:bert", "debug:llama"])
def test_load_model_puts_every_weight_on_the_resolved_device(monkeypatch, name):
    # "meta" stands in for a GPU: the model must end up there and say so in its provenance
    monkeypatch.setattr("attnscope.models.loading.resolve_device", lambda d: "meta" if d == "cuda" else "cpu")
    lm = load_model(name, device="cuda")
    assert {p.device.type for p in lm.model.parameters()} == {"meta"}
    assert {b.device.type for b in lm.model.buffers()} <= {"meta"}
    assert lm.describe()["device"] == "meta"
    assert load_model(name).describe()["device"] == "cpu"


def test_load_model_refuses_a_bad_device_before_loading(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the model was loaded before the device was checked")

    monkeypatch.setattr("attnscope.models.loading._load", boom)
    with pytest.raises(ModelError, match=r"^device bogus: "):
        load_model("debug:bert", device="bogus")


# -- forward moves its inputs -------------------------------------------------------------------
def test_forward_moves_inputs_and_gates_to_the_model_device(monkeypatch):
    """The model's device is reported as "meta"; what reaches the model must be on it."""
    from attnscope.models import forward as fw

    lm = load_model("debug:bert")
    inputs = fw.pad_batch(lm, [lm.tokenizer("the cat sat")["input_ids"], [2, 3]], [[0] * 5, [0, 0]])
    gates = torch.ones(lm.num_layers, lm.num_heads, requires_grad=True)
    seen = {}

    class Reached(Exception):
        pass

    def pre(module, args, kwargs):
        seen.update({k: v.device.type for k, v in kwargs.items() if isinstance(v, torch.Tensor)})
        seen["gates"] = fw._ACTIVE.get().gates.device.type
        raise Reached

    monkeypatch.setattr(fw, "model_device", lambda model: torch.device("meta"))
    handle = lm.model.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        with pytest.raises(Reached):
            fw.forward(lm, inputs, gates=gates, grad=True)
    finally:
        handle.remove()
    assert seen == {"input_ids": "meta", "attention_mask": "meta", "token_type_ids": "meta",
                    "gates": "meta"}
    assert inputs.input_ids.device.type == "cpu"  # the caller's batch is not changed


def test_forward_keeps_the_gate_gradient_on_the_callers_tensor():
    from attnscope.models.forward import forward, pad_batch

    lm = load_model("debug:bert")
    inputs = pad_batch(lm, [lm.tokenizer("the cat sat")["input_ids"]])
    gates = torch.ones(lm.num_layers, lm.num_heads, requires_grad=True)
    out = forward(lm, inputs, gates=gates, grad=True)
    out.output.last_hidden_state[..., 0].sum().backward()  # a whole LayerNorm row sums to a constant
    assert gates.grad is not None and gates.grad.shape == (lm.num_layers, lm.num_heads)
    assert torch.count_nonzero(gates.grad) > 0


# -- the command line ---------------------------------------------------------------------------
def test_extract_cpu_and_auto_equal_the_default_bit_for_bit(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # "auto" must mean cpu here
    stores, examples = {}, _examples(tmp_path)
    for label, extra in (("default", []), ("cpu", ["--device", "cpu"]), ("auto", ["--device", "auto"])):
        out = tmp_path / label
        assert main(["extract", str(examples), "--model", "debug:bert", "--out", str(out), "-q",
                     "--dtype", "float32", *extra]) == 0
        stores[label] = _store_arrays(out)
        assert _json(out / "manifest.json")["model"]["device"] == "cpu"
    assert len(stores["default"]) == 12
    for label in ("cpu", "auto"):
        assert len(stores[label]) == len(stores["default"])
        for a, b in zip(stores[label], stores["default"]):
            assert a.dtype == b.dtype and np.array_equal(a, b)


@pytest.mark.heavy
def test_analyze_auto_equals_the_default_bit_for_bit(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for label, extra in (("default", []), ("auto", ["--device", "auto"])):
        assert main(["analyze", "longctx", str(DEMO), "--model", "debug:llama", "--out",
                     str(tmp_path / label), "-q", *extra]) == 0
    a = _json(tmp_path / "default" / "results" / "longctx.json")
    b = _json(tmp_path / "auto" / "results" / "longctx.json")
    assert a["meta"]["model"]["device"] == b["meta"]["model"]["device"] == "cpu"
    assert a["arrays"] and a == b


@pytest.mark.heavy
def test_run_records_the_device_asked_for_and_the_one_used(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "run"
    assert main(["run", "--text", str(DEMO), "--model", "debug:bert", "--out", str(out), "-q",
                 "--device", "auto"]) == 0
    prov = _json(out / "results.json")["provenance"]
    assert (prov["arguments"]["device"], prov["model"]["device"]) == ("auto", "cpu")


@pytest.mark.parametrize("device", ["cuda", "bogus"])
@pytest.mark.parametrize("command", [
    ["extract", str(ROOT / "tests" / "no-such-input.json"), "--model", "debug:bert"],
    ["analyze", "longctx", str(DEMO), "--model", "debug:llama"],
    ["run", "--text", str(DEMO), "--model", "debug:bert"],
], ids=["extract", "analyze", "run"])
def test_unusable_device_is_one_line_exit_2_and_no_output(tmp_path, capsys, monkeypatch, command, device):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    assert main([*command, "--out", str(out), "--device", device]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: --device {device}: ")
    assert not out.exists()


# -- source checks: tensors made where the model's tensors are, numpy only after .cpu() -----------
CONSTRUCTORS = {"tensor", "zeros", "ones", "full", "arange", "empty", "as_tensor", "from_numpy", "eye"}
DEVICE_FILES = ["models/forward.py", "extract/runner.py", "viz/neuron.py", "families/patterns.py",
                *(f"analyses/{m}.py" for m in ("ablation", "gradients", "importance", "lm_objective",
                                              "longctx", "norms", "value_zeroing", "agreement", "rollout")),
                *sorted(str(p.relative_to(SRC)) for p in (SRC / "engines").glob("*.py"))]
#: (file, enclosing function, constructor): tensors that stay on the CPU by design, and why.
CPU_BY_DESIGN = {
    ("models/forward.py", "pad_batch", "full"): "a CPU batch; forward() moves it",
    ("models/forward.py", "pad_batch", "zeros"): "a CPU batch; forward() moves it",
    ("models/forward.py", "pad_batch", "as_tensor"): "a CPU batch; forward() moves it",
    ("analyses/longctx.py", "update", "tensor"): "stored maps are numpy; no model runs",
    ("analyses/longctx.py", "update", "as_tensor"): "stored maps are numpy; no model runs",
    ("analyses/ablation.py", "mean_ablation_hook", "as_tensor"): "moved with .to(out.device) in the hook",
    ("analyses/gradients.py", "__init__", "zeros"): "the fitted head trains on the CPU, then moves",
    ("analyses/gradients.py", "fit_mlm_head", "as_tensor"): "targets of the CPU-fitted head",
    ("engines/streaming.py", "make_sequences", "as_tensor"): "stacked, then .to(device)",
}


def _constructor_calls():
    """``(file, innermost enclosing function, call node)`` for every ``torch.<constructor>(...)``."""
    def visit(node, fn, rel):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn = node.name
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                and node.func.attr in CONSTRUCTORS):
            yield rel, fn, node
        for child in ast.iter_child_nodes(node):
            yield from visit(child, fn, rel)

    for rel in DEVICE_FILES:
        yield from visit(ast.parse((SRC / rel).read_text(encoding="utf-8")), "<module>", rel)


def test_model_facing_tensor_constructors_pass_device():
    missing, used = [], set()
    for rel, fn, node in _constructor_calls():
        if any(k.arg == "device" for k in node.keywords):
            continue
        key = (rel, fn, node.func.attr)
        if key in CPU_BY_DESIGN:
            used.add(key)
            continue
        missing.append(f"{rel}:{node.lineno} torch.{node.func.attr}(...) in {fn}() has no device=")
    assert not missing, "\n".join(missing)
    assert used == set(CPU_BY_DESIGN), f"stale CPU_BY_DESIGN entries: {set(CPU_BY_DESIGN) - used}"


def test_numpy_is_only_called_after_cpu():
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        if "probes" in path.parts:  # features built from numpy, trained on the CPU
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "numpy" and not node.args):
                inner = node.func.value
                ok = (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute)
                      and inner.func.attr == "cpu")
                if not ok:
                    bad.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not bad, f".numpy() without .cpu() first: {bad}"


# -- on a GPU machine only ----------------------------------------------------------------------
def _arrays(d) -> dict[str, np.ndarray]:
    out = {}

    def walk(o, where):
        if isinstance(o, dict):
            if "data" in o and isinstance(o.get("data"), list):
                out[where] = np.asarray(o["data"], dtype=np.float64)
            for k, v in o.items():
                walk(v, f"{where}/{k}")

    walk(d, "")
    return out


@pytest.mark.skipif(NO_CUDA, reason="torch sees no CUDA GPU")
def test_cuda_matches_cpu(tmp_path):
    from attnscope.pipeline import run_family

    cpu, gpu = tmp_path / "cpu", tmp_path / "gpu"
    examples = _examples(tmp_path)
    for dev, out in (("cpu", cpu), ("cuda", gpu)):
        assert main(["extract", str(examples), "--model", "debug:bert", "--out", str(out / "store"), "-q",
                     "--dtype", "float32", "--device", dev]) == 0
        run_family("longctx", {"documents": DEMO}, out / "longctx", model="debug:llama", device=dev)
        run_family("attribution", {"attribution": DEMO}, out / "attr", model="debug:gpt2", device=dev,
                   attribution_examples=3, attribution_methods="importance,norms")
    for a, b in zip(_store_arrays(cpu / "store"), _store_arrays(gpu / "store"), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4)
    assert _json(gpu / "store" / "manifest.json")["model"]["device"].startswith("cuda")
    for rel in ("longctx/results/longctx.json", "attr/results/attribution.json"):
        a, b = _arrays(_json(cpu / rel)), _arrays(_json(gpu / rel))
        assert a and a.keys() == b.keys()
        for k in a:
            np.testing.assert_allclose(a[k], b[k], atol=1e-4, err_msg=k)
