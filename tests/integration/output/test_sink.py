"""The Parquet sink: atomic publish under a plan-derived path, manifest, same plan twice = one copy."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from tests.integration.read_helpers import chunk_layout
from tidemark.config.models import Feed
from tidemark.errors import PublishError
from tidemark.output.output_schema import CARRIER_NAME, ROOT_FILES
from tidemark.output.parquet import MANIFEST_NAME, load_manifest, publish, published_dir, verify
from tidemark.planning.plan import Chunk, PartitionPlan, Plan, Task, compute_plan_id

pytestmark = pytest.mark.spark

DAY1 = dt.datetime(2026, 3, 1, 23, 59, tzinfo=dt.UTC)
DAY2 = dt.datetime(2026, 3, 2, 0, 1, tzinfo=dt.UTC)


def _plan(feed: str = "sinkfeed", end: int = 4) -> Plan:
    parts = tuple(
        PartitionPlan(topic="orders", partition=p, leader=1, committed=None, checkpoint=None, log_start=0,
                      high_watermark=end, end_available=end, start=0, end=end, reason="earliest")
        for p in range(2)
    )  # fmt: skip
    tasks = (Task(0, 1, tuple(Chunk("orders", p, 0, end) for p in range(2))),)
    return Plan(
        plan_id=compute_plan_id(feed, "g", "scheduled", "read_committed", parts), feed=feed, group="g",
        mode="scheduled", commit=True, isolation="read_committed", created_at="2026-03-02T00:00:00+00:00",
        partitions=parts, tasks=tasks,
    )  # fmt: skip


def _df(spark: Any, plan: Plan) -> Any:
    from tidemark.spark.source import SCHEMA

    rows = [
        ("orders", p, o, DAY1 if o < 2 else DAY2, 0, f"k{o}".encode(), f"v{p}-{o}".encode(), [], plan.plan_id)
        for p in range(2)
        for o in range(4)
    ]
    return spark.createDataFrame(rows, SCHEMA)


def _snapshot(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in root.rglob("*") if p.is_file()}


def test_publish_is_atomic_and_idempotent(spark: Any, tmp_path: Path) -> None:
    feed = Feed(name="sinkfeed", topics=("orders",), group="g", output=str(tmp_path / "out"))
    plan = _plan()
    df = _df(spark, plan)
    bad = df.limit(1).withColumn("decode_error", df.value.cast("string"))

    first = publish(df, plan, feed, quarantine={"decode": bad}, extra={"run": "r1"})
    assert not first.reused
    final = published_dir(feed.output_dir(), plan.plan_id)
    assert Path(first.location) == final.resolve()
    assert (first.records, first.quarantined) == (8, 1)
    assert {f.path.split("/part-")[0] for f in first.files} == {
        "topic=orders/date=2026-03-01", "topic=orders/date=2026-03-02", "_quarantine/decode",
    }  # fmt: skip
    assert verify(first) == []
    assert json.loads((final / MANIFEST_NAME).read_text())["plan_id"] == plan.plan_id
    assert not list((feed.output_dir() / "_staging").iterdir())

    before = _snapshot(feed.output_dir())
    second = publish(df, plan, feed, quarantine={"decode": bad})
    assert second.reused
    assert second.files == first.files
    assert _snapshot(feed.output_dir()) == before  # nothing rewritten
    # Beside the plan's folder: the output's one schema, a file of no rows readers take it from.
    assert sorted(p.name for p in feed.output_dir().iterdir() if not p.name.startswith("_")) == sorted(
        [CARRIER_NAME, final.name]
    )

    # Readers see one copy: the staging and quarantine folders are invisible to them.
    back = spark.read.parquet(str(feed.output_dir()))
    assert back.count() == 8
    assert {r.plan_id for r in back.select("plan_id").distinct().collect()} == {plan.plan_id}
    table = ds.dataset(str(feed.output_dir()), format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 8
    # The payload is written without dictionary or statistics; the other columns keep their statistics.
    (one_file, *_) = sorted(final.glob("topic=*/date=*/*.parquet"))
    layout = chunk_layout(one_file, ["value", "offset", "key"])
    assert layout["value"] == (False, False)
    assert layout["offset"][0] and layout["key"][0]


def test_crash_before_publish_leaves_nothing_visible(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    feed = Feed(name="sinkfeed", topics=("orders",), group="g", output=str(tmp_path / "out"))
    plan = _plan()
    df = _df(spark, plan)

    def crash(src: Any, dst: Any) -> None:
        raise KeyboardInterrupt("killed just before the rename")

    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(KeyboardInterrupt):
        publish(df, plan, feed)
    monkeypatch.undo()
    assert load_manifest(feed.output_dir(), plan.plan_id) is None
    # Only the abandoned staging folder, and the output's schema recorded before a plan can be shown (no rows).
    assert sorted(p.name for p in feed.output_dir().iterdir()) == sorted(["_staging", *ROOT_FILES])

    manifest = publish(df, plan, feed)  # the retry cleans the leftover and publishes
    assert not manifest.reused and manifest.records == 8
    assert list((feed.output_dir() / "_staging").iterdir()) == []


def test_refuses_a_foreign_folder_and_a_foreign_plan(spark: Any, tmp_path: Path) -> None:
    feed = Feed(name="sinkfeed", topics=("orders",), group="g", output=str(tmp_path / "out"))
    plan = _plan()
    published_dir(feed.output_dir(), plan.plan_id).mkdir(parents=True)
    with pytest.raises(PublishError, match=r"exists without _manifest\.json"):
        publish(_df(spark, plan), plan, feed)
    other = Feed(name="other", topics=("orders",), group="g", output=str(tmp_path / "o2"))
    with pytest.raises(PublishError, match="belongs to feed 'sinkfeed'"):
        publish(_df(spark, plan), plan, other)


# -- staged publication (what the job does) ------------------------------------------------


def _stage(root: Path, outcome: str, rows: int, day: str = "2026-03-01") -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = root / f"_outcome={outcome}" / "topic=orders" / f"date={day}"
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({"partition": pa.array([0] * rows, pa.int32()), "offset": pa.array(range(rows), pa.int64())})
    pq.write_table(table, folder / f"part-{len(list(folder.iterdir()))}.parquet")


def _quarantine_writer(reasons: dict[str, str]) -> Any:
    """What the job hands publish_staged, with pyarrow: each staged file again, plus the reason of its code."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def write(folders: Any, target_url: str) -> None:
        target = Path(target_url)
        for folder in map(Path, folders):
            why = reasons[folder.name.partition("=")[2]]
            for path in sorted(folder.rglob("*.parquet")):
                table = pq.read_table(path, partitioning=None)
                table = table.append_column("_reason", pa.array([why] * table.num_rows, pa.string()))
                dest = target / path.parent.relative_to(folder) / f"{folder.name.partition('=')[2]}-{path.name}"
                dest.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(table, dest)

    return write


def test_publish_staged_renames_good_records_into_place_and_keeps_bad_ones_aside(tmp_path: Path) -> None:
    from tidemark.output.parquet import new_staging, publish_staged

    plan = _plan()
    feed = Feed(name=plan.feed, topics=("orders",), group="g", output=str(tmp_path / "out"))
    staging = new_staging(tmp_path / "out", plan.plan_id)
    _stage(staging.written, "ok", 3)
    _stage(staging.written, "ok", 2, day="2026-03-02")
    _stage(staging.written, "rules-1", 1)

    reasons = {"rules-1": "expect_column_values_to_not_be_null(n)"}
    manifest = publish_staged(staging, plan, feed, outcome_column="_outcome", ok_value="ok",
                              write_quarantine=_quarantine_writer(reasons),
                              expect_records=5, expect_quarantined=1)  # fmt: skip
    final = published_dir((tmp_path / "out").resolve(), plan.plan_id)
    assert (manifest.records, manifest.quarantined) == (5, 1)
    assert sorted(f.path for f in manifest.files) == [
        "_quarantine/topic=orders/date=2026-03-01/rules-1-part-0.parquet",
        "topic=orders/date=2026-03-01/part-0.parquet",
        "topic=orders/date=2026-03-02/part-0.parquet",
    ]
    assert not staging.root.exists() and not (final / "_pass").exists()
    assert load_manifest((tmp_path / "out").resolve(), plan.plan_id) == manifest
    good = ds.dataset(str(tmp_path / "out"), format="parquet", partitioning="hive").to_table()
    assert good.num_rows == 5  # the quarantine folder stays out of the dataset


@pytest.mark.parametrize(("records", "quarantined"), [(6, 1), (5, 0)], ids=["records", "quarantined"])
def test_publish_staged_refuses_counts_that_differ_from_validation(
    tmp_path: Path, records: int, quarantined: int
) -> None:
    from tidemark.output.parquet import new_staging, publish_staged

    plan = _plan()
    feed = Feed(name=plan.feed, topics=("orders",), group="g", output=str(tmp_path / "out"))
    staging = new_staging(tmp_path / "out", plan.plan_id)
    _stage(staging.written, "ok", 5)
    _stage(staging.written, "decode-1", 1)
    with pytest.raises(PublishError, match=r"validation passed on"):
        publish_staged(staging, plan, feed, outcome_column="_outcome", ok_value="ok",
                       write_quarantine=_quarantine_writer({"decode-1": "decode_error: value is not valid UTF-8"}),
                       expect_records=records, expect_quarantined=quarantined)  # fmt: skip
    out = (tmp_path / "out").resolve()
    assert load_manifest(out, plan.plan_id) is None and not published_dir(out, plan.plan_id).exists()
    assert not staging.root.exists()


def test_new_staging_clears_a_crashed_attempt_and_refuses_a_published_plan(spark: Any, tmp_path: Path) -> None:
    from tidemark.output.base import STAGING_DIR
    from tidemark.output.parquet import new_staging

    plan = _plan()
    feed = Feed(name=plan.feed, topics=("orders",), group="g", output=str(tmp_path / "out"))
    from tidemark.output.staging import release

    crashed = new_staging(tmp_path / "out", plan.plan_id)
    _stage(crashed.written, "ok", 1)
    live = new_staging(tmp_path / "out", plan.plan_id, run_id="run-b")  # another run's job, staging now
    release(crashed.root)  # the crashed attempt's process is gone: its lock is free (the kernel's doing)
    assert crashed.root.exists()
    fresh = new_staging(tmp_path / "out", plan.plan_id)
    assert not crashed.root.exists() and fresh.root.exists() and live.root.exists()
    assert sorted(p.name for p in (tmp_path / "out" / STAGING_DIR).iterdir() if p.is_dir()) == sorted(
        [fresh.root.name, live.root.name]
    )
    again = new_staging(tmp_path / "out", plan.plan_id, run_id="run-b")  # a second attempt of the live run
    assert live.root.exists() and again.root.name.startswith("run-b.")  # a live attempt's folder is never taken
    for staging in (fresh, live, again):
        staging.discard()
    assert list((tmp_path / "out" / STAGING_DIR).iterdir()) == []
    publish(_df(spark, plan), plan, feed, output_dir=tmp_path / "out")
    with pytest.raises(PublishError, match="already published"):
        new_staging(tmp_path / "out", plan.plan_id)


def test_two_attempts_publishing_one_plan_at_the_same_time_publish_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retried task beside its zombie: both staged the plan, both reach the rename into place together.

    The rename is the publication's exclusivity: one attempt publishes, the other finds
    the winner's manifest and returns it as reused; the output holds the plan once.
    """
    import threading

    from tidemark.output import parquet as sink
    from tidemark.output.parquet import new_staging, publish_staged

    plan = _plan()
    out = (tmp_path / "out").resolve()
    feed = Feed(name=plan.feed, topics=("orders",), group="g", output=str(out))
    stagings = [new_staging(out, plan.plan_id) for _ in range(2)]
    for staging in stagings:
        _stage(staging.written, "ok", 5)
    both_sealed = threading.Barrier(2, timeout=60)
    rename = sink._rename_into_place

    def rename_together(staging: Path, output: Any, manifest: Any) -> Any:
        both_sealed.wait()  # each attempt has written its manifest; now both move into place at once
        return rename(staging, output, manifest)

    monkeypatch.setattr(sink, "_rename_into_place", rename_together)
    results: list[Any] = []

    def attempt(staging: Any) -> None:
        try:
            results.append(publish_staged(staging, plan, feed, outcome_column="_outcome", ok_value="ok",
                                          write_quarantine=_quarantine_writer({}),
                                          expect_records=5, expect_quarantined=0))  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - an attempt's failure is part of the outcome asserted below
            results.append(exc)

    threads = [threading.Thread(target=attempt, args=(s,)) for s in stagings]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 2 and not [r for r in results if isinstance(r, Exception)], results
    assert sorted(r.reused for r in results) == [False, True], "both attempts published the plan"
    winner = next(r for r in results if not r.reused)
    assert all(r.files == winner.files for r in results)
    assert load_manifest(out, plan.plan_id) == winner and verify(winner) == []
    assert ds.dataset(str(out), format="parquet", partitioning="hive").to_table().num_rows == 5
