"""Reading and writing example files: a JSON list of dicts, or JSON Lines.

Each dict has exactly one of ``text`` (a string), ``words`` (a list of strings) or ``tokens``
(a list of strings that already include the model's special tokens), optionally
``text_pair`` or ``words_pair``, optional annotations, and any other fields, which are carried
through untouched.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from attnscope.data.records import CONTENT_KEYS, Example
from attnscope.errors import AttnscopeError, InputError


def read_text(path: str | Path) -> str:
    """Read a UTF-8 file, naming the file and line of the first undecodable byte."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except IsADirectoryError:
        raise InputError(path, "is a folder, expected a file") from None
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror}") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputError(path, f"not UTF-8 (byte 0x{raw[exc.start]:02x})", line=line) from None


def _check_str_list(value: Any, key: str, where: str, path: Path | None, line: int | None) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
        raise InputError(path, f"{where}: '{key}' must be a list of strings", line=line)
    if not value:
        raise InputError(path, f"{where}: '{key}' is empty", line=line)
    if any(not w.strip() for w in value):
        raise InputError(path, f"{where}: '{key}' holds an empty or blank string", line=line)
    return list(value)


def example_from_dict(d: Any, index: int, path: str | Path | None = None,
                      line: int | None = None) -> Example:
    """Validate one input dict and turn it into an :class:`Example`.

    ``index`` is the example's 0-based position, used in error messages.
    """
    path = None if path is None else Path(path)
    where = f"example {index}"
    if not isinstance(d, dict):
        raise InputError(path, f"{where}: expected an object, got {type(d).__name__}", line=line)
    present = [k for k in CONTENT_KEYS if k in d]
    if len(present) != 1:
        what = "none" if not present else " and ".join(present)
        raise InputError(path, f"{where}: needs exactly one of text/words/tokens, has {what}", line=line)
    key = present[0]
    ex = Example()
    if key == "text":
        if not isinstance(d["text"], str):
            raise InputError(path, f"{where}: 'text' must be a string", line=line)
        if not d["text"].strip():
            raise InputError(path, f"{where}: 'text' is empty", line=line)
        ex.text = d["text"]
    else:
        setattr(ex, key, _check_str_list(d[key], key, where, path, line))
    if "text_pair" in d and "words_pair" in d:
        raise InputError(path, f"{where}: has both text_pair and words_pair", line=line)
    if "text_pair" in d:
        if key != "text" or not isinstance(d["text_pair"], str) or not d["text_pair"].strip():
            raise InputError(path, f"{where}: 'text_pair' must be a non-empty string beside 'text'", line=line)
        ex.text_pair = d["text_pair"]
    if "words_pair" in d:
        if key != "words":
            raise InputError(path, f"{where}: 'words_pair' goes with 'words'", line=line)
        ex.words_pair = _check_str_list(d["words_pair"], "words_pair", where, path, line)
    n = ex.num_words
    if "heads" in d:
        heads = d["heads"]
        if n is None:
            raise InputError(path, f"{where}: 'heads' needs 'words'", line=line)
        if not isinstance(heads, list) or len(heads) != n or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in heads):
            raise InputError(path, f"{where}: 'heads' must be {n} integers", line=line)
        bad = [h for h in heads if h < 0 or h > n]
        if bad:
            raise InputError(path, f"{where}: head {bad[0]} out of range 0..{n}", line=line)
        check_tree(heads, path, line, where)
        ex.heads = list(heads)
    for key_ in ("relns", "pos", "upos"):
        if key_ in d:
            vals = d[key_]
            if n is None or not isinstance(vals, list) or len(vals) != n or not all(
                    isinstance(v, str) for v in vals):
                raise InputError(path, f"{where}: '{key_}' must be one string per word", line=line)
            setattr(ex, key_, list(vals))
    if "feats" in d:
        ex.feats = d["feats"]
    ex.fields = {k: v for k, v in d.items() if k not in (
        "text", "words", "tokens", "text_pair", "words_pair", "heads", "relns", "pos", "upos", "feats")}
    return ex


def check_tree(heads: list[int], path: Path | str | None, line: int | None, where: str) -> None:
    """Reject dependency structures with a cycle (every word must reach the root 0)."""
    node = find_cycle(heads)
    if node is not None:
        raise InputError(path, f"{where}: dependency cycle through word {node}", line=line)


def parse_head(raw: str, path: Path | str | None, line: int) -> int:
    """A dependency head index from a file: a number >= 0 (0 = root), else a file:line error."""
    try:
        head = int(raw)
    except ValueError:
        raise InputError(path, f"head '{raw}' is not a number", line=line) from None
    if head < 0:
        raise InputError(path, f"head {head} is negative", line=line)
    return head


def find_cycle(heads: list[int]) -> int | None:
    """A 1-based word on a cycle of ``heads`` (1-based, 0 = root), or None for a tree."""
    n = len(heads)
    state = [0] * (n + 1)  # 0 unknown, 1 visiting, 2 reaches root
    state[0] = 2
    for start in range(1, n + 1):
        path_nodes = []
        node = start
        while state[node] == 0:
            state[node] = 1
            path_nodes.append(node)
            node = heads[node - 1]
        if state[node] == 1:
            return node
        for p in path_nodes:
            state[p] = 2
    return None


def read_examples(path: str | Path) -> list[Example]:
    """Read a JSON list of dicts or a JSON Lines file into examples (validated)."""
    return list(iter_examples(path))


def iter_examples(path: str | Path) -> Iterator[Example]:
    path = Path(path)
    text = read_text(path)
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(path, f"invalid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno) from None
        except RecursionError:
            raise InputError(path, "invalid JSON: nested too deeply") from None
        if not isinstance(data, list):
            raise InputError(path, "expected a JSON list of objects")
        if not data:
            raise InputError(path, "holds no examples")
        for i, d in enumerate(data):
            yield example_from_dict(d, i, path)
        return
    if stripped.startswith("{") and _one_object(text, path):
        raise InputError(path, "holds one JSON object, not a list of examples: write [{...}, ...] "
                               "(or JSON Lines, one object per line, in a .jsonl file)")
    count = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            d = json.loads(raw)
        except RecursionError:
            raise InputError(path, "invalid JSON: nested too deeply", line=lineno) from None
        except json.JSONDecodeError as exc:
            if count == 0 and re.fullmatch(r"\S+\s+\d+-\S+", raw.strip()):
                raise InputError(path, "the paper's dependency format ('word head-relation'), not "
                                 f"JSON; run 'attnscope prepare depparse {path} --out "
                                 "examples.json' first", line=lineno) from None
            if count == 0 and not raw.lstrip().startswith(("{", "[", '"')):
                raise InputError(path, "plain text, not JSON or JSON Lines; for sentence-per-line "
                                 f"text run 'attnscope prepare unlabeled {path} --out "
                                 "examples.json' first", line=lineno) from None
            raise InputError(path, f"invalid JSON: {exc.msg} (column {exc.colno})", line=lineno) from None
        yield example_from_dict(d, count, path, line=lineno)
        count += 1
    if count == 0:
        raise InputError(path, "holds no examples")


def _one_object(text: str, path: Path) -> bool:
    """Whether ``text`` is a single JSON object where a list is expected: the whole file parses
    as one object, and it is either named ``.json`` or spread over several lines (so it cannot
    be JSON Lines); a one-line object in a ``.jsonl`` (or ``.txt``) file is one example."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return False  # JSON Lines (several objects), or bad JSON that the line reader reports
    if not isinstance(data, dict):
        return False
    lines = len([line for line in text.splitlines() if line.strip()])
    return path.suffix.lower() == ".json" or lines > 1


def write_examples(examples: Iterable[Example | dict], path: str | Path) -> int:
    """Write examples as a JSON list, atomically (a temporary file renamed into place)."""
    items = [e.to_dict() if isinstance(e, Example) else e for e in examples]
    atomic_write_text(Path(path), json.dumps(items, ensure_ascii=False, indent=1) + "\n")
    return len(items)


_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees either the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the usual mode
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def fingerprint(*parts: Any) -> str:
    """sha256 of ``parts`` as canonical JSON, one line each (keys sorted, non-ASCII kept, any
    other object as its ``str``): the one fingerprint of what decides a job's numbers, for
    ``--resume`` and the resumable unit logs (:class:`attnscope.store.checkpoints.UnitLog`).

    >>> fingerprint({"b": 1, "a": "é"}) == fingerprint({"a": "é", "b": 1}) != fingerprint({"a": 1})
    True
    """
    return text_fingerprint("".join(json.dumps(part, sort_keys=True, ensure_ascii=False, default=str) + "\n"
                                    for part in parts))


def text_fingerprint(text: str) -> str:
    """sha256 of ``text`` in UTF-8 (hex)."""
    return hashlib.sha256(text.encode()).hexdigest()


def file_fingerprint(*paths: str | Path) -> str:
    """sha256 of the bytes of ``paths`` one after another, in sorted order (a model's weight
    files; one file: that file's sha256), for provenance records."""
    h = hashlib.sha256()
    for path in sorted(Path(p) for p in paths):
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def to_plain(x: Any) -> Any:
    """Numpy scalars and arrays, paths, tuples and sets as plain JSON values; NaN and infinities
    become None (strict JSON has no NaN).

    >>> import numpy as np
    >>> to_plain({"a": np.float32(0.5), "b": (1, float("nan")), "c": np.array([[1, 2]])})
    {'a': 0.5, 'b': [1, None], 'c': [[1, 2]]}
    """
    if isinstance(x, dict):
        return {str(k): to_plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_plain(v) for v in x]
    if isinstance(x, (set, frozenset)):
        return [to_plain(v) for v in sorted(x)]
    if isinstance(x, np.ndarray):
        return to_plain(x.tolist())
    if isinstance(x, np.generic):
        return to_plain(x.item())
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def check_writable(path: str | Path, *, folder: bool, name: str = "out_dir") -> None:
    """Refuse an output that cannot be written, before any model loads or any work is done.

    ``path`` is the folder (``folder``) or file a command will write. It must not be a file
    where a folder is meant or the other way round, and the nearest folder that exists on its
    way must take a new file: a probe file is made there and removed, so nothing is left
    behind (no folder is made). Mode bits are not trusted: they do not stop root, while a
    read-only mount stops everyone. ``name``: the parameter (or command-line option) that gave
    the path, named in the message.
    """
    params = (name,) if name.isidentifier() else ()
    path = Path(path)
    try:
        if path.exists() and path.is_dir() != folder:
            what = "a file, not a folder" if folder else "a folder, not a file"
            raise AttnscopeError(f"{path}: is {what} (choose another {name})", params=params)
        parent = path if path.is_dir() else path.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            raise AttnscopeError(f"{path}: cannot be made, {parent} is a file (choose another {name})",
                                 params=params)
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".attnscope-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = (exc.strerror or type(exc).__name__).lower()
        raise AttnscopeError(f"{path}: cannot be written ({reason}; choose another {name})",
                             params=params) from None
