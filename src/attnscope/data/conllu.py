"""A CoNLL-U reader that keeps line numbers, so every error names ``file:line``.

Multiword-token lines (``3-4``) and empty nodes (``5.1``) are skipped for the tree; the
surface words of the sentence are the ordinary word lines. Comments are kept per sentence
(``# newdoc id = ...`` marks a new document, used by the coreference reader).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from attnscope.data.io import find_cycle, parse_head, read_text
from attnscope.errors import InputError


@dataclass
class Token:
    """One word line of a CoNLL-U sentence."""

    id: int
    form: str
    lemma: str
    upos: str
    xpos: str
    feats: dict[str, str]
    head: int
    deprel: str
    misc: str
    line: int


@dataclass
class Sentence:
    tokens: list[Token]
    comments: list[str] = field(default_factory=list)
    line: int = 0  # line of the first word

    @property
    def words(self) -> list[str]:
        return [t.form for t in self.tokens]

    def comment_value(self, key: str) -> str | None:
        """Value of a ``# key = value`` comment, or None."""
        for c in self.comments:
            body = c.lstrip("#").strip()
            if "=" in body:
                k, v = body.split("=", 1)
                if k.strip() == key:
                    return v.strip()
        return None


def _parse_feats(raw: str, path: Path, lineno: int) -> dict[str, str]:
    if raw == "_" or not raw:
        return {}
    feats = {}
    for part in raw.split("|"):
        if "=" not in part:
            raise InputError(path, f"bad FEATS entry '{part}'", line=lineno)
        k, v = part.split("=", 1)
        feats[k] = v
    return feats


def iter_conllu(path: str | Path, check_trees: bool = True) -> Iterator[Sentence]:
    """Yield the sentences of a CoNLL-U file with validated heads."""
    path = Path(path)
    text = read_text(path)
    tokens: list[Token] = []
    comments: list[str] = []
    first_line = 0

    def finish() -> Sentence:
        n = len(tokens)
        for i, t in enumerate(tokens):
            if t.id != i + 1:
                raise InputError(path, f"word id {t.id} out of order (expected {i + 1})", line=t.line)
        for t in tokens:
            if t.head > n:
                raise InputError(path, f"head {t.head} out of range 0..{n}", line=t.line)
        if check_trees:
            node = find_cycle([t.head for t in tokens])
            if node is not None:
                raise InputError(path, f"dependency cycle through word {node}",
                                 line=tokens[node - 1].line)
        return Sentence(tokens=list(tokens), comments=list(comments), line=first_line)

    lines = text.splitlines()
    for lineno, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            if tokens:
                yield finish()
                tokens, comments = [], []
            continue
        if line.startswith("#"):
            comments.append(line)
            continue
        cols = line.split("\t")
        if len(cols) != 10:
            raise InputError(path, f"expected 10 tab-separated columns, found {len(cols)}", line=lineno)
        tid = cols[0]
        if "-" in tid or "." in tid:
            continue  # multiword token or empty node
        try:
            wid = int(tid)
        except ValueError:
            raise InputError(path, f"word id '{tid}' is not a number", line=lineno) from None
        head = parse_head(cols[6], path, lineno)
        if not tokens:
            first_line = lineno
        tokens.append(Token(id=wid, form=cols[1], lemma=cols[2], upos=cols[3], xpos=cols[4],
                            feats=_parse_feats(cols[5], path, lineno), head=head, deprel=cols[7],
                            misc=cols[9], line=lineno))
    if tokens:
        yield finish()
