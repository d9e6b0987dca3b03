"""What the ``tidemark`` commands print: tables, JSON documents, progress lines and errors.

A leaf of the CLI: it imports no other ``tidemark.cli`` module, so every command module
(and the parser in ``tidemark.cli``) can import it at the top without a cycle. Results
go to stdout, errors to stderr; progress lines are flushed at once, so a run's progress
shows while its Spark job works.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain left-aligned text table."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_json(document: Any, *, sort_keys: bool = False) -> None:
    """``document`` as indented JSON; values JSON has no type for (datetimes, paths) as their text."""
    print(json.dumps(document, indent=2, sort_keys=sort_keys, default=str))


def progress(message: str) -> None:
    """One progress line of a run, stamped with the UTC time of day."""
    print(f"[{datetime.now(UTC).strftime('%H:%M:%S')}] {message}", flush=True)


def step(message: str) -> None:
    """One progress line nested under a heading (the demo's runs)."""
    print(f"  .. {message}", flush=True)


def error(message: object) -> None:
    """An error the command stops on, as one line on stderr."""
    print(f"tidemark: error: {message}", file=sys.stderr)
