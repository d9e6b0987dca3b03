"""What the differential tests share: values put in one comparable form, and the closing count line."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from typing import Any

import pytest


def comparable(v: Any) -> Any:
    """``v`` in a form both decoders' results compare in: NaN equal to itself, maps (lists of key-value pairs)
    as sorted pairs, timestamps as aware UTC."""
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, dict):
        return {k: comparable(x) for k, x in v.items()}
    if isinstance(v, list):
        pairs = v and all(isinstance(x, tuple) and len(x) == 2 for x in v)
        return sorted((k, comparable(x)) for k, x in v) if pairs else [comparable(x) for x in v]
    if isinstance(v, dt.datetime):
        return v.replace(tzinfo=dt.UTC) if v.tzinfo is None else v.astimezone(dt.UTC)
    return v


def report_counts(request: pytest.FixtureRequest, title: str, examples: int, counts: Mapping[str, int]) -> None:
    """One line of what a differential run generated and checked, shown whether or not pytest captures output."""
    line = f"differential {title} ({examples} examples asked): " + ", ".join(
        f"{k} {v}" for k, v in sorted(counts.items())
    )
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        print(f"\n{line}")
