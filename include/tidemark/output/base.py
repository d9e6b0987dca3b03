r"""Where a plan is published: the one place that knows a feed's output kind (Parquet folder or Iceberg table).

The job, the pipeline and the DAGs ask a :class:`Publisher` three things and never look
at the feed's ``output_format``: *is this plan already published?* (:meth:`Publisher.published`,
the idempotence check of a rerun and of the commit protocol), *publish what the job
staged* (:meth:`Publisher.new_staging` then :meth:`Publisher.publish_staged`), *what
position does the output's own history give for a group* (:meth:`Publisher.positions`,
the planner's last resort when Kafka's offsets and the checkpoint store are both gone),
and the three moves of the commit protocol (``docs/ARCHITECTURE.md``, "The commit
protocol"): a run's job stages its publication *pending*, invisible to readers
(:meth:`Publisher.publish_staged` with the run's id); after the group's commit
:meth:`Publisher.promote` shows it; a run whose commit was refused
:meth:`Publisher.discard`\ s it, never having been visible. Nothing shown is ever taken back.

:func:`publisher_for` chooses: a feed with ``output_format: iceberg`` publishes its
scheduled runs to its table (:class:`tidemark.output.iceberg.IcebergPublisher`); every
other case, and every backfill or replay (they publish beside the feed's output so that
its readers never see a record twice), is the Parquet folder of :mod:`tidemark.output.parquet`,
unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tidemark.config.models import Feed
from tidemark.errors import ConfigError
from tidemark.planning.plan import Plan, RecoveredPosition
from tidemark.storage import Location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from tidemark.output.parquet import Manifest, Staging
    from tidemark.spark.stats import RangeStats


@dataclass(frozen=True)
class StagedRecords:
    """How to read what the job staged: the outcome partitioning and the good records' columns.

    Folders are given as :meth:`Staging.url` gives them (a local path or an object-store URL).
    ``read_good(folder)`` gives the good records under a staged outcome folder with exactly
    the publication's columns (``schema``); ``unpublished`` names the columns the staged
    files carry and the publication must not (the job's digests of the raw bytes, and the
    raw bytes of bad records), so that a rename-only publication is impossible.
    ``write_quarantine(folders, target)`` writes
    the records of the bad outcome folders under ``target`` (partitioned by topic and
    date) with the full reason each outcome code stands for as the ``_reason`` column.
    """

    outcome_column: str
    ok_value: str
    schema: StructType
    read_good: Callable[[str], DataFrame]
    unpublished: tuple[str, ...]
    write_quarantine: Callable[[Sequence[str], str], None]


class Publisher(Protocol):
    kind: str
    location: Location  # where the published data lives (a folder, or the table's location)

    def describe(self) -> str:
        """For messages and reports: the output and its kind."""
        ...

    def check_schema(self, schema: StructType, plan: Plan) -> None:
        """Raise before anything is staged when the output cannot take ``plan``'s records of ``schema``."""
        ...

    def published(self, plan_id: str) -> Manifest | None:
        """The record of ``plan_id``'s publication (``reused=True``), or ``None`` when it was never published."""
        ...

    def new_staging(self, plan_id: str, on_store: bool = False) -> Staging:
        """A fresh staging for ``plan_id``; ``on_store``: Spark stages on the output's object store."""
        ...

    def publish_staged(
        self,
        staging: Staging,
        plan: Plan,
        feed: Feed,
        *,
        staged: StagedRecords,
        stats: Sequence[RangeStats],
        extra: Mapping[str, Any],
        expect_records: int,
        expect_quarantined: int,
        run_id: str | None,
    ) -> Manifest:
        """Publish what the job staged, at most once per plan; raises :class:`~tidemark.errors.PublishError`.

        With ``run_id`` the publication is left pending for that run (:meth:`staged`), shown
        only by :meth:`promote`; without one (a job outside any run) it is shown at once.
        """
        ...

    def positions(self, feed: Feed) -> RecoveredPosition | None:
        """The group's position from the output's history, or ``None`` when it keeps none."""
        ...

    def staged(self, plan_id: str, run_id: str) -> Manifest | None:
        """What run ``run_id`` staged for ``plan_id`` and nobody promoted yet, or ``None``."""
        ...

    def promote(self, plan_id: str, run_id: str) -> Manifest:
        """Show run ``run_id``'s pending publication; a plan already shown stays as it is (``reused``). Idempotent."""
        ...

    def discard(self, plan_id: str, run_id: str) -> Manifest | None:
        """Drop run ``run_id``'s pending publication (never shown); what was dropped, or ``None``."""
        ...


class ParquetPublisher:
    """A Parquet folder with one manifest per plan (:mod:`tidemark.output.parquet`)."""

    kind = "parquet"

    def __init__(self, location: Location) -> None:
        self.location = location

    def describe(self) -> str:
        return str(self.location)

    def check_schema(self, schema: StructType, plan: Plan) -> None:
        """Any schema: each plan's folder carries its own."""

    def published(self, plan_id: str) -> Manifest | None:
        from dataclasses import replace

        from tidemark.output.parquet import load_manifest

        found = load_manifest(self.location, plan_id)
        return None if found is None else replace(found, reused=True)

    def new_staging(self, plan_id: str, on_store: bool = False) -> Staging:
        from tidemark.output.parquet import new_staging

        return new_staging(self.location, plan_id, on_store)

    def publish_staged(
        self,
        staging: Staging,
        plan: Plan,
        feed: Feed,
        *,
        staged: StagedRecords,
        stats: Sequence[RangeStats],
        extra: Mapping[str, Any],
        expect_records: int,
        expect_quarantined: int,
        run_id: str | None,
    ) -> Manifest:
        from tidemark.output.parquet import publish_staged

        # The manifest names the run that published (as an Iceberg snapshot does): a failed
        # run that shares the plan id is then not taken for "published, not committed".
        extra = {**extra, "run_id": run_id} if run_id else extra
        return publish_staged(
            staging, plan, feed, outcome_column=staged.outcome_column, ok_value=staged.ok_value,
            write_quarantine=staged.write_quarantine, unpublished=staged.unpublished,
            stats=stats, extra=extra,
            expect_records=expect_records, expect_quarantined=expect_quarantined, pending=run_id,
        )  # fmt: skip

    def positions(self, feed: Feed) -> RecoveredPosition | None:
        return None  # manifests name plans, not which of them the group committed last

    def staged(self, plan_id: str, run_id: str) -> Manifest | None:
        from tidemark.output.parquet import load_pending

        return load_pending(self.location, plan_id, run_id)

    def promote(self, plan_id: str, run_id: str) -> Manifest:
        from tidemark.output.parquet import promote

        return promote(self.location, plan_id, run_id)

    def discard(self, plan_id: str, run_id: str) -> Manifest | None:
        from tidemark.output.parquet import discard

        return discard(self.location, plan_id, run_id)


def publisher_for(feed: Feed, plan: Plan | None = None, output: Location | str | Path | None = None) -> Publisher:
    """The publisher of ``plan`` (or of the feed's scheduled runs): given ``output``, else the plan's, else the feed's.

    An explicit ``output`` or a plan that names its own output (backfills, replays) is a
    Parquet folder; otherwise the feed's ``output_format`` decides.
    """
    if output is not None:
        return ParquetPublisher(Location.of(output))
    if plan is not None and plan.output:
        return ParquetPublisher(Location.of(plan.output))
    if feed.output_format == "iceberg":
        from tidemark.output.iceberg import IcebergPublisher

        return IcebergPublisher(feed)
    return ParquetPublisher(feed.output_location())


def _resolved(where: Location | str) -> str:
    """``where`` as the writer reaches it: a local path with every symlink followed; an object-store URL as is."""
    location = Location.of(where)
    if not location.is_local:
        return location.url.rstrip("/")
    return os.path.realpath(location.local_path())


def check_replay_output(target: Location, feeds: Mapping[str, Feed], roots: Sequence[str]) -> None:
    """Refuse a backfill's or replay's ``target`` unless, resolved here (where the writer runs), it lies under
    one of ``roots`` (resolved too) and is neither any feed's output nor inside one.

    The lexical check (:func:`tidemark.planning.requests.confine_output`) reads the text only;
    a symlink under an allowed root, or a root broad enough to hold other feeds' outputs,
    would let a replay write its records into another feed's output.
    """
    place = _resolved(target)

    def under(base: str) -> bool:
        return place == base or place.startswith(base.rstrip("/") + "/")

    # The feed is not named: the caller may not be allowed to know it exists.
    if any(under(_resolved(f.output_location())) for f in feeds.values()):
        raise ConfigError(
            f"parameter 'output': {target.url} resolves to {place}, inside a feed's output; a backfill or replay "
            "publishes beside feeds' outputs, never into one (their readers would see its records as the feed's); "
            "choose another place"
        )
    if not any(under(_resolved(root)) for root in roots):
        raise ConfigError(
            f"parameter 'output': {target.url} resolves to {place}, outside the places replays and backfills may "
            f"write ({', '.join(roots)}, symlinks followed); choose a place under one of them"
        )
