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
3. **removes orphans**: files under the table's own location (the one its metadata names),
   in ``data/``, ``metadata/`` and ``_staging/`` only (:data:`OWN_FOLDERS`), that no remaining
   snapshot (manifest list, manifests, data files), metadata file or statistics file names,
   that no pending run names (``<location>.pending/``, staged files waiting for their run's
   commit) and no run the run ledger holds open names by its plan id, older than
   ``orphan_min_age``. The pending records are read *before* the table, so a plan promoted
   meanwhile is in one or the other. A subtree that is another table's or a Parquet
   publication's is never judged, and a location another table's metadata shares is left
   alone (:func:`orphan_candidates`).

No step deletes a file a committed snapshot names, whatever signal arrives when: compaction
deletes the files it wrote only when no commit was sent with them, or when every commit was
refused and the reloaded table names none of them; an interrupt after a commit was sent leaves
them to orphan removal. Fault points ``maintenance.*`` sit between the steps.

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

from tidemark.checkpoints.store import CheckpointStore, default_store
from tidemark.config.models import Feed, Maintenance, state_location
from tidemark.errors import ConfigError, PublishError, StateStoreError
from tidemark.faults import fault_point
from tidemark.output.base import STAGING_DIR
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
# What an Iceberg table and Tidemark write under a table's location; orphan removal lists only these.
OWN_FOLDERS = ("data", "metadata", STAGING_DIR)


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


def open_plans(feed: Feed, store: CheckpointStore | None = None) -> list[str]:
    """The plan ids of the feed's runs and re-drives the run ledger holds open (planned, committing, committed)."""
    ledger = store if store is not None else default_store()
    return [r.plan_id for name in (feed.name, f"{feed.name}:redrive") for r in ledger.open_runs(name)]


def maintain(
    feed: Feed,
    *,
    dry_run: bool = False,
    now: datetime | None = None,
    root: Any = None,
    store: CheckpointStore | None = None,
) -> MaintenanceReport:
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
    plans = open_plans(feed, store)
    remove_orphans(table, settings, tally, now=now, dry_run=dry_run, open_plans=plans, outputs=[publisher.location])
    dead, dead_tally = publisher.dead_letter_table(), _Tally()
    if dead is not None:
        dead = expire(dead, settings, dead_tally, now=now, dry_run=dry_run)
        remove_orphans(dead, settings, dead_tally, now=now, dry_run=dry_run, open_plans=plans)
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
    from pyiceberg.exceptions import CommitFailedException, ValidationException

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
    sent = False  # once a commit was sent, only the catalog's answer says whether a snapshot names the new files
    try:
        for group in groups:
            new += _rewrite(table, group, settings.target_file_bytes)
        tally.written = len(new)
        fault_point("maintenance.after_rewrite")  # the new files written, no commit sent
        for _ in range(ATTEMPTS):
            try:
                sent = True
                _replace_files(table, old, new)
                fault_point("maintenance.after_compaction")  # committed: the current snapshot names the new files
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
    except BaseException:
        # An interrupt (SIGINT, a task timeout), a crash or a commit in an unknown state: after a commit was sent the
        # new files may be the current snapshot's, so they stay for orphan removal, which judges them by the
        # metadata it loads. Only files no commit ever named are this run's to delete.
        if not sent:
            _delete_files(table, new)
        raise
    _delete_unreferenced(table, new)  # every commit refused; deleted only if the reloaded table names none of them
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


def _delete_unreferenced(table: Table, files: Iterable[DataFile]) -> None:
    """Delete ``files`` that no snapshot of the table, loaded again now, names."""
    named = referenced(table.refresh())
    _delete_files(table, [f for f in files if plain(f.file_path) not in named])


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
            fault_point("maintenance.after_expiry")  # expired in the metadata; expiry deletes no file
            return table.refresh()
        except CommitFailedException:
            tally.retries += 1
            table = table.refresh()
    tally.notes.append(f"snapshot expiry refused {ATTEMPTS} times (the table kept changing); nothing expired")
    return table


# -- 3. orphan files ------------------------------------------------------------------------


def plain(path: str) -> str:
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
    return {plain(n) for n in names}


def pending_files(location: Location) -> set[str]:
    """The data files runs staged for this table and have not committed (``<location>.pending/<run>/*.json``)."""
    pending = location.with_name(f"{location.name}.pending")
    found: set[str] = set()
    for name, _ in pending.files() if pending.exists() else []:
        if name.endswith(".json"):
            found |= {plain(p) for p in json.loads((pending / name).read_text()).get("paths", [])}
    return found


def table_location(table: Table) -> Location:
    """The table's own location, as its metadata names it (not the feed file's output: the table is what it is)."""
    return Location.of(plain(table.location()).rstrip("/"))


def _foreign(parts: list[str], foreign_roots: set[str]) -> bool:
    """Whether a file (its path's parts below the table location) belongs to someone else: a Parquet publication
    (a ``plan_id=`` folder or a ``_manifest.json``) or another table whose root lies inside this one."""
    if parts[-1] == "_manifest.json" or any(p.startswith("plan_id=") for p in parts[:-1]):
        return True
    return any(parts[: len(root)] == root for root in (r.split("/") for r in foreign_roots))


def orphan_candidates(location: Location) -> tuple[list[tuple[str, Any]], int]:
    """The files maintenance may judge under ``location`` (a table's own), and how many it leaves as someone else's.

    Only the folders an Iceberg table and Tidemark write there (:data:`OWN_FOLDERS`: ``data/``,
    ``metadata/``, the staging folder ``_staging/``) are listed; inside them, a subtree that is
    another table's (it holds ``metadata/*.metadata.json``) or a Parquet publication's is left alone.
    """
    import pyarrow.fs as pafs

    base = location.fs_path.rstrip("/") + "/"
    found: list[tuple[str, Any]] = []
    for folder in OWN_FOLDERS:
        selector = pafs.FileSelector((location / folder).fs_path, allow_not_found=True, recursive=True)
        found += [(i.path[len(base) :], i) for i in location.fs.get_file_info(selector) if i.type == pafs.FileType.File]
    roots = set()
    for rel, _ in found:
        parts = rel.split("/")
        if len(parts) > 2 and parts[-2] == "metadata" and parts[-1].endswith(".metadata.json"):
            roots.add("/".join(parts[:-2]))
    mine = [(rel, info) for rel, info in found if not _foreign(rel.split("/"), roots)]
    return mine, len(found) - len(mine)


def _another_table(location: Location, rel: str, table: Table) -> str | None:
    """The table uuid of metadata file ``rel`` when it is not ``table``'s: another table shares the location."""
    try:
        uuid_text = str(json.loads((location / rel).read_text()).get("table-uuid", ""))
    except (OSError, ValueError, StateStoreError):
        return None
    return uuid_text if uuid_text and uuid_text != str(table.metadata.table_uuid) else None


def remove_orphans(
    table: Table,
    settings: Maintenance,
    tally: _Tally,
    *,
    now: datetime,
    dry_run: bool = False,
    open_plans: Iterable[str] = (),
    outputs: Iterable[Location] = (),
) -> None:
    """Delete the files of the table's own location that nothing names (see the module docstring), older than the
    minimum age: none that a kept snapshot, a pending publication (``<location>.pending/``, and beside each of
    ``outputs``) or an open run of the run ledger (``open_plans``: their plan ids, which name their data files and
    staging folders) names, none that is someone else's."""
    location = table_location(table)
    keep = pending_files(location)  # first: a plan promoted after this is in the table loaded below
    for output in outputs:  # the feed's output, where its runs record pending publications, if it is elsewhere
        keep |= pending_files(output) if output != location else set()
    plans = tuple(open_plans)
    table = table.refresh()
    keep |= referenced(table)
    cutoff = now - settings.orphan_min_age_td
    candidates, foreign = orphan_candidates(location)
    if foreign:
        tally.notes.append(f"{foreign} files under {location} belong to another table or publication; left alone")
    chosen = []
    for rel, info in candidates:
        path = info.path if location.is_local else f"{location.url.split('://', 1)[0]}://{info.path}"
        if path in keep or info.mtime is None or info.mtime.astimezone(UTC) >= cutoff:
            continue
        name = rel.rsplit("/", 1)[-1]
        if any(name.startswith(f"{p}-") or f"/{p}." in f"/{rel}" for p in plans):
            continue  # an open run's files: its pending record may not be written yet
        chosen.append((rel, path, info))
    uuids = (_another_table(location, rel, table) for rel, _, _ in chosen if rel.endswith(".metadata.json"))
    others = {u for u in uuids if u is not None}
    if others:
        tally.notes.append(
            f"metadata of another table ({', '.join(sorted(others))}) lies in {location}: no orphan removed there"
        )
        return
    fault_point("maintenance.before_orphans")  # chosen, none deleted
    for _, path, info in chosen:
        if not dry_run:
            try:
                location.fs.delete_file(info.path)
            except OSError as exc:
                tally.notes.append(f"could not remove orphan {path}: {exc}")
                continue
            fault_point("maintenance.after_orphan")  # one orphan deleted, the others not yet
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
