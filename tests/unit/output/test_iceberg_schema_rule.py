"""The rule an Iceberg table's schema follows when a feed's decoded schema changes (no catalog needed)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids
from pyiceberg.schema import Schema, assign_fresh_schema_ids

from tidemark.errors import SchemaError
from tidemark.output.iceberg import schema_changes

CUSTOMER = pa.struct([("id", pa.int64()), ("email", pa.string())])
BEFORE = pa.schema([
    ("offset", pa.int64()), ("id", pa.int32()), ("score", pa.float32()), ("amount", pa.decimal128(10, 2)),
    ("customer", CUSTOMER), ("items", pa.list_(pa.int32())), ("tags", pa.map_(pa.string(), pa.int32())),
    ("status", pa.string()), ("gone", pa.string()),
])  # fmt: skip


def _table(arrow: pa.Schema) -> Schema:
    """A table schema with field ids, as pyiceberg's create_table makes one from an Arrow schema."""
    return assign_fresh_schema_ids(_pyarrow_to_schema_without_ids(arrow))


def _with(**types: pa.DataType) -> pa.Schema:
    """BEFORE with some columns' types replaced (a new name is appended)."""
    fields = [pa.field(f.name, types.pop(f.name, f.type)) for f in BEFORE]
    return pa.schema(fields + [pa.field(name, t) for name, t in types.items()])


def test_added_columns_and_iceberg_promotions_evolve_and_removed_columns_stay() -> None:
    table = _table(BEFORE)
    assert schema_changes(table, BEFORE, "lake.t", "records") == []
    assert schema_changes(table, BEFORE.remove(BEFORE.get_field_index("gone")), "lake.t", "records") == []
    decoded = _with(
        id=pa.int64(), score=pa.float64(), amount=pa.decimal128(12, 2),
        customer=pa.struct([("id", pa.int64()), ("email", pa.string()), ("vip", pa.bool_())]),
        items=pa.list_(pa.int64()), tags=pa.map_(pa.string(), pa.int64()), channel=pa.string(),
    )  # fmt: skip
    assert schema_changes(table, decoded, "lake.t", "records") == [
        "promoted id: int -> long", "promoted score: float -> double",
        "promoted amount: decimal(10, 2) -> decimal(12, 2)", "added customer.vip: boolean",
        "promoted items.element: int -> long", "promoted tags.value: int -> long", "added channel: string",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("types", "column", "table_type", "record_type", "kind"),
    [
        ({"offset": pa.int32()}, "offset", "long", "int", "a narrowing"),
        ({"amount": pa.decimal128(8, 2)}, "amount", "decimal(10, 2)", "decimal(8, 2)", "a narrowing"),
        ({"id": pa.float64()}, "id", "int", "double", "not a promotion Iceberg allows"),  # Avro allows int -> double
        ({"amount": pa.decimal128(12, 3)}, "amount", "decimal(10, 2)", "decimal(12, 3)", "not a promotion"),
        ({"status": pa.binary()}, "status", "string", "binary", "not a promotion"),  # Avro allows string -> bytes
        ({"customer": pa.string()}, "customer", "struct<", "string", "not a promotion"),
        ({"customer": pa.struct([("id", pa.int32())])}, "customer.id", "long", "int", "a narrowing"),
    ],
)
def test_any_other_type_change_is_refused_naming_table_column_both_types_and_records(
    types: dict[str, pa.DataType], column: str, table_type: str, record_type: str, kind: str
) -> None:
    with pytest.raises(SchemaError) as info:
        schema_changes(_table(BEFORE), _with(**types), "lake.t", "the records of plan p (t[0] offsets [4, 8))")
    message = str(info.value)
    assert message.startswith("Iceberg table lake.t cannot take the records of plan p (t[0] offsets [4, 8)): ")
    assert f"column '{column}' is {table_type}" in message and f"and {record_type} in the records ({kind}" in message
    assert "pin deserialization.schema_version" in message and "nothing was published or committed" in message
