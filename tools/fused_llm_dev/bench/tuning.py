"""The committed dispatch tables of the Triton packages (``torch-ext/<pkg>/_tuning.py``): how a
tune script rewrites one. Imports no torch."""

from __future__ import annotations

import ast
import pprint
from pathlib import Path


def read_table(path: Path) -> tuple[str, dict]:
    """``(MADE_BY, TABLE)`` of the table file at ``path`` as it stands on disk. A tune script
    reads the file it is about to rewrite, not the package's imported copy: a build copies the
    package's Python files, so after one run writes the table the imported module is stale until
    the next build, and a second run merging into it dropped the first run's entries."""
    values = {}
    for node in ast.parse(path.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id in ("MADE_BY", "TABLE"):
            values[target.id] = ast.literal_eval(node.value)
    return values.get("MADE_BY", ""), values.get("TABLE", {})


def write_table(path: Path, table: dict, made_by: str, annotation: str) -> None:
    """Rewrite ``path``: its docstring and imports (everything before ``MADE_BY = ``) kept, then
    ``MADE_BY`` (the commands that measured it) and ``TABLE: <annotation> = <table>``."""
    text = path.read_text()
    head = text[: text.index("MADE_BY = ")]
    body = f"MADE_BY = {made_by!r}\n\nTABLE: {annotation} = " + pprint.pformat(table, width=110, sort_dicts=True) + "\n"
    path.write_text(head + body)
