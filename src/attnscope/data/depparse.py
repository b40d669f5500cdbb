"""Dependency-parsed inputs: the paper's ``word head-relation`` format and CoNLL-U (UD).

Both produce :class:`~attnscope.data.records.Example` records with ``words``, ``heads``
(1-based, 0 = root), ``relns`` and ``pos``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from attnscope.data.conllu import iter_conllu
from attnscope.data.io import find_cycle, parse_head, read_text
from attnscope.data.records import Example
from attnscope.errors import InputError


def iter_paper_depparse(path: str | Path) -> Iterator[Example]:
    """The paper's format: one ``word head-relation`` per line, blank lines between sentences.

    >>> # "The 2-det" means: word "The", head is word 2, relation det.
    """
    path = Path(path)
    text = read_text(path)
    words: list[str] = []
    heads: list[int] = []
    relns: list[str] = []
    lines: list[int] = []

    def finish() -> Example:
        n = len(words)
        for h, ln in zip(heads, lines):
            if h > n:
                raise InputError(path, f"head {h} out of range 0..{n}", line=ln)
        node = find_cycle(heads)
        if node is not None:
            raise InputError(path, f"dependency cycle through word {node}", line=lines[node - 1])
        return Example(words=list(words), heads=list(heads), relns=list(relns),
                       fields={"source_line": lines[0]})

    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            if words:
                yield finish()
                words, heads, relns, lines = [], [], [], []
            continue
        parts = line.split()
        if len(parts) != 2:
            raise InputError(path, f"expected 'word head-relation', found {len(parts)} columns "
                                   "(CoNLL-U is read too: a .conllu file, or 10 tab-separated columns)",
                             line=lineno)
        word, hr = parts
        if "-" not in hr:
            raise InputError(path, f"expected head-relation, found '{hr}'", line=lineno)
        head_raw, reln = hr.split("-", 1)
        head = parse_head(head_raw, path, lineno)
        words.append(word)
        heads.append(head)
        relns.append(reln)
        lines.append(lineno)
    if words:
        yield finish()


def iter_conllu_depparse(path: str | Path) -> Iterator[Example]:
    """CoNLL-U sentences as examples; ``pos`` is XPOS when present, else UPOS."""
    for sent in iter_conllu(path):
        toks = sent.tokens
        xpos = [t.xpos for t in toks]
        upos = [t.upos for t in toks]
        pos = xpos if all(p != "_" for p in xpos) else upos
        fields = {"source_line": sent.line}
        sid = sent.comment_value("sent_id")
        if sid is not None:
            fields["sent_id"] = sid
        yield Example(words=sent.words, heads=[t.head for t in toks], relns=[t.deprel for t in toks],
                      pos=pos, upos=upos, feats=None, fields=fields)


def _is_conllu(path: Path) -> bool:
    if path.suffix.lower() in (".conllu", ".conll"):
        return True
    text = read_text(path)
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            return line.count("\t") == 9
    return False


def iter_depparse(path: str | Path) -> Iterator[Example]:
    """Read a dependency file of either format, chosen from its name or first word line.

    A folder reads ``train.txt`` / ``dev.txt`` (the paper's layout): pass the file instead.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(path, "is a folder: pass one split, e.g. train.txt or dev.txt")
    if _is_conllu(path):
        yield from iter_conllu_depparse(path)
    else:
        yield from iter_paper_depparse(path)


def depparse_splits(path: str | Path) -> dict[str, Path]:
    """The split files of a dependency folder (``train``/``dev``/``test``, .txt or .conllu)."""
    path = Path(path)
    if not path.is_dir():
        return {path.stem: path}
    found = {}
    for f in sorted(path.iterdir()):
        if f.suffix.lower() in (".txt", ".conllu", ".conll"):
            for split in ("train", "dev", "test"):
                if split in f.stem.lower():
                    found[split] = f
    if not found:
        raise InputError(path, "holds no train/dev/test .txt or .conllu files")
    return found
