"""Tables as CSV, JSON, Markdown and LaTeX, from one list of row dicts."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

from attnscope.data.io import atomic_write_text
from attnscope.store.results import dumps

FORMATS = ("csv", "json", "md", "tex")


def _cell(v, digits: int) -> str:
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return "" if v is None else str(v)


def to_csv(rows: Sequence[dict], columns: Sequence[str]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: r.get(c) for c in columns})
    return buf.getvalue()


def to_markdown(rows: Sequence[dict], columns: Sequence[str], digits: int = 3) -> str:
    """A GitHub-flavoured Markdown table; ``|`` in cells is escaped."""
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    lines = ["| " + " | ".join(esc(c) for c in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(esc(_cell(r.get(c), digits)) for c in columns) + " |")
    return "\n".join(lines) + "\n"


_TEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}"}


def tex_escape(s: str) -> str:
    return "".join(_TEX_ESCAPES.get(ch, ch) for ch in s)


def to_latex(rows: Sequence[dict], columns: Sequence[str], caption: str = "", digits: int = 3) -> str:
    """A booktabs ``tabular`` inside a ``table`` environment."""
    align = "".join("r" if rows and isinstance(rows[0].get(c), (int, float)) else "l" for c in columns)
    out = ["\\begin{table}[t]", "\\centering", f"\\begin{{tabular}}{{{align}}}", "\\toprule",
           " & ".join(tex_escape(c) for c in columns) + " \\\\", "\\midrule"]
    for r in rows:
        out.append(" & ".join(tex_escape(_cell(r.get(c), digits)) for c in columns) + " \\\\")
    out += ["\\bottomrule", "\\end{tabular}"]
    if caption:
        out.append(f"\\caption{{{tex_escape(caption)}}}")
    out.append("\\end{table}")
    return "\n".join(out) + "\n"


def write_table(rows: Sequence[dict], stem: str | Path, *, columns: Sequence[str] | None = None,
                caption: str = "", formats: Sequence[str] = FORMATS, digits: int = 3) -> list[Path]:
    """Write ``rows`` to ``stem.csv``, ``stem.json``, ``stem.md`` and ``stem.tex``."""
    stem = Path(stem)
    columns = list(columns or (list(rows[0].keys()) if rows else []))
    writers = {
        "csv": lambda: to_csv(rows, columns),
        "json": lambda: dumps(list(rows)),
        "md": lambda: to_markdown(rows, columns, digits),
        "tex": lambda: to_latex(rows, columns, caption, digits),
    }
    paths = []
    for fmt in formats:
        p = stem.with_suffix(f".{fmt}")
        atomic_write_text(p, writers[fmt]())
        paths.append(p)
    return paths
