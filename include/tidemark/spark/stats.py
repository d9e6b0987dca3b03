"""Per-range statistics of what a read returned, computed on the driver in one aggregation.

One :class:`RangeStats` per planned range: records, first and last offset, gaps, the
timestamp bounds, bytes and an order-independent checksum. A masked feed's checksum and bytes are of
its records as masked (:func:`masked_row_digest`), never of their raw bytes: an unkeyed digest of a
one-record range would let anyone who sees it test guesses of a hashed value offline. The same type carries what the
built-in range checks need besides (:func:`tidemark.validation.rules.check_ranges`): the
distinct offsets where they were counted and where the reader stopped. Validation, the
publishers and the job's report read them; nothing here imports the data source.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tidemark._types import TopicPartition as TP
from tidemark.errors import ReadError
from tidemark.planning.plan import Plan
from tidemark.staged import ROW_BYTES_COLUMN, ROW_HASH_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# What the range checks read besides the statistics: neither compared nor reported.
CHECK_FIELDS = ("distinct_offsets", "position")


@dataclass(frozen=True)
class RangeStats:
    """What a read returned of one range ``[start, end)``; a partition the plan does not read has ``[0, 0)``.

    The content figures (timestamps, ``bytes``, ``checksum``) are ``None`` where the records'
    raw bytes were not at hand (validation of decoded records alone counts only).
    """

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
    bytes: int | None  # key + value bytes (a masked feed's: its masked records' JSON text's)
    # order-independent digest of (topic, partition, offset, key, value); a masked feed's of its records as masked
    checksum: str | None
    # Counted only where the reader could yield an offset twice; None: duplicates show as more records than offsets.
    distinct_offsets: int | None = field(default=None, compare=False)
    position: int | None = field(default=None, compare=False)  # next offset the reader reached, when it says

    @property
    def key(self) -> TP:
        return (self.topic, self.partition)

    @property
    def planned(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        """The statistics as the manifest and ``job.json`` keep them (without the checks' inputs)."""
        doc = asdict(self)
        for name in CHECK_FIELDS:
            doc.pop(name)
        return doc


def range_stats(df: DataFrame, plan: Plan, *, value_column: str = "value") -> list[RangeStats]:
    """One aggregation over ``df``: statistics for every planned range.

    ``df`` holds the records with ``topic, partition, offset, timestamp, key`` and the raw
    value as ``value_column``; ``key`` may be the binary or its string cast (same bytes).
    """
    rows = df.groupBy("topic", "partition").agg(*range_stat_aggs(value_column)).collect()
    stats = stats_from_rows(rows, plan)
    planned = {p.key for p in plan.partitions}
    extra = sorted(s.key for s in stats if s.key not in planned)
    if extra:
        names = ", ".join(f"{t}[{p}]" for t, p in extra)
        raise ReadError(f"plan {plan.plan_id}: the read returned records of partitions not in the plan: {names}")
    return stats


def row_digest(value: Column | str = "value", key: Column | str = "key") -> list[Column]:
    """Each record's hash and key + value bytes, as :func:`range_stat_aggs` folds them, named
    :data:`tidemark.staged.DIGEST_COLUMNS`.

    ``key`` and ``value`` are the bytes Kafka holds (a string cast of them hashes the same).
    """
    return [_row_hash(value, key).alias(ROW_HASH_COLUMN), _row_bytes(value, key).alias(ROW_BYTES_COLUMN)]


def masked_row_digest(columns: Sequence[str]) -> list[Column]:
    """A masked feed's :func:`row_digest`: each record's hash and byte count over its masked ``columns`` (the
    record's own, ``topic``, ``partition`` and ``offset`` among them) as one JSON text, named
    :data:`tidemark.staged.DIGEST_COLUMNS`.

    Computed after masking, so the published checksum and bytes say nothing of a raw value that the
    published record does not: guessing a hashed email needs the masking key, as for the record itself.
    """
    from pyspark.sql import functions as F

    message = F.to_json(F.struct(*columns))
    return [F.xxhash64(message).alias(ROW_HASH_COLUMN), F.octet_length(message).cast("long").alias(ROW_BYTES_COLUMN)]


def _row_hash(value: Column | str, key: Column | str) -> Column:
    from pyspark.sql import functions as F

    return F.xxhash64("topic", "partition", "offset", key, value)


def _row_bytes(value: Column | str, key: Column | str) -> Column:
    from pyspark.sql import functions as F

    return F.coalesce(F.octet_length(key), F.lit(0)) + F.coalesce(F.octet_length(value), F.lit(0))


def range_stat_aggs(
    value_column: str = "value", *, digested: bool = False, content: bool = True, distinct: bool = False
) -> list[Column]:
    """The aggregations behind :class:`RangeStats`, per ``(topic, partition)`` group.

    Column names: ``records, first, last``, with ``content`` also ``min_ts, max_ts, bytes,
    h1, h2``, with ``distinct`` also ``distinct_offsets``; any other aggregation over the
    same groups can ride along (validation does). ``digested``: the rows carry
    :func:`row_digest`'s columns instead of their raw key and value.
    """
    from pyspark.sql import functions as F

    counts = [F.count(F.lit(1)).alias("records"), F.min("offset").alias("first"), F.max("offset").alias("last")]
    if distinct:
        # Counting distinct offsets is the costliest part of the checks (a second aggregation level: 7 s of 5M
        # rows on two cores). Tidemark's reader cannot yield an offset twice (it drops any offset at or below one
        # it has yielded for the partition), so the job skips it and relies on "no more records than offsets
        # planned" and the bounds.
        counts.append(F.count_distinct("offset").alias("distinct_offsets"))
    if not content:
        return counts
    row_hash = F.col(ROW_HASH_COLUMN) if digested else _row_hash(value_column, "key")
    row_bytes = F.col(ROW_BYTES_COLUMN) if digested else _row_bytes(value_column, "key")
    return [
        *counts,
        F.min("timestamp").alias("min_ts"),
        F.max("timestamp").alias("max_ts"),
        F.sum(row_bytes).alias("bytes"),
        # Two XORs of independent 64-bit hashes: an order-independent 128-bit digest of the
        # range's content (a row present twice cancels out; duplicates are checked apart).
        F.bit_xor(row_hash).alias("h1"),
        F.bit_xor(F.xxhash64(row_hash, F.lit("tidemark"))).alias("h2"),
    ]


def stats_from_rows(
    agg: Iterable[Any],
    plan: Plan,
    positions: Mapping[TP, int] | None = None,
    *,
    content: bool = True,
    distinct: bool = False,
) -> list[RangeStats]:
    """:class:`RangeStats` from :func:`range_stat_aggs` rows (same ``content`` and ``distinct``).

    Every planned range, in the plan's order (missing: empty), then any partition the plan
    does not read (its range ``[0, 0)``); ``positions``: where the reader stopped, per partition.
    """
    found = {(r["topic"], int(r["partition"])): r for r in agg}
    ranges: list[tuple[str, int, int, int, int | None]] = [
        (p.topic, p.partition, p.start, p.end, p.records) for p in plan.partitions
    ]
    planned = {(t, n) for t, n, *_ in ranges}
    ranges += [(t, n, 0, 0, None) for t, n in sorted(k for k in found if k not in planned)]
    return [
        _stats_of(found.get((t, n)), t, n, start, end, offsets, (positions or {}).get((t, n)), content, distinct)
        for t, n, start, end, offsets in ranges
    ]


def _stats_of(
    row: Any, topic: str, partition: int, start: int, end: int, offsets: int | None, position: int | None,
    content: bool, distinct: bool,
) -> RangeStats:  # fmt: skip
    records = int(row["records"]) if row else 0
    return RangeStats(
        topic=topic,
        partition=partition,
        start=start,
        end=end,
        records=records,
        first_offset=_int(row["first"]) if row else None,
        last_offset=_int(row["last"]) if row else None,
        gaps=offsets - records if offsets is not None else 0,  # offsets: None for a partition the plan does not read
        min_timestamp_ms=_ms(row["min_ts"]) if row and content else None,
        max_timestamp_ms=_ms(row["max_ts"]) if row and content else None,
        bytes=(int(row["bytes"] or 0) if row else 0) if content else None,
        checksum=(_checksum(row) if row else "0" * 32) if content else None,
        distinct_offsets=(int(row["distinct_offsets"]) if row else 0) if distinct else None,
        position=position,
    )


def _checksum(row: Any) -> str:
    return f"{int(row['h1']) & (2**64 - 1):016x}{int(row['h2']) & (2**64 - 1):016x}"


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


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
