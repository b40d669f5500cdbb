"""Fuzzing every reader: the outcome is a read or ONE AttnscopeError line naming the file.

Inputs: random bytes, the valid file cut at every line and at random bytes, the valid file in
other encodings, huge lines, and line-level edits with the characters each format gives
meaning to. Anything else (another exception type, a multi-line message, a message that does
not name the file, a run over the time limit) fails.

The default run is short (``max_examples`` 25 per strategy); set ``ATTNSCOPE_FUZZ_EXAMPLES``
for more, e.g. ``ATTNSCOPE_FUZZ_EXAMPLES=2000``. Every case run is counted in
``CASES`` and written to ``$ATTNSCOPE_FUZZ_COUNT`` (a file) when that is set.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from conftest import one_line, says
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnscope.data.coref import read_coref
from attnscope.data.depparse import iter_depparse
from attnscope.data.io import read_examples
from attnscope.data.unlabeled import prepare_unlabeled, read_documents
from attnscope.errors import AttnscopeError
from attnscope.store.paper_pickle import read_paper_pickle

MAX_EXAMPLES = int(os.environ.get("ATTNSCOPE_FUZZ_EXAMPLES", "25"))
TIME_LIMIT_S = 30
FUZZ = settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
CASES: dict[str, int] = {}


def _count(kind: str) -> None:
    CASES[kind] = CASES.get(kind, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def _write_count():
    yield
    target = os.environ.get("ATTNSCOPE_FUZZ_COUNT")
    if target:
        Path(target).write_text(json.dumps({"total": sum(CASES.values()), **CASES}, indent=1))


@contextmanager
def time_limit(seconds: int):
    def on_alarm(signum, frame):
        raise TimeoutError(f"reader ran over {seconds} s (a hang?)")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def outcome(kind: str, read, path: Path) -> str:
    """``"read"`` or ``"error"``; fails the test on any other outcome."""
    _count(kind)
    try:
        with time_limit(TIME_LIMIT_S):
            result = read(path)
            if not isinstance(result, list):
                result = list(result)
    except AttnscopeError as exc:
        message = str(exc)
        assert "\n" not in message and "\r" not in message, repr(message)
        assert str(path) in message, f"error does not name the file: {message!r}"
        assert "Traceback" not in message
        return "error"
    return "read"


# ---------------------------------------------------------------------------------------------
# valid seed files, one per format


def conllu_line(i, form, head, deprel, misc="_", upos="NOUN", xpos="NN"):
    return "\t".join([str(i), form, form.lower(), upos, xpos, "_", str(head), deprel, "_", misc])


def c12(word_no, word, pos, bit, coref, sep="   "):
    return sep.join(["fz/doc", "0", str(word_no), word, pos, bit, "-", "-", "-", "spk", "*", "*", coref])


SEEDS: dict[str, tuple[str, str]] = {
    "json": ("in.json", json.dumps([
        {"words": ["The", "café", "sat"], "heads": [2, 3, 0], "relns": ["det", "nsubj", "root"]},
        {"text": "A naïve dog ran.", "id": 7}, {"tokens": ["[CLS]", "x", "[SEP]"]}], indent=1)),
    "jsonl": ("in.jsonl", "\n".join(json.dumps(d) for d in [
        {"words": ["The", "café", "sat"], "heads": [2, 3, 0]}, {"text": "A naïve dog ran."},
        {"text": "Zwei", "text_pair": "Sätze"}]) + "\n"),
    "paper_dep": ("dev.txt", "The 2-det\ncafé 3-nsubj\nsat 0-root\n\nDogs 2-nsubj\nbark 0-root\n"),
    "conllu_dep": ("dev.conllu", "\n".join([
        "# sent_id = 1", conllu_line(1, "The", 2, "det"), conllu_line(2, "café", 3, "nsubj"),
        conllu_line(3, "sat", 0, "root"), "", "# sent_id = 2", "1-2\tdon't\t_\t_\t_\t_\t_\t_\t_\t_",
        conllu_line(1, "do", 0, "root"), conllu_line(2, "n't", 1, "advmod"), ""]) + "\n"),
    "conllu_coref": ("coref.conllu", "\n".join([
        "# newdoc id = d1", "# sent_id = 1",
        conllu_line(1, "John", 2, "nsubj", "Entity=(1)", "PROPN", "NNP"),
        conllu_line(2, "saw", 0, "root", upos="VERB", xpos="VBD"),
        conllu_line(3, "his", 5, "nmod:poss", "Entity=(2(1)", "PRON", "PRP$"),
        conllu_line(4, "old", 5, "amod"), conllu_line(5, "friend", 2, "obj", "Entity=2)"),
        conllu_line(6, ".", 2, "punct", upos="PUNCT", xpos="."), "",
        "# newdoc id = d2", conllu_line(1, "Él", 2, "nsubj", "Entity=(e3-person-1-)", "PRON", "PRP"),
        conllu_line(2, "ríe", 0, "root"), ""]) + "\n"),
    "conll2012": ("fz_gold_conll", "\n".join([
        "#begin document (fz/doc); part 000", c12(0, "John", "NNP", "(TOP(S(NP*)", "(0)"),
        c12(1, "saw", "VBD", "(VP*", "-"), c12(2, "Zoë", "NNP", "(NP*))", "(1)"),
        c12(3, ".", ".", "*))", "-"), "", c12(0, "He", "PRP", "(TOP(S(NP*)", "(0)"),
        c12(1, "left", "VBD", "(VP*)))", "-"), "", "#end document"]) + "\n"),
    "conll2012_tabs": ("fzt_gold_conll", "\n".join([
        "#begin document (fz/doc); part 000",
        "fz/doc\t0\t0\tJohn\tNNP\t(TOP(S(NP*)\t\t\t\tspk\t\t*\t(0)",
        "fz/doc\t0\t1\tsaw\tVBD\t(VP*\tsee\t01\t\tspk\t\t(V*)\t",
        "fz/doc\t0\t2\tZoë\tNNP\t(NP*))\t\t\t\tspk\t\t*\t(1)",
        "fz/doc\t0\t3\t.\t.\t*))\t\t\t\tspk\t\t*\t", "", "#end document"]) + "\n"),
    "text": ("sents.txt", "The café was open.\nZoë sat down.\n\nA second document.\nIt ends.\n"),
}

#: Characters each format gives meaning to, for line-level edits.
ALPHABETS = {
    "json": '[]{}",:0123456789 -.etruflnawodshixrs\\u', "jsonl": '[]{}",:0123456789 -.etruflnawodshx\\',
    "paper_dep": "0123456789- \t\nab", "conllu_dep": "0123456789-._\t |=#\nab",
    "conllu_coref": "0123456789-()_\t|=Entity#\nab", "conll2012": "0123456789-()*|_ \t#\nab",
    "conll2012_tabs": "0123456789-()*|_ \t#\nab", "text": "ab .\n\t",
}


@pytest.fixture(scope="module")
def tokenizer():
    from attnscope.models import load_model

    return load_model("debug:bert").tokenizer


def _readers(tokenizer):
    return {
        "json": read_examples, "jsonl": read_examples,
        "paper_dep": lambda p: list(iter_depparse(p)), "conllu_dep": lambda p: list(iter_depparse(p)),
        "conllu_coref": read_coref, "conll2012": read_coref, "conll2012_tabs": read_coref,
        "text": lambda p: (list(read_documents(p)),
                           prepare_unlabeled(p, tokenizer, max_seq_len=24))[1],
    }


FORMATS = list(SEEDS)


def _write(tmp_path: Path, fmt: str, data: bytes) -> Path:
    path = tmp_path / SEEDS[fmt][0]
    path.write_bytes(data)
    return path


def test_seeds_read(tmp_path, tokenizer):
    readers = _readers(tokenizer)
    for fmt in FORMATS:
        path = _write(tmp_path, fmt, SEEDS[fmt][1].encode("utf-8"))
        assert outcome(fmt, readers[fmt], path) == "read", fmt


@pytest.mark.parametrize("fmt", FORMATS)
def test_cut_at_every_line(tmp_path, tokenizer, fmt):
    read = _readers(tokenizer)[fmt]
    data = SEEDS[fmt][1].encode("utf-8")
    cuts = [k for k, b in enumerate(data) if b == 0x0A]
    for cut in [0, *cuts, *(k + 1 for k in cuts)]:
        outcome(fmt, read, _write(tmp_path, fmt, data[:cut]))
        # the same cut without its line break, and a cut in the middle of the next line
        outcome(fmt, read, _write(tmp_path, fmt, data[:max(cut - 1, 0)]))
        outcome(fmt, read, _write(tmp_path, fmt, data[:cut + 3]))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("encoding", ["latin-1", "cp1252", "utf-16", "utf-32", "utf-8-sig", "mac-roman"])
def test_other_encodings(tmp_path, tokenizer, fmt, encoding):
    data = SEEDS[fmt][1].encode(encoding)
    result = outcome(fmt, _readers(tokenizer)[fmt], _write(tmp_path, fmt, data))
    if encoding == "utf-8-sig":
        assert result == "read"


@pytest.mark.parametrize("fmt", FORMATS)
def test_random_bytes(tmp_path, tokenizer, fmt):
    read = _readers(tokenizer)[fmt]

    @FUZZ
    @given(data=st.binary(max_size=3000))
    def run(data):
        outcome(fmt, read, _write(tmp_path, fmt, data))

    run()


@pytest.mark.parametrize("fmt", FORMATS)
def test_random_cuts_and_line_edits(tmp_path, tokenizer, fmt):
    read = _readers(tokenizer)[fmt]
    lines = SEEDS[fmt][1].split("\n")
    edit = st.tuples(st.integers(0, len(lines) - 1),
                     st.sampled_from(["insert", "replace", "append", "delete", "duplicate"]),
                     st.text(alphabet=ALPHABETS[fmt], max_size=40))

    @FUZZ
    @given(edits=st.lists(edit, max_size=4), cut=st.none() | st.integers(0, 4000))
    def run(edits, cut):
        out = list(lines)
        for i, op, s in edits:
            i = min(i, len(out) - 1) if out else 0
            if not out:
                out.append(s)
            elif op == "insert":
                out.insert(i, s)
            elif op == "replace":
                out[i] = s
            elif op == "append":
                out[i] = out[i] + s
            elif op == "delete":
                del out[i]
            else:
                out.insert(i, out[i])
        data = "\n".join(out).encode("utf-8")
        outcome(fmt, read, _write(tmp_path, fmt, data if cut is None else data[:cut]))

    run()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["long-word", "many-columns", "deep-nesting", "long-blank"])
def test_huge_lines(tmp_path, tokenizer, fmt, kind):
    read = _readers(tokenizer)[fmt]
    huge = {"long-word": "x" * 1_000_000, "many-columns": "a\t" * 200_000,
            "deep-nesting": "[" * 100_000 + "(" * 100_000, "long-blank": " " * 1_000_000}[kind]
    lines = SEEDS[fmt][1].split("\n")
    for where in (0, len(lines) // 2, len(lines) - 1):
        data = "\n".join([*lines[:where], huge, *lines[where:]]).encode("utf-8")
        outcome(fmt, read, _write(tmp_path, fmt, data))
    if fmt in ("json", "jsonl"):  # a huge but valid example is a read
        big = json.dumps({"words": ["w"] * 200_000}) + "\n"
        assert outcome(fmt, read, _write(tmp_path, fmt, big.encode() if fmt == "jsonl"
                                          else f"[{big}]".encode())) == "read"


# ---------------------------------------------------------------------------------------------
# the paper pickle (read with allow_pickle=True; only plain types and arrays are rebuilt)


def _pickle_seed(protocol: int) -> bytes:
    rng = np.random.default_rng(0)
    a = rng.random((2, 2, 3, 3)).astype(np.float16)
    return pickle.dumps([{"tokens": ["[CLS]", "hi", "[SEP]"], "attns": a, "words": ["hi"]}],
                        protocol=protocol)


def _read_pickle(p):
    """Read the pickle, then import it into a store (what ``attnscope import`` does)."""
    from attnscope.store.paper_pickle import import_paper_pickle

    data = read_paper_pickle(p, allow_pickle=True)
    import_paper_pickle(p, p.parent / "imported", allow_pickle=True, overwrite=True)
    return data


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_pickle_seed_and_every_cut(tmp_path, protocol):
    data = _pickle_seed(protocol)
    path = tmp_path / "x_attn.pkl"
    path.write_bytes(data)
    assert outcome("pickle", _read_pickle, path) == "read"
    for cut in range(0, len(data), max(1, len(data) // 200)):
        path.write_bytes(data[:cut])
        outcome("pickle", _read_pickle, path)


def test_pickle_random_bytes_and_flips(tmp_path):
    path = tmp_path / "x_attn.pkl"
    seed = _pickle_seed(4)

    @FUZZ
    @given(data=st.binary(max_size=2000) | st.lists(
        st.tuples(st.integers(0, len(seed) - 1), st.integers(0, 255)), min_size=1, max_size=6
    ).map(lambda flips: _flip(seed, flips)))
    def run(data):
        path.write_bytes(data)
        outcome("pickle", _read_pickle, path)

    run()


def _flip(data: bytes, flips) -> bytes:
    b = bytearray(data)
    for i, v in flips:
        b[i] = v
    return bytes(b)


def test_pickle_of_odd_structures(tmp_path):
    path = tmp_path / "x_attn.pkl"
    arrays = st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(0, 3)).map(
        lambda t: np.zeros((1,) * t[0] + (t[1],) * min(t[0], 2) if t[0] else (), np.float16)
        if t[0] != 4 else np.zeros((1, 1, t[1], t[2]), np.float16))
    sets = st.frozensets(st.integers(0, 3) | st.text(max_size=2), max_size=3) | st.sets(
        st.integers(0, 3) | st.text(max_size=2), max_size=3)
    item = st.dictionaries(st.sampled_from(["tokens", "attns", "words", "text", "extra"]),
                           json_values | arrays | sets, max_size=4)

    @FUZZ
    @given(data=st.lists(item, max_size=3) | json_values)
    def run(data):
        path.write_bytes(pickle.dumps(data, protocol=4))
        outcome("pickle", _read_pickle, path)

    run()


class _Uninitialised:
    """Pickles as ``numpy.ndarray(shape, float32)``: an allowed class, called with a shape and no
    data, which numpy allocates lazily (the pages exist once something reads them)."""

    def __init__(self, shape):
        self.shape = shape

    def __reduce__(self):
        return np.ndarray, (self.shape, np.float32)


def test_pickle_of_an_array_larger_than_the_file_is_refused_before_it_is_read(tmp_path):
    # found by the fuzzer, in CI: a flipped byte made an array's shape huge; the checks then read
    # every value (np.isfinite) and the test process grew to 24 GB and was killed. An array made
    # from the file's data can hold no more bytes than the file, so a larger one is refused
    # before any of its values is read: here 0.5 GB (n = 11,585) from a 50 kB file
    import resource

    n = 11_585
    path = tmp_path / "x_attn.pkl"
    path.write_bytes(pickle.dumps([{"tokens": ["a"] * n, "attns": _Uninitialised((1, 1, n, n))}], protocol=4))
    assert path.stat().st_size < 100_000
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(AttnscopeError) as e:
        read_paper_pickle(path, allow_pickle=True)
    # the file, the example, the array, the bytes it claims and the file's size
    says(one_line(e.value), str(path), "example 0", "'attns'", f"{n * n * 4} bytes", f"{path.stat().st_size}")
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 100, grown_mb  # the half gigabyte was never touched


def test_pickle_naming_a_class_with_a_line_break_gives_one_line(tmp_path):
    # found by the fuzzer: a flipped byte put "\n" into a module name, and the message with it
    path = tmp_path / "x_attn.pkl"
    module = b"num\npy"
    path.write_bytes(b"\x80\x04\x8c" + bytes([len(module)]) + module + b"\x8c\x07ndarray\x93.")
    assert outcome("pickle", _read_pickle, path) == "error"


def test_pickle_with_a_set_of_mixed_values_is_refused(tmp_path):
    # sets need no class lookup in a pickle; the import cannot sort {1, "a"} into JSON
    path = tmp_path / "x_attn.pkl"
    a = np.zeros((1, 1, 2, 2), np.float16)
    path.write_bytes(pickle.dumps([{"tokens": ["a", "b"], "attns": a, "extra": {1, "a"}}], protocol=4))
    assert outcome("pickle", _read_pickle, path) == "error"


def test_pickle_with_a_forbidden_class_is_refused(tmp_path):
    path = tmp_path / "x_attn.pkl"
    path.write_bytes(pickle.dumps([{"tokens": ["a"], "attns": Path("/")}], protocol=4))
    assert outcome("pickle", _read_pickle, path) == "error"


# ---------------------------------------------------------------------------------------------
# a store folder


@pytest.fixture(scope="module")
def seed_store(tmp_path_factory):
    from attnscope.data.records import Example
    from attnscope.jobs import extract_to_store
    from attnscope.models import load_model

    out = tmp_path_factory.mktemp("store") / "s"
    examples = [Example(words=["the", "cat", "sat"]), Example(text="a dog ran."), Example(text="hi")]
    extract_to_store(examples, out, load_model("debug:bert"), shard_size=2)
    return out


def _read_store(path: Path):
    from attnscope.store import open_store

    store = open_store(path)
    summary = store.summary()
    json.dumps(summary)
    maps = list(store)
    for i in range(len(store)):
        store[i]
    store.verify()
    return maps


def _store_files(store: Path) -> list[str]:
    return sorted(str(p.relative_to(store)) for p in store.rglob("*") if p.is_file())


json_values = st.recursive(st.none() | st.booleans() | st.integers(-5, 10**6) | st.text(max_size=8)
                           | st.floats(allow_nan=True), lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)


def _mutate_json(data: bytes, path_keys: list, value) -> bytes:
    obj = json.loads(data)
    node = obj
    for k in path_keys[:-1]:
        if isinstance(node, dict) and node:
            node = node[list(node)[k % len(node)]]
        elif isinstance(node, list) and node:
            node = node[k % len(node)]
        else:
            break
    if isinstance(node, dict) and node:
        node[list(node)[path_keys[-1] % len(node)]] = value
    elif isinstance(node, list) and node:
        node[path_keys[-1] % len(node)] = value
    else:
        obj = value
    return json.dumps(obj).encode()


def test_store_seed_reads(seed_store):
    assert outcome("store", _read_store, seed_store) == "read"
    assert len(_read_store(seed_store)) == 3


def test_store_fuzz(tmp_path, seed_store):
    import shutil

    files = _store_files(seed_store)
    mutation = st.one_of(
        st.tuples(st.just("bytes"), st.sampled_from(files), st.binary(max_size=600)),
        st.tuples(st.just("cut"), st.sampled_from(files), st.floats(0, 1)),
        st.tuples(st.just("delete"), st.sampled_from(files), st.none()),
        st.tuples(st.just("json"), st.sampled_from([f for f in files if f.endswith(".json")]),
                  st.tuples(st.lists(st.integers(0, 50), min_size=1, max_size=4), json_values)),
        st.tuples(st.just("flip"), st.sampled_from(files),
                  st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
                           min_size=1, max_size=4)),
    )

    @FUZZ
    @given(mutations=st.lists(mutation, min_size=1, max_size=3))
    def run(mutations):
        store = tmp_path / "s"
        if store.exists():
            shutil.rmtree(store)
        shutil.copytree(seed_store, store)
        for kind, name, arg in mutations:
            f = store / name
            if not f.exists():
                continue
            data = f.read_bytes()
            if kind == "bytes":
                f.write_bytes(arg)
            elif kind == "cut":
                f.write_bytes(data[:int(len(data) * arg)])
            elif kind == "delete":
                f.unlink()
            elif kind == "json":
                try:
                    f.write_bytes(_mutate_json(data, *arg))
                except ValueError:
                    continue  # an earlier mutation left no JSON to edit
            else:
                f.write_bytes(_flip(data, [(int(p * len(data)), v) for p, v in arg]) if data else data)
        outcome("store", _read_store, store)

    run()
