"""Exact time windows in the job: which staged records lie outside the window, and what the window counted.

A backfill or replay with an exact window (``plan.time_filter``) reads its planned ranges
whole, stages every record, marks those stamped outside the window with the outcome
:data:`tidemark.staged.OUTSIDE_WINDOW` (:func:`stamped_outside`), and leaves them out of
the output. :func:`window_counts` gives each partition's counts and ``timestamp_skew``
events (step ``window``); a committing window also reports the records it commits past
(:func:`outside_window_events`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tidemark.planning.plan import Event, Plan
from tidemark.staged import OUTCOME_COLUMN, OUTSIDE_WINDOW

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


def stamped_outside(time_filter: Mapping[str, Any]) -> Column:
    """Whether a record's timestamp lies outside the exact window ``time_filter`` (the plan's) describes."""
    from pyspark.sql import functions as F

    ts = F.col("timestamp")
    conditions = []
    if time_filter.get("start_ms") is not None:
        conditions.append(ts < F.timestamp_millis(F.lit(int(time_filter["start_ms"]))))
    if time_filter.get("end_ms") is not None:
        conditions.append(ts >= F.timestamp_millis(F.lit(int(time_filter["end_ms"]))))
    outside = F.lit(False)
    for condition in conditions:
        outside = outside | condition
    return outside


def window_counts(
    staged: DataFrame, plan: Plan, time_filter: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per partition of an exact window: records read, in the end margin, kept, dropped; skew events.

    The *end margin* is ``[cut end, planned end)``: the records past Kafka's own cut at the
    window's end, read only because of the skew bound. A record's *lateness* is how far its
    timestamp lies behind the newest timestamp read before it in its partition; the
    largest lateness seen is the skew the bound must cover. A partition whose largest
    lateness reaches half the bound gets a ``timestamp_skew`` event (at or past the bound,
    records stamped inside the window may lie beyond the range read: raise ``max_skew``).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    cuts = {k: v for k, v in (time_filter.get("cut_ends") or {}).items()}
    bound = int(time_filter["max_skew_ms"])
    ts_ms = F.unix_millis(F.col("timestamp"))
    before = Window.partitionBy("topic", "partition").orderBy("offset").rowsBetween(Window.unboundedPreceding, -1)
    cut = F.lit(None).cast("long")
    for key, value in cuts.items():
        if value is not None:
            topic, _, part = key.rpartition(":")
            cut = F.when((F.col("topic") == topic) & (F.col("partition") == int(part)), F.lit(value)).otherwise(cut)
    outside = F.col(OUTCOME_COLUMN) == OUTSIDE_WINDOW
    in_margin = cut.isNotNull() & (F.col("offset") >= cut)
    lateness = F.greatest(F.max(ts_ms).over(before) - ts_ms, F.lit(0))
    rows = (
        staged.select("topic", "partition", "offset", "timestamp", OUTCOME_COLUMN)
        .withColumn("_late", lateness)
        .groupBy("topic", "partition")
        .agg(
            F.count(F.lit(1)).alias("read"),
            F.sum(in_margin.cast("long")).alias("read_in_margin"),
            F.sum((~outside).cast("long")).alias("kept"),
            F.sum(outside.cast("long")).alias("dropped"),
            F.sum((in_margin & ~outside).cast("long")).alias("kept_in_margin"),
            F.max("_late").alias("largest_skew_ms"),
        )
        .collect()
    )
    counts = []
    events: list[dict[str, Any]] = []
    for r in sorted(rows, key=lambda r: (r["topic"], r["partition"])):
        doc = {k: (int(r[k]) if r[k] is not None else 0) for k in
               ("read", "read_in_margin", "kept", "dropped", "kept_in_margin", "largest_skew_ms")}  # fmt: skip
        doc = {"topic": r["topic"], "partition": int(r["partition"]), **doc}
        counts.append(doc)
        if bound and doc["largest_skew_ms"] * 2 >= bound:
            exceeded = doc["largest_skew_ms"] >= bound
            events.append(Event(
                "timestamp_skew",
                f"{doc['topic']}[{doc['partition']}]: a record's timestamp lies {doc['largest_skew_ms']} ms behind "
                f"an earlier record's, {'at or past' if exceeded else 'over half of'} the window's skew bound "
                f"max_skew={bound} ms; records stamped inside the window may lie beyond the range read. "
                "Rerun with a larger max_skew to be sure",
                topic=str(r["topic"]), partition=int(r["partition"]),
                details={"largest_skew_ms": doc["largest_skew_ms"], "max_skew_ms": bound, "exceeded": exceeded},
            ).to_dict())  # fmt: skip
    return counts, events


def outside_window_events(window: Sequence[Mapping[str, Any]], plan: Plan) -> list[dict[str, Any]]:
    """``records_outside_window`` events of a committing exact window: records read, dropped, and committed past."""
    ranges = {(p.topic, p.partition): (p.start, p.end) for p in plan.partitions}
    events = []
    for w in window:
        if not w["dropped"]:
            continue
        start, end = ranges.get((w["topic"], w["partition"]), (None, None))
        events.append(Event(
            "records_outside_window",
            f"{w['topic']}[{w['partition']}]: {w['dropped']} records in [{start}, {end}) are stamped outside the "
            f"window; the {plan.mode} leaves them out of the output and commits past them",
            topic=w["topic"], partition=w["partition"], details={"dropped": w["dropped"], "start": start, "end": end},
        ).to_dict())  # fmt: skip
    return events
