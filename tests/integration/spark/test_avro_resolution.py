"""Avro resolution checked with logical types (``tidemark.spark.avro._incompatibility``, in Spark's JVM): Avro's own
check sees only the underlying types, and a decimal at another scale, or a date read as a timestamp, is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tidemark.spark.avro import _incompatibility

pytestmark = pytest.mark.spark


def _decimal(precision: int, scale: int) -> dict[str, Any]:
    return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}


def _record(amount: Any, *, wrap: str = "plain") -> str:
    """A record whose field ``amount`` (or its line's, its list's items, its map's values) has type ``amount``."""
    shapes = {
        "plain": amount,
        "nullable": ["null", amount],
        "nested": {"type": "record", "name": "Line", "fields": [{"name": "amount", "type": amount}]},
        "array": {"type": "array", "items": amount},
        "map": {"type": "map", "values": amount},
    }
    return json.dumps({"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"}, {"name": "amount", "type": shapes[wrap]}]})  # fmt: skip


@pytest.mark.parametrize("wrap", ["plain", "nullable", "nested", "array", "map"])
def test_a_decimal_resolves_only_at_equal_precision_and_scale(spark: Any, wrap: str) -> None:
    assert _incompatibility(spark, _record(_decimal(10, 2), wrap=wrap), _record(_decimal(10, 2), wrap=wrap)) is None
    problem = _incompatibility(spark, _record(_decimal(12, 4), wrap=wrap), _record(_decimal(10, 2), wrap=wrap))
    assert problem is not None and "Order.amount" in problem, problem
    assert "written as decimal(10,2), read as decimal(12,4)" in problem


MILLIS = {"type": "long", "logicalType": "timestamp-millis"}
MICROS = {"type": "long", "logicalType": "timestamp-micros"}


@pytest.mark.parametrize(
    ("reader", "writer", "refused"),
    [
        (_decimal(10, 2), "bytes", True),  # raw bytes read as a decimal
        (MICROS, MILLIS, True),
        (MILLIS, {"type": "int", "logicalType": "date"}, True),
        (MILLIS, "long", False),  # the number as written
        ("long", MILLIS, False),
        ("double", "int", False),  # Avro's promotions are untouched
    ],
)
def test_logical_types_resolve_only_to_themselves(spark: Any, reader: Any, writer: Any, refused: bool) -> None:
    problem = _incompatibility(spark, _record(reader), _record(writer))
    assert (problem is not None) == refused, problem
