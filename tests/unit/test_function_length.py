"""A run reads as its steps: no function in ``runs/`` or ``job/`` runs over 80 lines.

Measured on the package that is imported (so a checkout's own tree), with ``ast``: a
function's lines run from its ``def`` to its last line, nested functions included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tidemark

PACKAGE = Path(tidemark.__file__).parent
MAX_LINES = 80


def long_functions(folder: Path) -> list[str]:
    """``path:line name (N lines)`` for each function under ``folder`` longer than :data:`MAX_LINES`."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_LINES:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({lines} lines)")
    return found


@pytest.mark.parametrize("folder", ["runs", "job"])
def test_no_function_runs_over_80_lines(folder: str) -> None:
    assert long_functions(PACKAGE / folder) == []
