"""Checkpoints of finished families: a report section without its maps, as JSON and back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnscope.data.io import to_plain
from attnscope.report.section import FigureArtifact, Section, TableArtifact


def section_to_json(section: Section, out_dir: Path) -> dict[str, Any]:
    """The section as JSON, file paths relative to ``out_dir``; ``maps`` are left out."""
    def rel(p: Path) -> str:
        try:
            return Path(p).resolve().relative_to(out_dir.resolve()).as_posix()
        except ValueError:
            return str(p)

    return to_plain({
        "key": section.key, "title": section.title, "findings": list(section.findings),
        "tables": [{"name": t.name, "caption": t.caption, "rows": t.rows, "columns": list(t.columns),
                    "paths": [rel(p) for p in t.paths]} for t in section.tables],
        "figures": [{"name": f.name, "caption": f.caption, "paths": [rel(p) for p in f.paths]}
                    for f in section.figures],
        "methods": list(section.methods), "paper": list(section.paper),
        "best_heads": [list(b) for b in section.best_heads],
    })


def section_from_json(d: dict[str, Any], out_dir: Path) -> Section:
    def path(p: str) -> Path:
        q = Path(p)
        return q if q.is_absolute() else out_dir / q

    return Section(
        key=d["key"], title=d["title"], findings=list(d.get("findings", [])),
        tables=[TableArtifact(t["name"], t["caption"], t["rows"], t["columns"], [path(p) for p in t["paths"]])
                for t in d.get("tables", [])],
        figures=[FigureArtifact(f["name"], f["caption"], [path(p) for p in f["paths"]])
                 for f in d.get("figures", [])],
        methods=list(d.get("methods", [])), paper=list(d.get("paper", [])),
        best_heads=[tuple(b) for b in d.get("best_heads", [])])
