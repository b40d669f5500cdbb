"""The one-pass kernel compiled for an H100 on this machine, no GPU needed: Triton's own compiler
and the ptxas it ships take the kernel to sm_90a machine code, which proves what the interpreter
cannot (the interpreter runs the kernel's Python, not Triton's typing of it: a loop variable
reused across a static and a dynamic loop ran there and failed here) and reports each launch
configuration's registers and spills (``onepass.launch`` picks sizes that spill none).

Triton cannot compile in a process that imported it for the interpreter (``conftest.py`` sets
``TRITON_INTERPRET=1``), so the compiling runs in a child process: this file run as a script.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

#: (inputs, model mask: 0 none / 1 boolean / 2 additive, causal, soft-capping, head size)
CASES = {"bfloat16-causal": ("bfloat16", 0, True, False, 64), "bfloat16-model-mask": ("bfloat16", 1, True, False, 64),
         "float32-causal": ("float32", 0, True, False, 64), "float32-model-mask": ("float32", 1, True, False, 64),
         "bfloat16-encoder-capped-additive": ("bfloat16", 2, False, True, 64),
         "bfloat16-causal-head-128": ("bfloat16", 0, True, False, 128),
         "bfloat16-model-mask-head-128": ("bfloat16", 1, True, False, 128),
         "float32-causal-head-128": ("float32", 0, True, False, 128)}


def compile_for_h100(name: str) -> dict:
    """Registers and spilled bytes of the kernel for one of :data:`CASES`, at the launch
    configuration ``onepass.launch`` picks on CUDA."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnscope.engines import onepass
    from attnscope.engines.rows import NUM_BUCKETS

    dtype, mask, causal, cap, D = CASES[name]
    dtype = getattr(torch, dtype)
    kernel = onepass._kernel()
    BM, BN, warps = onepass.launch(torch.device("cuda"), dtype, mask != 0, D)
    const = dict(G=4, D=D, F=3, FP=16, NB=NUM_BUCKETS, NBP=32, CAUSAL=causal, CAP=cap,
                 PREC="ieee" if dtype == torch.float32 else None, MASK=mask, BM=BM, BN=BN)
    ptr = {torch.bfloat16: "*bf16", torch.float32: "*fp32"}[dtype]
    sig = {name: ("constexpr" if name in const else ptr if name in ("Q", "K", "V")
                  else {1: "*u8", 2: "*fp32"}.get(mask, "*fp32") if name == "M"
                  else "*fp32" if name in ("C", "OUT", "LSE", "ROWS", "DIST")
                  else "fp32" if name in ("scale", "cap", "low") else "i32")
           for name in kernel.arg_names}
    src = ASTSource(fn=kernel, signature=sig,
                    constexprs={(kernel.arg_names.index(k),): v for k, v in const.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    ptx = Path(os.environ["OUT"]) / f"{name}.ptx"
    ptx.write_text(compiled.asm["ptx"])
    run = subprocess.run([str(ptxas), "-v", "--gpu-name", "sm_90a", str(ptx), "-o", str(ptx.with_suffix(".cubin"))],
                         capture_output=True, text=True, timeout=300)
    if run.returncode:
        return {"error": run.stderr.strip()[-2000:]}
    return {"blocks": [BM, BN, warps],
            "spilled": int(re.search(r"(\d+) bytes spill stores", run.stderr).group(1)),
            "registers": int(re.search(r"Used (\d+) registers", run.stderr).group(1))}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    pytest.importorskip("triton")
    import triton

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").is_file():
        pytest.skip("this Triton ships no ptxas")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(OUT=str(tmp_path_factory.mktemp("ptx")),
               PYTHONPATH=os.pathsep.join([str(root / "src"), env.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", list(CASES))
def test_the_kernel_compiles_for_an_h100_without_spilling(compiled, case):
    # measured at head size 64, registers of 255: 243, 229, 172, 166 and 238 (the next block
    # size up, 64 x 64, spills 0.4-15 KB with a mask or float32 inputs); at 128 the sizes of 64
    # spill 60 B to 25 KB
    got = compiled[case]
    assert "error" not in got, got.get("error")
    assert got["spilled"] == 0, got


def _each() -> dict:
    out = {}
    for name in CASES:
        try:
            out[name] = compile_for_h100(name)
        except Exception as exc:  # a compile error is the test's finding, case by case
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[-3000:]}
    return out


if __name__ == "__main__":
    print(json.dumps(_each()))
