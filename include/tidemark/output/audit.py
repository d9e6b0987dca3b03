"""What a feed's output holds, read from outside the run: its publications, their records' offsets, its files.

``tidemark verify`` (:mod:`tidemark.runs.verify`) compares this with Kafka and the run
ledger. Nothing here writes. Two backends, one shape:

- **Parquet folder**: every ``plan_id=<id>/`` with a manifest is a publication (its ranges
  and digests from the manifest); its data and quarantine files are the ones the manifest
  lists, read with pyarrow (``partition``, ``offset``, the ``topic`` from the file or its
  ``topic=`` folder, and ``key``/``value`` where the feed publishes the raw bytes), each
  checked against the manifest's sha256.
- **Iceberg table**: every snapshot of the current ancestry with ``tidemark.plan-id`` is a
  publication (its ranges from ``tidemark.ranges``); the rows are the current snapshot's,
  through pyiceberg's scan; a plan's quarantine is its folder beside the table.

**What owns a file** is one function, :func:`owner`: a publication's manifest and the files
it lists (with Spark's ``.crc`` sidecars), the files an Iceberg table's metadata names, a
pending publication of a run the ledger holds open, a staging folder ``_staging/<run id>.<nonce>/``
(and its lock ``<run id>.<nonce>.lock``) of such a run (``<plan id>.<nonce>``: of a job outside any run
staging such a plan), a run's quarantine folder ``run_id=<run>/plan_id=<id>/`` while the ledger holds the run
open or once the output shows the plan as that run published it, and the older ``plan_id=<id>/`` quarantine
of a shown or open plan. A file under the output that none of these claims is owned by nothing.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tidemark.config.models import Feed
from tidemark.errors import PublishError, StateStoreError
from tidemark.output.base import QUARANTINE_DIR, STAGING_DIR
from tidemark.output.iceberg import PLAN_KEY, RANGES_KEY, RUN_KEY, IcebergPublisher, plan_history
from tidemark.output.maintenance import plain, referenced
from tidemark.output.output_schema import ROOT_FILES
from tidemark.output.parquet import MANIFEST_NAME, PENDING_DIR, load_manifest
from tidemark.storage import Location

if TYPE_CHECKING:
    import pyarrow as pa

Scope = Mapping[tuple[str, int], tuple[int, int]]  # per topic and partition, the [start, end) a scoped audit reads
LEFTOVER = "leftover"  # owner() of an earlier attempt's upload, awaiting maintenance's orphan removal
REDRIVE_PREFIX = "redrive-"  # a re-drive's publication id (tidemark.runs.redrive)
ROW_COLUMNS = ("topic", "partition", "offset")
CONTENT_COLUMNS = ("key", "value")


@dataclass(frozen=True)
class Range:
    """One range a publication claims, with the digest its job recorded (``None``: not recorded or not found)."""

    topic: str
    partition: int
    start: int
    end: int
    topic_id: str | None = None
    records: int | None = None
    bytes: int | None = None
    checksum: str | None = None


@dataclass(frozen=True)
class Publication:
    plan_id: str
    run_id: str | None
    where: str  # for messages: the manifest's path or the snapshot
    ranges: tuple[Range, ...] = ()

    @property
    def redrive(self) -> bool:
        return self.plan_id.startswith(REDRIVE_PREFIX)


def overlaps(publication: Publication, scope: Scope | None) -> bool:
    """Whether ``publication``'s recorded ranges meet ``scope`` (``None``: the whole feed). A re-drive records no
    ranges and holds only dead letters: always read, so a re-driven dead letter is told from an unlisted one."""
    if scope is None or publication.redrive:
        return True
    for r in publication.ranges:
        span = scope.get((r.topic, r.partition))
        if span is not None and r.start < span[1] and span[0] < r.end:
            return True
    return False


@dataclass
class Rows:
    """Records a publication shows (``data``) or keeps aside (``quarantine``): arrow columns ``topic, partition,
    offset`` and, where published as raw bytes, ``key, value``."""

    plan_id: str
    where: str
    table: pa.Table
    quarantine: bool = False


@dataclass(frozen=True)
class FileProblem:
    kind: str  # missing_file, changed_file, unowned_file
    path: str
    message: str


@dataclass(frozen=True)
class Claims:
    """What may own a file under a feed's output: see :func:`owner`."""

    listed: frozenset[str] = frozenset()  # files a manifest lists, manifests, files an Iceberg table's metadata names
    open_runs: frozenset[str] = frozenset()  # run ids the ledger holds open (their pending publications)
    open_plans: frozenset[str] = frozenset()  # plan ids of those runs (their staging and quarantine folders)
    shown_plans: frozenset[str] = frozenset()  # plan ids the output shows (their quarantine folders)
    pending_files: frozenset[str] = frozenset()  # files the pending records of open runs list
    shown_runs: frozenset[tuple[str, str]] = frozenset()  # (run id, plan id) of each shown publication (its quarantine)


def owner(path: str, root: Location, claims: Claims) -> str | None:
    """Who owns the file ``path`` (a path or URL) under ``root`` (the output, the table location or a sibling of
    it), or ``None`` when nothing does. The one rule ``tidemark verify`` applies to every file it lists."""
    if path in claims.listed or path in claims.pending_files:
        return "referenced"
    folder, name = posixpath.split(path)
    sidecar_of = posixpath.join(folder, name[1 : -len(".crc")])  # Spark's checksum sidecar of a file beside it
    if name.startswith(".") and name.endswith(".crc") and sidecar_of in claims.listed:
        return "sidecar"
    relative = path[len(str(root).rstrip("/")) + 1 :] if path.startswith(str(root).rstrip("/") + "/") else path
    parts = relative.split("/")
    base = root.name
    if parts[0] == "data" and name.split("-", 1)[0] in claims.shown_plans | claims.open_plans:
        # An Iceberg upload of a plan the table shows or an open run stages, in no snapshot: a crashed or losing
        # attempt's (attempts are named apart), which the table's orphan removal deletes once old enough.
        return LEFTOVER
    if base.endswith(".pending") and len(parts) >= 2:  # an Iceberg table's pending records: <run>/plan_id=<id>.json
        return "pending" if parts[0] in claims.open_runs else None
    if base.endswith(".quarantine") and parts[0].startswith("run_id=") and len(parts) >= 3:
        # A run's own quarantine, <quarantine>/run_id=<run>/plan_id=<id>/: the run's while the ledger holds it open
        # (its discard deletes it), the plan's once the output shows the plan as this run published it.
        run_id = parts[0][len("run_id=") :]
        plan_id = parts[1][len("plan_id=") :] if parts[1].startswith("plan_id=") else None
        if plan_id is not None and (run_id in claims.open_runs or (run_id, plan_id) in claims.shown_runs):
            return "quarantine"
        return None
    if base.endswith(".quarantine") and parts[0].startswith("plan_id="):  # a job outside any run, or older plans
        plan_id = parts[0][len("plan_id=") :]
        return "quarantine" if plan_id in claims.shown_plans | claims.open_plans else None
    if len(parts) == 1 and parts[0] in ROOT_FILES:  # a Parquet output's one schema (tidemark.output.output_schema)
        return "output_schema"
    if parts[0] == PENDING_DIR and len(parts) >= 3:  # a Parquet output's pending publication: _pending/<run>/...
        return "pending" if parts[1] in claims.open_runs else None
    if parts[0] == STAGING_DIR and len(parts) >= 2:
        # A staging folder _staging/<run id>.<nonce>/... and its lock _staging/<run id>.<nonce>.lock (a job outside
        # any run: <plan id>.<nonce>); run ids and plan ids hold no dot.
        return "staging" if parts[1].split(".", 1)[0] in claims.open_runs | claims.open_plans else None
    return None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _topic_from(path: str) -> str | None:
    for part in path.split("/"):
        if part.startswith("topic="):
            return part[len("topic=") :]
    return None


def _read_rows(data: bytes, relative: str, content: bool) -> pa.Table:
    """A Parquet file's ``topic, partition, offset`` (and ``key, value`` with ``content``, where present)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = pa.BufferReader(data)
    names = set(pq.read_schema(source).names)
    wanted = [c for c in (*ROW_COLUMNS, *(CONTENT_COLUMNS if content else ())) if c in names]
    table = pq.read_table(pa.BufferReader(data), columns=wanted)
    if "topic" not in names:
        table = table.append_column("topic", pa.array([_topic_from(relative)] * table.num_rows, pa.string()))
    return table.select([c for c in (*ROW_COLUMNS, *CONTENT_COLUMNS) if c in table.column_names])


def _ranges(docs: Iterable[Mapping[str, Any]], topic_ids: Mapping[tuple[str, int], str | None]) -> tuple[Range, ...]:
    return tuple(
        Range(
            topic=str(r["topic"]),
            partition=int(r["partition"]),
            start=int(r["start"]),
            end=int(r["end"]),
            topic_id=r.get("topic_id") or topic_ids.get((str(r["topic"]), int(r["partition"]))),
            records=None if r.get("records") is None else int(r["records"]),
            bytes=None if r.get("bytes") is None else int(r["bytes"]),
            checksum=r.get("checksum"),
        )
        for r in docs
    )


@dataclass
class OutputView:
    """What :func:`read_output` found."""

    publications: list[Publication] = field(default_factory=list)
    rows: list[Rows] = field(default_factory=list)
    problems: list[FileProblem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def read_parquet_output(root: Location, content: bool, claims: Claims, scope: Scope | None = None) -> OutputView:
    """A Parquet folder's publications, rows and file problems (``claims``: what the ledger holds open). With
    ``scope``, only the files of publications whose ranges meet it are read (the others' manifests are, and their
    files listed as owned)."""
    view = OutputView()
    listed: set[str] = set()
    shown: set[str] = set()
    for folder in root.children(folders_only=True):
        if not folder.name.startswith("plan_id="):
            continue
        plan_id = folder.name[len("plan_id=") :]
        try:
            manifest = load_manifest(root, plan_id)
        except PublishError:
            manifest = None  # a folder without a manifest: every file in it is owned by nothing
        if manifest is None:
            continue
        shown.add(plan_id)
        where = str(folder / MANIFEST_NAME)
        listed.add(where)
        publication = Publication(plan_id, manifest.extra.get("run_id"), where, _ranges(manifest.ranges, {}))
        view.publications.append(publication)
        entries = {entry.path: entry for entry in manifest.files}
        if not overlaps(publication, scope):
            listed |= {str(folder / name) for name in entries}
            continue
        # A local folder is read whole by its readers (Spark, pyarrow): every Parquet file in it counts, listed or
        # not. On an object store readers go by the manifest's list.
        seen = sorted(
            set(entries) | ({n for n, _ in folder.files() if n.endswith(".parquet")} if root.is_local else set())
        )
        for name in seen:
            path = folder / name
            entry = entries.get(name)
            if entry is not None:
                listed.add(str(path))
            try:
                data = path.read_bytes()
            except (FileNotFoundError, StateStoreError) as exc:
                view.problems.append(
                    FileProblem("missing_file", str(path), f"{path}: listed by {where}, missing: {exc}")
                )
                continue
            if entry is not None and _sha256(data) != entry.sha256:
                view.problems.append(FileProblem("changed_file", str(path),
                                                 f"{path}: its sha256 differs from the one {where} lists"))  # fmt: skip
            quarantine = name.startswith(QUARANTINE_DIR)
            view.rows.append(Rows(plan_id, str(path), _read_rows(data, name, content and not quarantine),
                                  quarantine=quarantine))  # fmt: skip
    claims = replace(claims, listed=frozenset(listed), shown_plans=frozenset(shown))
    view.problems += unowned(root, claims)
    return view


def unowned(root: Location, claims: Claims, leftovers: list[str] | None = None) -> list[FileProblem]:
    """Every file under ``root`` that :func:`owner` gives no owner (``leftovers``: gets the :data:`LEFTOVER` ones)."""
    found = []
    for name, _ in root.files():
        path = str(root / name)
        who = owner(path, root, claims)
        if who == LEFTOVER and leftovers is not None:
            leftovers.append(path)
        if who is None:
            found.append(FileProblem("unowned_file", path, f"{path}: under the feed's output, owned by nothing "
                                     "(no manifest, snapshot, pending publication or open run names it)"))  # fmt: skip
    return found


def _missing(paths: Iterable[str], what: str) -> list[FileProblem]:
    problems = []
    for path in sorted(paths):
        if not Location.of(path).exists():
            problems.append(FileProblem("missing_file", path, f"{path}: {what}, missing"))
    return problems


def _added_by(table: Any) -> dict[str, int]:
    """The current snapshot's live data files, each with the id of the snapshot that added it."""
    snapshot = table.current_snapshot()
    found: dict[str, int] = {}
    for manifest in snapshot.manifests(table.io) if snapshot is not None else ():
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.snapshot_id is not None:
                found[entry.data_file.file_path] = int(entry.snapshot_id)
    return found


def row_filter(scope: Scope | None) -> Any:
    """A pyiceberg row filter keeping the rows of ``scope``'s offsets (everything with ``None``)."""
    from functools import reduce

    from pyiceberg.expressions import AlwaysFalse, AlwaysTrue, And, EqualTo, GreaterThanOrEqual, LessThan, Or

    if scope is None:
        return AlwaysTrue()
    make: Any = (EqualTo, GreaterThanOrEqual, LessThan)  # pyiceberg's stubs take bound terms only
    equal, at_least, below = make
    parts = [And(equal("topic", t), equal("partition", p), at_least("offset", start), below("offset", end))
             for (t, p), (start, end) in sorted(scope.items())]  # fmt: skip
    either: Any = Or
    return reduce(either, parts, AlwaysFalse())


def _scan_present(
    table: Any, columns: tuple[str, ...], redrives: Mapping[int, str], scope: Scope | None = None
) -> list[tuple[str, pa.Table]]:
    """The current snapshot's rows of ``columns``, from the data files that exist (a missing one is named apart):
    ``("*", rows)`` for the plans' files, and ``(re-drive id, rows)`` for the files a re-drive's snapshot added
    (``redrives``: snapshot id -> re-drive id), so that a re-driven dead letter is told from a published record.
    With ``scope``, only the rows of its offsets (the files whose statistics rule them out are not read)."""
    from pyiceberg.io.pyarrow import ArrowScan

    scan = table.scan(selected_fields=columns, row_filter=row_filter(scope))
    added = _added_by(table) if redrives else {}
    groups: dict[str, list[Any]] = {"*": []}
    for task in scan.plan_files():
        if Location.of(plain(task.file.file_path)).exists():
            groups.setdefault(redrives.get(added.get(task.file.file_path, -1), "*"), []).append(task)
    arrow = ArrowScan(table.metadata, table.io, scan.projection(), scan.row_filter, scan.case_sensitive)
    return [(plan_id, arrow.to_table(tasks)) for plan_id, tasks in groups.items() if tasks or plan_id == "*"]


def read_iceberg_output(
    feed: Feed, content: bool, claims: Claims, run_ranges: Mapping[str, tuple[Mapping[str, Any], ...]],
    scope: Scope | None = None,
) -> OutputView:  # fmt: skip
    """An Iceberg table's publications (the current ancestry's plans), its current rows, its quarantine folders'
    rows and file problems. ``run_ranges``: per run id, the range statistics its job recorded (``job.json``).
    ``scope``: only the rows of its offsets, and the quarantine folders of the publications whose ranges meet it."""
    view = OutputView()
    publisher = IcebergPublisher(feed)
    table = publisher.load()
    if table is None:
        view.notes.append(f"Iceberg table {publisher.table_name} does not exist yet")
        return view
    for snapshot in reversed(plan_history(table)):
        summary = snapshot.summary
        plan_id = None if summary is None else summary.get(PLAN_KEY)
        if summary is None or plan_id is None:
            continue
        run_id = summary.get(RUN_KEY)
        recorded = {(str(r["topic"]), int(r["partition"])): r for r in run_ranges.get(run_id or "", ())}
        docs = []
        for r in json.loads(summary.get(RANGES_KEY) or "[]"):  # the job's digest, where its run dir still holds it
            got = recorded.get((str(r["topic"]), int(r["partition"])), {})
            docs.append({**r, **{k: got[k] for k in ("records", "bytes", "checksum") if k in got}})
        view.publications.append(
            Publication(
                plan_id, run_id, f"snapshot {snapshot.snapshot_id} of {publisher.table_name}", _ranges(docs, {})
            )
        )
    names = set(table.schema().column_names)
    wanted = [c for c in (*ROW_COLUMNS, *(CONTENT_COLUMNS if content else ())) if c in names]
    redrives = {s.snapshot_id: str(s.summary.get(PLAN_KEY)) for s in plan_history(table)
                if s.summary is not None and str(s.summary.get(PLAN_KEY) or "").startswith(REDRIVE_PREFIX)}  # fmt: skip
    for plan_id, rows in _scan_present(table, tuple(wanted), redrives, scope):
        view.rows.append(Rows(plan_id, f"table {publisher.table_name}", rows))
    shown = {p.plan_id for p in view.publications}
    shown_runs = {(p.run_id, p.plan_id) for p in view.publications if p.run_id}
    for plan_id, run_id in sorted({(p.plan_id, p.run_id or "") for p in view.publications if overlaps(p, scope)}):
        # The quarantine as the run that shows the plan wrote it (its own folder, else the older plan_id= one).
        folder = publisher.quarantine_folder(plan_id, run_id or None)
        for name, _ in folder.files() if folder.exists() else []:
            if name.endswith(".parquet"):
                data = (folder / name).read_bytes()
                view.rows.append(Rows(plan_id, str(folder / name), _read_rows(data, name, False), quarantine=True))
    listed = referenced(table)
    dead = publisher.dead_letter_table()
    dead_listed = referenced(dead) if dead is not None else set()
    view.problems += _missing(listed, f"named by the metadata of {publisher.table_name}")
    view.problems += _missing(dead_listed, f"named by the metadata of {publisher.dead_letters_name}")
    claims = replace(claims, listed=frozenset(listed | dead_listed), shown_plans=frozenset(shown),
                     shown_runs=frozenset(shown_runs))  # fmt: skip
    location = publisher.location
    leftovers: list[str] = []
    for root in (location, location.with_name(f"{location.name}.pending"), publisher.quarantine,
                 publisher.dead_letters_location):  # fmt: skip
        view.problems += unowned(root, claims, leftovers)
    if leftovers:
        view.notes.append(
            f"{len(leftovers)} data files of earlier attempts of shown or open plans lie in no snapshot (e.g. "
            f"{leftovers[0]}): the table's maintenance removes them as orphans once old enough"
        )
    return view
