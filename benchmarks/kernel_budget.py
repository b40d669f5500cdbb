"""The one-pass kernel's instruction budget on an H100, read on the CPU: no GPU needed.

Triton compiles, for sm_90a and with the specialisation its JIT gives a launch (16-byte-aligned
pointers and strides divisible by 16 marked so; an integer equal to 1 made a constant), two
kernels for one case each (the Llama-3.2-1B shape: bfloat16, head size 64, grouped-query heads,
causal, no mask of the model's; and head size 128, the 8B shape):

- attnscope's one-pass kernel exactly as :func:`attnscope.engines.onepass.layer_stats` launches
  it (:func:`attnscope.engines.onepass.arguments` gives the arguments; the launch sizes are
  :func:`attnscope.engines.onepass.launch`'s);
- a bare flash-attention forward written below (the output and nothing else: the floor), with the
  same blocks and warps, in the form of Triton's fused-attention tutorial (the scale folded into
  one FFMA before ``exp2``, a loop over the blocks wholly below the diagonal without a mask and
  one over the diagonal's blocks with it, ``P V`` accumulated in place).

The ptxas that Triton's wheel ships (with the flags Triton gives it) reports registers and
spilled bytes; ``cuobjdump -sass`` gives the machine code, whose control-flow graph is read here:
each loop that multiplies on the tensor cores, in program order (below the diagonal, then the
diagonal's blocks), and on it the fewest instructions one iteration can issue (the common path:
a block wholly below the diagonal and, for attnscope's kernel, inside one distance bucket).
Instructions per score per thread = that count / (BM BN / (32 warps)): an SM issues four warp
instructions a clock, so the issue rate allows at most ``128 / (instructions per score)`` scores a
clock per SM.

    python benchmarks/kernel_budget.py            # the two cases, side by side
    python benchmarks/kernel_budget.py --all      # every launch configuration onepass picks

The last line printed is one JSON object keyed by case, each
``{"attnscope": per score, "bare": per score, "ratio": ..., "spilled": bytes, ...}``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter compiles nothing
    sys.exit("kernel_budget: run it without TRITON_INTERPRET=1 (Triton must compile, not interpret)")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from attnscope.engines import onepass  # noqa: E402

#: case -> (input dtype, head size, causal, the model's mask: None / "bool" / "additive", soft-capping)
CASES = {"bf16-d64-causal": ("bfloat16", 64, True, None, False),
         "bf16-d128-causal": ("bfloat16", 128, True, None, False)}
#: the other launch configurations :func:`onepass.launch` picks (compiled for spills only)
MORE = {"bf16-d64-mask": ("bfloat16", 64, True, "bool", False),
        "f32-d64-causal": ("float32", 64, True, None, False),
        "f32-d64-mask": ("float32", 64, True, "bool", False),
        "bf16-d64-encoder-capped-additive": ("bfloat16", 64, False, "additive", True),
        "bf16-d128-mask": ("bfloat16", 128, True, "bool", False),
        "f32-d128-causal": ("float32", 128, True, None, False),
        "f32-d128-mask": ("float32", 128, True, "bool", False)}
TOKENS = 32768  # the length whose strides the arguments have (every stride here divisible by 16)
GROUPS = 4  # query heads per key head (Llama-3.2-1B: 32 / 8)


@triton.jit
def bare_kernel(Q, K, V, OUT, n, scale, sq_h, sq_n, sk_h, sk_n, so_h, so_n,
                G: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Causal flash attention's forward, output only."""
    blk = tl.program_id(0)
    h = tl.program_id(1)
    kv = h // G
    rows = blk * BM + tl.arange(0, BM)
    dd = tl.arange(0, D)
    q = tl.load(Q + h * sq_h + rows[:, None] * sq_n + dd[None, :], mask=(rows < n)[:, None], other=0.0)
    qk = scale * 1.4426950408889634  # log2(e)
    m = tl.full([BM], float("-inf"), tl.float32)
    z = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for start in range(0, blk * BM, BN):  # wholly below the diagonal: no mask
        cols = start + tl.arange(0, BN)
        k = tl.load(K + kv * sk_h + cols[:, None] * sk_n + dd[None, :])
        v = tl.load(V + kv * sk_h + cols[:, None] * sk_n + dd[None, :])
        s = tl.dot(q, tl.trans(k))
        m_new = tl.maximum(m, tl.max(s, 1) * qk)
        p = tl.exp2(s * qk - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        z = z * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m = m_new
    for start in range(blk * BM, tl.minimum(n, (blk + 1) * BM), BN):  # the diagonal's blocks
        cols = start + tl.arange(0, BN)
        k = tl.load(K + kv * sk_h + cols[:, None] * sk_n + dd[None, :], mask=(cols < n)[:, None], other=0.0)
        v = tl.load(V + kv * sk_h + cols[:, None] * sk_n + dd[None, :], mask=(cols < n)[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k))
        s = tl.where((rows[:, None] >= cols[None, :]) & (cols < n)[None, :], s * qk, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        z = z * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m = m_new
    tl.store(OUT + h * so_h + rows[:, None] * so_n + dd[None, :], acc / z[:, None], mask=(rows < n)[:, None])


def _inputs(dtype: str, d: int, mask: str | None, n: int = TOKENS):
    """q, k, v, classes (3: first token, special, punctuation) and the model's mask, on the CPU,
    shaped as on the GPU (their pointers' alignment is what the JIT reads of them)."""
    dt = getattr(torch, dtype)
    hkv = 2
    q = torch.empty(hkv * GROUPS, n, d, dtype=dt)
    k, v = torch.empty(hkv, n, d, dtype=dt), torch.empty(hkv, n, d, dtype=dt)
    own = None
    if mask == "bool":
        own = torch.empty(n, n, dtype=torch.bool) if n <= 4096 else torch.empty(1, 1, dtype=torch.bool).expand(n, n)
    elif mask == "additive":
        own = torch.empty(1, 1).expand(n, n)
    return q, k, v, torch.zeros(n, 3), own


def _source(fn, args, consts):
    """Triton's source for ``fn`` specialised as its JIT specialises a launch with ``args``."""
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler import ASTSource
    from triton.runtime.jit import native_specialize_impl

    names = [a for a in fn.arg_names if a not in consts]
    signature, attrs, constexprs = {}, {}, dict(consts)
    for i, (name, arg) in enumerate(zip(names, args)):
        kind, spec = native_specialize_impl(CUDABackend, arg, False, True, True)[:2]
        if kind == "constexpr":  # an integer equal to 1
            constexprs[name] = arg
            continue
        signature[name] = kind
        if spec:
            attrs[(fn.arg_names.index(name),)] = CUDABackend.parse_attr(spec)
    for name in consts:
        signature[name] = "constexpr"
    for name in list(constexprs):
        signature[name] = "constexpr"
    signature = {a: signature[a] for a in fn.arg_names}
    return ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)


def compile_sm90(fn, args, consts, warps: int, stages: int, workdir: Path, name: str) -> dict:
    """Registers, spilled bytes and the SASS of ``fn`` for an H100."""
    from triton.backends.compiler import GPUTarget

    compiled = triton.compile(_source(fn, args, consts), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "num_stages": stages})
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    ptx = workdir / f"{name}.ptx"
    ptx.write_text(compiled.asm["ptx"])
    cubin = ptx.with_suffix(".cubin")
    run = subprocess.run([str(bin_dir / "ptxas"), "-v", "--regAllocOptLevel=2", "--gpu-name=sm_90a",
                          str(ptx), "-o", str(cubin)], capture_output=True, text=True, timeout=600)
    if run.returncode:
        raise RuntimeError(run.stderr.strip()[-2000:])
    sass = subprocess.run([str(bin_dir / "cuobjdump"), "-sass", str(cubin)], capture_output=True,
                          text=True, check=True, timeout=120).stdout
    return {"registers": int(re.search(r"Used (\d+) registers", run.stderr).group(1)),
            "spilled": int(re.search(r"(\d+) bytes spill stores", run.stderr).group(1))
            + int(re.search(r"(\d+) bytes spill loads", run.stderr).group(1)),
            "sass": sass}


# -- reading the SASS ---------------------------------------------------------------------------

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")


def instructions(sass: str) -> list[tuple[int, str]]:
    """``(address, text)`` of every instruction of the one kernel in ``sass`` (NOPs left out)."""
    out = []
    for m in _LINE.finditer(sass):
        text = m.group(2).strip()
        if text.split()[0] != "NOP":
            out.append((int(m.group(1), 16), text))
    return out


def _opcode(text: str) -> tuple[bool, str]:
    """Whether the instruction is predicated, and its opcode without modifiers."""
    parts = text.split()
    pred = parts[0].startswith("@")
    op = parts[1 if pred else 0]
    return pred and not parts[0].startswith("@PT"), op.split(".")[0]


def blocks_of(instr: list[tuple[int, str]]):
    """The control-flow graph: basic blocks as lists of instruction indices, and each block's
    successors (by block index)."""
    addr = {a: i for i, (a, _) in enumerate(instr)}
    leaders = {0}
    targets = {}
    for i, (_, text) in enumerate(instr):
        pred, op = _opcode(text)
        if op in ("BRA", "EXIT", "RET", "BRX", "JMP", "JMX", "BREAK"):
            leaders.add(i + 1)
            t = re.search(r"(?:BRA|JMP)\s+(?:`\()?(0x[0-9a-f]+)", text)
            if t and int(t.group(1), 16) in addr:
                targets[i] = addr[int(t.group(1), 16)]
                leaders.add(targets[i])
    starts = sorted(x for x in leaders if x < len(instr))
    block_of = {}
    blocks = []
    for b, s in enumerate(starts):
        e = starts[b + 1] if b + 1 < len(starts) else len(instr)
        blocks.append(list(range(s, e)))
        for i in range(s, e):
            block_of[i] = b
    succ = []
    for b, idx in enumerate(blocks):
        last = idx[-1]
        pred, op = _opcode(instr[last][1])
        nxt = [b + 1] if b + 1 < len(blocks) else []
        if op in ("BRA", "JMP"):
            out = [block_of[targets[last]]] if last in targets else []
            succ.append(out + (nxt if pred else []))
        elif op in ("EXIT", "RET", "BRX", "JMX", "BREAK"):
            succ.append(nxt if pred else [])
        else:
            succ.append(nxt)
    return blocks, succ


def dominators(succ) -> list[set[int]]:
    """Each block's dominators (the blocks every path from the entry to it passes through)."""
    preds = [[a for a, ns in enumerate(succ) if b in ns] for b in range(len(succ))]
    every = set(range(len(succ)))
    dom = [{0}] + [set(every) for _ in range(1, len(succ))]
    changed = True
    while changed:
        changed = False
        for b in range(1, len(succ)):
            new = {b} | (set.intersection(*(dom[a] for a in preds[b])) if preds[b] else set())
            if new != dom[b]:
                dom[b], changed = new, True
    return dom


def loops(instr, blocks, succ) -> list[dict]:
    """Each natural loop (an edge to a block that dominates its source): its header, its blocks,
    the fewest instructions an iteration can issue (header to the edge back, the loops inside it
    taken zero times) and the instructions of its blocks each counted once."""
    dom = dominators(succ)
    preds = [[a for a, ns in enumerate(succ) if b in ns] for b in range(len(blocks))]
    back = {(a, b) for a, ns in enumerate(succ) for b in ns if b in dom[a]}
    out = []
    for src, head in sorted(back):
        body, stack = {head, src}, [src]
        while stack:
            for a in preds[stack.pop()]:
                if a not in body:
                    body.add(a)
                    stack.append(a)
        # shortest path from the header to the source over the body's forward edges (a DAG)
        fwd = {b: [c for c in succ[b] if c in body and (b, c) not in back] for b in body}
        order, seen = [], set()

        def visit(b):
            seen.add(b)
            for c in fwd[b]:
                if c not in seen:
                    visit(c)
            order.append(b)

        visit(head)
        cost = {b: math.inf for b in body}
        cost[head] = len(blocks[head])
        for b in reversed(order):
            for c in fwd[b]:
                cost[c] = min(cost[c], cost[b] + len(blocks[c]))
        ops = [_opcode(instr[i][1])[1] for b in body for i in blocks[b]]
        out.append({"head": head, "latch": src, "blocks": body, "fewest": cost[src],
                    "every": sum(len(blocks[b]) for b in body),
                    "mma": sum(o in ("HGMMA", "HMMA") for o in ops)})
    return sorted(out, key=lambda x: x["head"])


def per_score(sass: str, BM: int, BN: int, warps: int) -> dict:
    """Instructions per score per thread on the outermost loops that multiply on the tensor cores
    (any, for float32 inputs): the
    first (below the diagonal) on its common path, the last (the diagonal's blocks) with each of
    its instructions once."""
    instr = instructions(sass)
    blocks, succ = blocks_of(instr)
    every = loops(instr, blocks, succ)
    mma = [lp for lp in every if lp["mma"]] or every  # float32 inputs multiply on the CUDA cores
    span = [(blocks[lp["head"]][0], blocks[lp["latch"]][-1]) for lp in mma]  # (first, last instruction)
    outer = [lp for lp, (a, b) in zip(mma, span)  # not inside another loop's span of addresses
             if not any((c <= a and b <= d) and (c, d) != (a, b) for c, d in span)]
    if not outer:
        raise RuntimeError("the kernel has no loop")
    scores = BM * BN / (32 * warps)
    return {"common": outer[0]["fewest"] / scores, "diagonal": outer[-1]["every"] / scores,
            "loop_instructions": outer[0]["fewest"], "loops": len(outer), "total": len(instr)}


def case(name: str, spec, workdir: Path, bare: bool = True) -> dict:
    dtype, d, causal, mask, cap = spec
    q, k, v, classes, own = _inputs(dtype, d, mask)
    dev = torch.device("cuda")
    BM, BN, warps, stages = onepass.launch(dev, q.dtype, own is not None, d)
    grid, args, consts, _ = onepass.arguments(q, k, v, classes, scale=d ** -0.5, cap=50.0 if cap else None,
                                              causal=causal, mask=own, config=(BM, BN, warps, stages))
    got = compile_sm90(onepass._kernel(), args, consts, warps, stages, workdir, name)
    row = {"blocks": [BM, BN, warps, stages], "registers": got["registers"], "spilled": got["spilled"]}
    row.update({f"attnscope_{k}": v for k, v in per_score(got["sass"], BM, BN, warps).items()})
    if bare:
        out = torch.empty(q.shape, dtype=torch.float32)
        bargs = (q, k, v, out, q.shape[1], d ** -0.5, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                 out.stride(0), out.stride(1))
        b = compile_sm90(bare_kernel, bargs, dict(G=GROUPS, D=d, BM=BM, BN=BN), warps, stages, workdir,
                         name + "-bare")
        row.update({f"bare_{k}": v for k, v in per_score(b["sass"], BM, BN, warps).items()},
                   bare_registers=b["registers"], bare_spilled=b["spilled"])
        row.update(attnscope=round(row["attnscope_common"], 2), bare=round(row["bare_common"], 2),
                   ratio=round(row["attnscope_common"] / row["bare_common"], 3))
    return row


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="also compile every other launch configuration "
                    "onepass picks (registers and spills)")
    ap.add_argument("--keep", type=Path, help="keep the PTX, cubins and SASS in this folder")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        rows = {name: case(name, spec, workdir) for name, spec in CASES.items()}
        if args.all:
            rows.update({name: case(name, spec, workdir, bare=False) for name, spec in MORE.items()})
    print(f"{'case':34} {'blocks':>10} {'regs':>5} {'spill':>6} {'attnscope':>10} {'bare':>6} {'ratio':>6} "
          f"{'diag':>6} {'scores/clk/SM':>14}")
    for name, r in rows.items():
        blocks = "x".join(map(str, r["blocks"]))
        a = r["attnscope_common"]
        bare = f"{r['bare_common']:6.2f} {a / r['bare_common']:6.2f}" if "bare_common" in r else f"{'':6} {'':6}"
        print(f"{name:34} {blocks:>10} {r['registers']:5d} {r['spilled']:6d} {a:10.2f} {bare} "
              f"{r['attnscope_diagonal']:6.1f} {128 / a:14.2f}"
              + (f" (bare {128 / r['bare_common']:.2f})" if "bare_common" in r else ""))
    result = {name: {"attnscope": round(r["attnscope_common"], 2), "bare": r.get("bare"),
                     "ratio": r.get("ratio"), "spilled": r["spilled"], "registers": r["registers"],
                     "blocks": r["blocks"], "diagonal": round(r["attnscope_diagonal"], 2)}
              for name, r in rows.items()}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
