"""The streaming engine's compiled kernels (``native_tiles.c``), built on first use.

:func:`flash` does one layer of one sequence in one call: the attention output and every row's
entropy, largest weight, mass on each key class and mass per distance bucket, from blocks of 384 /
G rows of a key head's G query heads and 256 keys, which stay in the cache as in torch's fused CPU
attention (``scaled_dot_product_attention``), with an online softmax across the key blocks. Its two
products per block are the BLAS ``sgemm_`` that torch's own library exports (MKL in the x86
wheels); the blocks are shared among torch's OpenMP threads. Measured on one layer of SmolLM2's
shapes at 16k tokens (one thread, random inputs): the kernel alone 4.3-4.4 s against sdpa's 4.0 s;
with the engine's per-layer work (sampled rows, the fold) 4.5-4.8 s, where the tiles that hold
whole rows took 5.8-6.1 s.

:func:`softmax_stats` does the row work of one such tile (word-level sequences and probes, which
need each row's weights, and the layers where :func:`flash` is not available): a tile's row
softmax, entropies, largest weights, mass per distance and mass on each key class, in three passes
over each row while the row is in the cache. The torch path (``tiled.softmax_entropy``,
``longctx.diagonal_sums``, and the classes as extra value columns of ``P V``) makes about eight
passes over the whole tile.

The kernels are plain C with no Python or torch headers. The first use compiles them with the
system's C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``) for this CPU (``-march=native``,
with OpenMP where the compiler has it) into ``<cache>/native/`` (the cache folder of
:func:`attnscope.models.cache.cache_root`), under a name made from the source, the compiler, its
flags and the CPU, written under a temporary name and renamed into place; later runs load that
file (one that does not load is built again). Where no compiler works, or with
``ATTNSCOPE_NATIVE=0``, the engine uses the torch path (with ``ATTNSCOPE_NATIVE=tiles``, the tiles
that hold whole rows with :func:`softmax_stats`), whose values are the same to float32
rounding (tests/engines/test_native.py).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from attnscope.models.cache import cache_root

PTR, INT = ctypes.c_void_p, ctypes.c_int64  # the C arguments' types

SOURCE = Path(__file__).with_name("native_tiles.c")
# -ffast-math at compile time only: linked with it, gcc adds a start-up file that makes the whole
# process flush denormals (see the C file)
ATTEMPTS = (  # OpenMP: torch's own runtime (libgomp.so.1, already loaded) shares out the blocks
    (["-O3", "-ffast-math", "-march=native", "-fopenmp"], ["-fopenmp", "-lmvec", "-lm"]),
    (["-O3", "-ffast-math", "-march=native"], ["-lmvec", "-lm"]),  # glibc: vectorized expf
    (["-O3", "-ffast-math", "-march=native"], ["-lm"]),
    (["-O3", "-ffast-math"], ["-lm"]),
)
log = logging.getLogger(__name__)


def _compiler() -> str | None:
    for name in (os.environ.get("CC", "").split(" ")[0], "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _build(cc: str, cflags: list[str], libs: list[str], out: Path) -> bool:
    """Compile and link the kernel into ``out``; False where that fails (or the folder is not
    writable)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp:
            obj, lib = Path(tmp, "tiles.o"), Path(tmp, "tiles.so")
            for cmd in ([cc, *cflags, "-fPIC", "-c", str(SOURCE), "-o", str(obj)],
                        [cc, "-shared", str(obj), "-o", str(lib), *libs]):
                if subprocess.run(cmd, capture_output=True, timeout=120).returncode:
                    return False
            os.replace(lib, out)  # atomic: a killed build leaves no half-written library
    except (OSError, subprocess.SubprocessError) as err:
        log.info("native tile kernel: %s", err)
        return False
    return True


@cache
def library():
    """The loaded kernel library (:class:`ctypes.CDLL`), or None (no compiler, or disabled)."""
    import torch  # noqa: F401 (first: its OpenMP runtime, libgomp.so.1, is the one the kernel gets)

    if os.environ.get("ATTNSCOPE_NATIVE", "1") == "0":
        return None
    cc = _compiler()
    if cc is None:
        log.info("no C compiler: the streaming engine uses its torch path")
        return None

    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        log.info("C compiler %s: %s; the streaming engine uses its torch path", cc, err)
        return None
    where = [SOURCE.read_text(), cc, version, platform.machine(), _cpu()]  # the same for every attempt
    for cflags, libs in ATTEMPTS:
        key = hashlib.sha256("\n".join([*where, *cflags, *libs]).encode()).hexdigest()[:16]
        path = cache_root() / "native" / f"tiles-{key}.so"
        for fresh in (False, True):  # a cached file that does not load is built again, once
            if (fresh or not path.is_file()) and not _build(cc, cflags, libs, path):
                break
            try:
                lib = ctypes.CDLL(str(path))
                lib.attnscope_softmax_stats, lib.attnscope_flash  # noqa: B018 (both are there)
                return lib
            except (OSError, AttributeError) as err:
                log.info("native tile kernel %s: %s", path, err)
    log.info("the native tile kernel did not build with %s: the streaming engine uses its torch path", cc)
    return None


@cache
def kernel():
    """The loaded ``attnscope_softmax_stats`` function, or None."""
    lib = library()
    if lib is None:
        return None
    fn = lib.attnscope_softmax_stats
    fn.restype = None
    fn.argtypes = [PTR, INT, INT, INT, PTR, PTR, PTR, PTR, INT, INT, PTR]
    return fn


@cache
def flash_kernel():
    """``(attnscope_flash, the address of torch's sgemm_)``, or None (no kernel, a torch that
    exports no Fortran ``sgemm_``, or ``ATTNSCOPE_NATIVE=tiles``: then the engine's tiles hold
    whole rows)."""
    import torch

    lib = library()
    if lib is None or os.environ.get("ATTNSCOPE_NATIVE") == "tiles":
        return None
    try:
        blas = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        gemm = ctypes.cast(blas.sgemm_, ctypes.c_void_p).value
    except (OSError, AttributeError) as err:
        log.info("no sgemm_ in torch's library (%s): the streaming engine's tiles hold whole rows", err)
        return None
    if not gemm:
        return None
    fn = lib.attnscope_flash
    fn.restype = ctypes.c_int
    fn.argtypes = [PTR, PTR, INT, INT, PTR, INT, INT, PTR, INT, INT, PTR, INT, INT, INT, INT, INT, INT, INT,
                   ctypes.c_float, ctypes.c_float, ctypes.c_int, PTR, INT, PTR, INT, INT, PTR, INT, INT, PTR,
                   INT, INT, INT]
    return fn, gemm


def available(device) -> bool:
    """Whether the kernel can work on tiles on ``device`` (the CPU, where it built)."""
    return getattr(device, "type", device) == "cpu" and kernel() is not None


def softmax_stats(s, diag=None, classes=None):
    """In place on the float32, contiguous scores ``s`` ``[h c K]`` on the CPU: ``s`` becomes the row
    softmax ``p``. Returns each row's entropy and largest weight ``[h c]``, and its mass on each
    key class ``[h c F]`` (``classes``: float32 ``[F >= K]``, rows contiguous; F = 0 without).
    ``diag``, where given (float32 ``[h K+c-1]``, contiguous), receives the mass of each head's
    rows per distance, as :func:`attnscope.engines.rows.diagonal_sums` lays it out."""
    import torch

    h, c, K = s.shape
    assert s.device.type == "cpu" and s.dtype == torch.float32 and s.is_contiguous()
    ent = s.new_empty(h, c)
    top = s.new_empty(h, c)
    F = 0 if classes is None else classes.shape[0]
    mass = s.new_empty(h, c, F)
    if diag is not None:
        assert diag.shape == (h, K + c - 1) and diag.is_contiguous() and diag.dtype == s.dtype
    if F:
        assert classes.shape[1] >= K and classes.stride(1) == 1 and classes.dtype == s.dtype
    kernel()(s.data_ptr(), h * c, K, c, ent.data_ptr(), top.data_ptr(),
             None if diag is None else diag.data_ptr(), classes.data_ptr() if F else None, F,
             classes.stride(0) if F else 0, mass.data_ptr())
    return ent, top, mass


#: the rows of a block (of all G query heads of a key head together, at head size 64) and keys of
#: a block in :func:`flash`: at 16k tokens, 128 / 64 / 192 / 85 rows of 3 heads with 256 / 512 /
#: 384 / 256 keys took 4.27-4.43 s (one thread), within the noise of each other
BLOCK_ROWS, BLOCK_KEYS = 384, 256


def flash(q, k, v, out, n: int, nkeys: int, scale: float, cap: float | None, causal: bool, mask,
          classes, rowv, dist) -> None:
    """One layer of one sequence through ``attnscope_flash`` (float32 CPU tensors, last dimension
    contiguous): queries ``q`` ``[Hq >=n d]``, keys and values ``[Hkv >=nkeys d]``; writes the
    output rows ``out`` ``[>=n Hq d]`` ``0 .. n-1`` and each row's entropy, largest weight and mass
    on each key class into ``rowv`` ``[2+F Hq n]`` (contiguous; ``classes`` ``[F >=nkeys]``, rows
    contiguous), and adds each head's mass per distance bucket over rows ``1 .. n-1`` (the buckets
    of :func:`attnscope.engines.rows.bucket_of`, then distance +1) to ``dist`` ``[Hq NB+1]``
    (float64, contiguous). Keys: ``0 .. i`` for row ``i`` where ``causal``, else ``0 .. nkeys-1``;
    where ``mask`` (bool ``[>=n >=nkeys]``, True = attend) is given, the keys it allows among
    them. ``cap``: logit soft-capping, ``cap tanh(s / cap)``."""
    import torch

    fn, gemm = flash_kernel()
    Hq, _, d = q.shape
    Hkv = k.shape[0]
    F = classes.shape[0]
    for t in (q, k, v, out, classes):
        assert t.device.type == "cpu" and t.dtype == torch.float32 and t.stride(-1) == 1
    assert rowv.shape == (2 + F, Hq, n) and rowv.is_contiguous() and rowv.dtype == torch.float32
    assert dist.shape[0] == Hq and dist.is_contiguous() and dist.dtype == torch.float64
    assert classes.shape[1] >= nkeys and out.shape[1:] == (Hq, d) and Hq % Hkv == 0
    assert min(k.stride(1), v.stride(1)) >= d and max(k.stride(1), v.stride(1)) < 2 ** 31  # BLAS's ld
    if mask is not None:
        assert mask.dtype == torch.bool and mask.stride(-1) == 1
    G = Hq // Hkv
    rows = max(1, BLOCK_ROWS * 64 // max(d, 64) // G)
    if fn(gemm, q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0), k.stride(1),
          v.data_ptr(), v.stride(0), v.stride(1), out.data_ptr(), out.stride(1), out.stride(0), Hkv, G, d,
          n, nkeys, scale, cap or 0.0, int(causal), None if mask is None else mask.data_ptr(),
          0 if mask is None else mask.stride(0), classes.data_ptr(), F, classes.stride(0),
          rowv.data_ptr(), Hq * n, n, dist.data_ptr(), dist.shape[1] - 1, rows, BLOCK_KEYS):
        raise MemoryError("the streaming kernel could not allocate its blocks")
