"""Coreference corpora: CoNLL-U with ``Entity=`` brackets (CorefUD / OntoGUM) and CoNLL-2012.

Both readers produce :class:`Document` records: the words of one document (sentences
concatenated), the sentence starts, per-word annotations, and the gold :class:`Mention`\\ s with
their cluster, head word and type. Word indices are 0-based positions in ``Document.words``;
spans are half-open ``[start, end)``.

Brackets (both formats)
    ``(7`` opens a mention of entity 7, ``7)`` closes the most recently opened, still open
    mention of entity 7, ``(7)`` is a one-word mention. Mentions may nest. A mention may span a
    sentence boundary (OntoGUM has a few); it is kept as is, because clusters live at the
    document level. A bracket that closes nothing, or one still open at the end of its
    document, is an :class:`~attnscope.errors.InputError` naming ``file:line``.

Head word of a mention
    1. When the document has a dependency tree (CoNLL-U, or a CoNLL-2012 parse converted
       with head rules), the word of the span whose head lies outside the span. If several
       words qualify (e.g. a span over two sentences, or punctuation attached outside), the
       non-punctuation one closest to its sentence's root wins, then the leftmost.
    2. CoNLL-2012 constituency parse bits are turned into a dependency tree with Collins-style
       head rules (:func:`constituency_heads`), then rule 1 applies.
    3. Otherwise (no tree, no parse): the rightmost word of the span that is not punctuation
       (English noun phrases are head-final). This is a fallback, recorded per document in
       ``Document.head_source``.

Mention type (from the head word)
    ``pronoun``: UPOS ``PRON``, or PTB XPOS ``PRP``/``PRP$``/``WP``/``WP$``; ``proper``: UPOS
    ``PROPN`` or XPOS ``NNP``/``NNPS``; ``nominal``: everything else.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from attnscope.data.conllu import iter_conllu
from attnscope.data.io import read_text
from attnscope.errors import InputError

MENTION_TYPES = ("pronoun", "proper", "nominal")

_PRONOUN_XPOS = {"PRP", "PRP$", "WP", "WP$"}
_PROPER_XPOS = {"NNP", "NNPS"}
_PUNCT_XPOS = {",", ".", ":", "``", "''", "-LRB-", "-RRB-", "HYPH", "NFP", "$", "#", "-NONE-"}


@dataclass
class Mention:
    """One gold mention: words ``[start, end)`` of its document, in cluster ``cluster``."""

    start: int
    end: int
    cluster: str
    head: int = -1  # document word index of the head word
    type: str = "nominal"  # one of MENTION_TYPES
    line: int = 0  # source line of the opening bracket

    @property
    def span(self) -> tuple[int, int]:
        return (self.start, self.end)


@dataclass
class Document:
    """One coreference document (a CoNLL-2012 part is its own document).

    ``heads``: per word, the document index of its syntactic head, -1 for a sentence root
    (None when there is no tree). ``upos``/``xpos``/``feats``/``lemmas`` are per word, with
    "_" / {} where the data has nothing. ``mentions`` are sorted by ``(start, -end)``.
    """

    id: str
    words: list[str]
    sentence_starts: list[int]
    mentions: list[Mention] = field(default_factory=list)
    heads: list[int] | None = None
    upos: list[str] = field(default_factory=list)
    xpos: list[str] = field(default_factory=list)
    feats: list[dict[str, str]] = field(default_factory=list)
    lemmas: list[str] = field(default_factory=list)
    source: str = ""
    line: int = 0
    head_source: str = "tree"  # "tree" (UD), "parse" (head rules) or "fallback"

    @property
    def clusters(self) -> dict[str, list[int]]:
        """Cluster id -> indices into ``mentions``, in text order."""
        out: dict[str, list[int]] = {}
        for i, m in enumerate(self.mentions):
            out.setdefault(m.cluster, []).append(i)
        return out

    def mention_text(self, m: Mention) -> str:
        return " ".join(self.words[m.start:m.end])


# ---------------------------------------------------------------------------------------------
# brackets


class _Brackets:
    """Open/close bookkeeping for one document's mention brackets."""

    def __init__(self, path: Path):
        self.path = path
        self.open: list[tuple[str, int, int]] = []  # (cluster, start word, line)
        self.done: list[Mention] = []

    def opening(self, cluster: str, word: int, line: int) -> None:
        self.open.append((cluster, word, line))

    def closing(self, cluster: str, word: int, line: int) -> None:
        for k in range(len(self.open) - 1, -1, -1):
            if self.open[k][0] == cluster:
                _, start, open_line = self.open.pop(k)
                self.done.append(Mention(start, word + 1, cluster, line=open_line))
                return
        raise InputError(self.path, f"bracket '{cluster})' closes no open mention of entity {cluster}",
                         line=line)

    def finish(self, doc_id: str) -> list[Mention]:
        if self.open:
            cluster, _, line = self.open[0]
            raise InputError(self.path, f"mention '({cluster}' is never closed in document {doc_id!r}",
                             line=line)
        return sorted(self.done, key=lambda m: (m.start, -m.end, m.line))


_CONLL12_ITEM = re.compile(r"^(\()?([^()|]+?)(\))?$")


def parse_conll2012_coref(cell: str, path: Path, line: int) -> list[tuple[str, str]]:
    """``"(12|(3)|5)"`` -> ``[("open", "12"), ("one", "3"), ("close", "5")]``.

    ``-`` or ``_`` means no bracket. Anything else is an error naming ``file:line``.
    """
    if cell in ("-", "_", ""):
        return []
    out = []
    for item in cell.split("|"):
        m = _CONLL12_ITEM.match(item)
        if not m or not (m.group(1) or m.group(3)) or not m.group(2).strip():
            raise InputError(path, f"malformed coreference bracket {item!r} in {cell!r}", line=line)
        kind = "one" if m.group(1) and m.group(3) else ("open" if m.group(1) else "close")
        out.append((kind, m.group(2)))
    return out


def parse_entity_misc(value: str, path: Path, line: int) -> list[tuple[str, str]]:
    """A CorefUD ``Entity=`` value -> ``[(kind, entity id)]`` in order.

    ``(1(2)`` -> open 1, one 2; ``1)2)`` -> close 1, close 2. An opening bracket may carry
    CorefUD's extra fields (``(e5-person-1-...``): the entity id is the part before the first
    ``-``. Discontinuous parts (``e5[1/2]``) are read as the entity ``e5``.
    """
    out: list[tuple[str, str]] = []
    i, n = 0, len(value)
    while i < n:
        if value[i] == "(":
            j = i + 1
            while j < n and value[j] not in "()":
                j += 1
            body = value[i + 1:j]
            eid = _entity_id(body.split("-", 1)[0], value, path, line)
            if j < n and value[j] == ")":
                out.append(("one", eid))
                i = j + 1
            else:
                out.append(("open", eid))
                i = j
        else:
            j = i
            while j < n and value[j] not in "()":
                j += 1
            if j >= n or value[j] != ")":
                raise InputError(path, f"malformed Entity value {value!r}", line=line)
            out.append(("close", _entity_id(value[i:j], value, path, line)))
            i = j + 1
    return out


def _entity_id(raw: str, value: str, path: Path, line: int) -> str:
    eid = re.sub(r"\[\d+/\d+\]$", "", raw)
    if not eid or any(c in eid for c in " \t|="):
        raise InputError(path, f"malformed Entity value {value!r}", line=line)
    return eid


# ---------------------------------------------------------------------------------------------
# CoNLL-U with Entity= in MISC


def _misc_entity(misc: str) -> str | None:
    if misc in ("_", ""):
        return None
    for part in misc.split("|"):
        if part.startswith("Entity="):
            return part[len("Entity="):]
    return None


def iter_conllu_coref(path: str | Path) -> Iterator[Document]:
    """Documents of a CorefUD-style CoNLL-U file (``# newdoc id = ...`` starts a document).

    Words are the syntactic word lines (multiword-token lines and empty nodes are skipped, as
    in :func:`~attnscope.data.conllu.iter_conllu`); heads come from the UD tree.
    """
    path = Path(path)
    doc: dict | None = None
    count = 0

    def new_doc(doc_id: str, line: int) -> dict:
        return {"id": doc_id, "line": line, "words": [], "starts": [], "heads": [], "upos": [],
                "xpos": [], "feats": [], "lemmas": [], "brackets": _Brackets(path)}

    def finish(d: dict) -> Document:
        mentions = d["brackets"].finish(d["id"])
        out = Document(id=d["id"], words=d["words"], sentence_starts=d["starts"], mentions=mentions,
                       heads=d["heads"], upos=d["upos"], xpos=d["xpos"], feats=d["feats"],
                       lemmas=d["lemmas"], source=str(path), line=d["line"], head_source="tree")
        assign_heads_and_types(out)
        return out

    for sent in iter_conllu(path):
        doc_id = sent.comment_value("newdoc id")
        if doc_id is not None or doc is None:
            if doc is not None and doc["words"]:
                yield finish(doc)
                count += 1
            doc = new_doc(doc_id if doc_id is not None else f"{path.stem}-{count}", sent.line)
        offset = len(doc["words"])
        doc["starts"].append(offset)
        for t in sent.tokens:
            w = offset + t.id - 1
            doc["words"].append(t.form)
            doc["heads"].append(-1 if t.head == 0 else offset + t.head - 1)
            doc["upos"].append(t.upos)
            doc["xpos"].append(t.xpos)
            doc["feats"].append(t.feats)
            doc["lemmas"].append(t.lemma)
            value = _misc_entity(t.misc)
            if value is None:
                continue
            items = parse_entity_misc(value, path, t.line)
            # closings of one word apply after its openings of one-word mentions; "(1" then "1)"
            # on the same word would be a one-word mention written oddly: keep the order given.
            for kind, eid in items:
                if kind == "open":
                    doc["brackets"].opening(eid, w, t.line)
                elif kind == "one":
                    doc["brackets"].opening(eid, w, t.line)
                    doc["brackets"].closing(eid, w, t.line)
                else:
                    doc["brackets"].closing(eid, w, t.line)
    if doc is not None and doc["words"]:
        yield finish(doc)
    elif doc is None:
        raise InputError(path, "holds no sentences")


# ---------------------------------------------------------------------------------------------
# CoNLL-2012 *_conll


_BEGIN = re.compile(r"^#begin document \((.*)\);?\s*(?:part\s+(\d+))?\s*$")


def _conll2012_columns(raw: str) -> list[str]:
    """The columns of one CoNLL-2012 word line.

    Space-aligned lines split on runs of whitespace. A line with tabs splits on each tab, so
    that an empty field (written by some distributions instead of ``-``) stays a column; it
    becomes ``-``. A line that ends with a tab has an empty last (coreference) column.
    """
    if "\t" not in raw:
        return raw.split()
    cells = [c.strip() for c in raw.rstrip("\r\n").split("\t")]
    return [c if c else "-" for c in cells]


def iter_conll2012(path: str | Path) -> Iterator[Document]:
    """Documents of a CoNLL-2012 ``*_conll`` file; each ``#begin document ...; part N`` is one.

    Columns (space-aligned, or tab-separated with empty fields for ``-``; at least 12): document id, part, word number, word, POS,
    parse bit, predicate lemma, frameset, sense, speaker, named entities, predicate
    arguments..., coreference (last). The parse bits, when present (not all ``-``), give the
    head words through :func:`constituency_heads`.
    """
    path = Path(path)
    text = read_text(path)
    current: dict | None = None
    sent_rows: list[tuple[int, list[str]]] = []
    seen = 0

    def flush_sentence() -> None:
        nonlocal sent_rows
        if not sent_rows:
            return
        assert current is not None
        ncols = len(sent_rows[0][1])
        for lineno, cols in sent_rows:
            if len(cols) != ncols:
                raise InputError(path, f"expected {ncols} columns like the sentence's first line, "
                                       f"found {len(cols)}", line=lineno)
        offset = len(current["words"])
        current["starts"].append(offset)
        parse_bits = [cols[5] for _, cols in sent_rows]
        tags = [cols[4] for _, cols in sent_rows]
        words = [cols[3] for _, cols in sent_rows]
        if all(b in ("-", "_") for b in parse_bits):
            current["has_parse"] = False
            heads = [-1] * len(words)
        else:
            heads = constituency_heads(parse_bits, tags, path, sent_rows[0][0],
                                       [ln for ln, _ in sent_rows])
        for k, (lineno, cols) in enumerate(sent_rows):
            w = offset + k
            current["words"].append(cols[3])
            current["xpos"].append(cols[4])
            current["heads"].append(-1 if heads[k] < 0 else offset + heads[k])
            for kind, eid in parse_conll2012_coref(cols[-1], path, lineno):
                if kind in ("open", "one"):
                    current["brackets"].opening(eid, w, lineno)
                if kind in ("close", "one"):
                    current["brackets"].closing(eid, w, lineno)
        sent_rows = []

    def finish() -> Document:
        assert current is not None
        mentions = current["brackets"].finish(current["id"])
        n = len(current["words"])
        has_parse = current["has_parse"] and n > 0
        doc = Document(id=current["id"], words=current["words"], sentence_starts=current["starts"],
                       mentions=mentions, heads=current["heads"] if has_parse else None,
                       upos=["_"] * n, xpos=current["xpos"], feats=[{} for _ in range(n)],
                       lemmas=["_"] * n, source=str(path), line=current["line"],
                       head_source="parse" if has_parse else "fallback")
        assign_heads_and_types(doc)
        return doc

    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line.startswith("#begin document"):
            if current is not None:
                raise InputError(path, "'#begin document' inside an open document "
                                       f"({current['id']!r} has no '#end document')", line=lineno)
            m = _BEGIN.match(line)
            if not m:
                raise InputError(path, f"cannot read document name from {line!r}", line=lineno)
            name = m.group(1) + (f"/part_{m.group(2)}" if m.group(2) is not None else "")
            current = {"id": name, "line": lineno, "words": [], "starts": [], "heads": [], "xpos": [],
                       "brackets": _Brackets(path), "has_parse": True}
            continue
        if line.startswith("#end document"):
            if current is None:
                raise InputError(path, "'#end document' without '#begin document'", line=lineno)
            flush_sentence()
            if current["words"]:
                yield finish()
                seen += 1
            current = None
            continue
        if not line:
            if current is not None:
                flush_sentence()
            continue
        if line.startswith("#"):
            continue
        if current is None:
            raise InputError(path, "word line outside '#begin document' ... '#end document'", line=lineno)
        cols = _conll2012_columns(raw)
        if len(cols) < 12:
            raise InputError(path, f"expected at least 12 columns (CoNLL-2012), found {len(cols)}",
                             line=lineno)
        sent_rows.append((lineno, cols))
    if current is not None:
        raise InputError(path, f"document {current['id']!r} has no '#end document'", line=current["line"])
    if seen == 0:
        raise InputError(path, "holds no documents")


# ---------------------------------------------------------------------------------------------
# constituency parse -> dependency heads (Collins-style head rules)

#: Head rules: category -> (search direction, priority list). "left" searches children from
#: the left, "right" from the right; the first category of the list found wins, then the next.
#: After Collins (1999, appendix A); noun phrases have their own rule in :func:`_np_head`.
HEAD_RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "ADJP": ("left", ("NNS", "QP", "NN", "$", "ADVP", "JJ", "VBN", "VBG", "ADJP", "JJR", "NP", "JJS",
                      "DT", "FW", "RBR", "RBS", "SBAR", "RB")),
    "ADVP": ("right", ("RB", "RBR", "RBS", "FW", "ADVP", "TO", "CD", "JJR", "JJ", "IN", "NP", "JJS", "NN")),
    "CONJP": ("right", ("CC", "RB", "IN")),
    "FRAG": ("right", ()),
    "INTJ": ("left", ()),
    "LST": ("right", ("LS", ":")),
    "NAC": ("left", ("NN", "NNS", "NNP", "NNPS", "NP", "NAC", "EX", "$", "CD", "QP", "PRP", "VBG", "JJ",
                     "JJS", "JJR", "ADJP", "FW")),
    "PP": ("left", ("IN", "TO", "VBG", "VBN", "RP", "FW")),
    "PRN": ("left", ()),
    "PRT": ("right", ("RP",)),
    "QP": ("left", ("$", "IN", "NNS", "NN", "JJ", "RB", "DT", "CD", "NCD", "QP", "JJR", "JJS")),
    "RRC": ("right", ("VP", "NP", "ADVP", "ADJP", "PP")),
    "S": ("left", ("TO", "IN", "VP", "S", "SBAR", "ADJP", "UCP", "NP")),
    "SBAR": ("left", ("WHNP", "WHPP", "WHADVP", "WHADJP", "IN", "DT", "S", "SQ", "SINV", "SBAR", "FRAG")),
    "SBARQ": ("left", ("SQ", "S", "SINV", "SBARQ", "FRAG")),
    "SINV": ("left", ("VBZ", "VBD", "VBP", "VB", "MD", "VP", "S", "SINV", "ADJP", "NP")),
    "SQ": ("left", ("VBZ", "VBD", "VBP", "VB", "MD", "VP", "SQ")),
    "UCP": ("right", ()),
    "VP": ("left", ("TO", "VBD", "VBN", "MD", "VBZ", "VB", "VBG", "VBP", "VP", "ADJP", "NN", "NNS", "NP")),
    "WHADJP": ("left", ("CC", "WRB", "JJ", "ADJP")),
    "WHADVP": ("right", ("CC", "WRB")),
    "WHNP": ("left", ("WDT", "WP", "WP$", "WHADJP", "WHPP", "WHNP")),
    "WHPP": ("right", ("IN", "TO", "FW")),
}


@dataclass
class _Node:
    label: str
    children: list["_Node"] = field(default_factory=list)
    word: int = -1  # leaf: word index in the sentence

    @property
    def leaf(self) -> bool:
        return self.word >= 0


def _base_label(label: str) -> str:
    """``NP-SBJ-1`` -> ``NP``; ``-NONE-`` and ``-LRB-`` stay as they are."""
    if label.startswith("-"):
        return label
    return re.split(r"[-=]", label, maxsplit=1)[0]


def _pick(children: list[_Node], direction: str, priority: tuple[str, ...]) -> int:
    order = list(range(len(children)))
    if direction == "right":
        order.reverse()
    for cat in priority:
        for i in order:
            if _base_label(children[i].label) == cat:
                return i
    return order[0]


def _np_head(children: list[_Node]) -> int:
    """Collins's noun-phrase rule, except that a possessive ``POS`` is never the head."""
    labels = [_base_label(c.label) for c in children]
    idx = [i for i, lab in enumerate(labels) if lab != "POS"] or list(range(len(children)))
    right = list(reversed(idx))
    for i in right:
        if labels[i] in ("NN", "NNP", "NNPS", "NNS", "NX", "JJR"):
            return i
    for i in idx:
        if labels[i] == "NP":
            return i
    for group in (("$", "ADJP", "PRN"), ("CD",), ("JJ", "JJS", "RB", "QP")):
        for i in right:
            if labels[i] in group:
                return i
    return right[0]


def _head_child(node: _Node) -> int:
    kids = node.children
    if len(kids) == 1:
        return 0
    label = _base_label(node.label)
    if label in ("NP", "NX", "NML"):
        return _np_head(kids)
    direction, priority = HEAD_RULES.get(label, ("left", ()))
    return _pick(kids, direction, priority)


def constituency_heads(bits: list[str], tags: list[str], path: Path, first_line: int,
                       lines: list[int]) -> list[int]:
    """Word heads (sentence indices, -1 = root) from CoNLL-2012 parse bits by head rules.

    ``bits[i]`` is word i's parse bit, e.g. ``(TOP(S(NP*`` or ``*))``; the ``*`` stands for
    the leaf ``(POS word)``. Each word's head is the lexical head of the lowest constituent
    in which the word is not itself the head.

    >>> constituency_heads(["(TOP(S(NP*", "*)", "(VP*)))"], ["DT", "NN", "VBD"], Path("x"), 1, [1, 2, 3])
    [1, 2, -1]
    """
    root = _Node("ROOT")
    stack = [root]
    for i, (bit, tag) in enumerate(zip(bits, tags)):
        if bit.count("*") != 1 or not re.fullmatch(r"(\([^()*\s]+)*\*\)*", bit):
            raise InputError(path, f"malformed parse bit {bit!r}", line=lines[i])
        head_part, tail = bit.split("*")
        for label in re.findall(r"\(([^()*\s]+)", head_part):
            node = _Node(label)
            stack[-1].children.append(node)
            stack.append(node)
        stack[-1].children.append(_Node(tag, word=i))
        for _ in range(tail.count(")")):
            if len(stack) == 1:
                raise InputError(path, f"parse bit {bit!r} closes more brackets than are open",
                                 line=lines[i])
            stack.pop()
    if len(stack) != 1:
        raise InputError(path, "parse bits of this sentence leave brackets open", line=first_line)
    n = len(bits)
    heads = [-1] * n

    def lexical_head(node: _Node) -> int:
        if node.leaf:
            return node.word
        lex = [lexical_head(c) for c in node.children]
        h = lex[_head_child(node)] if node is not root else lex[_root_child(node)]
        for w in lex:
            if w != h:
                heads[w] = h
        return h

    def _root_child(node: _Node) -> int:
        return 0 if len(node.children) == 1 else _pick(node.children, "left", ("TOP", "S"))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * n + 100))
    try:
        lexical_head(root)
    finally:
        sys.setrecursionlimit(limit)
    return heads


# ---------------------------------------------------------------------------------------------
# heads, types, agreement


def _is_punct(doc: Document, w: int) -> bool:
    upos = doc.upos[w] if doc.upos else "_"
    if upos == "PUNCT":
        return True
    if upos in ("_", "") and doc.xpos and doc.xpos[w] in _PUNCT_XPOS:
        return True
    return bool(re.fullmatch(r"[^\w]+", doc.words[w]))


def _depth(doc: Document, w: int) -> int:
    d, node = 0, w
    assert doc.heads is not None
    while doc.heads[node] >= 0 and d <= len(doc.words):
        node = doc.heads[node]
        d += 1
    return d


def mention_head(doc: Document, m: Mention) -> int:
    """The head word of ``m`` (document index) by the rules in the module docstring."""
    span = range(m.start, m.end)
    if doc.heads is not None:
        outside = [w for w in span if not (m.start <= doc.heads[w] < m.end)]
        good = [w for w in outside if not _is_punct(doc, w)] or outside
        if good:
            return min(good, key=lambda w: (_depth(doc, w), w))
    words = [w for w in span if not _is_punct(doc, w)] or list(span)
    return words[-1]


def mention_type(doc: Document, w: int) -> str:
    """``pronoun``, ``proper`` or ``nominal`` from the head word's UPOS, else its PTB XPOS."""
    upos = doc.upos[w] if doc.upos else "_"
    xpos = doc.xpos[w] if doc.xpos else "_"
    if upos == "PRON" or xpos in _PRONOUN_XPOS:
        return "pronoun"
    if upos == "PROPN" or (upos in ("_", "") and xpos in _PROPER_XPOS):
        return "proper"
    return "nominal"


def assign_heads_and_types(doc: Document) -> None:
    for m in doc.mentions:
        m.head = mention_head(doc, m)
        m.type = mention_type(doc, m.head)


#: English pronouns: number (sg/pl), gender (masc/fem/neut), person (1/2/3); None = unknown.
PRONOUNS: dict[str, tuple[str | None, str | None, str | None]] = {}
for _words, _attrs in [
    ("i me my mine myself", ("sg", None, "1")),
    ("we us our ours ourselves", ("pl", None, "1")),
    ("you your yours", (None, None, "2")),
    ("yourself", ("sg", None, "2")),
    ("yourselves", ("pl", None, "2")),
    ("he him his himself", ("sg", "masc", "3")),
    ("she her hers herself", ("sg", "fem", "3")),
    ("it its itself", ("sg", "neut", "3")),
    ("they them their theirs themselves themself", ("pl", None, "3")),
]:
    for _w in _words.split():
        PRONOUNS[_w] = _attrs

_NUMBER = {"Sing": "sg", "Plur": "pl"}
_GENDER = {"Masc": "masc", "Fem": "fem", "Neut": "neut"}


def mention_attributes(doc: Document, m: Mention) -> tuple[str | None, str | None, str | None]:
    """(number, gender, person) of a mention from its head word; None where unknown.

    UD features (``Number``, ``Gender``, ``Person``) come first; then the English pronoun
    lexicon :data:`PRONOUNS`; then PTB tags (``NNS``/``NNPS`` plural, ``NN``/``NNP`` singular).
    Non-pronouns are third person.
    """
    w = m.head
    feats = doc.feats[w] if doc.feats else {}
    lex = PRONOUNS.get(doc.words[w].lower(), (None, None, None))
    number = _NUMBER.get(feats.get("Number", "")) or lex[0]
    gender = _GENDER.get(feats.get("Gender", "")) or lex[1]
    person = feats.get("Person") or lex[2]
    xpos = doc.xpos[w] if doc.xpos else "_"
    if number is None and xpos in ("NNS", "NNPS"):
        number = "pl"
    elif number is None and xpos in ("NN", "NNP"):
        number = "sg"
    if person is None and m.type != "pronoun":
        person = "3"
    return number, gender, person


# ---------------------------------------------------------------------------------------------
# format detection


def detect_format(path: str | Path) -> str:
    """``"conllu"`` or ``"conll2012"`` from the first non-blank line of the file."""
    path = Path(path)
    text = read_text(path)
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("#begin document"):
            return "conll2012"
        if s.startswith("#"):
            continue
        return "conllu" if line.count("\t") == 9 else "conll2012"
    raise InputError(path, "is empty")


def read_coref(path: str | Path) -> list[Document]:
    """All documents of a coreference file, CorefUD CoNLL-U or CoNLL-2012 (detected)."""
    path = Path(path)
    fmt = detect_format(path)
    docs = list(iter_conllu_coref(path) if fmt == "conllu" else iter_conll2012(path))
    if not docs:
        raise InputError(path, "holds no documents")
    return docs
