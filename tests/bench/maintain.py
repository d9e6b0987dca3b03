"""Maintenance benchmark: ``python -m tests.bench.maintain [--plans N] [--records R] [--out FILE]``.

What a year of small runs does to an Iceberg table, and what ``maintain`` undoes. ``N`` plans
(default 1,000) of ``R`` records (default 1,000) over 3 partitions of one topic, 15 minutes
apart (so 1,000 plans span about 10 days: 11 ``date`` partitions), are committed into a fresh
table (SQLite catalog in a temporary state dir) exactly as a run's promotion commits them:
one Parquet file per plan in the table's shape, then :func:`tidemark.output.iceberg.commit_files`
(``add_files`` and the feed's ledger, one compare-and-set commit). No Kafka and no Spark: the
table is the subject, not the run.

Measured before and after :func:`tidemark.output.maintenance.maintain` (default settings:
128 MB target, 5 input files, 10 snapshots kept, 120h, 72h; run with "now" six days after the
last commit, so the snapshots and the replaced files are old enough, as on a feed that has
been running): live data files, bytes, median file size, snapshots, the metadata file's size,
scan planning time (``plan_files()``, whole table and one day; median of 5), a whole-table
read (median of 3) and a plan's commit (median of the last 20 before maintenance and of 20
more plans committed after it: ``add_files`` reads every manifest to refuse duplicate files,
so a commit's cost grows with the table's history until maintenance shrinks it). Printed as
a table with the ratios before/after, and written as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

PARTITIONS = 3
TOPIC = "orders"
EVERY = timedelta(minutes=15)
AFTER = 20  # plans committed after maintenance (and the last ones before it), for the commit time


def _median_s(fn: Callable[[], Any], times: int) -> float:
    taken = []
    for _ in range(times):
        start = time.perf_counter()
        fn()
        taken.append(time.perf_counter() - start)
    return statistics.median(taken)


def _plan_rows(index: int, records: int, at: datetime) -> pa.Table:
    base = index * records // PARTITIONS
    rows = range(records)
    return pa.table({
        "topic": pa.array([TOPIC] * records, pa.string()),
        "partition": pa.array([r % PARTITIONS for r in rows], pa.int32()),
        "offset": pa.array([base + r // PARTITIONS for r in rows], pa.int64()),
        "timestamp": pa.array([at + timedelta(milliseconds=r) for r in rows], pa.timestamp("us", tz="UTC")),
        "key": pa.array([f"k{r}".encode() for r in rows], pa.binary()),
        "value": pa.array([f'{{"order": {base + r}, "amount": {r * 7 % 1000}, "note": "{"x" * 40}"}}' for r in rows],
                          pa.string()),
        "date": pa.array([at.date()] * records, pa.date32()),
    })  # fmt: skip


def _spark_schema() -> Any:
    from pyspark.sql.types import (
        BinaryType,
        DateType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    return StructType([
        StructField("topic", StringType()), StructField("partition", IntegerType()), StructField("offset", LongType()),
        StructField("timestamp", TimestampType()), StructField("key", BinaryType()), StructField("value", StringType()),
        StructField("date", DateType()),
    ])  # fmt: skip


def _figures(table: Any) -> dict[str, Any]:
    files = [t.file for t in table.scan().plan_files()]
    sizes = [f.file_size_in_bytes for f in files]
    day = max(f.partition[0] for f in files)
    metadata = Path(table.metadata_location.removeprefix("file:"))
    return {
        "data_files": len(files),
        "bytes": sum(sizes),
        "median_file_bytes": int(statistics.median(sizes)) if sizes else 0,
        "snapshots": len(table.snapshots()),
        "metadata_file_bytes": metadata.stat().st_size if metadata.exists() else None,
        "plan_files_s": _median_s(lambda: list(table.scan().plan_files()), 5),
        "plan_one_day_s": _median_s(
            lambda: list(table.scan(row_filter=f"date = '{date.fromordinal(day + 719163)}'").plan_files()), 5
        ),
        "read_s": _median_s(lambda: table.scan().to_arrow(), 3),
    }


def run(plans: int, records: int, work: Path) -> dict[str, Any]:
    os.environ["TIDEMARK_STATE_DIR"] = str(work / "state")
    os.environ.pop("TIDEMARK_ICEBERG_CATALOG_URI", None)
    from tidemark.config.models import Feed
    from tidemark.output.iceberg import (
        FEED_KEY,
        GROUP_KEY,
        PLAN_KEY,
        QUARANTINED_KEY,
        RANGES_KEY,
        RECORDS_KEY,
        RUN_KEY,
        IcebergPublisher,
        commit_files,
    )
    from tidemark.output.maintenance import maintain

    feed = Feed(name="bench", topics=(TOPIC,), group="g-bench", output=str(work / "out"), output_format="iceberg",
                iceberg={"table": "bench.orders"})  # type: ignore[arg-type]  # fmt: skip
    publisher = IcebergPublisher(feed)
    publisher.load_or_create(_spark_schema())
    first = datetime(2026, 1, 1, tzinfo=UTC)

    def commit_plan(i: int) -> float:
        at = first + i * EVERY
        rows = _plan_rows(i, records, at)
        path = f"{publisher.location}/data/date={at.date()}/topic={TOPIC}/plan-{i:06d}.parquet"
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(rows, path)
        per = records // PARTITIONS
        ranges = [{"topic": TOPIC, "partition": p, "start": i * per, "end": (i + 1) * per, "records": per,
                   "topic_id": "bench-topic-id"} for p in range(PARTITIONS)]  # fmt: skip
        table = publisher.load()  # as a promotion does: the table as it is now, then one compare-and-set commit
        assert table is not None
        started = time.perf_counter()
        commit_files(table, [path], {PLAN_KEY: f"plan-{i:06d}", RUN_KEY: f"run-{i:06d}", FEED_KEY: feed.name,
                                     GROUP_KEY: feed.group, RANGES_KEY: json.dumps(ranges),
                                     RECORDS_KEY: str(records), QUARANTINED_KEY: "0"}, "bench.orders")  # fmt: skip
        return time.perf_counter() - started

    started = time.perf_counter()
    commits = [commit_plan(i) for i in range(plans)]
    commit_s = time.perf_counter() - started
    before = _figures(publisher.load())
    before["commit_s"] = statistics.median(commits[-AFTER:])  # the last plans' commits, before maintenance
    started = time.perf_counter()
    report = maintain(feed, now=datetime.now(UTC) + timedelta(days=6))
    maintain_s = time.perf_counter() - started
    after = _figures(publisher.load())
    after["commit_s"] = statistics.median(commit_plan(plans + i) for i in range(AFTER))  # the next plans' commits
    ledger_plan = publisher.published(f"plan-{plans - 1:06d}")
    assert ledger_plan is not None, "the last plan before maintenance is no longer found after it"
    position = publisher.positions(feed)
    assert position is not None and position.ends[(TOPIC, 0)] == (plans + AFTER) * (records // PARTITIONS)
    return {"plans": plans, "records_per_plan": records, "commit_all_s": commit_s, "maintain_s": maintain_s,
            "first_commits_s": statistics.median(commits[:AFTER]), "before": before, "after": after,
            "report": report.to_dict()}  # fmt: skip


def _fmt(key: str, value: float) -> str:
    return f"{value * 1000:.1f} ms" if key.endswith("_s") else f"{value:,}"


def show(result: dict[str, Any]) -> str:
    before, after = result["before"], result["after"]
    lines = [
        f"{result['plans']} plans of {result['records_per_plan']} records committed in {result['commit_all_s']:.1f} s "
        f"(median commit of the first {AFTER}: {result['first_commits_s'] * 1000:.1f} ms); maintain took "
        f"{result['maintain_s']:.1f} s; commit_s: median of the last {AFTER} commits before and the next {AFTER} after",
        f"{'':24}{'before':>14}{'after':>14}{'before/after':>14}",
    ]
    for key in ("data_files", "bytes", "median_file_bytes", "snapshots", "metadata_file_bytes", "plan_files_s",
                "plan_one_day_s", "read_s", "commit_s"):  # fmt: skip
        b, a = before[key], after[key]
        ratio = f"{b / a:.1f}x" if a else "-"
        lines.append(f"{key:24}{_fmt(key, b):>14}{_fmt(key, a):>14}{ratio:>14}")
    lines.append(f"maintenance record: {result['report']['notes'] or 'no notes'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--plans", type=int, default=1000)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-maintain-") as work:
        result = run(args.plans, args.records, Path(work))
    print(show(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2, sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
