"""The Iceberg publisher on a real SQLite catalog and Spark: table shape, snapshot summary, reruns, refusals.

One module-scoped setup stages records the way the job does (Parquet partitioned by
outcome, topic and date) for two consecutive plans and publishes the first; the tests
then read the real table back with pyiceberg (catalog in the state dir's SQLite file,
table under the feed's output folder). A job outside any run commits at once and appends
its dead letters to the feed's dead-letter table right after, once, whatever crash between
the two commits and reruns come.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tidemark.config.models import Feed, parse_feed
from tidemark.errors import PublishError
from tidemark.faults import FAULTS_ENV, InjectedFault
from tidemark.job.stage import quarantine_writer
from tidemark.output import publisher_for
from tidemark.output.base import Manifest, StagedRecords
from tidemark.output.iceberg import (
    GROUP_KEY,
    PLAN_KEY,
    RANGES_KEY,
    RUN_KEY,
    IcebergPublisher,
    commit_files,
    plan_history,
)
from tidemark.planning.plan import Plan
from tidemark.planning.resolve import Observed, PartitionSnapshot, PlanRequest, Policy, build_plan
from tidemark.spark.source import SCHEMA
from tidemark.spark.stats import RangeStats
from tidemark.staged import OK_OUTCOME, OUTCOME_COLUMN

pytestmark = [pytest.mark.integration, pytest.mark.spark]

BAD_REASON = "expect_column_values_to_match_regex(value)"
DAY = datetime(2026, 11, 22, 23, 59, 58, tzinfo=UTC)  # records straddle midnight: two date partitions


def _plan(feed: Feed, starts: dict[tuple[str, int], int], ends: dict[tuple[str, int], int]) -> Plan:
    snaps = [
        PartitionSnapshot(topic=t, partition=p, leader=1, committed=starts[(t, p)], checkpoint=None, log_start=0,
                          high_watermark=ends[(t, p)], last_stable=ends[(t, p)])
        for (t, p) in sorted(starts)
    ]  # fmt: skip
    return build_plan(PlanRequest(feed.name, feed.group, Policy.from_feed(feed), DAY), Observed(tuple(snaps)))


def _rows(plan: Plan, bad: set[tuple[str, int]]) -> list[dict[str, Any]]:
    rows = []
    for part in plan.partitions:
        for offset in range(part.start, part.end):
            ts = DAY + timedelta(seconds=offset)
            rows.append({
                "topic": part.topic, "partition": part.partition, "offset": offset, "timestamp": ts,
                "timestamp_type": 0, "key": b"k", "value": f"{part.topic}-{offset}".encode(), "headers": [],
                "date": ts.date(),
                OUTCOME_COLUMN: "rules-1" if (part.topic, offset) in bad else OK_OUTCOME,
            })  # fmt: skip
    return rows


@dataclass
class Setup:
    spark: Any
    feed: Feed
    publisher: IcebergPublisher
    first: Plan
    second: Plan
    manifest: Manifest
    tmp: Path

    def publish(
        self,
        plan: Plan,
        bad: set[tuple[str, int]] = frozenset(),  # type: ignore[assignment]
        run_id: str = "run-1",
    ) -> Manifest:
        """Stage ``plan``'s records as the job does for run ``run_id``, then promote them as its commit step does.

        The job's publication is pending (data files uploaded, a pending record beside the
        table, no snapshot) until :meth:`IcebergPublisher.promote` commits it. A plan already
        in the table's history is found when staging: nothing is staged, the found record is
        returned (``reused``).
        """
        staged = self.stage(plan, bad, run_id)
        if staged.reused:
            assert self.publisher.staged(plan.plan_id, run_id) is None  # nothing pending was written
            return staged
        pending = self.publisher.staged(plan.plan_id, run_id)
        assert pending is not None and (pending.files, pending.records) == (staged.files, staged.records)
        assert self.publisher.published(plan.plan_id) is None  # pending: in no snapshot yet
        shown = self.publisher.promote(plan.plan_id, run_id)
        assert self.publisher.staged(plan.plan_id, run_id) is None  # the pending record went with the commit
        return shown

    def stage(self, plan: Plan, bad: set[tuple[str, int]], run_id: str | None) -> Manifest:
        """Stage ``plan``'s records as the job does, then publish them pending for ``run_id`` through the publisher
        (``None``: a job outside any run, which commits at once)."""
        from pyspark.sql.types import DateType, StringType, StructField, StructType

        publisher = publisher_for(self.feed, plan)
        staging = publisher.new_staging(plan.plan_id)
        fields = [f for f in SCHEMA.fields if f.name != "plan_id"]
        schema = StructType([*fields, StructField("date", DateType()), StructField(OUTCOME_COLUMN, StringType())])
        rows = _rows(plan, set(bad))
        df = self.spark.createDataFrame(rows, schema)
        df.write.partitionBy(OUTCOME_COLUMN, "topic", "date").parquet(str(staging.written))
        published_schema = StructType([f for f in schema.fields if f.name != OUTCOME_COLUMN])

        def read_good(source: Path) -> Any:
            return self.spark.read.schema(published_schema).parquet(str(source)).select(*published_schema.names)

        stats = [RangeStats(p.topic, p.partition, p.start, p.end, p.records, None, None, 0, None, None, 0, "")
                 for p in plan.partitions]  # fmt: skip
        good = sum(1 for r in rows if r[OUTCOME_COLUMN] == OK_OUTCOME)
        return publisher.publish_staged(
            staging, plan, self.feed, staged=StagedRecords(
                OUTCOME_COLUMN, OK_OUTCOME, published_schema, read_good, unpublished=(),
                write_quarantine=quarantine_writer(self.spark, published_schema, {"rules-1": BAD_REASON}.__getitem__),
            ),
            stats=stats, extra={}, expect_records=good, expect_quarantined=len(rows) - good, run_id=run_id,
        )  # fmt: skip


@pytest.fixture(scope="module")
def setup(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("iceberg")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIDEMARK_STATE_DIR", str(tmp / "state"))  # the catalog: SQLite in the state dir
        patch.delenv("TIDEMARK_ICEBERG_CATALOG_URI", raising=False)
        patch.setenv("TIDEMARK_STAGING_DIR", str(tmp / "staging"))
        feed = parse_feed("ice", {"topics": ["t1", "t2"], "group": "g-ice", "output": str(tmp / "lake" / "ice"),
                                  "output_format": "iceberg", "iceberg": {"table": "lake.ice"}}, "test")  # fmt: skip
        first = _plan(feed, {("t1", 0): 0, ("t2", 0): 0}, {("t1", 0): 4, ("t2", 0): 3})
        second = _plan(feed, {("t1", 0): 4, ("t2", 0): 3}, {("t1", 0): 6, ("t2", 0): 5})
        publisher = publisher_for(feed)
        assert isinstance(publisher, IcebergPublisher)
        box = Setup(spark, feed, publisher, first, second, None, tmp)  # type: ignore[arg-type]
        box.manifest = box.publish(first, bad={("t2", 1)})
        yield box


def test_the_table_is_created_from_the_schema_partitioned_by_date_and_topic(setup: Setup) -> None:
    table = setup.publisher.load()
    assert table is not None and table.location() == str(setup.tmp / "lake" / "ice")
    assert [f.name for f in table.schema().fields] == [
        "topic", "partition", "offset", "timestamp", "timestamp_type", "key", "value", "headers", "date",
    ]  # fmt: skip
    assert str(table.schema().find_field("timestamp").field_type) == "timestamptz"
    spec = table.spec()
    assert [(f.name, str(f.transform)) for f in spec.fields] == [("date", "identity"), ("topic", "identity")]
    assert table.properties["commit.retry.num-retries"] == "0"
    # Every data file holds one (date, topic), both as columns, timestamps as INT64 micros.
    files = list(table.inspect.files().to_pylist())
    assert {(str(f["partition"]["date"]), f["partition"]["topic"]) for f in files} == {
        ("2026-11-22", "t1"), ("2026-11-23", "t1"), ("2026-11-22", "t2"), ("2026-11-23", "t2"),
    }  # fmt: skip
    for f in files:
        meta = pq.read_metadata(f["file_path"])
        names = [meta.schema.column(i).name for i in range(meta.num_columns)]
        assert "topic" in names and "date" in names
        ts = meta.schema.column(names.index("timestamp"))
        assert ts.physical_type == "INT64" and "timeUnit=microseconds" in str(ts.logical_type), ts


def test_one_snapshot_holds_exactly_the_good_records_and_names_the_plan(setup: Setup) -> None:
    table = setup.publisher.load()
    assert table is not None
    (snapshot,) = plan_history(table)
    summary = snapshot.summary
    assert summary is not None
    assert summary[PLAN_KEY] == setup.first.plan_id and summary[GROUP_KEY] == "g-ice" and summary[RUN_KEY] == "run-1"
    assert json.loads(summary[RANGES_KEY]) == [
        {"topic": "t1", "partition": 0, "start": 0, "end": 4, "records": 4},
        {"topic": "t2", "partition": 0, "start": 0, "end": 3, "records": 3},
    ]
    assert summary["added-records"] == "6" and summary["tidemark.quarantined"] == "1"
    rows = table.scan().to_arrow().select(["topic", "partition", "offset", "value", "date"]).to_pylist()
    expected = [(r["topic"], r["offset"]) for r in _rows(setup.first, set()) if (r["topic"], r["offset"]) != ("t2", 1)]
    assert sorted((r["topic"], r["offset"]) for r in rows) == sorted(expected)
    assert all(r["value"] == f"{r['topic']}-{r['offset']}".encode() for r in rows)
    assert {r["date"] for r in rows} == {date(2026, 11, 22), date(2026, 11, 23)}
    # The quarantined record: in the sibling Parquet folder, not in the table.
    quarantine = setup.tmp / "lake" / "ice.quarantine" / "run_id=run-1" / f"plan_id={setup.first.plan_id}"
    bad = [pq.read_table(p).to_pylist() for p in sorted(quarantine.rglob("*.parquet"))]
    assert [(r["offset"], r["_reason"]) for rows_ in bad for r in rows_] == [(1, BAD_REASON)]
    assert setup.manifest.records == 6 and setup.manifest.quarantined == 1 and not setup.manifest.reused


def test_publishing_a_plan_already_in_the_history_adds_nothing(setup: Setup) -> None:
    found = setup.publisher.published(setup.first.plan_id)
    assert found is not None and found.reused and found.records == 6
    assert setup.publisher.published(setup.second.plan_id) is None
    again = setup.publish(setup.first, bad={("t2", 1)})
    table = setup.publisher.load()
    assert table is not None
    assert again.reused and len(table.snapshots()) == 1 and table.scan().to_arrow().num_rows == 6


def test_a_commit_on_a_table_that_changed_since_it_was_read_is_refused_not_rebased(setup: Setup) -> None:
    stale = setup.publisher.load()
    assert stale is not None
    later = setup.publish(setup.second)  # another writer commits after `stale` was read
    assert not later.reused
    # A data file this writer had ready (under the table's location, not committed anywhere).
    source = sorted((setup.tmp / "lake" / "ice" / "data").rglob("*.parquet"))[0]
    extra = source.with_name("extra-writer.parquet")
    extra.write_bytes(source.read_bytes())
    with pytest.raises(PublishError, match=r"lake\.ice: the commit of plan other-plan was refused") as refused:
        commit_files(stale, [str(extra)], {PLAN_KEY: "other-plan"}, "lake.ice")
    assert "not retried" in str(refused.value)
    table = setup.publisher.load()
    assert table is not None
    assert [s.summary[PLAN_KEY] for s in plan_history(table) if s.summary] == [
        setup.second.plan_id, setup.first.plan_id,
    ]  # fmt: skip
    assert str(extra) not in {f["file_path"] for f in table.inspect.files().to_pylist()}
    # The group's position from the table's history: the newest snapshot's ends.
    position = setup.publisher.positions(setup.feed)
    assert position is not None and dict(position.ends) == {("t1", 0): 6, ("t2", 0): 5}
    assert position.details["plan_id"] == setup.second.plan_id


def test_backfills_of_an_iceberg_feed_publish_parquet_beside_it(setup: Setup) -> None:
    from dataclasses import replace

    from tidemark.output.parquet import ParquetPublisher

    backfill = replace(setup.first, output=str(setup.feed.output_for("backfill")))
    chosen = publisher_for(setup.feed, backfill)
    assert isinstance(chosen, ParquetPublisher) and chosen.location == setup.feed.output_for("backfill")


def test_a_job_outside_any_run_appends_its_dead_letters_once_through_a_crash_between_its_two_commits(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job commits the data at once, then dies before the dead letters' append; its rerun finds the plan in
    the table, writes no data, and appends the dead letters; a further rerun appends nothing. The feed names a
    dead-letter table of its own (``iceberg.dead_letters``): neither feed lists the other's rows."""
    from tidemark.output.deadletters import dead_letters

    feed = parse_feed("ice_dl", {"topics": ["t1", "t2"], "group": "g-ice-dl", "output": str(setup.tmp / "lake" / "dl"),
                                 "output_format": "iceberg",
                                 "iceberg": {"table": "lake.ice_dl", "dead_letters": "lake.ice_dl_bad"}},
                      "test")  # fmt: skip
    publisher = publisher_for(feed)
    assert isinstance(publisher, IcebergPublisher) and publisher.dead_letters_name == "lake.ice_dl_bad"
    assert setup.publisher.dead_letters_name == "lake.ice_dead_letters"  # the default, <table>_dead_letters
    plan = _plan(feed, {("t1", 0): 0, ("t2", 0): 0}, {("t1", 0): 4, ("t2", 0): 3})
    job = Setup(setup.spark, feed, publisher, plan, plan, None, setup.tmp)  # type: ignore[arg-type]
    bad = {("t1", 2), ("t2", 1)}

    def dead_rows() -> list[tuple[str, int, str | None, tuple[str, ...]]]:
        table = publisher.dead_letter_table()
        rows = [] if table is None else table.scan().to_arrow().to_pylist()
        return sorted((r["topic"], r["offset"], r["plan_id"], tuple(r["reason_codes"])) for r in rows
                      if r["feed"] == feed.name)  # fmt: skip

    theirs = [(d.topic, d.offset) for d in dead_letters(setup.feed)]
    assert theirs == [("t2", 1)]  # the module feed's own dead letter, appended by its promotion

    monkeypatch.setenv(FAULTS_ENV, "iceberg.before_dead_letters")
    with pytest.raises(InjectedFault):
        job.stage(plan, bad, None)
    monkeypatch.delenv(FAULTS_ENV)
    assert publisher.published(plan.plan_id) is not None and dead_rows() == []
    expected = [("t1", 2, plan.plan_id, (BAD_REASON,)), ("t2", 1, plan.plan_id, (BAD_REASON,))]
    for _ in range(2):
        again = job.stage(plan, bad, None)
        assert again.reused and dead_rows() == expected
    table = publisher.load()
    dead = publisher.dead_letter_table()
    assert table is not None and len(table.snapshots()) == 1 and table.scan().to_arrow().num_rows == 5
    assert dead is not None and [(s.summary or {}).get(PLAN_KEY) for s in dead.snapshots()] == [plan.plan_id]
    assert [(f.name, str(f.transform)) for f in dead.spec().fields] == [("day", "identity")]
    assert dead.properties["commit.retry.num-retries"] == "0"  # a refused append is decided again, never rebased
    assert [(d.topic, d.offset, d.plan_id) for d in dead_letters(feed)] == [(t, o, p) for t, o, p, _ in expected]
    assert [(d.topic, d.offset) for d in dead_letters(setup.feed)] == theirs  # neither lists the other's
