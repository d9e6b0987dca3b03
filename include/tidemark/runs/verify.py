"""``tidemark verify FEED``: the feed's invariants audited from outside any run.

:func:`verify_feed` reads the feed's output (:mod:`tidemark.output.audit`: the published
plans' manifests and files, or the Iceberg table's current ancestry), the run ledger and
the runs' reports, re-reads from Kafka (``read_committed``, in batches) every partition's
retained records up to the group's position, and names, per topic and partition:

1. ``duplicate``: an offset the output holds twice (two publications, a data file copied,
   a record both published and quarantined, or published and re-driven);
2. ``missing``: a record Kafka still holds below the group's committed position that the
   output holds nowhere (neither published nor quarantined) and no event names (a plan's
   or report's ``data_loss``, ``offsets_skipped``, ``not_shown``, ``group_moved``,
   ``commit_refused``...); ``past_group``: a published offset at or past the group's
   position that no event names;
3. ``digest_differs``: a fully retained range whose records, bytes or checksum, recomputed
   from Kafka's bytes as the job computes them (:mod:`tidemark.spark.rowhash`), differ from
   what the plan's manifest (Parquet) or its job's ``job.json`` (Iceberg) recorded;
   ``value_differs``: where the output publishes the raw key and value (``bytes`` and
   ``string`` feeds without masking), a record whose bytes differ from Kafka's at its offset;
4. ``dead_letter_unlisted`` (a quarantined record neither listed by ``tidemark deadletters``
   nor re-driven) and ``dead_letter_listed_and_redriven``;
5. ``missing_publication`` (a run the ledger records ``shown`` whose plan the output does not
   hold), ``missing_file`` (referenced by a manifest or a table's metadata, absent),
   ``changed_file`` (a Parquet file whose sha256 differs from its manifest's) and
   ``unowned_file`` (under the output, owned by nothing: :func:`tidemark.output.audit.owner`).

With ``plan`` (the feed DAG's ``verify`` task passes its run's plan; ``tidemark verify FEED --plan ID``), the
audit is scoped to that plan: Kafka is read only in the plan's ranges, the output's rows only of the publications
whose recorded ranges meet them (an Iceberg table through a row filter on them), and the offset, digest and
dead-letter checks apply inside them (its quarantine); the files are listed whole. A run costs what it read.

Nothing is written anywhere. Records of a topic's earlier incarnation (a range whose topic id
differs from the topic's now) are left out of the offset checks and counted in a note.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, get_args

import numpy as np
import pyarrow as pa

from tidemark._types import TopicPartition as TP
from tidemark.checkpoints.store import OPEN_STATES, CheckpointStore, LedgerRun, RunState
from tidemark.config.models import Feed, load_feed
from tidemark.errors import TidemarkError
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.connection import KafkaConnection, from_env, logged
from tidemark.output.audit import Claims, OutputView, Rows, Scope, read_iceberg_output, read_parquet_output
from tidemark.output.deadletters import dead_letters, redrive_ledger_feed
from tidemark.output.iceberg import IcebergPublisher, table_ledger
from tidemark.output.maintenance import plain
from tidemark.planning.plan import PLAN_FILE
from tidemark.runs.run import Progress, Root, open_checkpoints, runs_root, silent
from tidemark.spark.rowhash import SECOND, SEED, U64, hash_long, row_hashes
from tidemark.storage import Location

ALL_STATES: tuple[RunState, ...] = get_args(RunState)  # every state, ``discarding`` included
BATCH = 10_000  # records per consume() call
# Events whose details name offsets the output does not hold, and where they name them.
Span = tuple[int, int]


@dataclass(frozen=True)
class Finding:
    """One breach of the feed's invariants: what, where (topic, partition and offset spans, or a file), and why."""

    kind: str
    message: str
    topic: str | None = None
    partition: int | None = None
    offsets: tuple[Span, ...] = ()  # [start, end) spans
    path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "topic": self.topic, "partition": self.partition,
                "offsets": [list(s) for s in self.offsets], "path": self.path, "message": self.message}  # fmt: skip


@dataclass
class VerifyReport:
    feed: str
    output: str
    plan: str | None = None  # the plan the audit is scoped to (None: the whole feed)
    partitions: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kafka_records: int = 0
    output_records: int = 0
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        return {"feed": self.feed, "output": self.output, "plan": self.plan, "clean": self.clean,
                "kafka_records": self.kafka_records, "output_records": self.output_records,
                "seconds": round(self.seconds, 3), "partitions": self.partitions,
                "findings": [f.to_dict() for f in self.findings], "notes": self.notes}  # fmt: skip


def spans(offsets: Iterable[int] | np.ndarray) -> tuple[Span, ...]:
    """Sorted offsets as ``[start, end)`` spans of consecutive offsets."""
    arr = np.unique(np.asarray(list(offsets) if not isinstance(offsets, np.ndarray) else offsets, dtype=np.int64))
    if not len(arr):
        return ()
    breaks = np.nonzero(np.diff(arr) != 1)[0]
    starts = np.concatenate(([arr[0]], arr[breaks + 1]))
    ends = np.concatenate((arr[breaks], [arr[-1]])) + 1
    return tuple((int(s), int(e)) for s, e in zip(starts, ends, strict=True))


def show_spans(found: Sequence[Span], limit: int = 8) -> str:
    text = ", ".join(f"{s}" if e == s + 1 else f"{s}-{e - 1}" for s, e in found[:limit])
    return text + (f" and {len(found) - limit} more spans" if len(found) > limit else "")


# -- the ledger, the run dirs and their events ---------------------------------------------------


@dataclass
class History:
    """What the run ledger and the run dirs say of the feed."""

    runs: list[LedgerRun] = field(default_factory=list)
    named: dict[TP, list[Span]] = field(default_factory=dict)  # offsets events name as in no output
    job_ranges: dict[str, tuple[Mapping[str, Any], ...]] = field(default_factory=dict)  # run id -> job.json ranges
    topic_ids: dict[str, dict[TP, str]] = field(default_factory=dict)  # plan id -> topic ids of its ranges
    plan_offsets: dict[str, int] = field(default_factory=dict)  # plan id -> offsets its ranges span (or letters)
    plan_ranges: dict[str, dict[TP, Span]] = field(default_factory=dict)  # plan id -> its non-empty ranges
    published_at: dict[str, str] = field(default_factory=dict)  # run id -> where its report says it published

    def open(self) -> list[LedgerRun]:
        return [r for r in self.runs if r.state in OPEN_STATES]


def event_spans(event: Mapping[str, Any]) -> list[tuple[TP, Span]]:
    """The offsets an event names as in no output of the feed, per partition (none for other events)."""
    details = event.get("details") or {}
    kind = event.get("kind")
    topic, partition = event.get("topic"), event.get("partition")
    found: list[tuple[TP, Span]] = []
    for r in details.get("ranges") or ():  # not_shown, commit_refused, group_moved after a commit
        found.append(((str(r["topic"]), int(r["partition"])), (int(r["start"]), int(r["end"]))))
    if topic is None or partition is None:
        return found
    tp = (str(topic), int(partition))
    if "lost_start" in details:  # data_loss
        found.append((tp, (int(details["lost_start"]), int(details["lost_end"]))))
    elif details.get("start") is not None and details.get("end") is not None:  # offsets_skipped, group_moved...
        found.append((tp, (int(details["start"]), int(details["end"]))))
    elif kind in ("reset", "offset_ahead", "topic_recreated") and details.get("offset") is not None:
        found.append((tp, (0, int(details["offset"]))))  # a reset leaves what lies before its start unread
    return found


def _json(loc: Location) -> Any:
    try:
        return json.loads(loc.read_text()) if loc.exists() else None
    except (ValueError, OSError):
        return None


def read_history(feed: Feed, store: CheckpointStore, root: Root | None) -> History:
    """The feed's ledger rows (its runs and re-drives) and, from every run dir, its events and job statistics."""
    history = History(store.feed_runs(feed.name, ALL_STATES) + store.feed_runs(redrive_ledger_feed(feed.name),
                                                                                 ALL_STATES))  # fmt: skip
    dirs = {r.run_dir.rstrip("/") for r in history.runs}
    base = runs_root(root) / feed.name
    dirs |= {str(d) for d in base.children(folders_only=True)} if base.exists() else set()
    for folder in sorted(dirs):
        loc = Location.of(folder)
        plan, report, job = _json(loc / PLAN_FILE), _json(loc / "report.json"), _json(loc / "job.json")
        events = [*(plan or {}).get("events", ()), *(report or {}).get("events", ()), *(job or {}).get("events", ())]
        for event in events:
            for tp, span in event_spans(event):
                history.named.setdefault(tp, []).append(span)
        if job and job.get("ranges"):
            history.job_ranges[loc.name] = tuple(job["ranges"])
        where = (((report or {}).get("outputs") or {}).get("manifest") or {}).get("location")
        if where:
            history.published_at[loc.name] = str(where)
        if plan and plan.get("plan_id"):
            ids = {(str(p["topic"]), int(p["partition"])): p.get("topic_id") for p in plan.get("partitions", ())}
            history.topic_ids[str(plan["plan_id"])] = {k: v for k, v in ids.items() if v}
            history.plan_offsets[str(plan["plan_id"])] = sum(
                int(p["end"]) - int(p["start"]) for p in plan.get("partitions", ())
            ) + len(plan.get("letters", ()))  # a re-drive's plan publishes its dead letters
            history.plan_ranges[str(plan["plan_id"])] = {
                (str(p["topic"]), int(p["partition"])): (int(p["start"]), int(p["end"]))
                for p in plan.get("partitions", ()) if int(p["end"]) > int(p["start"])
            }  # fmt: skip
    return history


def _claims(feed: Feed, history: History) -> Claims:
    open_runs = history.open()
    pending: set[str] = set()
    if feed.output_format == "iceberg":
        publisher = IcebergPublisher(feed)
        for row in open_runs:
            doc = _json(publisher.location.with_name(f"{publisher.location.name}.pending") / row.run_id
                        / f"plan_id={row.plan_id}.json")  # fmt: skip
            pending |= {plain(p) for p in (doc or {}).get("paths", ())}
    return Claims(open_runs=frozenset(r.run_id for r in open_runs), open_plans=frozenset(r.plan_id for r in open_runs),
                  pending_files=frozenset(pending))  # fmt: skip


# -- Kafka ----------------------------------------------------------------------------------------


@dataclass
class Scanned:
    """One partition's retained records up to where the check stops: offsets and their digests, sorted by offset."""

    offsets: np.ndarray
    h1: np.ndarray
    h2: np.ndarray
    sizes: np.ndarray


def _digested(
    tp: TP, offsets: np.ndarray, keys: pa.Array, values: pa.Array
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One partition's records as offsets, both digests and sizes (key + value bytes)."""
    import pyarrow.compute as pc

    h1 = row_hashes(tp[0], tp[1], offsets, keys, values)
    h2 = hash_long(np.full(len(h1), SECOND, dtype=U64), hash_long(h1, SEED))
    sizes = (pc.fill_null(pc.binary_length(keys), 0).to_numpy(zero_copy_only=False).astype(np.int64)
             + pc.fill_null(pc.binary_length(values), 0).to_numpy(zero_copy_only=False).astype(np.int64))  # fmt: skip
    return offsets, h1, h2, sizes


FLUSH = 200_000  # records of a partition digested at once: numpy's per-call cost spread over many records


def _batch(msgs: list[Any]) -> tuple[list[str], np.ndarray, np.ndarray, pa.Array, pa.Array]:
    """A consumed batch's records as columns (one comprehension per column rather than one loop appending to
    three lists, which the profile of a 300,000-record verify showed as the scan's largest own cost)."""
    topics = [m.topic() for m in msgs]
    partitions = np.fromiter((m.partition() for m in msgs), dtype=np.int64, count=len(msgs))
    offsets = np.fromiter((m.offset() for m in msgs), dtype=np.int64, count=len(msgs))
    keys = pa.array([m.key() for m in msgs], pa.binary())
    values = pa.array([m.value() for m in msgs], pa.binary())
    return topics, partitions, offsets, keys, values


def scan_kafka(connection: KafkaConnection, wanted: Mapping[TP, Span], batch: int = BATCH) -> dict[TP, Scanned]:
    """Every record of ``wanted`` (``[start, stop)`` per partition) as a ``read_committed`` consumer sees it."""
    from confluent_kafka import Consumer, KafkaError
    from confluent_kafka import TopicPartition as KafkaTP

    todo = {tp: r for tp, r in wanted.items() if r[1] > r[0]}
    parts: dict[TP, list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]] = {tp: [] for tp in wanted}
    if todo:
        consumer = Consumer(logged(connection.client_config(**{
            "group.id": "tidemark-verify", "enable.auto.commit": False, "isolation.level": "read_committed",
            "auto.offset.reset": "error", "enable.partition.eof": True, "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
        })))  # fmt: skip
        got: dict[TP, list[tuple[np.ndarray, pa.Array, pa.Array]]] = {}

        def flush(tp: TP) -> None:
            chunks = got.pop(tp)
            offsets = np.concatenate([c[0] for c in chunks])
            keys, values = pa.concat_arrays([c[1] for c in chunks]), pa.concat_arrays([c[2] for c in chunks])
            parts[tp].append(_digested(tp, offsets, keys, values))

        try:
            consumer.assign([KafkaTP(t, p, start) for (t, p), (start, _) in todo.items()])
            done: set[TP] = set()
            while len(done) < len(todo):
                msgs = consumer.consume(num_messages=batch, timeout=1.0)
                failed = [m for m in msgs if m.error() is not None]
                for msg in failed:
                    tp = (msg.topic(), msg.partition())
                    if msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= todo[tp][1]:
                        done.add(tp)
                records = [m for m in msgs if m.error() is None] if failed else msgs
                if records:
                    topics, partitions, offsets, keys, values = _batch(records)
                    names = set(topics)
                    codes = np.array([t for t in topics], dtype=object) if len(names) > 1 else None
                    for t in names:
                        in_topic = (codes == t) if codes is not None else np.ones(len(topics), dtype=bool)
                        for p in np.unique(partitions[in_topic]).tolist():
                            tp = (t, int(p))
                            if tp not in todo:
                                continue
                            chosen = np.nonzero(in_topic & (partitions == p) & (offsets < todo[tp][1]))[0]
                            if len(chosen) == len(records):
                                got.setdefault(tp, []).append((offsets, keys, values))
                            elif len(chosen):
                                index = pa.array(chosen)
                                got.setdefault(tp, []).append((offsets[chosen], keys.take(index), values.take(index)))
                for tp in [tp for tp, chunks in got.items() if sum(len(c[0]) for c in chunks) >= FLUSH]:
                    flush(tp)
                positions = consumer.position([KafkaTP(t, p) for t, p in todo if (t, p) not in done])
                done |= {(p.topic, p.partition) for p in positions if p.offset >= todo[(p.topic, p.partition)][1]}
            for tp in list(got):
                flush(tp)
        finally:
            consumer.close()
    scanned = {}
    for tp, chunks in parts.items():
        if not chunks:
            scanned[tp] = Scanned(np.zeros(0, np.int64), np.zeros(0, U64), np.zeros(0, U64), np.zeros(0, np.int64))
            continue
        offsets = np.concatenate([c[0] for c in chunks])
        order = np.argsort(offsets, kind="stable")
        scanned[tp] = Scanned(*(np.concatenate([c[i] for c in chunks])[order] for i in range(4)))
    return scanned


# -- the checks -----------------------------------------------------------------------------------


def _by_partition(rows: Iterable[Rows], content: bool) -> dict[TP, tuple[np.ndarray, np.ndarray | None]]:
    """Offsets per partition (and, with ``content``, each row's digest; ``None`` where a file has no raw bytes)."""
    found: dict[TP, list[tuple[np.ndarray, np.ndarray | None]]] = {}
    for r in rows:
        table = r.table
        if table.num_rows == 0:
            continue
        topic_codes = table.column("topic").combine_chunks().dictionary_encode()
        names = topic_codes.dictionary.to_pylist()
        codes = topic_codes.indices.to_numpy(zero_copy_only=False)
        partitions = table.column("partition").to_numpy(zero_copy_only=False).astype(np.int64)
        offsets = table.column("offset").to_numpy(zero_copy_only=False).astype(np.int64)
        pairs = {}
        for code, t in enumerate(names):
            in_topic = codes == code
            for p in np.nonzero(np.bincount(partitions[in_topic]))[0]:
                pairs[(str(t), int(p))] = np.nonzero(in_topic & (partitions == p))[0]
        has_content = content and "key" in table.column_names and "value" in table.column_names
        for tp, idx in pairs.items():
            digests = None
            if has_content:
                sub = table.take(pa.array(idx))
                digests = row_hashes(tp[0], tp[1], offsets[idx], sub.column("key"), sub.column("value"))
            found.setdefault(tp, []).append((offsets[idx], digests))
    merged: dict[TP, tuple[np.ndarray, np.ndarray | None]] = {}
    for tp, chunks in found.items():
        offs = np.concatenate([c[0] for c in chunks])
        digests = (
            None if any(c[1] is None for c in chunks) else np.concatenate([c[1] for c in chunks if c[1] is not None])
        )
        merged[tp] = (offs, digests)
    return merged


def _empty() -> np.ndarray:
    return np.zeros(0, np.int64)


def _twice(offsets: np.ndarray) -> np.ndarray:
    ordered = np.sort(offsets)
    found: np.ndarray = ordered[1:][ordered[1:] == ordered[:-1]]
    return found


def _both(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    return small[np.isin(small, large)] if len(small) else small


def held_twice(data: np.ndarray, quarantined: np.ndarray, redriven: np.ndarray) -> np.ndarray:
    """Offsets the output holds more than once: twice among the published records, the quarantined or the
    re-driven ones, or both published and quarantined, or published and re-driven. A quarantined record that a
    re-drive published is held once (the re-drive took it)."""
    return np.unique(np.concatenate([_twice(data), _twice(quarantined), _twice(redriven),
                                     _both(data, quarantined), _both(data, redriven)]))  # fmt: skip


def plan_scope(feed: Feed, history: History, plan: str, report: VerifyReport) -> Scope:
    """The ranges of ``plan`` (from its run dir's plan), noted in the report."""
    if plan not in history.plan_ranges:
        raise TidemarkError(f"feed '{feed.name}': no run dir holds plan {plan}: nothing to scope the audit to "
                            "(`tidemark runs` lists the runs and their plans)")  # fmt: skip
    scope = history.plan_ranges[plan]
    shown = ", ".join(f"{t}[{n}] [{s}, {e})" for (t, n), (s, e) in sorted(scope.items())) or "none (no records)"
    report.notes.append(f"scoped to plan {plan}: its ranges {shown}; Kafka, the offsets, the digests and the dead "
                        "letters are checked inside them only, the files listed whole (without --plan: the whole "
                        "feed)")  # fmt: skip
    return scope


def _clip(
    parts: Mapping[TP, tuple[np.ndarray, np.ndarray | None]], scope: Scope | None
) -> dict[TP, tuple[np.ndarray, np.ndarray | None]]:
    """Each partition's offsets (and digests) inside ``scope`` (all with ``None``)."""
    if scope is None:
        return dict(parts)
    clipped = {}
    for tp, (offs, digests) in parts.items():
        if tp in scope:
            inside = (offs >= scope[tp][0]) & (offs < scope[tp][1])
            clipped[tp] = (offs[inside], None if digests is None else digests[inside])
    return clipped


def _named_mask(offsets: np.ndarray, named: Sequence[Span]) -> np.ndarray:
    mask = np.zeros(len(offsets), dtype=bool)
    for start, end in named:
        mask |= (offsets >= start) & (offsets < end)
    return mask


def _content(feed: Feed) -> bool:
    """Whether the output publishes each record's key and value as Kafka's bytes (so they can be compared)."""
    d = feed.deserialization
    return d.format in ("bytes", "string") and d.key_format in ("bytes", "string") and feed.masking is None


def verify_feed(
    feed_name: str | Feed,
    *,
    connection: KafkaConnection | None = None,
    checkpoints: CheckpointStore | None = None,
    root: Root | None = None,
    batch: int = BATCH,
    progress: Progress = silent,
    plan: str | None = None,
) -> VerifyReport:
    """Audit ``feed_name``'s output against Kafka and the run ledger (``plan``: inside that plan's ranges only);
    see the module docstring."""
    began = time.monotonic()
    feed = feed_name if isinstance(feed_name, Feed) else load_feed(feed_name)
    store = open_checkpoints(root, checkpoints)
    connection = connection or from_env()
    history = read_history(feed, store, root)
    content = _content(feed)
    claims = _claims(feed, history)
    report = VerifyReport(feed.name, str(feed.output_location()), plan=plan)
    scope = None if plan is None else plan_scope(feed, history, plan, report)
    progress(f"reading the output of feed '{feed.name}' ({feed.output_location()})")
    if feed.output_format == "iceberg":
        view = read_iceberg_output(feed, content, claims, history.job_ranges, scope)
    else:
        view = read_parquet_output(feed.output_location(), content, claims, scope)
    # A manifest's ranges carry no topic id: the plan's own copy in its run dir does.
    view.publications = [
        replace(p, ranges=tuple(r if r.topic_id else replace(r, topic_id=history.topic_ids.get(p.plan_id, {}).get(
            (r.topic, r.partition))) for r in p.ranges))
        for p in view.publications
    ]  # fmt: skip
    report.notes += view.notes
    report.findings += [Finding(p.kind, p.message, path=p.path) for p in view.problems]
    _check_ledger(feed, history, view, report)
    _check_offsets(feed, connection, store, history, view, report, content, batch, progress, scope)
    _check_dead_letters(feed, store, view, report)
    report.seconds = time.monotonic() - began
    return report


def _check_ledger(feed: Feed, history: History, view: OutputView, report: VerifyReport) -> None:
    held = {p.plan_id for p in view.publications}
    if feed.output_format == "iceberg":
        # The table ledger's plans whose snapshot expired count as held; one whose snapshot is still in the
        # metadata but not in the current ancestry was rolled back: not held.
        table = IcebergPublisher(feed).load()
        ledger = None if table is None else table_ledger(table, feed.name)
        if table is not None and ledger is not None:
            for plan in ledger.recent:
                if plan.snapshot_id is None or table.metadata.snapshot_by_id(plan.snapshot_id) is None:
                    held.add(plan.plan_id)
    moved = 0
    for row in history.runs:
        # A plan without records publishes nothing (an idle run): nothing to hold.
        if report.plan is not None and row.plan_id != report.plan:
            continue  # a scoped audit looks for its own plan's publication only
        if row.state == "shown" and row.plan_id not in held and history.plan_offsets.get(row.plan_id, 1) > 0:
            where = history.published_at.get(row.run_id) if feed.output_format == "parquet" else None
            if where is not None and not plain(where).startswith(plain(report.output).rstrip("/") + "/"):
                moved += 1  # its report says it published into another output: the feed's output was moved since
                continue
            report.findings.append(Finding(
                "missing_publication", f"run {row.run_id} is recorded shown in the run ledger, but the output "
                f"({report.output}) holds no publication of its plan {row.plan_id}", path=report.output))  # fmt: skip
    if moved:
        report.notes.append(f"{moved} shown runs published into another output (their reports name it): the feed's "
                            "output was moved since; they are not looked for here")  # fmt: skip


def _check_offsets(
    feed: Feed, connection: KafkaConnection, store: CheckpointStore, history: History, view: OutputView,
    report: VerifyReport, content: bool, batch: int, progress: Progress, scope: Scope | None = None,
) -> None:  # fmt: skip
    adapter = KafkaAdapter(connection)
    topics = sorted({r.topic for p in view.publications for r in p.ranges} | set(feed.topics))
    infos = adapter.partitions(topics) if topics else []
    tps = [(i.topic, i.partition) for i in infos if scope is None or (i.topic, i.partition) in scope]
    current_id = {i.topic: i.topic_id for i in infos}
    committed = {tp: c.offset for tp, c in adapter.committed(feed.group, tps).items()} if tps else {}
    saved = store.get(feed.group, tps) if tps else {}
    log_start = adapter.log_start_offsets(tps) if tps else {}
    ends = adapter.end_offsets(tps, "read_committed") if tps else {}
    stale = {p.plan_id for p in view.publications
             if p.ranges and all(r.topic_id and r.topic_id != current_id.get(r.topic) for r in p.ranges
                                 if r.end > r.start)}  # fmt: skip
    if stale:
        report.notes.append(f"{len(stale)} publications of a topic's earlier incarnation (another topic id) are "
                            "left out of the offset checks")  # fmt: skip
    data_rows = [
        r for r in view.rows if not r.quarantine and r.plan_id not in stale and not r.plan_id.startswith("redrive-")
    ]
    data = _clip(_by_partition(data_rows, content), scope)
    redriven = _clip(_by_partition([r for r in view.rows if r.plan_id.startswith("redrive-")], content), scope)
    quarantined = _clip(_by_partition([r for r in view.rows if r.quarantine and r.plan_id not in stale], False), scope)
    report.output_records = sum(len(v[0]) for v in (*data.values(), *redriven.values(), *quarantined.values()))
    shown_end: dict[TP, int] = {}
    for p in view.publications:
        for r in p.ranges:
            shown_end[(r.topic, r.partition)] = max(shown_end.get((r.topic, r.partition), 0), r.end)
    position: dict[TP, int | None] = {}
    wanted: dict[TP, Span] = {}
    for tp in tps:
        group_at = committed.get(tp)
        if group_at is None and tp in saved:
            group_at = saved[tp].offset
        position[tp] = group_at
        stop = min(ends.get(tp, 0), max(group_at or 0, shown_end.get(tp, 0)))
        start = log_start.get(tp, 0)
        if scope is not None:  # the plan's range, as far as Kafka still holds it
            start, stop = max(start, scope[tp][0]), min(ends.get(tp, 0), scope[tp][1])
        wanted[tp] = (start, max(stop, start))
    keyed = feed.tombstones_are_changes
    if keyed:
        report.notes.append("a keyed table (iceberg.mode: upsert) holds each key's last change: offsets held twice "
                            "or missing are not checked, only the ranges' digests and the files")  # fmt: skip
    progress(f"reading {sum(e - s for s, e in wanted.values())} offsets from Kafka (read_committed)")
    scanned = scan_kafka(connection, wanted, batch)
    report.kafka_records = sum(len(s.offsets) for s in scanned.values())
    for tp in tps:
        t, n = tp
        s = scanned[tp]
        d_off, d_dig = data.get(tp, (_empty(), None))
        r_off, r_dig = redriven.get(tp, (_empty(), None))
        q_off, _ = quarantined.get(tp, (_empty(), None))
        report.partitions.append({"topic": t, "partition": n, "log_start": log_start.get(tp), "group": position[tp],
                                  "end": ends.get(tp), "kafka_records": len(s.offsets),
                                  "output_records": len(d_off) + len(r_off) + len(q_off)})  # fmt: skip
        if keyed:  # a keyed table holds each key's last change, not every offset: only digests and files apply
            continue
        _check_partition(tp, s, history.named.get(tp, []), (d_off, d_dig), (r_off, r_dig), q_off, position[tp],
                         report)  # fmt: skip
    _check_digests(view, scanned, log_start, wanted, current_id, stale, report, masked=feed.masking is not None)


def _check_partition(
    tp: TP, s: Scanned, named: Sequence[Span], data: tuple[np.ndarray, np.ndarray | None],
    redriven: tuple[np.ndarray, np.ndarray | None], q_off: np.ndarray, group_at: int | None, report: VerifyReport,
) -> None:  # fmt: skip
    """One partition's offsets held twice, missing or past the group, and records whose bytes differ from Kafka's."""
    t, n = tp
    (d_off, d_dig), (r_off, r_dig) = data, redriven
    twice = held_twice(d_off, q_off, r_off)
    if len(twice):
        found = spans(twice)
        report.findings.append(Finding("duplicate", f"{t}[{n}]: offsets {show_spans(found)} are in the feed's "
                                       "output more than once", t, n, found))  # fmt: skip
    if group_at is None:
        report.notes.append(f"{t}[{n}]: the group has no committed offset and no checkpoint; missing offsets "
                            "not checked")  # fmt: skip
    else:
        below = s.offsets[s.offsets < group_at]
        held = np.concatenate([d_off, q_off, r_off])
        gone = below[~np.isin(below, held, kind="table")] if len(held) else below
        gone = gone[~_named_mask(gone, named)]
        if len(gone):
            found = spans(gone)
            report.findings.append(Finding(
                "missing", f"{t}[{n}]: offsets {show_spans(found)} are below the group's position {group_at}, "
                "still in Kafka, and in no output of the feed; no event names them", t, n, found))  # fmt: skip
        past = d_off[d_off >= group_at]
        past = past[~_named_mask(past, named)]
        if len(past):
            found = spans(past)
            report.findings.append(Finding(
                "past_group", f"{t}[{n}]: offsets {show_spans(found)} are shown at or past the group's position "
                f"{group_at} (readers see records the group has not committed)", t, n, found))  # fmt: skip
    for offs, digests in ((d_off, d_dig), (r_off, r_dig)):
        if digests is None or not len(offs):
            continue
        at = np.searchsorted(s.offsets, offs)
        inside = (
            (at < len(s.offsets)) & (s.offsets[np.minimum(at, len(s.offsets) - 1)] == offs)
            if len(s.offsets)
            else np.zeros(len(offs), bool)
        )
        differ = offs[inside][s.h1[at[inside]] != digests[inside]]
        if len(differ):
            found = spans(differ)
            report.findings.append(Finding(
                "value_differs", f"{t}[{n}]: offsets {show_spans(found)}: the key or value the output holds "
                "differs from Kafka's bytes", t, n, found))  # fmt: skip


def _check_digests(
    view: OutputView, scanned: Mapping[TP, Scanned], log_start: Mapping[TP, int], wanted: Mapping[TP, Span],
    current_id: Mapping[str, str], stale: set[str], report: VerifyReport, masked: bool = False,
) -> None:  # fmt: skip
    """Each fully retained range's records, bytes and checksum against Kafka's; a masked feed's records only (its
    checksum and bytes are of the masked records, which only the masking key could recompute)."""
    if masked:
        report.notes.append("a masked feed's ranges record the digest of their masked records: only their record "
                            "counts are compared with Kafka's")  # fmt: skip
    unrecorded = 0
    for p in view.publications:
        if p.plan_id in stale or p.redrive:
            continue
        for r in p.ranges:
            tp = (r.topic, r.partition)
            if r.end <= r.start or tp not in scanned or (r.topic_id and r.topic_id != current_id.get(r.topic)):
                continue
            if r.checksum is None:
                unrecorded += 1
                continue
            if r.start < max(log_start.get(tp, 0), wanted[tp][0]) or r.end > wanted[tp][1]:
                continue  # partly deleted by retention, or outside what was read: nothing to compare with
            s = scanned[tp]
            lo, hi = np.searchsorted(s.offsets, [r.start, r.end])
            h1 = int(np.bitwise_xor.reduce(s.h1[lo:hi])) if hi > lo else 0
            h2 = int(np.bitwise_xor.reduce(s.h2[lo:hi])) if hi > lo else 0
            checksum, size, records = f"{h1:016x}{h2:016x}", int(s.sizes[lo:hi].sum()), int(hi - lo)
            differs = records != r.records if masked else (checksum, size, records) != (r.checksum, r.bytes, r.records)
            if differs:
                report.findings.append(Finding(
                    "digest_differs", f"{r.topic}[{r.partition}] range [{r.start}, {r.end}) of plan {p.plan_id} "
                    f"({p.where}): recorded {r.records} records, {r.bytes} bytes, checksum {r.checksum}; Kafka "
                    f"holds {records} records, {size} bytes, checksum {checksum}", r.topic, r.partition,
                    ((r.start, r.end),)))  # fmt: skip
    if unrecorded:
        report.notes.append(f"{unrecorded} ranges have no recorded digest (their run's job.json is gone): "
                            "their digests were not compared")  # fmt: skip


def _check_dead_letters(feed: Feed, store: CheckpointStore, view: OutputView, report: VerifyReport) -> None:
    quarantined: set[tuple[str, str, int, int]] = set()
    for r in view.rows:  # a scoped audit: its plan's quarantine only
        if r.quarantine and r.table.num_rows and report.plan in (None, r.plan_id):
            cols = [r.table.column(c).to_pylist() for c in ("topic", "partition", "offset")]
            quarantined |= {(r.plan_id, str(t), int(p), int(o)) for t, p, o in zip(*cols, strict=True)}
    if not quarantined:
        return
    redriven: set[TP | tuple[str, int, int]] = set()
    for r in view.rows:
        if r.plan_id.startswith("redrive-") and not r.quarantine and r.table.num_rows:
            cols = [r.table.column(c).to_pylist() for c in ("topic", "partition", "offset")]
            redriven |= {(str(t), int(p), int(o)) for t, p, o in zip(*cols, strict=True)}
    listed = {d.key_of for d in dead_letters(feed, store=store)}
    neither, both = [], []
    for key in sorted(quarantined):
        again = key[1:] in redriven
        if key in listed and again:
            both.append(key)
        elif key not in listed and not again:
            neither.append(key)
    unlisted = "neither listed by `tidemark deadletters` nor re-driven"
    for kind, keys, what in (("dead_letter_unlisted", neither, unlisted),
                             ("dead_letter_listed_and_redriven", both, "listed and re-driven both")):  # fmt: skip
        by_tp: dict[TP, list[int]] = {}
        for _, t, n, o in keys:
            by_tp.setdefault((t, n), []).append(o)
        for (t, n), offsets in sorted(by_tp.items()):
            found = spans(offsets)
            report.findings.append(Finding(kind, f"{t}[{n}]: dead letters at offsets {show_spans(found)} are {what}",
                                           t, n, found))  # fmt: skip
