"""A Parquet output's one schema (tidemark.output.output_schema): the evolution rule, the files at the output's root
that pyarrow's dataset and Spark take the schema from, and the plan files rewritten with it, read back by pyarrow."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tidemark.config.models import SchemaChange
from tidemark.errors import PublishError
from tidemark.output.output_schema import CARRIER_NAME, OutputSchema, conform, evolve, load, record
from tidemark.output.parquet import refuse_schema_change
from tidemark.storage import Location

CUSTOMER = pa.struct([("id", pa.int64()), ("email", pa.string())])
V1 = pa.schema([
    ("offset", pa.int64()), ("id", pa.int32()), ("score", pa.float32()), ("amount", pa.decimal128(12, 3)),
    ("customer", CUSTOMER), ("items", pa.list_(pa.int32())), ("tags", pa.map_(pa.string(), pa.int32())),
])  # fmt: skip


def _with(schema: pa.Schema, **types: pa.DataType) -> pa.Schema:
    fields = [pa.field(f.name, types.pop(f.name, f.type)) for f in schema]
    return pa.schema(fields + [pa.field(name, t) for name, t in types.items()])


def test_a_first_plan_sets_the_schema() -> None:
    found = evolve(None, V1)
    assert found.schema.equals(V1) and not found.changes and not found.conflicts and not found.conform


def test_added_columns_and_widenings_evolve_and_are_named() -> None:
    wider = _with(V1, id=pa.int64(), score=pa.float64(), amount=pa.decimal128(14, 3),
                  customer=pa.struct([("id", pa.int64()), ("email", pa.string()), ("vip", pa.bool_())]),
                  items=pa.list_(pa.int64()), channel=pa.string())  # fmt: skip
    found = evolve(V1, wider)
    assert not found.conflicts and not found.conform
    assert found.schema.field("id").type == pa.int64() and found.schema.field("amount").type == pa.decimal128(14, 3)
    assert found.schema.field("customer").type.field("vip").type == pa.bool_()
    assert found.schema.names[-1] == "channel" and found.schema.field("channel").nullable
    assert set(found.columns) == {"id", "score", "amount", "customer.vip", "items[]", "channel"}
    assert "column 'amount' widened from decimal128(12, 3) to decimal128(14, 3)" in found.changes


def test_a_plan_narrower_or_missing_a_column_is_conformed_without_a_change() -> None:
    wide = _with(V1, id=pa.int64())
    narrow = pa.schema([f for f in V1 if f.name != "tags"])
    found = evolve(wide, narrow)
    assert found.conform and not found.changes and not found.conflicts
    assert found.schema.field("id").type == pa.int64() and "tags" in found.schema.names


@pytest.mark.parametrize(
    ("column", "kind"),
    [("amount", pa.decimal128(12, 4)), ("id", pa.string()), ("score", pa.int32()), ("tags", pa.list_(pa.int32()))],
    ids=["decimal-scale", "int-to-string", "float-to-int", "map-to-list"],
)
def test_any_other_type_change_is_a_conflict_naming_the_column(column: str, kind: pa.DataType) -> None:
    found = evolve(V1, _with(V1, **{column: kind}))
    assert len(found.conflicts) == 1 and f"column '{column}'" in found.conflicts[0]


def test_the_recorded_schema_is_what_pyarrow_s_dataset_reads_the_whole_output_with(tmp_path: Path) -> None:
    old = tmp_path / "plan_id=aa" / "part-0.parquet"  # sorts first: pyarrow would take the schema of the first file
    new = tmp_path / "plan_id=zz" / "part-0.parquet"
    old.parent.mkdir()
    new.parent.mkdir()
    pq.write_table(
        pa.table({"id": pa.array([1], pa.int32()), "amount": pa.array([Decimal("1.5")], pa.decimal128(4, 1))}), old
    )
    plan = pa.schema([("id", pa.int32()), ("amount", pa.decimal128(4, 1))])
    record(Location.of(tmp_path), plan, version=1, plan_id="aa", readers="r1", changes=())
    wider = pa.schema([("id", pa.int64()), ("amount", pa.decimal128(6, 1)), ("c", pa.string())])
    pq.write_table(pa.table({"id": [2**40], "amount": pa.array([Decimal("12345.5")], pa.decimal128(6, 1)),
                             "c": ["x"]}, schema=wider), new)  # fmt: skip
    found = evolve(load(Location.of(tmp_path)).schema, wider)  # type: ignore[union-attr]
    record(Location.of(tmp_path), found.schema, version=2, plan_id="zz", readers="r2", changes=found.changes)

    dataset = ds.dataset(str(tmp_path), format="parquet", partitioning="hive")

    assert Path(dataset.files[0]).name == CARRIER_NAME
    assert dataset.schema.field("id").type == pa.int64() and dataset.schema.field("c").type == pa.string()
    table = dataset.to_table()
    rows = sorted(table.select(["id", "amount", "c"]).to_pylist(), key=lambda r: r["id"])
    assert rows == [
        {"id": 1, "amount": Decimal("1.5"), "c": None},
        {"id": 2**40, "amount": Decimal("12345.5"), "c": "x"},
    ]
    assert load(Location.of(tmp_path)).version == 2  # type: ignore[union-attr]


def test_conform_rewrites_a_plan_file_with_the_output_schema(tmp_path: Path) -> None:
    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"id": pa.array([7], pa.int32())}), path)
    target = pa.schema([("id", pa.int64()), ("gone", pa.string())])
    assert conform([path], target) == 1
    assert pq.read_table(path).to_pylist() == [{"id": 7, "gone": None}]
    assert pq.read_schema(path).remove_metadata().equals(target)
    assert conform([path], target) == 0


@pytest.mark.parametrize("policy", ["fail", "quarantine", "evolve"])
def test_a_change_is_refused_unless_the_feed_evolves_and_a_conflict_always(policy: SchemaChange) -> None:
    current = OutputSchema(V1, 3, "p1", "subject 'o-value' version 1")
    added = evolve(V1, _with(V1, channel=pa.string()))
    out, reader = Location.of("/tmp/out"), "subject 'o-value' version 2"
    if policy == "evolve":
        refuse_schema_change(out, added, current, reader, policy, "p2")
    else:
        with pytest.raises(PublishError) as info:
            refuse_schema_change(out, added, current, reader, policy, "p2")
        says = ("column 'channel' added", "version 3", "subject 'o-value' version 1", reader, f"is '{policy}'")
        assert [part for part in says if part not in str(info.value)] == []
    conflict = evolve(V1, _with(V1, id=pa.string()))
    with pytest.raises(PublishError, match="column 'id' is int32 in the output and string in this plan"):
        refuse_schema_change(out, conflict, current, "v2", policy, "p2")


def test_a_decimal_at_a_higher_scale_widens_where_every_value_stays_exact() -> None:
    base = _with(V1, amount=pa.decimal128(10, 2))
    found = evolve(base, _with(V1, amount=pa.decimal128(12, 4)))  # eight digits before the point on both sides
    assert found.schema.field("amount").type == pa.decimal128(12, 4) and not found.conflicts
    back = evolve(found.schema, base)  # an older reader's plan: cast up, no change
    assert back.conform and not back.changes and back.schema.field("amount").type == pa.decimal128(12, 4)
