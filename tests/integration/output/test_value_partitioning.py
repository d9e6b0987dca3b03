"""Outputs partitioned by a field of the value, on the real cluster: its event time's day, and its value.

A JSON feed of orders (``order_ts`` a timestamp, ``order_ms`` the same instant in epoch
milliseconds, ``country`` a string; some of each null) runs into a Parquet folder and into an
Iceberg table (the SQLite catalog in the state dir, local Spark). Each time:

- the output equals an independent ``read_committed`` scan of the topic (the fault suite's
  ``scan``, parsed here with ``json``), nothing twice;
- each record is in the partition its field says, worked out here from the scanned value in
  UTC: the Parquet plan folder's Hive-style folders (which pyarrow's dataset reader
  discovers), the Iceberg data files' partition values (``inspect.files``), a null field in
  the null partition;
- the same plan staged twice (its first staging discarded) gives the same partitions holding
  the same records, and a rerun of a published plan publishes nothing again;
- changing the choice evolves the Iceberg table's spec; files written before keep theirs and
  stay readable.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tests.conftest import KafkaTestCluster
from tests.faults.harness import FaultEnv, scan
from tidemark.kafka.admin import Record
from tidemark.runs.pipeline import RunHandle, commit_run, plan_run

pytestmark = [pytest.mark.integration, pytest.mark.spark]

DDL = "id long NOT NULL, order_ts timestamp, order_ms long, country string"
COUNTRIES = ("DE", "FR", "US", None)
BASE = datetime(2026, 3, 1, 22, 30, tzinfo=UTC)  # runs of 7h steps cross UTC midnights
Key = tuple[int, int]  # (partition, offset)


@pytest.fixture
def fenv(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultEnv:
    env = FaultEnv(kafka, spark, tmp_path, "value-partitioning")
    env.install(monkeypatch)
    return env


def write_feed(fenv: FaultEnv, section: str, choice: Any, **more: Any) -> None:
    fenv.write_feed(
        deserialization={"format": "json", "schema_ddl": DDL},
        validation={"on_bad_records": "quarantine", "quarantine_max_ratio": 0.5},
        **{section: {"partition_by": choice, **more}},
    )


def produce_orders(fenv: FaultEnv, count: int) -> None:
    """``count`` orders numbered on from the last, 7 hours apart; every fifth has no ``order_ts``/``order_ms``."""
    records = []
    for i in range(fenv.sent, fenv.sent + count):
        when = BASE + timedelta(hours=7 * i, milliseconds=i)
        stamp = None if i % 5 == 4 else when
        doc = {"id": i, "country": COUNTRIES[i % len(COUNTRIES)],
               "order_ts": None if stamp is None else stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
               "order_ms": None if stamp is None else int(stamp.timestamp() * 1000)}  # fmt: skip
        records.append(Record(json.dumps(doc).encode(), key=f"k{i}".encode(), partition=i % fenv.partitions))
    fenv.sent += count
    fenv.kafka.produce(fenv.topic, records)


def scanned(fenv: FaultEnv) -> dict[Key, dict[str, Any]]:
    """The committed records as an independent read_committed consumer sees them, parsed with ``json``."""
    committed = fenv.committed()
    ranges = {(fenv.topic, p): (0, c or 0) for p, c in committed.items()}
    return {(row[1], row[2]): json.loads(value or b"null") for row, value in scan(fenv.kafka.connection, ranges)}


def day_of(doc: Mapping[str, Any]) -> str | None:
    """The UTC day of an order's ``order_ms`` (what ``order_ts`` says too), as the folder names it."""
    ms = doc["order_ms"]
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d")


# -- Parquet ---------------------------------------------------------------------------------------


def plan_folders(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("plan_id=*") if p.is_dir())


def folder_rows(plan: Path) -> dict[Key, tuple[dict[str, str], dict[str, Any]]]:
    """Every published row of a plan folder the manifest lists: its Hive folders (name -> value) and its columns."""
    manifest = json.loads((plan / "_manifest.json").read_text())
    found: dict[Key, tuple[dict[str, str], dict[str, Any]]] = {}
    for entry in manifest["files"]:
        if entry["path"].startswith("_quarantine"):
            continue
        folders = dict(part.split("=", 1) for part in Path(entry["path"]).parts[:-1])
        for row in pq.read_table(plan / entry["path"]).to_pylist():
            key = (row["partition"], row["offset"])
            assert key not in found, f"{key} published twice"
            found[key] = (folders, row)
    return found


def layout(files: list[Path], base: Path) -> dict[str, set[Key]]:
    """The records of each partition folder (relative to ``base``) of ``files``."""
    by_folder: dict[str, set[Key]] = {}
    for path in files:
        rows = pq.read_table(path, columns=["partition", "offset"]).to_pylist()
        by_folder.setdefault(str(path.parent.relative_to(base)), set()).update(
            (r["partition"], r["offset"]) for r in rows
        )
    return by_folder


def staged_twice(fenv: FaultEnv, read_layout: Any) -> tuple[RunHandle, dict[str, set[Key]], dict[str, set[Key]]]:
    """A run's plan staged by its job, its staging discarded, the same plan staged again: both layouts; then
    the run commits the second."""
    from tidemark.config.models import load_feed
    from tidemark.output import publisher_for

    handle = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.in_process(handle, fenv.kafka.connection)
    first = read_layout(handle)
    publisher_for(load_feed(fenv.feed)).discard(handle.plan().plan_id, handle.run_id)
    assert not read_layout(handle)
    fenv.in_process(handle, fenv.kafka.connection)
    second = read_layout(handle)
    assert commit_run(handle, fenv.kafka.connection, root=fenv.root).committed
    return handle, first, second


def test_parquet_partitioned_by_a_value_fields_day_then_by_its_value(fenv: FaultEnv) -> None:
    write_feed(fenv, "parquet", {"field": "order_ts", "granularity": "day"})
    produce_orders(fenv, 15)

    def pending_layout(handle: RunHandle) -> dict[str, set[Key]]:
        base = fenv.output / "_pending" / handle.run_id
        return layout(sorted(base.glob("plan_id=*/**/*.parquet")), base)

    handle, first, second = staged_twice(fenv, pending_layout)
    assert first == second and len(first) > 3  # the same partitions holding the same records

    expected = scanned(fenv)
    [plan] = plan_folders(fenv.output)
    rows = folder_rows(plan)
    assert {k: r["id"] for k, (_, r) in rows.items()} == {k: d["id"] for k, d in expected.items()}
    for key, (folders, row) in rows.items():
        day = day_of(expected[key])
        assert folders == {"order_ts_day": day or "__HIVE_DEFAULT_PARTITION__"}, (key, folders, expected[key])
        assert row["country"] == expected[key]["country"] and row["order_ms"] == expected[key]["order_ms"]
    # A Hive-style reader finds the partition column in the folder names.
    dataset = ds.dataset(plan, format="parquet", partitioning="hive", exclude_invalid_files=True)
    assert "order_ts_day" in dataset.schema.names and dataset.count_rows() == len(expected)

    # The published plan run again: found, nothing written.
    before = sorted(p.relative_to(plan) for p in plan.rglob("*"))
    job = fenv.in_process(handle, fenv.kafka.connection)
    assert job["reused"] and sorted(p.relative_to(plan) for p in plan.rglob("*")) == before
    assert len(plan_folders(fenv.output)) == 1

    write_feed(fenv, "parquet", {"field": "country"})
    produce_orders(fenv, 8)
    _, _, outcome = fenv.run()
    assert outcome.committed
    expected = scanned(fenv)
    newest = next(p for p in plan_folders(fenv.output) if p != plan)
    rows = folder_rows(newest)
    assert len(rows) == 8
    for key, (folders, row) in rows.items():
        assert folders == {"country_value": expected[key]["country"] or "__HIVE_DEFAULT_PARTITION__"}
        assert row["country"] == expected[key]["country"]  # the files keep the column; the folder is beside it
    dataset = ds.dataset(newest, format="parquet", partitioning="hive", exclude_invalid_files=True)
    table = dataset.to_table(columns=["partition", "offset", "country"])
    countries = {(r["partition"], r["offset"]): r["country"] for r in table.to_pylist()}
    assert countries == {k: expected[k]["country"] for k in rows}

    # The Kafka timestamp's hour, as Hive folders too: timestamp_hour=<UTC hour>/topic=<topic>/.
    write_feed(fenv, "parquet", "hour")
    produce_orders(fenv, 4)
    fenv.run()
    expected = scanned(fenv)
    hourly = next(p for p in plan_folders(fenv.output) if p not in (plan, newest))
    rows_by_hour = folder_rows(hourly)
    assert len(rows_by_hour) == 4
    for folders, row in rows_by_hour.values():
        stamp = row["timestamp"].astimezone(UTC).strftime("%Y-%m-%d-%H")
        assert folders == {"timestamp_hour": stamp, "topic": fenv.topic} and "topic" not in row
    # Nothing twice across the plans, nothing missing: the scan of every committed offset.
    everything = {**folder_rows(plan), **rows, **rows_by_hour}
    assert {k: r["id"] for k, (_, r) in everything.items()} == {k: d["id"] for k, d in expected.items()}


# -- Iceberg ---------------------------------------------------------------------------------------


def table_of(fenv: FaultEnv) -> Any:
    from tidemark.config.models import load_feed
    from tidemark.output.iceberg import IcebergPublisher

    table = IcebergPublisher(load_feed(fenv.feed)).load()
    assert table is not None
    return table


def table_partitions(table: Any) -> dict[Key, tuple[int, dict[str, Any]]]:
    """Each row's data file's spec id and partition values, read from the table's own file list."""
    found: dict[Key, tuple[int, dict[str, Any]]] = {}
    for f in table.inspect.files().to_pylist():
        path = f["file_path"].removeprefix("file://")
        for row in pq.read_table(path, columns=["partition", "offset"]).to_pylist():
            key = (row["partition"], row["offset"])
            assert key not in found, f"{key} in two data files"
            found[key] = (f["spec_id"], dict(f["partition"]))
    return found


def assert_table_is_the_scan(fenv: FaultEnv) -> dict[Key, dict[str, Any]]:
    expected = scanned(fenv)
    rows = table_of(fenv).scan(selected_fields=("partition", "offset", "id", "country", "order_ms")).to_arrow()
    got = [((r["partition"], r["offset"]), r) for r in rows.to_pylist()]
    assert len(got) == len(dict(got)), "a record in the table twice"
    assert {k: (r["id"], r["country"], r["order_ms"]) for k, r in got} == {
        k: (d["id"], d["country"], d["order_ms"]) for k, d in expected.items()
    }
    return expected


def utc_date(doc: Mapping[str, Any]) -> date | None:
    """The UTC date of an order, as pyiceberg shows a ``day`` partition value."""
    ms = doc["order_ms"]
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).date()


def test_iceberg_partitioned_by_a_value_fields_day_then_its_value_evolves_the_spec(fenv: FaultEnv) -> None:
    from tidemark.output.iceberg import spec_of

    fenv.use_iceberg("tidemark.by_value")
    write_feed(fenv, "iceberg", {"field": "order_ts", "granularity": "day"}, table="tidemark.by_value")
    produce_orders(fenv, 15)

    def pending_layout(handle: RunHandle) -> dict[str, set[Key]]:
        pending = fenv.output.with_name(f"{fenv.output.name}.pending") / handle.run_id
        paths = [Path(p) for doc in pending.glob("*.json") for p in json.loads(doc.read_text())["paths"]]
        return layout(paths, fenv.output)

    handle, first, second = staged_twice(fenv, pending_layout)
    assert first == second and len(first) > 3
    table = table_of(fenv)
    assert spec_of(table) == {("order_ts", "day")}
    expected = assert_table_is_the_scan(fenv)
    parts = table_partitions(table)
    assert {k: p["order_ts_day"] for k, (_, p) in parts.items()} == {k: utc_date(d) for k, d in expected.items()}
    assert None in {p["order_ts_day"] for _, p in parts.values()}  # the null partition

    snapshots = len(table.snapshots())
    job = fenv.in_process(handle, fenv.kafka.connection)
    assert job["reused"] and len(table_of(fenv).snapshots()) == snapshots

    # By the field's value: the next commit evolves the spec; the day files keep theirs and stay readable.
    write_feed(fenv, "iceberg", {"field": "country"}, table="tidemark.by_value")
    produce_orders(fenv, 8)
    _, _, outcome = fenv.run()
    assert outcome.committed
    table = table_of(fenv)
    assert spec_of(table) == {("country", "identity")}
    expected = assert_table_is_the_scan(fenv)
    parts = table_partitions(table)
    current = table.spec().spec_id
    new = {k: p for k, (spec, p) in parts.items() if spec == current}
    old = {k: p for k, (spec, p) in parts.items() if spec != current}
    assert len(new) == 8 and len(old) == 15
    assert {k: p["country"] for k, p in new.items()} == {k: expected[k]["country"] for k in new}
    assert all(p["order_ts_day"] == utc_date(expected[k]) for k, p in old.items())

    # Epoch milliseconds by the hour: Iceberg's truncate of the long to whole hours.
    write_feed(fenv, "iceberg", {"field": "order_ms", "granularity": "hour"}, table="tidemark.by_value")
    produce_orders(fenv, 6)
    fenv.run()
    table = table_of(fenv)
    assert spec_of(table) == {("order_ms", "truncate[3600000]")}
    expected = assert_table_is_the_scan(fenv)
    hours = {k: p for k, (spec, p) in table_partitions(table).items() if spec == table.spec().spec_id}
    assert len(hours) == 6
    for key, p in hours.items():
        ms = expected[key]["order_ms"]
        assert p["order_ms_hour"] == (None if ms is None else ms - ms % 3_600_000)


def test_an_avro_feed_partitions_by_its_reader_schemas_field_and_a_missing_one_is_refused_before_staging(
    fenv: FaultEnv, registry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registry format's fields are known when a run reads the reader schema: a field it lacks fails the run naming
    the feed, the option and the value's fields, before anything is staged or committed; a field it has partitions
    (here ``id`` truncated to even numbers, ``id_trunc=<n>/`` folders beside the column)."""
    from tidemark.errors import TidemarkError

    monkeypatch.setenv("TIDEMARK_SCHEMA_REGISTRY_URL", registry)
    fenv.use_avro(registry)
    fenv.write_feed(parquet={"partition_by": {"field": "order_ts", "granularity": "day"}})
    fenv.produce_avro(6)
    with pytest.raises(TidemarkError) as err:
        fenv.run()
    message = str(err.value)
    assert "parquet.partition_by: 'order_ts' is not a field of the decoded value" in message, message
    assert "id, name" in message and f"feed '{fenv.feed}'" in message
    assert set(fenv.committed().values()) == {None} and not plan_folders(fenv.output) and not fenv.staged()

    fenv.write_feed(parquet={"partition_by": {"field": "id", "truncate": 2}})
    _, _, outcome = fenv.run()
    assert outcome.committed
    [plan] = plan_folders(fenv.output)
    rows = folder_rows(plan)
    assert sorted(r["id"] for _, r in rows.values()) == list(range(6))
    assert all(folders == {"id_trunc": str(r["id"] - r["id"] % 2)} for folders, r in rows.values())


def test_iceberg_never_mixes_an_empty_string_and_null_in_one_file_so_every_filter_finds_its_rows(
    fenv: FaultEnv,
) -> None:
    """``""`` and null are two partition values: Spark's folders used to put both in one file, whose partition value
    (from its column statistics) was ``""``, so ``IsNull`` missed the nulls. Each filter is checked with pyiceberg's
    own scan against the scan of the topic, on both sides of the empty string (``""`` against ``" "`` and null)."""
    from pyiceberg.expressions import EqualTo, GreaterThanOrEqual, IsNull, LessThan, NotNull

    fenv.use_iceberg("tidemark.empty_or_null")
    write_feed(fenv, "iceberg", {"field": "country"}, table="tidemark.empty_or_null")
    countries = ("DE", "", None, " ", "", None, "FR", None)
    records = [
        Record(json.dumps({"id": i, "country": countries[i % len(countries)], "order_ts": None, "order_ms": None})
               .encode(), key=f"k{i}".encode(), partition=i % fenv.partitions)
        for i in range(24)
    ]  # fmt: skip
    fenv.kafka.produce(fenv.topic, records)
    _, _, outcome = fenv.run()
    assert outcome.committed
    expected = assert_table_is_the_scan(fenv)
    table = table_of(fenv)

    for path_partition in table_partitions(table).values():  # every data file holds one partition value
        assert path_partition[1]["country"] in {"DE", "", None, " ", "FR"}
    files = table.inspect.files().to_pylist()
    for f in files:
        values = set(pq.read_table(f["file_path"].removeprefix("file://"), columns=["country"]).column(0).to_pylist())
        assert values == {f["partition"]["country"]}, (f["file_path"], values, f["partition"])

    def found(row_filter: Any) -> set[Key]:
        rows = table.scan(row_filter=row_filter, selected_fields=("partition", "offset")).to_arrow().to_pylist()
        return {(r["partition"], r["offset"]) for r in rows}

    def where(test: Any) -> set[Key]:
        return {k for k, d in expected.items() if test(d["country"])}

    assert found(IsNull("country")) == where(lambda c: c is None) and len(where(lambda c: c is None)) == 9
    assert found(NotNull("country")) == where(lambda c: c is not None)
    assert found(EqualTo("country", "")) == where(lambda c: c == "") and len(where(lambda c: c == "")) == 6
    assert found(EqualTo("country", " ")) == where(lambda c: c == " ")
    assert found(LessThan("country", " ")) == where(lambda c: c is not None and c < " ")  # "" only
    assert found(GreaterThanOrEqual("country", " ")) == where(lambda c: c is not None and c >= " ")


def test_parquet_partition_values_read_back_exactly_with_pyarrow_and_spark(fenv: FaultEnv, spark: Any) -> None:
    """Partitioned by a string field, ``""`` and null get their own folders and the column stays in the files, so
    every documented reader (pyarrow's dataset with Hive partitioning and without, ``pq.read_table``, Spark's
    ``spark.read.parquet``) gets each value exactly, of type string, as the scan of the topic has it: ``""`` is not
    null, ``"02134"`` is not the integer 2134. Both sides of the empty string: ``" "`` and null."""
    import pyarrow as pa

    write_feed(fenv, "parquet", {"field": "country"})
    countries = ("02134", "", None, "10001", " ", "", "00501", None, "a/b=c%")  # zip codes, "" and null, " ", escapes
    records = [
        Record(json.dumps({"id": i, "country": countries[i % len(countries)], "order_ts": None, "order_ms": None})
               .encode(), key=f"k{i}".encode(), partition=i % fenv.partitions)
        for i in range(27)
    ]  # fmt: skip
    fenv.kafka.produce(fenv.topic, records)
    _, _, outcome = fenv.run()
    assert outcome.committed
    expected = {k: d["country"] for k, d in scanned(fenv).items()}
    assert len(expected) == 27 and {"", None, "02134", " "} <= set(expected.values())
    [plan] = plan_folders(fenv.output)

    # Each folder holds one value, "" and null apart; the files keep the column, exactly.
    by_folder: dict[str, set[str | None]] = {}
    for key, (folders, row) in folder_rows(plan).items():
        assert "country" in row and row["country"] == expected[key], (key, row, expected[key])
        [(name, folder)] = folders.items()
        assert name == "country_value", folders
        by_folder.setdefault(folder, set()).add(row["country"])
    assert all(len(values) == 1 for values in by_folder.values()), by_folder
    assert by_folder["__HIVE_DEFAULT_PARTITION__"] == {None} and by_folder["__TIDEMARK_EMPTY_STRING__"] == {""}

    def exact(table: pa.Table) -> None:
        assert table.schema.field("country").type == pa.string(), table.schema
        got = {(r["partition"], r["offset"]): r["country"] for r in table.to_pylist()}
        assert got == expected

    columns = ["partition", "offset", "country"]
    for partitioning in ("hive", None):
        exact(ds.dataset(plan, format="parquet", partitioning=partitioning).to_table(columns=columns))
    exact(pq.read_table(plan, columns=columns))
    # The documented pruning recipe: the folder column read as strings, escapes decoded; "" and null as escaped.
    strings = ds.partitioning(pa.schema([("country_value", pa.string())]), flavor="hive")
    folders = ds.dataset(plan, format="parquet", partitioning=strings).to_table(columns=["country", "country_value"])
    assert {(r["country"], r["country_value"]) for r in folders.to_pylist()} == {
        (c, "__TIDEMARK_EMPTY_STRING__" if c == "" else c) for c in expected.values()
    }
    frame = spark.read.parquet(str(plan))
    assert dict(frame.dtypes)["country"] == "string", frame.dtypes
    exact(pa.Table.from_pylist([r.asDict() for r in frame.select(*columns).collect()]))
