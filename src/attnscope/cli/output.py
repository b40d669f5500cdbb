"""Where command output goes: results on stdout, progress and warnings on stderr.

``results`` prints what a command produced (a summary, a table, the path it wrote), so it can
be piped; ``attnscope.cli.common.console`` (stderr) carries progress bars and warnings.
"""

from __future__ import annotations

from rich.console import Console

#: Results: stdout, no colour codes when piped (rich turns them off for non-terminals).
results = Console(soft_wrap=True)
