"""Avro resolution checked with logical types (``tidemark.spark.avro._incompatibility``, in Spark's JVM): Avro's own
check sees only the underlying types, and a decimal whose values the reader cannot all represent (a lower scale, fewer
digits before the point), or a date read as a timestamp, is refused."""

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
def test_a_decimal_resolves_at_its_scale_with_at_least_its_precision(spark: Any, wrap: str) -> None:
    def problem(reader: tuple[int, int], writer: tuple[int, int]) -> str | None:
        return _incompatibility(spark, _record(_decimal(*reader), wrap=wrap), _record(_decimal(*writer), wrap=wrap))

    assert problem((10, 2), (10, 2)) is None
    assert problem((11, 2), (10, 2)) is None  # one digit wider at the same scale: every value fits
    assert problem((14, 3), (12, 3)) is None
    narrowed = problem((9, 2), (10, 2))  # one digit narrower: a written value may not fit
    assert narrowed is not None and "written as decimal(10,2), read as decimal(9,2)" in narrowed, narrowed
    assert problem((12, 4), (10, 2)) is None  # a higher scale, the same digits before the point: every value fits
    lowered = problem((12, 1), (10, 2))  # a lower scale: 3.34 has no exact value at scale 1
    assert lowered is not None and "Order.amount" in lowered, lowered
    assert "written as decimal(10,2), read as decimal(12,1)" in lowered
    shorter = problem((10, 4), (10, 2))  # six digits before the point where the writer has eight
    assert shorter is not None and "written as decimal(10,2), read as decimal(10,4)" in shorter, shorter


def _fixed_decimal(size: int, precision: int, scale: int) -> dict[str, Any]:
    return {"type": "fixed", "name": f"D{size}", "size": size, "logicalType": "decimal", "precision": precision,
            "scale": scale}  # fmt: skip


@pytest.mark.parametrize(
    ("reader", "writer", "refused"),
    [
        (_fixed_decimal(8, 14, 3), _fixed_decimal(8, 12, 3), False),  # fixed of one size: widened as bytes are
        (_fixed_decimal(8, 12, 3), _fixed_decimal(8, 14, 3), True),
        (_fixed_decimal(8, 12, 3), _decimal(12, 3), True),  # bytes and fixed do not resolve to each other in Avro
        (_decimal(12, 3), _fixed_decimal(8, 12, 3), True),
    ],
)
def test_fixed_and_bytes_decimals_resolve_as_the_spec_says(spark: Any, reader: Any, writer: Any, refused: bool) -> None:
    problem = _incompatibility(spark, _record(reader), _record(writer))
    assert (problem is not None) == refused, problem


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
