"""Table maintenance of an Iceberg feed: compaction, snapshot expiry and orphan-file removal, as one job.

``tidemark maintain FEED [--dry-run]`` and the feed's ``tidemark_maintain_<feed>`` DAG call
:func:`maintain`, which, with the feed's ``maintenance:`` settings
(:class:`tidemark.config.models.Maintenance`):

1. **compacts**: in every partition of the table's current spec with at least
   ``min_input_files`` small data files (under three quarters of the target size), packs
   them into groups of about ``target_file_mb``, reads each group through pyiceberg's own
   scan (so schema evolution and name mapping apply), writes it as Parquet files near the
   target size (sorted by topic, partition and offset) and commits **one** snapshot that
   deletes the small files and adds the new ones (``tidemark.maintenance=compaction`` in its
   summary). pyiceberg 0.12 cannot write a ``replace`` snapshot (its summary update refuses
   the operation), so it is an ``overwrite``: same rows, other files;
2. **expires** snapshots older than ``snapshot_max_age``, keeping the newest
   ``keep_snapshots`` of the main branch and every branch's or tag's head (pyiceberg's
   ``expire_snapshots``, which removes them from the metadata only);
3. **removes orphans**: files under the table's location that no remaining snapshot
   (manifest list, manifests, data files), metadata file or statistics file names, and
   that no pending run names (``<location>.pending/``, staged files waiting for their run's
   commit), older than ``orphan_min_age``. The pending records are read *before* the table,
   so a plan promoted meanwhile is in one or the other.

The feed's dead-letter table (:mod:`tidemark.output.dead_letter_table`) gets steps 2 and 3
with the same settings: its rows are appended once per plan with dead letters, one small
file each, and are never rewritten here. Its run-once check reads rows, not snapshots, so
expiring every old snapshot of it appends nothing twice.

Nothing here touches the feed's ledger (:mod:`tidemark.output.ledger`): it is a table
property, and every commit below is built on the table as loaded, properties included.
Every commit is a compare-and-set (``commit.retry.num-retries=0`` on Tidemark's tables):
when a feed committed a plan meanwhile, the catalog refuses it and maintenance loads the
table again and retries (up to :data:`ATTEMPTS` times); a compaction whose small files
another writer removed meanwhile gives up that round and deletes the files it wrote (but not
when the catalog cannot tell whether the commit landed: then they stay, for a later orphan
removal to take if no snapshot names them). The
feed's own commit, refused because maintenance committed first, reads the table again
(``IcebergPublisher.promote``). Neither loses the other's commit.

What it did is a :class:`MaintenanceReport`, saved (unless a dry run) as
``<state>/maintenance/<feed>/<UTC time>.json``: the run history the view's feed page reads
(:func:`last_record`).
"""

from __future__ import annotations

import json
import math
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tidemark.config.models import Feed, Maintenance, state_location
from tidemark.errors import ConfigError, PublishError
from tidemark.output.iceberg import IcebergPublisher, plan_history
from tidemark.storage import Location

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

ATTEMPTS = 5
SMALL = 0.75  # of the target size: a file below it is small
MAINTENANCE_KEY = "tidemark.maintenance"
RECORDS_DIR = "maintenance"
DEFAULT = Maintenance()


@dataclass(frozen=True)
class MaintenanceReport:
    """What one maintenance run found and did (counts of the table's live data files before and after)."""

    feed: str
    table: str
    started_at: str
    finished_at: str = ""
    dry_run: bool = False
    files_before: int = 0
    bytes_before: int = 0
    files_after: int = 0
    bytes_after: int = 0
    partitions_compacted: int = 0
    files_rewritten: int = 0
    files_written: int = 0
    snapshots_before: int = 0
    snapshots_expired: int = 0
    orphans_removed: int = 0
    orphan_bytes: int = 0
    commit_retries: int = 0
    dead_letter_snapshots_expired: int = 0  # the dead-letter table's (steps 2 and 3 only)
    dead_letter_orphans_removed: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["notes"] = list(self.notes)
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> MaintenanceReport:
        known = {k: v for k, v in doc.items() if k in cls.__dataclass_fields__}
        known["notes"] = tuple(known.get("notes", ()))
        return cls(**known)

    def summary(self) -> str:
        """One line: what the view and the CLI show."""
        verb = "would rewrite" if self.dry_run else "rewrote"
        return (
            f"{self.files_before} files ({_mb(self.bytes_before)}) -> {self.files_after} files "
            f"({_mb(self.bytes_after)}); {verb} {self.files_rewritten} small files into {self.files_written} in "
            f"{self.partitions_compacted} partitions; {self.snapshots_expired} of {self.snapshots_before} snapshots "
            f"expired; {self.orphans_removed} orphan files ({_mb(self.orphan_bytes)}) removed; "
            f"{self.commit_retries} commits retried"
        )


def _mb(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MB"


@dataclass
class _Tally:
    """Counters filled as the steps go (the report is built from them at the end)."""

    partitions: int = 0
    rewritten: int = 0
    written: int = 0
    snapshots_before: int = 0
    expired: int = 0
    orphans: int = 0
    orphan_bytes: int = 0
    retries: int = 0
    notes: list[str] = field(default_factory=list)


def maintain(feed: Feed, *, dry_run: bool = False, now: datetime | None = None, root: Any = None) -> MaintenanceReport:
    """Compact, expire and remove orphans of ``feed``'s table (see the module docstring); the report, saved."""
    if feed.output_format != "iceberg":
        raise ConfigError(
            f"feed '{feed.name}' publishes Parquet folders: maintenance is for Iceberg tables (a folder's plans are "
            "kept as published; see docs/ARCHITECTURE.md, 'Table maintenance')"
        )
    settings = feed.maintenance or DEFAULT
    started = datetime.now(UTC).isoformat()  # the record's time; ``now`` (a test's or a benchmark's) decides ages
    now = now or datetime.now(UTC)
    publisher = IcebergPublisher(feed)
    table = publisher.load()
    if table is None:
        return MaintenanceReport(feed.name, publisher.table_name, started, datetime.now(UTC).isoformat(), dry_run,
                                 notes=("the table does not exist yet",))  # fmt: skip
    files_before, bytes_before = _live_totals(table)
    tally = _Tally()
    table = compact(table, settings, tally, dry_run=dry_run)
    table = expire(table, settings, tally, now=now, dry_run=dry_run)
    remove_orphans(table, publisher.location, settings, tally, now=now, dry_run=dry_run)
    dead, dead_tally = publisher.dead_letter_table(), _Tally()
    if dead is not None:
        dead = expire(dead, settings, dead_tally, now=now, dry_run=dry_run)
        remove_orphans(dead, publisher.dead_letters_location, settings, dead_tally, now=now, dry_run=dry_run)
        tally.retries += dead_tally.retries
        tally.notes += [f"dead-letter table {publisher.dead_letters_name}: {n}" for n in dead_tally.notes]
    files_after, bytes_after = _live_totals(table) if not dry_run else (files_before, bytes_before)
    report = MaintenanceReport(
        feed=feed.name, table=publisher.table_name, started_at=started, finished_at=datetime.now(UTC).isoformat(),
        dry_run=dry_run, files_before=files_before, bytes_before=bytes_before, files_after=files_after,
        bytes_after=bytes_after, partitions_compacted=tally.partitions, files_rewritten=tally.rewritten,
        files_written=tally.written, snapshots_before=tally.snapshots_before, snapshots_expired=tally.expired,
        orphans_removed=tally.orphans, orphan_bytes=tally.orphan_bytes, commit_retries=tally.retries,
        dead_letter_snapshots_expired=dead_tally.expired, dead_letter_orphans_removed=dead_tally.orphans,
        notes=tuple(tally.notes),
    )  # fmt: skip
    if not dry_run:
        save_record(report, root)
    return report


def _live_totals(table: Table) -> tuple[int, int]:
    files = [t.file for t in table.scan().plan_files()]
    return len(files), sum(f.file_size_in_bytes for f in files)


# -- 1. compaction ------------------------------------------------------------------------


def _key(f: DataFile) -> tuple[Any, ...]:
    return tuple(f.partition[i] for i in range(len(f.partition)))


def compaction_groups(table: Table, settings: Maintenance) -> list[list[DataFile]]:
    """The groups of small files to rewrite, each into files near the target size (see the module docstring)."""
    spec = table.spec()
    target = settings.target_file_bytes
    by_partition: dict[Any, list[DataFile]] = defaultdict(list)
    for task in table.scan().plan_files():
        f = task.file
        if f.spec_id == spec.spec_id and f.file_size_in_bytes < target * SMALL and not task.delete_files:
            by_partition[_key(f)].append(f)
    groups: list[list[DataFile]] = []
    for small in by_partition.values():
        if len(small) < settings.min_input_files:
            continue
        group: list[DataFile] = []
        for f in sorted(small, key=lambda d: d.file_path):
            group.append(f)
            if sum(d.file_size_in_bytes for d in group) >= target:
                groups.append(group)
                group = []
        if len(group) > 1:
            groups.append(group)
    return groups


def compact(table: Table, settings: Maintenance, tally: _Tally, *, dry_run: bool = False) -> Table:
    """Rewrite the small files of :func:`compaction_groups` in one snapshot, retried on a refused commit."""
    from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException, ValidationException

    groups = compaction_groups(table, settings)
    if not groups:
        return table
    tally.partitions = len({_key(g[0]) for g in groups})
    tally.rewritten = sum(len(g) for g in groups)
    if dry_run:
        tally.written = sum(max(1, math.ceil(sum(f.file_size_in_bytes for f in g) / settings.target_file_bytes))
                            for g in groups)  # fmt: skip
        return table
    old = [f for g in groups for f in g]
    new: list[DataFile] = []
    try:
        for group in groups:
            new += _rewrite(table, group, settings.target_file_bytes)
        tally.written = len(new)
        for _ in range(ATTEMPTS):
            try:
                _replace_files(table, old, new)
                return table.refresh()
            except CommitFailedException:  # a feed (or anyone) committed meanwhile: build on the new table
                tally.retries += 1
                table = table.refresh()
                live = {t.file.file_path: t.file for t in table.scan().plan_files()}
                if not all(f.file_path in live for f in old):
                    tally.notes.append("another writer rewrote some of the small files meanwhile; compaction skipped")
                    break
                old = [live[f.file_path] for f in old]
            except ValidationException as exc:
                tally.notes.append(f"compaction skipped: {exc}")
                break
        else:
            tally.notes.append(f"compaction refused {ATTEMPTS} times (the table kept changing); nothing replaced")
    except CommitStateUnknownException:
        raise  # the commit may have landed with the new files: they are not this run's to delete
    except BaseException:
        _delete_files(table, new)
        raise
    _delete_files(table, new)  # never committed: no snapshot names them
    tally.rewritten = tally.written = tally.partitions = 0
    return table


def _rewrite(table: Table, group: list[DataFile], target: int) -> list[DataFile]:
    """Read ``group`` through pyiceberg's scan and write it as files near ``target`` bytes in its partition."""
    import pyarrow.parquet as pq
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan, parquet_file_to_data_file

    paths = {f.file_path for f in group}
    tasks = [t for t in table.scan().plan_files() if t.file.file_path in paths]
    data = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table(tasks)
    order = [(c, "ascending") for c in ("topic", "partition", "offset") if c in data.column_names]
    data = data.sort_by(order) if order else data
    count = max(1, math.ceil(sum(f.file_size_in_bytes for f in group) / target))
    rows = math.ceil(data.num_rows / count) if data.num_rows else 0
    folder = "/".join(["data", *filter(None, [table.spec().partition_to_path(group[0].partition, table.schema())])])
    batch = uuid.uuid4().hex[:12]
    written: list[DataFile] = []
    for index in range(count):
        part = data.slice(index * rows, rows) if rows else data
        if index and part.num_rows == 0:
            break
        path = f"{table.location().rstrip('/')}/{folder}/compacted-{batch}-{index:05d}.parquet"
        with table.io.new_output(path).create(overwrite=False) as out:
            pq.write_table(part, out)
        written.append(parquet_file_to_data_file(table.io, table.metadata, path))
    return written


def _replace_files(table: Table, old: Iterable[DataFile], new: Iterable[DataFile]) -> None:
    """One snapshot deleting ``old`` and adding ``new``: a compare-and-set on the metadata ``table`` was loaded with."""
    with (
        table.transaction() as tx,
        tx.update_snapshot(snapshot_properties={MAINTENANCE_KEY: "compaction"}).overwrite() as replace,
    ):
        for f in old:
            replace.delete_data_file(f)
        for f in new:
            replace.append_data_file(f)


def _delete_files(table: Table, files: Iterable[DataFile]) -> None:
    for f in files:
        table.io.delete(f.file_path)


# -- 2. snapshot expiry -------------------------------------------------------------------


def expirable(table: Table, settings: Maintenance, now: datetime) -> list[int]:
    """Snapshots older than ``snapshot_max_age``, less the newest ``keep_snapshots`` of main and every ref's head."""
    kept = {s.snapshot_id for s in plan_history(table)[: settings.keep_snapshots]}
    kept |= {ref.snapshot_id for ref in table.metadata.refs.values()}
    cutoff = (now - settings.snapshot_max_age_td).timestamp() * 1000
    return [s.snapshot_id for s in table.snapshots() if s.timestamp_ms < cutoff and s.snapshot_id not in kept]


def expire(table: Table, settings: Maintenance, tally: _Tally, *, now: datetime, dry_run: bool = False) -> Table:
    """Expire :func:`expirable` snapshots, retried on a refused commit (each retry decides again)."""
    from pyiceberg.exceptions import CommitFailedException

    tally.snapshots_before = len(table.snapshots())
    for _ in range(ATTEMPTS):
        chosen = expirable(table, settings, now)
        if dry_run or not chosen:
            tally.expired = len(chosen)
            return table
        try:
            table.maintenance.expire_snapshots().by_ids(chosen).commit()
            tally.expired = len(chosen)
            return table.refresh()
        except CommitFailedException:
            tally.retries += 1
            table = table.refresh()
    tally.notes.append(f"snapshot expiry refused {ATTEMPTS} times (the table kept changing); nothing expired")
    return table


# -- 3. orphan files ------------------------------------------------------------------------


def _plain(path: str) -> str:
    """A file's path or URL as the listing gives it: ``file:`` URLs as paths, object-store URLs as they are."""
    for prefix in ("file://", "file:"):
        if path.startswith(prefix):
            return path[len(prefix) :]
    return path


def referenced(table: Table) -> set[str]:
    """Every file the table's metadata names: metadata files, manifest lists, manifests, data and statistics files."""
    names = {table.metadata_location, *(e.metadata_file for e in table.metadata.metadata_log)}
    names |= {s.statistics_path for s in table.metadata.statistics}
    names |= {s.statistics_path for s in table.metadata.partition_statistics}
    seen: set[str] = set()
    for snapshot in table.snapshots():
        names.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            names.add(manifest.manifest_path)
            names |= {e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io, discard_deleted=True)}
    return {_plain(n) for n in names}


def pending_files(location: Location) -> set[str]:
    """The data files runs staged for this table and have not committed (``<location>.pending/<run>/*.json``)."""
    pending = location.with_name(f"{location.name}.pending")
    found: set[str] = set()
    for name, _ in pending.files() if pending.exists() else []:
        if name.endswith(".json"):
            found |= {_plain(p) for p in json.loads((pending / name).read_text()).get("paths", [])}
    return found


def remove_orphans(
    table: Table, location: Location, settings: Maintenance, tally: _Tally, *, now: datetime, dry_run: bool = False
) -> None:
    """Delete files under ``location`` that nothing names (see the module docstring), older than the minimum age."""
    import pyarrow.fs as pafs

    keep = pending_files(location)  # first: a plan promoted after this is in the table loaded below
    keep |= referenced(table.refresh())
    cutoff = now - settings.orphan_min_age_td
    selector = pafs.FileSelector(location.fs_path, allow_not_found=True, recursive=True)
    for info in location.fs.get_file_info(selector):
        if info.type != pafs.FileType.File:
            continue
        path = info.path if location.is_local else f"{location.url.split('://', 1)[0]}://{info.path}"
        if path in keep or info.mtime is None or info.mtime.astimezone(UTC) >= cutoff:
            continue
        if not dry_run:
            try:
                location.fs.delete_file(info.path)
            except OSError as exc:
                tally.notes.append(f"could not remove orphan {path}: {exc}")
                continue
        tally.orphans += 1
        tally.orphan_bytes += int(info.size or 0)


# -- the run history --------------------------------------------------------------------


def records_dir(feed: str, root: Any = None) -> Location:
    return (Location.of(root) if root is not None else state_location()) / RECORDS_DIR / feed


def save_record(report: MaintenanceReport, root: Any = None) -> Location:
    stamp = datetime.fromisoformat(report.started_at).strftime("%Y%m%dT%H%M%S%fZ")
    folder = records_dir(report.feed, root)
    folder.mkdir()
    path = folder / f"{stamp}.json"
    path.write_text(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    return path


def last_record(feed: str, root: Any = None) -> MaintenanceReport | None:
    """The feed's newest maintenance record, or ``None`` when it was never maintained."""
    folder = records_dir(feed, root)
    names = sorted(name for name, _ in folder.files()) if folder.exists() else []
    if not names:
        return None
    try:
        return MaintenanceReport.from_dict(json.loads((folder / names[-1]).read_text()))
    except (ValueError, TypeError) as exc:
        raise PublishError(f"maintenance record {folder / names[-1]} is unreadable: {exc}") from exc
