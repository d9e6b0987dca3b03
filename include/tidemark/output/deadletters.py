"""A feed's dead letters: every record its shown plans quarantined, read as one table, each once.

The job keeps a plan's bad records aside with their raw bytes, the full reason
(``_reason``) and the reason codes (``_reason_codes``: ``decode_error``, or each broken
rule's label); see :func:`tidemark.job.stage.quarantine_writer`. Where they live follows
the output, and so does what makes them visible:

- **Parquet output**: inside the plan's publication, ``<output>/plan_id=<id>/_quarantine/``,
  listed by the plan's manifest. The publication is shown by one rename (or, on an object
  store, one PUT of the manifest) after the group's commit, so a plan's dead letters appear
  with its good records, never before; the reader takes only files a shown manifest lists.
- **Iceberg output**: the feed's dead-letter table (:mod:`tidemark.output.dead_letter_table`),
  to which :meth:`~tidemark.output.iceberg.IcebergPublisher.promote` appends a plan's
  quarantine folder (the run's own ``<output>.quarantine/run_id=<run>/plan_id=<id>/``, or the
  feed's ``iceberg.quarantine``; ``plan_id=<id>/`` directly under it for a job outside any run
  and for plans published before) once, after the plan's catalog commit. The reader takes its rows,
  then the folders of shown plans it holds no row of: plans published before the table
  existed, and one whose promotion crashed between its two commits until the next settle
  appends them. Shown: the plans the run ledger records ``shown`` for the feed (the
  checkpoint store's ``runs`` table: its rows outlive every snapshot expiry), and those the
  table's main-branch history still shows (jobs outside any run commit at once and have no
  ledger row).

Every ``(topic, partition, offset)`` of a feed's output is in at most one shown plan (the
commit protocol, ``docs/ARCHITECTURE.md``), so a dead letter is listed once: a retry or
rerun of a plan replaces its unshown quarantine and adds nothing to a shown one.
Backfills and replays publish beside the feed's output; their dead letters are theirs, not
the feed's. :func:`dead_letters` returns the rows, :func:`summarize` groups them by reason
code and day with counts and examples (``tidemark deadletters FEED``). Nothing here masks a
value: the rows hold the bytes Kafka held.

A re-drive (:mod:`tidemark.runs.redrive`) publishes the dead letters that now pass into
the feed's output and keeps its record, :class:`RedriveRecord` (the ``(plan, topic,
partition, offset)`` it took, and the new reasons of those that still fail), in the run
ledger beside its row under :func:`redrive_ledger_feed` (a copy in its run dir's
``redrive.json``, which is read only for a re-drive recorded before the ledger kept records).
Only plans the feed wrote are read: a Parquet manifest or an Iceberg snapshot summary that
names another feed is not this feed's, wherever it lies. A dead
letter a shown re-drive took is *re-driven*: left out of the listing (``redriven=True``
lists them too), so no later re-drive takes it again; one that still failed carries the
newest re-drive's reasons (``rechecked_by`` names that run).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time
from typing import Any

from tidemark.checkpoints.store import CheckpointStore, LedgerRun, default_store
from tidemark.config.models import Feed, load_feed
from tidemark.output import publisher_for
from tidemark.output.base import QUARANTINE_DIR, Publisher
from tidemark.output.dead_letter_table import aware, file_rows, plans_in, quarantine_files, scan_rows
from tidemark.output.iceberg import FEED_KEY, PLAN_KEY, RETRACTED_KEY, RUN_KEY, IcebergPublisher, plan_history
from tidemark.output.parquet import load_manifest
from tidemark.storage import Location

EXAMPLES = 3  # per reason and day in a summary
REDRIVE_FILE = "redrive.json"  # in a re-drive's run dir: what it took (RedriveRecord)
Key = tuple[str, str, int, int]  # a dead letter's identity: (plan id, topic, partition, offset)


@dataclass(frozen=True)
class DeadLetter:
    """One quarantined record as Kafka held it, the plan and run that published it, and why it is bad."""

    topic: str
    partition: int
    offset: int
    timestamp: datetime | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    plan_id: str
    run_id: str | None
    reason_codes: tuple[str, ...]
    reason: str
    timestamp_type: int = 0  # Java's ids, as the read schema's
    rechecked_by: str | None = None  # the last re-drive that re-checked it (reason_codes are then its)
    redriven_by: str | None = None  # the re-drive run that published it (listed only with redriven=True)

    @property
    def key_of(self) -> Key:
        """What names it across re-drives: the plan that quarantined it (its id covers the topic id) and offset."""
        return (self.plan_id, self.topic, self.partition, self.offset)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: bytes as UTF-8 text, a byte that is not UTF-8 as ``\\xNN`` (``backslashreplace``)."""
        return {
            "topic": self.topic, "partition": self.partition, "offset": self.offset,
            "timestamp": None if self.timestamp is None else self.timestamp.isoformat(),
            "key": _text(self.key), "value": _text(self.value),
            "headers": [[k, _text(v)] for k, v in self.headers],
            "plan_id": self.plan_id, "run_id": self.run_id,
            "reason_codes": list(self.reason_codes), "reason": self.reason,
            "rechecked_by": self.rechecked_by, "redriven_by": self.redriven_by,
        }  # fmt: skip


@dataclass(frozen=True)
class ReasonDay:
    """The dead letters of one reason code on one UTC day (by record timestamp): how many, and a few of them."""

    reason: str
    day: date | None
    count: int
    examples: tuple[DeadLetter, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "day": None if self.day is None else self.day.isoformat(), "count": self.count,
                "examples": [e.to_dict() for e in self.examples]}  # fmt: skip


@dataclass(frozen=True)
class _Source:
    """A quarantine file of a shown plan."""

    file: Location
    path: str  # relative to the plan's quarantine folder: its topic=<t>/ part names the topic
    plan_id: str
    run_id: str | None


@dataclass(frozen=True)
class RedriveRecord:
    """What one re-drive took (``taken``: published into the feed's output) and what it found still failing.

    Written into the re-drive's run dir before its ledger row, so a row always has its record;
    ``redrive_id`` (the publication's plan id) is a hash of ``taken``: the same dead letters,
    the same publication, which the output publishes once.
    """

    redrive_id: str
    run_id: str
    feed: str
    taken: tuple[Key, ...]
    failing: tuple[tuple[Key, tuple[str, ...]], ...] = ()

    def to_json(self) -> str:
        return json.dumps({"redrive_id": self.redrive_id, "run_id": self.run_id, "feed": self.feed,
                           "taken": [list(k) for k in self.taken],
                           "failing": [[list(k), list(codes)] for k, codes in self.failing]}, indent=2)  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> RedriveRecord:
        doc = json.loads(text)
        return cls(
            redrive_id=str(doc["redrive_id"]), run_id=str(doc["run_id"]), feed=str(doc["feed"]),
            taken=tuple(_key(k) for k in doc["taken"]),
            failing=tuple((_key(k), tuple(str(c) for c in codes)) for k, codes in doc.get("failing", [])),
        )  # fmt: skip


def _key(row: Sequence[Any]) -> Key:
    plan_id, topic, partition, offset = row
    return (str(plan_id), str(topic), int(partition), int(offset))


def redrive_ledger_feed(feed: str) -> str:
    """The run ledger's ``feed`` value of ``feed``'s re-drives: apart from its runs, so settling a run of the feed
    never takes a re-drive for one (``:`` is in no feed name)."""
    return f"{feed}:redrive"


def read_redrive(row: LedgerRun, kept: Mapping[str, str] | None = None) -> RedriveRecord | None:
    """A re-drive row's record: the run ledger's (``kept``: :meth:`CheckpointStore.redrive_records`), else, for a
    re-drive recorded before the ledger kept records, the one in its run dir; ``None``: recorded nowhere."""
    text = (kept or {}).get(row.run_id)
    if text is not None:
        return RedriveRecord.from_json(text)
    path = Location.of(row.run_dir) / REDRIVE_FILE
    return RedriveRecord.from_json(path.read_text()) if path.exists() else None


@dataclass(frozen=True)
class Redriven:
    """A feed's shown re-drives: who took each dead letter, and the newest re-check of the rest."""

    taken: Mapping[Key, str]  # dead letter -> the re-drive run that published it
    rechecked: Mapping[Key, tuple[str, tuple[str, ...]]]  # dead letter -> (re-drive run, its reasons then)
    records: tuple[RedriveRecord, ...] = ()
    unknown: tuple[str, ...] = ()  # re-drives that published, their record in neither the ledger nor their run dir


def redriven(feed: Feed, store: CheckpointStore, publisher: Publisher | None = None) -> Redriven:
    """What ``feed``'s re-drives published: those the ledger records ``shown``, and any open one whose publication
    the output already shows (a re-drive that crashed after publishing, before its ledger said so). Each one's
    letters come from the run ledger (:func:`read_redrive`), so removing run dirs changes nothing."""
    ledger_feed = redrive_ledger_feed(feed.name)
    rows = store.feed_runs(ledger_feed, ("shown", "planned", "committing", "committed"))
    kept = store.redrive_records(feed.group, ledger_feed) if rows else {}
    taken: dict[Key, str] = {}
    rechecked: dict[Key, tuple[str, tuple[str, ...]]] = {}
    records = []
    unknown = []
    for row in rows:  # oldest first: a later re-check replaces an earlier one
        if row.state != "shown":
            publisher = publisher or publisher_for(feed)
            if publisher.published(row.plan_id) is None:
                continue
        record = read_redrive(row, kept)
        if record is None:
            unknown.append(row.run_id)
            continue
        records.append(record)
        taken.update((k, record.run_id) for k in record.taken)
        rechecked.update((k, (record.run_id, codes)) for k, codes in record.failing)
    return Redriven(taken, rechecked, tuple(records), tuple(unknown))


def dead_letters(
    feed: Feed | str,
    since: datetime | date | None = None,
    reason: str | None = None,
    *,
    store: CheckpointStore | None = None,
    redriven_too: bool = False,
) -> list[DeadLetter]:
    """The dead letters of ``feed`` (a :class:`Feed` or its name), oldest plan first, by topic, partition, offset.

    ``since``: only records stamped at or after it (a date is its UTC midnight; a naive time
    is UTC). ``reason``: only records with a reason code equal to it, or whose code is it
    followed by ``(`` (``expect_column_values_to_match_regex`` takes every column's); a
    record a re-drive re-checked goes by that re-drive's reasons. Dead letters a re-drive
    published are left out unless ``redriven_too``. ``store``: the checkpoint store with the
    run ledger (default: :func:`~tidemark.checkpoints.store.default_store`).
    """
    chosen = feed if isinstance(feed, Feed) else load_feed(feed)
    ledger = store if store is not None else default_store()
    floor = _utc(since)
    done = redriven(chosen, ledger)
    found = []
    for d in _letters(chosen, ledger, floor):
        by = done.taken.get(d.key_of)
        if by is not None:
            if not redriven_too:
                continue
            d = replace(d, redriven_by=by)
        elif (again := done.rechecked.get(d.key_of)) is not None:
            run_id, codes = again
            text = f"re-checked by re-drive {run_id}: {'; '.join(codes)} (first: {d.reason})"
            d = replace(d, reason_codes=codes, rechecked_by=run_id, reason=text)
        if floor is not None and (d.timestamp is None or d.timestamp < floor):
            continue
        if reason is not None and not any(c == reason or c.startswith(f"{reason}(") for c in d.reason_codes):
            continue
        found.append(d)
    return sorted(found, key=lambda d: (d.topic, d.partition, d.offset))


def summarize(letters: Iterable[DeadLetter], examples: int = EXAMPLES) -> list[ReasonDay]:
    """``letters`` by reason code and UTC day, most first; a record with two codes counts under each."""
    groups: dict[tuple[str, date | None], list[DeadLetter]] = defaultdict(list)
    for d in letters:
        day = None if d.timestamp is None else d.timestamp.astimezone(UTC).date()
        for code in d.reason_codes:
            groups[(code, day)].append(d)
    return sorted(
        (ReasonDay(code, day, len(rows), tuple(rows[:examples])) for (code, day), rows in groups.items()),
        key=lambda g: (-g.count, g.reason, g.day or date.min),
    )


def _utc(since: datetime | date | None) -> datetime | None:
    if since is None:
        return None
    if not isinstance(since, datetime):
        return datetime.combine(since, time.min, UTC)
    return since if since.tzinfo is not None else since.replace(tzinfo=UTC)


def _letters(feed: Feed, store: CheckpointStore, floor: datetime | None) -> list[DeadLetter]:
    publisher = publisher_for(feed)
    if isinstance(publisher, IcebergPublisher):
        return _iceberg_letters(publisher, store, floor)
    return [d for source in _parquet_sources(publisher, feed.name) for d in _read(source, feed.name)]


def _parquet_sources(publisher: Publisher, feed: str) -> list[_Source]:
    """The quarantine files the shown manifests of ``feed``'s plans list; a plan another feed wrote into the same
    folder (its manifest names that feed) is not this feed's."""
    root = publisher.location
    found = []
    for folder in root.children(folders_only=True) if root.exists() else []:
        if not folder.name.startswith("plan_id="):
            continue
        plan_id = folder.name[len("plan_id=") :]
        manifest = load_manifest(root, plan_id)  # the commit point: a folder without one is not shown
        if manifest is None or manifest.feed != feed:
            continue
        run_id = manifest.extra.get("run_id")
        found += [_Source(folder / f.path, f.path[len(QUARANTINE_DIR) + 1 :], plan_id, run_id)
                  for f in manifest.files if f.path.startswith(f"{QUARANTINE_DIR}/")]  # fmt: skip
    return found


def _iceberg_letters(publisher: IcebergPublisher, store: CheckpointStore, floor: datetime | None) -> list[DeadLetter]:
    """The rows of the feed's dead-letter table (``floor``: its day partitions before it pruned), and the quarantine
    folders of shown plans the table holds no row of (:func:`_iceberg_sources`)."""
    dead = publisher.dead_letter_table()
    name = publisher.feed.name
    letters = [] if dead is None else [_letter(row) for row in scan_rows(dead, name, floor)]
    appended = set() if dead is None else plans_in(dead, name)
    return letters + [d for source in _iceberg_sources(publisher, store, appended) for d in _read(source, name)]


def _iceberg_sources(publisher: IcebergPublisher, store: CheckpointStore, appended: set[str]) -> list[_Source]:
    """The quarantine folders of the plans the table shows and the dead-letter table holds no row of.

    Every plan committed since the dead-letter table exists appends its rows in its promotion
    (:meth:`IcebergPublisher.promote`), so this finds the plans published before it, and a plan
    whose promotion crashed between its two commits until the next settle appends them; a plan
    that quarantined nothing has no folder. Which plans the table shows: the run ledger's
    ``shown`` rows of the feed first (the commit protocol records a run ``shown`` only after its
    catalog commit, and the rows outlive snapshot expiry), then the main branch's history,
    newest snapshot first (a retraction hides older ones), for plans published outside any run:
    only snapshots whose summary names this feed (``tidemark.feed``), never another feed's plan in a
    shared table.
    A run shown in a backfill's or replay's own output has no folder here: its quarantine is
    beside that output.
    """
    table = publisher.load()
    if table is None:
        return []
    by_ledger = {row.plan_id: row.run_id for row in store.feed_runs(publisher.feed.name, ("shown",))}
    shown: dict[str, str | None] = {}
    hidden: set[str] = set()
    for snapshot in plan_history(table):
        summary = snapshot.summary
        if summary is None:
            continue
        retracted = summary.get(RETRACTED_KEY)
        if retracted and retracted not in shown:
            hidden.add(retracted)
        plan_id = summary.get(PLAN_KEY)
        if summary.get(FEED_KEY) != publisher.feed.name:  # another feed's plan in a shared table: not ours
            continue
        if plan_id and plan_id not in hidden and plan_id not in shown:
            shown[plan_id] = summary.get(RUN_KEY)
    plans = {**by_ledger, **{p: r for p, r in reversed(shown.items()) if p not in by_ledger}}  # oldest first
    found = []
    for plan_id, run_id in plans.items():
        if plan_id in appended:
            continue
        folder = publisher.quarantine_folder(plan_id, run_id)
        found += [_Source(file, name, plan_id, run_id) for file, name in quarantine_files(folder)]
    return found


def _read(source: _Source, feed: str) -> list[DeadLetter]:
    rows = file_rows(source.file, source.path, feed=feed, plan_id=source.plan_id, run_id=source.run_id,
                     dead_lettered_at=None)  # fmt: skip
    return [_letter(row) for row in rows]


def _letter(row: Mapping[str, Any]) -> DeadLetter:
    """A row as the dead-letter table holds it (:func:`tidemark.output.dead_letter_table.schema`)."""
    return DeadLetter(
        topic=str(row["topic"]),
        partition=int(row["partition"]),
        offset=int(row["offset"]),
        timestamp=aware(row.get("timestamp")),
        key=row.get("key"),
        value=row.get("value"),
        headers=tuple((str(h["key"]), h.get("value")) for h in row.get("headers") or ()),
        plan_id=str(row["plan_id"]),
        run_id=row.get("run_id"),
        reason_codes=tuple(row.get("reason_codes") or ()),
        reason=str(row.get("reason") or ""),
        timestamp_type=int(row.get("timestamp_type") or 0),
    )


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "backslashreplace")
