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
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time
from typing import Any
from urllib.parse import unquote

from tidemark.checkpoints.store import CheckpointStore, LedgerRun, RunState, default_store
from tidemark.config.models import Feed, load_feed
from tidemark.output import publisher_for
from tidemark.output.base import QUARANTINE_DIR, Publisher
from tidemark.output.dead_letter_table import (
    aware,
    file_rows,
    plans_in,
    quarantine_files,
    scan_rows,
    table_rows,
)
from tidemark.output.iceberg import FEED_KEY, PLAN_KEY, RETRACTED_KEY, RUN_KEY, IcebergPublisher, plan_history
from tidemark.output.parquet import load_manifest
from tidemark.planning.plan import REDRIVE_PREFIX
from tidemark.staged import REASON_CODES_COLUMN, REASON_COLUMN, reason_codes
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
    """The run ledger's ``feed`` value of ``feed``'s re-drives recorded before a re-drive was a run of the feed (read
    only: a re-drive's row is now under the feed's own name; ``:`` is in no feed name)."""
    return f"{feed}:redrive"


def read_redrive(row: LedgerRun, kept: Mapping[str, str] | None = None) -> RedriveRecord | None:
    """A re-drive row's record: the run ledger's (``kept``: :meth:`CheckpointStore.redrive_records`), else, for a
    re-drive recorded before the ledger kept records, the one in its run dir; ``None``: recorded nowhere."""
    text = (kept or {}).get(row.run_id)
    if text is not None:
        return RedriveRecord.from_json(text)
    path = Location.of(row.run_dir) / REDRIVE_FILE
    return RedriveRecord.from_json(path.read_text()) if path.exists() else None


REDRIVE_STATES: tuple[RunState, ...] = ("shown", "planned", "committing", "committed")


def is_redrive(row: LedgerRun) -> bool:
    """Whether a run-ledger row is a re-drive's (its plan ``redrive-…``)."""
    return row.plan_id.startswith(REDRIVE_PREFIX)


def redrive_rows(feed: str, store: CheckpointStore, states: tuple[RunState, ...] = REDRIVE_STATES) -> list[LedgerRun]:
    """The run ledger's rows of feed ``feed``'s re-drives (plans ``redrive-…``) in ``states``, oldest first, those
    recorded before re-drives were runs of the feed (under :func:`redrive_ledger_feed`) included."""
    rows = [r for r in store.feed_runs(feed, states) if is_redrive(r)]
    return sorted(rows + store.feed_runs(redrive_ledger_feed(feed), states), key=lambda r: r.run_id)


def redrive_records(feed: str, group: str, store: CheckpointStore) -> dict[str, str]:
    """The records (:class:`RedriveRecord`, as JSON) of feed ``feed``'s re-drives the run ledger keeps, by run id."""
    return {**store.redrive_records(group, redrive_ledger_feed(feed)), **store.redrive_records(group, feed)}


@dataclass(frozen=True)
class Redriven:
    """A feed's shown re-drives: who took each dead letter, and the newest re-check of the rest."""

    taken: Mapping[Key, str]  # dead letter -> the re-drive run that published it
    rechecked: Mapping[Key, tuple[str, tuple[str, ...]]]  # dead letter -> (re-drive run, its reasons then)
    records: tuple[RedriveRecord, ...] = ()
    unknown: tuple[str, ...] = ()  # re-drives that published, their record in neither the ledger nor their run dir


def redriven(feed: Feed, store: CheckpointStore, publisher: Publisher | None = None) -> Redriven:
    """What ``feed``'s re-drives published (:func:`redriven_in`)."""
    return redriven_in(feed.name, feed.group, store, publisher or publisher_for(feed))


def redriven_in(feed: str, group: str, store: CheckpointStore, publisher: Publisher) -> Redriven:
    """What feed ``feed``'s re-drives published into ``publisher``: the re-drive runs (plans ``redrive-…``) the run
    ledger records ``shown``, and any open one whose publication the output already shows (a re-drive that crashed
    after publishing, before its ledger row said so). Each one's letters come from the run ledger
    (:func:`read_redrive`), so removing run dirs changes nothing. Re-drives recorded before they were runs of the
    feed (under :func:`redrive_ledger_feed`) count as well."""
    rows = redrive_rows(feed, store)
    kept = redrive_records(feed, group, store) if rows else {}
    taken: dict[Key, str] = {}
    rechecked: dict[Key, tuple[str, tuple[str, ...]]] = {}
    records = []
    unknown = []
    for row in rows:  # oldest first: a later re-check replaces an earlier one
        if row.state != "shown" and publisher.published(row.plan_id) is None:
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


# -- bounded reading: counts from the reason and time columns, examples fetched by position --------------------

COUNT_BATCH = 65_536  # rows per batch of the count pass: its memory is bounded by this, not by the letters
EXAMPLE_BYTES = 8 << 20  # about this many bytes a batch when fetching examples (their values may be large)
# The columns the count pass reads of a quarantine file: the letter's identity, time and reasons, never its bytes.
COUNT_COLUMNS = ("topic", "partition", "offset", "timestamp", REASON_CODES_COLUMN)


@dataclass(frozen=True)
class Position:
    """Where one counted dead letter is, to fetch it: a row of a quarantine file (``source``: an index into
    :attr:`LetterCounts.sources`), or a row of the dead-letter table (``source`` None), and its identity."""

    key: Key
    source: int | None
    row: int


@dataclass(frozen=True)
class CountedGroup:
    """The dead letters of one reason code on one UTC day: how many, and where the first few are."""

    reason: str
    day: date | None
    count: int
    examples: tuple[Position, ...]


@dataclass(frozen=True)
class LetterCounts:
    """A feed's dead letters counted (:func:`count_dead_letters`): how many, by reason and day, most first."""

    records: int
    groups: tuple[CountedGroup, ...]
    sources: tuple[_Source, ...] = ()


class _Tally:
    """Counts by (reason code, day) and the first ``examples`` positions of each, folded batch by batch."""

    def __init__(self, examples: int) -> None:
        self.examples = examples
        self.records = 0
        self.counts: Counter[tuple[str, date | None]] = Counter()
        self.found: dict[tuple[str, date | None], list[Position]] = defaultdict(list)

    def add(self, codes: Any, days: Any, position: Callable[[int], Position]) -> None:
        """One batch: ``codes`` (a list array of reason codes per row), ``days`` (date32 per row)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        self.records += len(codes)
        parent = pc.list_parent_indices(codes)
        grouped = pa.table({"code": pc.list_flatten(codes), "day": days.take(parent), "i": parent})
        found = grouped.group_by(["code", "day"]).aggregate([("i", "count"), ("i", "list")])
        for code, day, count, rows in zip(*(found.column(c) for c in ("code", "day", "i_count", "i_list")),
                                          strict=True):  # fmt: skip
            group = (str(code.as_py()), day.as_py())
            self.counts[group] += int(count.as_py())
            need = self.examples - len(self.found[group])
            if need > 0:
                self.found[group] += [position(int(i)) for i in rows.values.slice(0, need).to_pylist()]

    def add_one(self, codes: Sequence[str], day: date | None, position: Position) -> None:
        self.records += 1
        for code in codes:
            self.counts[(code, day)] += 1
            if len(self.found[(code, day)]) < self.examples:
                self.found[(code, day)].append(position)

    def result(self, sources: Sequence[_Source]) -> LetterCounts:
        groups = [CountedGroup(code, day, n, tuple(self.found[(code, day)])) for (code, day), n in self.counts.items()]
        groups.sort(key=lambda g: (-g.count, g.reason, g.day or date.min))
        return LetterCounts(self.records, tuple(groups), tuple(sources))


def letters_signature(feed: Feed, store: CheckpointStore) -> tuple[Any, ...]:
    """What :func:`count_dead_letters` of ``feed`` depends on, cheaply: the shown plans' quarantine files (a shown
    plan's never change), the dead-letter table's current snapshot and the shown re-drives. Equal signatures,
    equal counts: a view may keep the counts until it changes."""
    done = redriven(feed, store)
    publisher = publisher_for(feed)
    snapshot = None
    if isinstance(publisher, IcebergPublisher):
        dead = publisher.dead_letter_table()
        current = None if dead is None else dead.current_snapshot()
        snapshot = None if current is None else current.snapshot_id
        appended = set() if dead is None else plans_in(dead, feed.name)
        sources = _iceberg_sources(publisher, store, appended)
    else:
        sources = _parquet_sources(publisher, feed.name)
    return (snapshot, tuple((s.file.url, s.plan_id) for s in sources), tuple(r.redrive_id for r in done.records))


def count_dead_letters(
    feed: Feed | str, *, store: CheckpointStore | None = None, examples: int = EXAMPLES
) -> LetterCounts:
    """The dead letters of ``feed`` counted by reason code and UTC day, as :func:`summarize` of
    :func:`dead_letters` counts them, without holding them: each quarantine file (and the Iceberg dead-letter
    table) is read in batches of :data:`COUNT_BATCH` rows, of its identity, time and reason columns only
    (:data:`COUNT_COLUMNS`), so memory does not grow with the letters. Each group keeps the positions of its first
    ``examples`` letters, for :func:`fetch_dead_letters`. Re-driven letters are left out; re-checked ones count
    under their newest reasons.
    """
    chosen = feed if isinstance(feed, Feed) else load_feed(feed)
    ledger = store if store is not None else default_store()
    done = redriven(chosen, ledger)
    tally = _Tally(examples)
    publisher = publisher_for(chosen)
    if isinstance(publisher, IcebergPublisher):
        dead = publisher.dead_letter_table()
        if dead is not None:
            _count_table(dead, chosen.name, done, tally)
        appended = set() if dead is None else plans_in(dead, chosen.name)
        sources = _iceberg_sources(publisher, ledger, appended)
    else:
        sources = _parquet_sources(publisher, chosen.name)
    for index, source in enumerate(sources):
        _count_file(source, index, done, tally)
    return tally.result(sources)


def _days(stamps: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.cast(stamps, pa.date32())


def _count_file(source: _Source, index: int, done: Redriven, tally: _Tally) -> None:
    """One quarantine file's letters counted, batch by batch, from :data:`COUNT_COLUMNS` only."""
    import pyarrow.parquet as pq

    handle = pq.ParquetFile(source.file.fs_path, filesystem=source.file.fs)
    names = handle.schema_arrow.names
    columns = [c for c in COUNT_COLUMNS if c in names]
    codes_column = REASON_CODES_COLUMN in names
    if not codes_column:  # a quarantine written before reason codes were: its codes come from the reason's text
        columns.append(REASON_COLUMN)
    folder_topic = next((unquote(p[len("topic=") :]) for p in source.path.split("/") if p.startswith("topic=")), "")
    touched = any(k[0] == source.plan_id for k in (*done.taken, *done.rechecked))
    start = 0
    for batch in handle.iter_batches(batch_size=COUNT_BATCH, columns=columns):
        days = _days(batch.column("timestamp"))
        position = _file_positions(source, index, start, batch, folder_topic)
        if codes_column and not touched:
            tally.add(batch.column(REASON_CODES_COLUMN), days, position)
        else:  # a plan re-drives touched, or reasons as text: row by row, still one batch at a time
            for i in range(batch.num_rows):
                at = position(i)
                if at.key in done.taken:
                    continue
                again = done.rechecked.get(at.key)
                stored = batch.column(REASON_CODES_COLUMN)[i].as_py() if codes_column else None
                text = "" if codes_column else str(batch.column(REASON_COLUMN)[i].as_py() or "")
                codes = again[1] if again else tuple(stored) if stored else reason_codes(text)
                tally.add_one(codes, days[i].as_py(), at)
        start += batch.num_rows


def _file_positions(
    source: _Source, index: int, start: int, batch: Any, folder_topic: str
) -> Callable[[int], Position]:
    """The :class:`Position` of a batch's row ``i`` of a quarantine file, its first row being the file's ``start``."""
    names = batch.schema.names
    topics = batch.column("topic") if "topic" in names else None
    partitions, offsets = batch.column("partition"), batch.column("offset")

    def position(i: int) -> Position:
        topic = str(topics[i].as_py()) if topics is not None else folder_topic
        key = (source.plan_id, topic, int(partitions[i].as_py()), int(offsets[i].as_py()))
        return Position(key, index, start + i)

    return position


def _table_positions(batch: Any) -> Callable[[int], Position]:
    """The :class:`Position` of a batch's row ``i`` of the dead-letter table: its identity."""
    plans, topics = batch.column("plan_id"), batch.column("topic")
    partitions, offsets = batch.column("partition"), batch.column("offset")

    def position(i: int) -> Position:
        key = (str(plans[i].as_py()), str(topics[i].as_py()), int(partitions[i].as_py()), int(offsets[i].as_py()))
        return Position(key, None, 0)

    return position


def _count_table(table: Any, feed: str, done: Redriven, tally: _Tally) -> None:
    """The dead-letter table's rows of ``feed``, counted batch by batch from their identity, time and reasons."""
    from pyiceberg import expressions

    equal: Any = expressions.EqualTo
    fields = ("plan_id", "topic", "partition", "offset", "timestamp", "reason_codes")
    reader = table.scan(row_filter=equal("feed", feed), selected_fields=fields).to_arrow_batch_reader()
    for batch in reader:
        plans = batch.column("plan_id")
        days = _days(batch.column("timestamp"))

        position = _table_positions(batch)
        touched = {k[0] for k in (*done.taken, *done.rechecked)}
        if not touched & set(plans.unique().to_pylist()):
            tally.add(batch.column("reason_codes"), days, position)
            continue
        for i in range(batch.num_rows):
            at = position(i)
            if at.key in done.taken:
                continue
            again = done.rechecked.get(at.key)
            stored = batch.column("reason_codes")[i].as_py() or ()
            tally.add_one(again[1] if again else tuple(stored), days[i].as_py(), at)


def fetch_dead_letters(
    feed: Feed | str, counts: LetterCounts, positions: Sequence[Position], *, store: CheckpointStore | None = None
) -> list[DeadLetter]:
    """The dead letters at ``positions`` (of ``counts``), whole, in the order given: of each quarantine file only
    the row groups holding a wanted row, up to the last one, in batches of about :data:`EXAMPLE_BYTES`; of the
    dead-letter table the rows by identity."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    chosen = feed if isinstance(feed, Feed) else load_feed(feed)
    ledger = store if store is not None else default_store()
    done = redriven(chosen, ledger)
    found: dict[Position, DeadLetter] = {}
    by_source: dict[int, list[Position]] = defaultdict(list)
    in_table: list[Position] = []
    for p in positions:
        (in_table if p.source is None else by_source[p.source]).append(p)
    for index, wanted in by_source.items():
        source = counts.sources[index]
        rows = {p.row: p for p in wanted}
        handle = pq.ParquetFile(source.file.fs_path, filesystem=source.file.fs)
        first = 0
        ordered = sorted(rows)
        for group in range(handle.metadata.num_row_groups):  # only the row groups holding a wanted row are decoded
            meta = handle.metadata.row_group(group)
            size = meta.num_rows
            if any(first <= r < first + size for r in rows):
                start = first
                # Batches of about EXAMPLE_BYTES: values may be megabytes each, or a few bytes (then many rows).
                batch_rows = max(1, min(COUNT_BATCH, EXAMPLE_BYTES * size // max(1, meta.total_byte_size)))
                for batch in handle.iter_batches(batch_size=batch_rows, row_groups=[group]):
                    low, high = bisect_left(ordered, start), bisect_left(ordered, start + batch.num_rows)
                    here = [r - start for r in ordered[low:high]]
                    if here:
                        table = pa.Table.from_batches([batch]).take(here)
                        letters = table_rows(table, source.path, feed=chosen.name, plan_id=source.plan_id,
                                             run_id=source.run_id, dead_lettered_at=None)  # fmt: skip
                        found.update((rows[start + i], _letter(row)) for i, row in zip(here, letters, strict=True))
                    start += batch.num_rows
                    if start > max(r for r in rows if r < first + size):
                        break
            first += size
    if in_table:
        publisher = publisher_for(chosen)
        dead = publisher.dead_letter_table() if isinstance(publisher, IcebergPublisher) else None
        if dead is not None:
            for row in _table_rows_at(dead, chosen.name, [p.key for p in in_table]):
                letter = _letter(row)
                found.update((p, letter) for p in in_table if p.key == letter.key_of)
    out = []
    for p in positions:
        held = found.get(p)
        if held is None:
            continue
        if (again := done.rechecked.get(held.key_of)) is not None:
            run_id, codes = again
            text = f"re-checked by re-drive {run_id}: {'; '.join(codes)} (first: {held.reason})"
            held = replace(held, reason_codes=codes, rechecked_by=run_id, reason=text)
        out.append(held)
    return out


def _table_rows_at(table: Any, feed: str, keys: Sequence[Key]) -> list[dict[str, Any]]:
    """The dead-letter table's rows of ``feed`` with these identities: one scan per (plan, topic, partition)."""
    from pyiceberg import expressions

    equal: Any = expressions.EqualTo
    among: Any = expressions.In
    wanted: dict[tuple[str, str, int], set[int]] = defaultdict(set)
    for plan_id, topic, partition, offset in keys:
        wanted[(plan_id, topic, partition)].add(offset)
    rows: list[dict[str, Any]] = []
    for (plan_id, topic, partition), offsets in wanted.items():
        where: Any = expressions.And(equal("feed", feed), equal("plan_id", plan_id), equal("topic", topic),
                                     equal("partition", partition), among("offset", offsets))  # fmt: skip
        rows += table.scan(row_filter=where).to_arrow().to_pylist()
    return rows


def counts_of(letters: Sequence[DeadLetter], examples: int = EXAMPLES) -> LetterCounts:
    """:class:`LetterCounts` of letters already held (a list the caller read): positions index the list."""
    tally = _Tally(examples)
    for i, d in enumerate(letters):
        day = None if d.timestamp is None else d.timestamp.astimezone(UTC).date()
        tally.add_one(d.reason_codes, day, Position(d.key_of, None, i))
    return tally.result(())
