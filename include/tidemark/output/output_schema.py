"""One schema per Parquet output: the schema every plan's data files are written with, evolved across plans.

A Parquet output keeps one **output schema** (Arrow types of the columns its data files hold;
partition columns live in folder names and are not part of it). Each publication compares the
plan's data files with it (:func:`evolve`):

- a column the plan holds and the output lacks is **added** (nullable: earlier files read null);
- a type the output can widen is **widened**: int8/16/32 → int64 (Avro int → long), float32 →
  float64, a decimal's precision or scale where every value stays exact, the same rules inside structs, list items
  and map values;
- a column the output has and the plan lacks, or holds narrower (a pinned older reader), is
  **conformed**: the plan's files are rewritten with the output's schema (null, or the value
  cast to the wider type, which holds it exactly);
- anything else (another type, a decimal at another scale) is a **conflict**: refused before
  anything is published, naming the output, the column, both types and the readers.

The feed's ``schema_change`` says what a change of the output's schema does: ``evolve`` applies
added and widened columns, ``fail`` (the default) refuses any change, naming the subject, the
versions and the column; ``quarantine`` is refused too for now (docs/schemas.md).

Where the schema is recorded: in each plan's manifest (``extra.output_schema``: its version,
columns and changes) and in two files at the output's root, written *before* the plan that
changes the schema is shown (a column shown ahead of its data reads null; data ahead of its
column would not be read): ``_common_metadata`` (the Parquet summary file Spark takes its schema
from when it exists) and :data:`CARRIER_NAME`, a Parquet file of no rows with the same schema,
named to sort before every ``plan_id=`` folder: pyarrow's dataset takes its schema from the
first file in path order. Earlier plans' files are compatible by construction: every change the
output takes is one a reader applies when it reads an older file with the newer schema (a
missing column reads null, a narrower type is cast to the wider one exactly).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidemark.errors import PublishError
from tidemark.storage import Location

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

CARRIER_NAME = "output-schema.parquet"  # sorts before "plan_id=": pyarrow's dataset takes its schema from it
SUMMARY_NAME = "_common_metadata"  # the Parquet summary file Spark takes its schema from
ROOT_FILES = (CARRIER_NAME, SUMMARY_NAME)
META_KEY = b"tidemark.output_schema"  # in both files' schema metadata: version, plan, readers, changes
SPARK_ROW_KEY = b"org.apache.spark.sql.parquet.row.metadata"


@dataclass(frozen=True)
class OutputSchema:
    """An output's recorded schema: the columns, its version (1 for the first plan's) and who set it."""

    schema: pa.Schema
    version: int
    plan_id: str
    readers: str  # the reader schemas of the plan that set it, as text (``subject 'x-value' version 2``)


@dataclass(frozen=True)
class Evolution:
    """What a plan's data files do to the output's schema (:func:`evolve`)."""

    schema: pa.Schema  # the output's schema after the plan: its files are written with it
    changes: tuple[str, ...] = ()  # columns added or widened ("column 'c' added (string)")
    conflicts: tuple[str, ...] = ()  # types the output cannot take ("column 'a' is ... in the output and ...")
    conform: bool = False  # the plan's files lack a column of the output or hold one narrower
    columns: tuple[str, ...] = field(default_factory=tuple)  # the top-level columns changed, for messages


_INTS = ("int8", "int16", "int32", "int64")


def _widened(out: pa.DataType, run: pa.DataType, path: str, ev: _Acc) -> pa.DataType:
    """The type a column of type ``out`` in the output and ``run`` in the plan has in the evolved output."""
    import pyarrow as pa

    if out.equals(run):
        return out
    if pa.types.is_integer(out) and pa.types.is_integer(run) and pa.types.is_signed_integer(out) == \
            pa.types.is_signed_integer(run):  # fmt: skip
        return _wider(out, run, str(out) in _INTS and _INTS.index(str(out)) >= _INTS.index(str(run)), path, ev)
    if pa.types.is_floating(out) and pa.types.is_floating(run):
        return _wider(out, run, out.bit_width >= run.bit_width, path, ev)
    if pa.types.is_decimal(out) and pa.types.is_decimal(run) and (_holds(out, run) or _holds(run, out)):
        return _wider(out, run, _holds(out, run), path, ev)
    if pa.types.is_timestamp(out) and pa.types.is_timestamp(run) and out.unit == run.unit:
        return out  # the zone's spelling only ("UTC", "+00:00"): the same instants
    if pa.types.is_struct(out) and pa.types.is_struct(run):
        return pa.struct(_fields(list(out), list(run), f"{path}.", ev))
    if pa.types.is_list(out) and pa.types.is_list(run):
        item = _widened(out.value_type, run.value_type, f"{path}[]", ev)
        return pa.list_(pa.field(out.value_field.name, item, nullable=True))
    if pa.types.is_map(out) and pa.types.is_map(run) and out.key_type.equals(run.key_type):
        return pa.map_(out.key_type, _widened(out.item_type, run.item_type, f"{path}{{}}", ev))
    ev.conflicts.append(f"column '{path}' is {out} in the output and {run} in this plan: not a widening")
    return out


def _holds(wide: pa.Decimal128Type, narrow: pa.Decimal128Type) -> bool:
    """Whether decimal ``wide`` represents every value of ``narrow`` exactly: at least its scale and its digits
    before the point (the rule Avro feeds are read by, ``tidemark.spark.avro``)."""
    return bool(wide.scale >= narrow.scale and wide.precision - wide.scale >= narrow.precision - narrow.scale)


def _wider(out: pa.DataType, run: pa.DataType, output_wider: bool, path: str, ev: _Acc) -> pa.DataType:
    if output_wider:
        ev.conform = True  # the plan's values are cast to the output's wider type
        return out
    ev.changes.append(f"column '{path}' widened from {out} to {run}")
    ev.columns.append(path)
    return run


def _fields(out: list[pa.Field], run: list[pa.Field], prefix: str, ev: _Acc) -> list[pa.Field]:
    """The output's fields evolved by the plan's: the output's in its order (widened), then the plan's new ones."""
    import pyarrow as pa

    theirs = {f.name: f for f in run}
    merged = []
    for f in out:
        other = theirs.get(f.name)
        if other is None:
            ev.conform = True  # the plan's files lack it: null there
            merged.append(f.with_nullable(True))
            continue
        kind = _widened(f.type, other.type, f"{prefix}{f.name}", ev)
        merged.append(pa.field(f.name, kind, nullable=f.nullable or other.nullable, metadata=f.metadata))
    mine = {f.name for f in out}
    for f in run:
        if f.name not in mine:
            ev.changes.append(f"column '{prefix}{f.name}' added ({f.type})")
            ev.columns.append(f"{prefix}{f.name}")
            merged.append(f.with_nullable(True))
    return merged


@dataclass
class _Acc:
    changes: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    conform: bool = False


def evolve(current: pa.Schema | None, plan: pa.Schema) -> Evolution:
    """The output's schema after a plan whose data files have schema ``plan`` (``current``: the output's, or None
    for an output without one yet, whose schema the plan's becomes)."""
    import pyarrow as pa

    bare = pa.schema(list(plan))  # no file metadata (Spark's row schema, pandas') in the output's schema
    if current is None:
        return Evolution(bare)
    acc = _Acc()
    merged = pa.schema(_fields(list(current), list(bare), "", acc))
    return Evolution(merged, tuple(acc.changes), tuple(acc.conflicts), acc.conform, tuple(acc.columns))


def load(output: Location) -> OutputSchema | None:
    """The output's recorded schema (from :data:`SUMMARY_NAME`), or None when it has none (no plan published by a
    version that records one)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    summary = output / SUMMARY_NAME
    if not summary.exists():
        return None
    schema = pq.read_schema(pa.BufferReader(summary.read_bytes()))
    meta = json.loads((schema.metadata or {}).get(META_KEY, b"{}"))
    return OutputSchema(schema.remove_metadata(), int(meta.get("version", 1)), str(meta.get("plan_id", "")),
                        str(meta.get("readers", "")))  # fmt: skip


def record(output: Location, schema: pa.Schema, *, version: int, plan_id: str, readers: str,
           changes: Sequence[str]) -> None:  # fmt: skip
    """Write the output's schema to its root: :data:`CARRIER_NAME` (no rows) and :data:`SUMMARY_NAME`, each
    atomically (a temporary file and a rename locally, one PUT on an object store)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    doc = {"version": version, "plan_id": plan_id, "readers": readers, "changes": list(changes)}
    tagged = schema.with_metadata({META_KEY: json.dumps(doc).encode()})
    carrier = pa.BufferOutputStream()
    pq.write_table(tagged.empty_table(), carrier)
    summary = pa.BufferOutputStream()
    pq.write_metadata(tagged, summary)
    (output / CARRIER_NAME).write_bytes(carrier.getvalue().to_pybytes())
    (output / SUMMARY_NAME).write_bytes(summary.getvalue().to_pybytes())


def data_files(root: Path, skip: str) -> list[Path]:
    """The Parquet data files of a plan folder being sealed (``skip``: the quarantine's folder name)."""
    return sorted(p for p in root.rglob("*.parquet") if p.relative_to(root).parts[0] != skip)


def folder_keys(root: Path, files: Sequence[Path]) -> frozenset[str]:
    """The columns every one of ``files`` (under ``root``) holds in its folder names (``key=value/``), not in the
    file: a layout's partition columns (``topic``, ``date``, ``timestamp_hour``...)."""
    keys: frozenset[str] | None = None
    for f in files:
        found = frozenset(part.split("=", 1)[0] for part in f.relative_to(root).parts[:-1] if "=" in part)
        keys = found if keys is None else keys & found
    return keys or frozenset()


def in_folders(plan: pa.Schema, current: pa.Schema | None, keys: frozenset[str]) -> pa.Schema:
    """``plan`` with the output's columns that the plan holds in its folder names (``keys``): those are neither
    missing from the plan nor to be written into its files (:func:`without`)."""
    import pyarrow as pa

    if current is None:
        return plan
    held = [current.field(n) for n in current.names if n in keys and n not in plan.names]
    return pa.schema([*plan, *held]) if held else plan


def without(schema: pa.Schema, keys: frozenset[str], plan: pa.Schema) -> pa.Schema:
    """``schema`` less the columns the plan holds only in its folder names: what its files are conformed to."""
    import pyarrow as pa

    return pa.schema([f for f in schema if f.name not in keys or f.name in plan.names])


def plan_schema(files: Sequence[Path]) -> pa.Schema | None:
    """The schema of a plan's data files (they share one: one staging path wrote them), None without files."""
    import pyarrow.parquet as pq

    schemas = {str(s): s for s in (pq.read_schema(f) for f in files)}
    if len(schemas) > 1:
        raise PublishError(f"the plan's data files have {len(schemas)} schemas; one plan is written with one")
    return next(iter(schemas.values())) if schemas else None


def conform(files: Sequence[Path], schema: pa.Schema) -> int:
    """Rewrite each of ``files`` whose columns are not ``schema``'s with exactly ``schema`` (missing columns null,
    narrower types cast to the wider one, which holds every value exactly); returns how many were rewritten."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rewritten = 0
    for path in files:
        table = pq.read_table(path)
        if table.schema.remove_metadata().equals(schema, check_metadata=False):
            continue
        columns = [
            table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
            for f in schema
        ]
        out = pa.Table.from_arrays(columns, schema=schema)
        tmp = path.with_name(f".{path.name}.conform")
        pq.write_table(out, tmp, coerce_timestamps="us", allow_truncated_timestamps=False)
        tmp.replace(path)
        # Spark's checksum sidecar of the file it wrote: Hadoop's local file system would refuse the new bytes.
        path.with_name(f".{path.name}.crc").unlink(missing_ok=True)
        rewritten += 1
    return rewritten


def arrow_of(schema: StructType, skip: set[str]) -> pa.Schema | None:
    """A Spark schema's columns (but ``skip``: those in folder names) as the Arrow types its Parquet files read
    back as; None when a type has no Arrow equivalent (the files are checked when published)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType as SparkStruct

    kept = SparkStruct([f for f in schema.fields if f.name not in skip])
    try:
        return pa.schema(list(to_arrow_schema(kept, timezone="UTC")))
    except (TypeError, ValueError, NotImplementedError):  # pyspark's PySparkTypeError is a TypeError
        return None


def readers_text(readers: Mapping[str, Mapping[str, Any]], fallback: str) -> str:
    """A plan's reader schemas as text for messages: ``subject 'x-value' version 2`` per part."""
    found = [f"subject '{r.get('subject')}' version {r.get('version')}" for _, r in sorted(readers.items())]
    return ", ".join(found) or fallback
