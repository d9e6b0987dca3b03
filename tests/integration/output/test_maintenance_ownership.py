"""Maintenance deletes only what its table owns, and no interrupt makes it delete a file a kept snapshot names.

Real pyiceberg tables in the SQLite catalog of a scratch state dir (no Kafka, no Spark: the rows
are the test's own, so the oracle is the list of rows it appended). Each table gets several
appends, so compaction has small files and expiry keeps several snapshots: orphan removal is
judged against older kept snapshots, which still name the small files compaction replaced.

- Beside the feed's table, inside its location, sit what the load-time refusal keeps out but
  maintenance must survive on its own: another table (at a subfolder, inside ``data/``, and at
  the very same location), another feed's pending record, a Parquet feed's publication, a
  quarantine folder. After maintenance every one of them reads as before (pyiceberg, pyarrow).
- ``tidemark maintain`` runs as a subprocess and gets a real SIGINT at each of maintenance's
  fault points; the table then scans (every kept snapshot too) equal to the oracle, and a second
  run finishes the job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([pa.field("topic", pa.string()), pa.field("partition", pa.int32()), pa.field("offset", pa.int64())])
SETTINGS = {"min_input_files": 2, "keep_snapshots": 3, "snapshot_max_age": "1s", "orphan_min_age": "1h"}


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
    from tidemark.output import iceberg

    paths = {"state": tmp_path / "state", "feeds": tmp_path / "feeds", "lake": tmp_path / "lake"}
    for p in paths.values():
        p.mkdir()
    monkeypatch.setenv("TIDEMARK_STATE_DIR", str(paths["state"]))
    monkeypatch.setenv("TIDEMARK_FEEDS_DIR", str(paths["feeds"]))
    for name in ("TIDEMARK_ICEBERG_CATALOG_URI", "TIDEMARK_ICEBERG_CATALOG_TYPE", "TIDEMARK_CHECKPOINT_URL",
                 "TIDEMARK_FAULTS"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    iceberg._catalog.cache_clear()
    yield paths
    iceberg._catalog.cache_clear()


def rows(start: int, count: int) -> pa.Table:
    return pa.table(
        {"topic": ["t"] * count, "partition": [0] * count, "offset": list(range(start, start + count))},
        schema=SCHEMA,
    )


def new_table(name: str, location: Path, appends: int, per: int = 10, first: int = 0) -> list[int]:
    """A table at ``location`` with ``appends`` snapshots of ``per`` rows each; the offsets appended."""
    from tidemark.output.iceberg import NO_RETRY, open_catalog

    catalog = open_catalog()
    catalog.create_namespace_if_not_exists(name.split(".")[0])
    table = catalog.create_table(name, schema=SCHEMA, location=str(location), properties=NO_RETRY)
    with table.transaction() as tx:  # as add_files sets it on Tidemark's tables: compaction writes no field ids
        tx.set_properties({"schema.name-mapping.default": table.schema().name_mapping.model_dump_json()})
    table = table.refresh()
    for i in range(appends):
        table.append(rows(first + i * per, per))
        table = table.refresh()
    return sorted(table.scan().to_arrow().column("offset").to_pylist())


def offsets(name: str, snapshot_id: int | None = None) -> list[int]:
    from tidemark.output.iceberg import open_catalog

    table = open_catalog().load_table(name)
    return sorted(table.scan(snapshot_id=snapshot_id).to_arrow().column("offset").to_pylist())


def kept_snapshots_scan(name: str) -> dict[int, list[int]]:
    """Every snapshot still in the table, scanned (a missing file raises)."""
    from tidemark.output.iceberg import open_catalog

    table = open_catalog().load_table(name)
    return {s.snapshot_id: offsets(name, s.snapshot_id) for s in table.snapshots()}


def write_feed(env: dict[str, Path], name: str, **more: Any) -> Path:
    doc = {"topics": ["t"], "group": f"g-{name}", "output": str(env["lake"] / name), "output_format": "iceberg",
           "iceberg": {"table": f"lake.{name}"}, "maintenance": SETTINGS, **more}  # fmt: skip
    path = env["feeds"] / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def age(root: Path, hours: float = 3) -> None:
    """Every file under ``root`` made ``hours`` old (orphan removal judges by age)."""
    then = time.time() - hours * 3600
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, (then, then))


def parquet_publication(folder: Path, first: int) -> pa.Table:
    """A Parquet feed's publication (a plan folder with its manifest) or a quarantine folder: what must survive."""
    data = rows(first, 5)
    plan = folder / "plan_id=abc"
    plan.mkdir(parents=True)
    pq.write_table(data, plan / "part-00000.parquet")
    (plan / "_manifest.json").write_text(json.dumps({"plan_id": "abc", "files": ["part-00000.parquet"]}))
    return data


NEIGHBOURS = ["table-in-subfolder", "table-in-data", "table-at-same-location", "pending-record", "parquet-output",
              "parquet-output-in-data", "quarantine", "quarantine-in-data"]  # fmt: skip


@pytest.mark.parametrize("neighbour", NEIGHBOURS)
def test_maintenance_deletes_only_its_own_tables_files(env: dict[str, Path], neighbour: str) -> None:
    from tidemark.checkpoints.store import open_store
    from tidemark.config.models import parse_feed
    from tidemark.output.maintenance import maintain

    location = env["lake"] / "orders"
    doc = yaml.safe_load(write_feed(env, "orders").read_text())
    feed = parse_feed("orders", doc, "orders.yaml")  # loaded alone: maintenance must be safe without the refusal
    expected = new_table("lake.orders", location, appends=6)
    history = kept_snapshots_scan("lake.orders")

    other: dict[str, Any] = {}
    if neighbour.startswith("table"):
        at = {"table-in-subfolder": location / "other", "table-in-data": location / "data" / "other",
              "table-at-same-location": location}[neighbour]  # fmt: skip
        other["table"] = new_table("lake.other", at, appends=3, first=5000)
    elif neighbour == "pending-record":  # a feed named orders.pending would have its location here
        record = location / "20260101T000000Z-abcdef" / "plan_id=abc.json"
        record.parent.mkdir(parents=True)
        record.write_text(json.dumps({"paths": [], "manifest": {}}))
        other["pending"] = record
    else:
        places = {"parquet-output": location / "pq", "parquet-output-in-data": location / "data" / "pq",
                  "quarantine": location / "quarantine", "quarantine-in-data": location / "data" / "q"}  # fmt: skip
        folder = places[neighbour]
        other["parquet"] = (folder, parquet_publication(folder, 9000))

    # The table's own orphans: one old (removed), one young (kept), and one of a run the run ledger holds open (kept).
    own = location / "data" / "orphan-00000.parquet"
    pq.write_table(rows(0, 1), own)
    store = open_store(root=env["state"])
    store.set_run("g-orders", "run-open", feed="orders", plan_id="openplan", state="committed", run_dir="x")
    uploaded = location / "data" / "openplan-1a2b3c4d-00000.parquet"
    pq.write_table(rows(0, 1), uploaded)
    age(env["lake"])
    young = location / "data" / "young-00000.parquet"
    pq.write_table(rows(0, 1), young)

    later = datetime.now(UTC) + timedelta(minutes=30)  # old files 3h old: past orphan_min_age (1h); young ones not
    report = maintain(feed, now=later, store=store)

    # first what is not the table's: it reads as before
    if "table" in other:
        assert offsets("lake.other") == other["table"]
        assert all(v == offsets("lake.other", s) for s, v in kept_snapshots_scan("lake.other").items())
    if "pending" in other:
        assert other["pending"].exists()
    if "parquet" in other:
        folder, data = other["parquet"]
        assert pq.read_table(folder / "plan_id=abc" / "part-00000.parquet").equals(data)
        assert (folder / "plan_id=abc" / "_manifest.json").exists()
    assert report.files_rewritten == 6 and report.snapshots_expired == 4, report  # 7 snapshots, 3 kept
    assert offsets("lake.orders") == expected
    kept = kept_snapshots_scan("lake.orders")  # older kept snapshots still name the compacted small files
    assert len(kept) == 3 and all(history[s] == v for s, v in kept.items() if s in history)
    if neighbour == "table-at-same-location":  # its metadata in ours: nothing there is provably ours alone
        assert own.exists() and report.orphans_removed == 0
        assert any("metadata of another table" in n for n in report.notes), report.notes
    else:
        assert not own.exists() and report.orphans_removed >= 1
    assert young.exists() and uploaded.exists()


def test_the_dead_letter_tables_orphans_are_judged_in_its_own_location(env: dict[str, Path]) -> None:
    """The dead-letter table is listed at its own location; a file beside it (the data table's) is not its to take."""
    from tidemark.config.models import load_feed
    from tidemark.output.maintenance import maintain

    write_feed(env, "orders")
    feed = load_feed("orders")
    expected = new_table("lake.orders", env["lake"] / "orders", appends=3)
    dead = new_table("lake.orders_dead_letters", env["lake"] / "orders.dead_letters", appends=3)
    orphan = env["lake"] / "orders.dead_letters" / "data" / "orphan.parquet"
    pq.write_table(rows(0, 1), orphan)
    age(env["lake"])

    report = maintain(feed, now=datetime.now(UTC) + timedelta(minutes=90))

    assert report.dead_letter_orphans_removed == 1 and not orphan.exists()
    assert offsets("lake.orders") == expected and offsets("lake.orders_dead_letters") == dead


POINTS = ["maintenance.after_rewrite", "maintenance.after_compaction", "maintenance.after_expiry",
          "maintenance.before_orphans", "maintenance.after_orphan"]  # fmt: skip


@pytest.mark.parametrize("point", POINTS)
def test_a_sigint_at_each_maintenance_step_never_deletes_a_file_a_kept_snapshot_names(
    env: dict[str, Path], point: str
) -> None:
    location = env["lake"] / "orders"
    write_feed(env, "orders")
    expected = new_table("lake.orders", location, appends=6)
    pq.write_table(rows(0, 1), location / "data" / "orphan-00000.parquet")
    age(env["lake"])
    time.sleep(1.1)  # every snapshot older than snapshot_max_age (1s)

    cmd = [sys.executable, "-m", "tidemark.cli", "maintain", "orders"]
    interrupted = subprocess.run(cmd, env={**os.environ, "TIDEMARK_FAULTS": f"{point}:sigint"}, capture_output=True,
                                 text=True, timeout=300)  # fmt: skip

    assert interrupted.returncode == 130, interrupted.stdout + interrupted.stderr  # the CLI's answer to Ctrl-C
    assert offsets("lake.orders") == expected  # pyiceberg scans the current snapshot: every file it names exists
    kept = kept_snapshots_scan("lake.orders")  # every kept snapshot scans, each holding the rows appended up to it
    assert kept and all(v == expected[: len(v)] for v in kept.values())
    again = subprocess.run(cmd, env=dict(os.environ), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert offsets("lake.orders") == expected
    kept_snapshots_scan("lake.orders")
    assert not (location / "data" / "orphan-00000.parquet").exists()
