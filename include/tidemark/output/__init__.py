"""Where a plan is published: one publisher interface, with Parquet and Iceberg behind it.

:func:`publisher_for` is the one place that reads a feed's ``output_format``; the
:class:`~tidemark.output.base.Publisher` protocol and the types every backend shares are in
:mod:`tidemark.output.base` and :mod:`tidemark.output.staging`, which the backends import
(never each other).
"""

from __future__ import annotations

from tidemark.config.models import Feed
from tidemark.output.base import Publisher
from tidemark.output.changes import ChangesPublisher
from tidemark.output.iceberg import IcebergPublisher
from tidemark.output.parquet import ParquetPublisher
from tidemark.planning.plan import Plan
from tidemark.storage import Location, Where

__all__ = ["publisher_for"]


def publisher_for(feed: Feed, plan: Plan | None = None, output: Where | None = None) -> Publisher:
    """The publisher of ``plan`` (or of the feed's scheduled runs): given ``output``, else the plan's, else the feed's.

    An explicit ``output`` or a plan that names its own output (backfills and replays publish
    beside the feed's output, so that its readers never see a record twice) is a Parquet
    folder; otherwise the feed's ``output_format`` decides: ``iceberg`` publishes to the
    feed's table (a keyed table, :mod:`tidemark.output.changes`, with ``iceberg.mode: upsert``), anything else
    to its Parquet folder. A Parquet folder takes the feed's partitioning (an Iceberg feed's backfill gets its
    table's choice, as Hive-style folders).
    """
    if output is not None:
        return ParquetPublisher(Location.of(output), feed.partitioning, feed.schema_change)
    if plan is not None and plan.output:
        return ParquetPublisher(Location.of(plan.output), feed.partitioning, feed.schema_change)
    if feed.output_format == "iceberg" and feed.iceberg is not None and feed.iceberg.mode == "upsert":
        return ChangesPublisher(feed)
    if feed.output_format == "iceberg":
        return IcebergPublisher(feed)
    return ParquetPublisher(feed.output_location(), feed.partitioning, feed.schema_change)
