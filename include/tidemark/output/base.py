r"""What every output shares: the :class:`Publisher` protocol and the types its backends hand back.

The job, the pipeline and the DAGs ask a :class:`Publisher` four things and never look at
the feed's ``output_format``:

1. *is this plan already published?* (:meth:`Publisher.published`, the idempotence check
   of a rerun and of the commit protocol);
2. *publish what the job staged* (:meth:`Publisher.new_staging`, then
   :meth:`Publisher.publish_staged`);
3. *what position does the output's own history give for a group?*
   (:meth:`Publisher.positions`, the planner's last resort when Kafka's offsets and the
   checkpoint store are both gone);
4. the commit protocol's moves (``docs/ARCHITECTURE.md``, "The commit protocol"): a run's
   job stages its publication *pending*, invisible to readers (:meth:`Publisher.publish_staged`
   with the run's id, found again by :meth:`Publisher.staged`); after the group's commit
   :meth:`Publisher.promote` shows it; a run whose commit was refused
   :meth:`Publisher.discard`\ s it, never having been visible. Nothing shown is ever taken back.

Each backend imports this module and :mod:`tidemark.output.staging`, never the other
backend: :class:`tidemark.output.parquet.ParquetPublisher` (a Parquet folder) and
:class:`tidemark.output.iceberg.IcebergPublisher` (an Iceberg table). Only
:func:`tidemark.output.publisher_for` (the package's factory) chooses between them.
:func:`check_replay_output` refuses a backfill's or replay's output that resolves into a
feed's output.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tidemark.config.models import Feed
from tidemark.errors import ConfigError
from tidemark.output.staging import Staging
from tidemark.planning.plan import Plan, RecoveredPosition
from tidemark.spark.stats import RangeStats
from tidemark.storage import Location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

MANIFEST_VERSION = 1
QUARANTINE_DIR = "_quarantine"  # inside a publication (or its staging folder): the records kept aside
STAGING_DIR = "_staging"  # under an output: staging folders (readers skip ``_``-prefixed folders)


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


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the published folder
    bytes: int
    rows: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    plan_id: str
    feed: str
    group: str
    location: str
    published_at: str
    records: int
    quarantined: int
    ranges: tuple[Mapping[str, Any], ...]
    files: tuple[FileEntry, ...]
    extra: Mapping[str, Any] = field(default_factory=dict)
    version: int = MANIFEST_VERSION
    # Not stored: True when this call found the plan already published and wrote nothing.
    reused: bool = False

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc.pop("reused")
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Manifest:
        body = dict(doc)
        body["ranges"] = tuple(body.get("ranges", ()))
        body["files"] = tuple(FileEntry(**f) for f in body.get("files", ()))
        return cls(**body)


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

    def new_staging(self, plan_id: str, on_store: bool = False, run_id: str | None = None) -> Staging:
        """A fresh staging for ``plan_id``, named by ``run_id`` (a run's job: its own folder, whatever other run
        shares the plan); ``on_store``: Spark stages on the output's object store."""
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
        """Show run ``run_id``'s pending publication; a plan already shown stays as it is (``reused``). Idempotent.

        What the run's jobs left in staging is removed too."""
        ...

    def discard(self, plan_id: str, run_id: str) -> Manifest | None:
        """Drop run ``run_id``'s pending publication (never shown) and what its jobs left in staging, only the run's
        own files; what was dropped, or ``None``. Idempotent: a discard cut short is finished by calling it again."""
        ...

    def clear_staging(self, run_id: str, *, dead_only: bool = False) -> None:
        """Remove what run ``run_id``'s jobs left in staging, and nothing of another run; ``dead_only`` (the run is
        still open): only folders no live job holds."""
        ...


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
