"""Per-range statistics of what a read returned, computed on the driver in one aggregation.

One :class:`RangeStats` per planned range: records, first and last offset, gaps, the
timestamp bounds, bytes and an order-independent checksum. Validation, the publishers
and the job's report read them; nothing here imports the data source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidemark.errors import ReadError
from tidemark.planning.plan import Plan

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


@dataclass(frozen=True)
class RangeStats:
    topic: str
    partition: int
    start: int
    end: int
    records: int
    first_offset: int | None
    last_offset: int | None
    gaps: int  # offsets inside [start, end) with no record (compaction, markers, aborted)
    min_timestamp_ms: int | None
    max_timestamp_ms: int | None
    bytes: int  # key + value bytes
    checksum: str  # order-independent digest of (topic, partition, offset, key, value)

    @property
    def planned(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def range_stats(df: DataFrame, plan: Plan, *, value_column: str = "value") -> list[RangeStats]:
    """One aggregation over ``df``: statistics for every planned range.

    ``df`` holds the records with ``topic, partition, offset, timestamp, key`` and the raw
    value as ``value_column``; ``key`` may be the binary or its string cast (same bytes).
    """
    rows = df.groupBy("topic", "partition").agg(*range_stat_aggs(value_column)).collect()
    return stats_from_rows(rows, plan)


# A record's share of its range's statistics, staged beside a record whose raw bytes are
# not (:func:`row_digest`): the job computes them while it writes, before the raw value of
# a good record is dropped, and the statistics then sum them (``digested=True``).
ROW_HASH_COLUMN = "_row_hash"
ROW_BYTES_COLUMN = "_row_bytes"
DIGEST_COLUMNS = (ROW_HASH_COLUMN, ROW_BYTES_COLUMN)


def row_digest(value: Column | str = "value", key: Column | str = "key") -> list[Column]:
    """Each record's hash and key + value bytes, as :func:`range_stat_aggs` folds them, named :data:`DIGEST_COLUMNS`.

    ``key`` and ``value`` are the bytes Kafka holds (a string cast of them hashes the same).
    """
    return [_row_hash(value, key).alias(ROW_HASH_COLUMN), _row_bytes(value, key).alias(ROW_BYTES_COLUMN)]


def _row_hash(value: Column | str, key: Column | str) -> Column:
    from pyspark.sql import functions as F

    return F.xxhash64("topic", "partition", "offset", key, value)


def _row_bytes(value: Column | str, key: Column | str) -> Column:
    from pyspark.sql import functions as F

    return F.coalesce(F.octet_length(key), F.lit(0)) + F.coalesce(F.octet_length(value), F.lit(0))


def range_stat_aggs(value_column: str = "value", *, digested: bool = False) -> list[Column]:
    """The aggregations behind :class:`RangeStats`, per ``(topic, partition)`` group.

    Column names: ``records, first, last, min_ts, max_ts, bytes, h1, h2``; any other
    aggregation over the same groups can ride along (validation does). ``digested``: the
    rows carry :func:`row_digest`'s columns instead of their raw key and value.
    """
    from pyspark.sql import functions as F

    row_hash = F.col(ROW_HASH_COLUMN) if digested else _row_hash(value_column, "key")
    row_bytes = F.col(ROW_BYTES_COLUMN) if digested else _row_bytes(value_column, "key")
    return [
        F.count(F.lit(1)).alias("records"),
        F.min("offset").alias("first"),
        F.max("offset").alias("last"),
        F.min("timestamp").alias("min_ts"),
        F.max("timestamp").alias("max_ts"),
        F.sum(row_bytes).alias("bytes"),
        # Two XORs of independent 64-bit hashes: an order-independent 128-bit digest of the
        # range's content (a row present twice cancels out; duplicates are checked apart).
        F.bit_xor(row_hash).alias("h1"),
        F.bit_xor(F.xxhash64(row_hash, F.lit("tidemark"))).alias("h2"),
    ]


def stats_from_rows(agg: Sequence[Any], plan: Plan) -> list[RangeStats]:
    """:class:`RangeStats` for every planned range from :func:`range_stat_aggs` rows (missing: empty)."""
    found = {(r["topic"], r["partition"]): r for r in agg}
    out = []
    for p in plan.partitions:
        row = found.pop((p.topic, p.partition), None)
        records = int(row["records"]) if row else 0
        out.append(
            RangeStats(
                topic=p.topic,
                partition=p.partition,
                start=p.start,
                end=p.end,
                records=records,
                first_offset=int(row["first"]) if row else None,
                last_offset=int(row["last"]) if row else None,
                gaps=p.records - records,
                min_timestamp_ms=_ms(row["min_ts"]) if row else None,
                max_timestamp_ms=_ms(row["max_ts"]) if row else None,
                bytes=int(row["bytes"] or 0) if row else 0,
                checksum=f"{int(row['h1']) & (2**64 - 1):016x}{int(row['h2']) & (2**64 - 1):016x}" if row else "0" * 32,
            )
        )
    if found:
        extra = ", ".join(f"{t}[{p}]" for t, p in sorted(found))
        raise ReadError(f"plan {plan.plan_id}: the read returned records of partitions not in the plan: {extra}")
    return out


def _ms(value: Any) -> int | None:
    if value is None:
        return None
    return int(value.timestamp() * 1000)


def check_complete(stats: Sequence[RangeStats]) -> list[str]:
    """Built-in completeness checks: problems found (empty when every range is sound)."""
    problems = []
    for s in stats:
        where = f"{s.topic}[{s.partition}] planned [{s.start}, {s.end})"
        if s.records > s.planned:
            problems.append(f"{where}: {s.records} records, more than the {s.planned} offsets planned (duplicates)")
        if s.first_offset is not None and s.first_offset < s.start:
            problems.append(f"{where}: offset {s.first_offset} lies before the range")
        if s.last_offset is not None and s.last_offset >= s.end:
            problems.append(f"{where}: offset {s.last_offset} lies past the range")
    return problems
