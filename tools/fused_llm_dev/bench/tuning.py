"""The committed dispatch tables of the Triton packages (``torch-ext/<pkg>/_tuning.py``): how a
tune script rewrites one. Imports no torch."""

from __future__ import annotations

import pprint
from pathlib import Path


def write_table(path: Path, table: dict, made_by: str, annotation: str) -> None:
    """Rewrite ``path``: its docstring and imports (everything before ``MADE_BY = ``) kept, then
    ``MADE_BY`` (the commands that measured it) and ``TABLE: <annotation> = <table>``."""
    text = path.read_text()
    head = text[: text.index("MADE_BY = ")]
    body = f"MADE_BY = {made_by!r}\n\nTABLE: {annotation} = " + pprint.pformat(table, width=110, sort_dicts=True) + "\n"
    path.write_text(head + body)
