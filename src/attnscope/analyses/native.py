"""The streaming engine's compiled tile kernel (``native_tiles.c``), built on first use.

One call does a tile's row softmax, entropies, largest weights, mass per distance and mass on each
key class, in three passes over each row while the row is in the cache. The torch path
(``streaming._softmax_entropy``, ``longctx.diagonal_sums``, and the classes as extra value columns
of ``P V``) makes about eight passes over the whole tile, and its ``P V`` product is slower with
the extra columns. Measured on one layer of SmolLM2's shapes at 16k tokens (one thread; sdpa
3.9 s): the row work 0.85-0.88 s against 1.75 s, ``P V`` 1.84-1.91 s against 2.35-2.41 s, the
layer 4.9-5.1 s against 6.5-6.8 s.

The kernel is plain C with no Python or torch headers. The first use compiles it with the
system's C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``) for this CPU (``-march=native``)
into ``<cache>/native/`` (the cache folder of :func:`attnscope.models.gguf.cache_root`), under a
name made from the source, the compiler, its flags and the CPU, written under a temporary name and
renamed into place; later runs load that file (one that does not load is built again). Where no
compiler works, or with ``ATTNSCOPE_NATIVE=0``, the engine uses the torch path, whose values are
the same to float32 rounding (tests/test_native.py).
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

SOURCE = Path(__file__).with_name("native_tiles.c")
# -ffast-math at compile time only: linked with it, gcc adds a start-up file that makes the whole
# process flush denormals (see the C file)
ATTEMPTS = (
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
def kernel():
    """The loaded ``attnscope_softmax_stats`` function, or None (no compiler, or disabled)."""
    if os.environ.get("ATTNSCOPE_NATIVE", "1") == "0":
        return None
    cc = _compiler()
    if cc is None:
        log.info("no C compiler: the streaming engine uses its torch path")
        return None
    from attnscope.models.gguf import cache_root

    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        log.info("C compiler %s: %s; the streaming engine uses its torch path", cc, err)
        return None
    where = [SOURCE.read_text(), cc, version, platform.machine(), _cpu()]  # the same for every attempt
    for cflags, libs in ATTEMPTS:
        key = hashlib.sha256("\n".join([*where, *cflags, *libs]).encode()).hexdigest()[:16]
        path = cache_root() / "native" / f"tiles-{key}.so"
        fn = None
        for fresh in (False, True):  # a cached file that does not load is built again, once
            if (fresh or not path.is_file()) and not _build(cc, cflags, libs, path):
                break
            try:
                fn = ctypes.CDLL(str(path)).attnscope_softmax_stats
                break
            except OSError as err:
                log.info("native tile kernel %s: %s", path, err)
        if fn is None:
            continue
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                       ctypes.c_void_p]
        return fn
    log.info("the native tile kernel did not build with %s: the streaming engine uses its torch path", cc)
    return None


def available(device) -> bool:
    """Whether the kernel can work on tiles on ``device`` (the CPU, where it built)."""
    return getattr(device, "type", device) == "cpu" and kernel() is not None


def softmax_stats(s, diag=None, classes=None):
    """In place on the float32, contiguous scores ``s`` ``[h c K]`` on the CPU: ``s`` becomes the row
    softmax ``p``. Returns each row's entropy and largest weight ``[h c]``, and its mass on each
    key class ``[h c F]`` (``classes``: float32 ``[F >= K]``, rows contiguous; F = 0 without).
    ``diag``, where given (float32 ``[h K+c-1]``, contiguous), receives the mass of each head's
    rows per distance, as :func:`attnscope.analyses.longctx.diagonal_sums` lays it out."""
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
