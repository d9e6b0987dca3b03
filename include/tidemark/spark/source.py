"""The ``tidemark_kafka`` PySpark data source: read exactly a plan's offset ranges.

Each task of the plan (chunks whose partitions share one leader broker) becomes one
Spark input partition. In the executor, :func:`read_task` opens one confluent-kafka
consumer, ``assign``s it at the planned start offsets (no group join, no commits,
``auto.offset.reset=error`` so a vanished offset fails loudly), consumes in batches and
yields Arrow record batches until every range has reached its end offset. Records past
an end are dropped; offsets missing inside a range (compaction, transaction markers,
aborted records under ``read_committed``) are normal and show up as gaps in
:func:`tidemark.spark.stats.range_stats`, which computes the per-range statistics with one
aggregation over records already read (the job runs it on its staged Parquet), never a
second read of Kafka. A small plan is read by the driver itself with the same
:func:`read_task`, one task after the other (:func:`read_plan_in_driver`), without the
Python processes the data source costs.

Connection settings reach the executors as options ``kafka.<librdkafka key>`` (Spark
redacts option values whose keys look secret) or, when no ``kafka.bootstrap.servers``
option is given, from the executors' ``TIDEMARK_*`` environment; they are never logged.

Example::

    from tidemark.spark.source import read_plan
    df = read_plan(spark, plan, connection)          # or, by hand:
    spark.dataSource.register(TidemarkKafkaSource)
    df = spark.read.format("tidemark_kafka").option("plan", plan.to_json()).load()
"""

from __future__ import annotations

import gc
import json
import os
import resource
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidemark.errors import ConfigError, ReadError, TidemarkError
from tidemark.kafka.connection import KafkaConnection, from_env, logged
from tidemark.planning.plan import Plan
from tidemark.spark.session import session_conf

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SOURCE_NAME = "tidemark_kafka"
KAFKA_OPTION_PREFIX = "kafka."
DEFAULT_BATCH_RECORDS = 10_000
DEFAULT_STALL_TIMEOUT_S = 120.0
POLL_TIMEOUT_S = 1.0
METRICS_ENV = "TIDEMARK_READ_METRICS_DIR"

# Java's TimestampType ids, as Spark's own Kafka source reports them:
# -1 no timestamp, 0 CreateTime, 1 LogAppendTime (librdkafka counts from 0 = none).
SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("timestamp", TimestampType(), True),
        StructField("timestamp_type", IntegerType(), False),
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField(
            "headers",
            ArrayType(
                StructType([StructField("key", StringType(), False), StructField("value", BinaryType(), True)]), False
            ),
            True,
        ),
        StructField("plan_id", StringType(), False),
    ]
)


def arrow_schema() -> pa.Schema:
    """The Arrow twin of :data:`SCHEMA`, exactly as Spark checks yielded batches against it."""
    return to_arrow_schema(SCHEMA, timezone="UTC")


# -- what one Spark task reads ---------------------------------------------------------


@dataclass(frozen=True)
class Range:
    """``[start, end)`` of one partition, as one task reads it."""

    topic: str
    partition: int
    start: int
    end: int

    def describe(self) -> str:
        return f"{self.topic}[{self.partition}] offsets [{self.start}, {self.end})"


@dataclass(frozen=True)
class ReadTask:
    """One Spark input partition's work: small, picklable, secret-free."""

    index: int
    leader: int
    plan_id: str
    group: str
    isolation: str
    ranges: tuple[Range, ...]

    @property
    def records(self) -> int:
        return sum(r.end - r.start for r in self.ranges)


def tasks_of(plan: Plan) -> list[ReadTask]:
    """The plan's tasks, with contiguous chunks of one partition merged into one range."""
    out = []
    for task in plan.tasks:
        merged: list[Range] = []
        for c in sorted(task.chunks, key=lambda c: (c.topic, c.partition, c.start)):
            if c.end <= c.start:
                continue
            last = merged[-1] if merged else None
            if last is not None and (last.topic, last.partition) == (c.topic, c.partition) and last.end == c.start:
                merged[-1] = Range(c.topic, c.partition, last.start, c.end)
            else:
                merged.append(Range(c.topic, c.partition, c.start, c.end))
        out.append(ReadTask(task.index, task.leader, plan.plan_id, plan.group, plan.isolation, tuple(merged)))
    return out


def _waves(ranges: Sequence[Range]) -> list[list[Range]]:
    """Split ranges so no partition appears twice in one assignment."""
    waves: list[list[Range]] = []
    for r in ranges:
        for wave in waves:
            if all((w.topic, w.partition) != (r.topic, r.partition) for w in wave):
                wave.append(r)
                break
        else:
            waves.append([r])
    return waves


# librdkafka defaults chosen for throughput with bounded memory; a connection may override them.
READ_TUNING: dict[str, Any] = {
    # librdkafka 2.x pauses a partition's fetching for fetch.queue.backoff.ms (1 s) whenever
    # its local queue is over a threshold; at that default a reader that drains its queue in
    # bursts sits idle most of the time (measured: 97k → 570k records/s for one task).
    "fetch.queue.backoff.ms": 1,
    "fetch.min.bytes": 1,
    "fetch.wait.max.ms": 100,
    # 4 MiB per partition and fetch instead of 1: a quarter of the fetch round trips, for
    # readers and brokers (measured: 3-6% faster reads, median of interleaved runs).
    "max.partition.fetch.bytes": 4 << 20,
    "queued.max.messages.kbytes": 16384,
}


def consumer_config(task: ReadTask, client_config: Mapping[str, Any]) -> dict[str, Any]:
    """librdkafka settings for reading ``task``: assign only, never commit, fail on lost offsets."""
    return {
        **READ_TUNING,
        **client_config,
        # Not negotiable: these make the read exact.
        "group.id": task.group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "enable.partition.eof": True,
        "isolation.level": task.isolation,
        "client.id": f"tidemark-reader-{task.plan_id[:8]}-{task.index}",
    }


# -- the executor-side reader ----------------------------------------------------------
# confluent_kafka and pyarrow.compute are imported inside the reader's functions: Spark imports this module in a
# Python process to create the source and in another to plan its partitions, which need neither (0.15 s and 0.09 s
# of import here).


class _Wave:
    """Per-wave bookkeeping: which ranges are still open, and vectorised range masks."""

    def __init__(self, ranges: Sequence[Range]) -> None:
        self.ranges = list(ranges)
        self.topics = sorted({r.topic for r in ranges})
        self.topic_index = {t: i for i, t in enumerate(self.topics)}
        self.stride = max(r.partition for r in ranges) + 1
        size = len(self.topics) * self.stride
        # Per (topic index, partition) slot: lowest offset still wanted and the end.
        self.low = np.full(size, np.iinfo(np.int64).max, dtype=np.int64)
        self.end = np.full(size, -1, dtype=np.int64)
        self.by_slot: dict[int, Range] = {}
        # Per slot: the next offset the reader had reached when it closed the range (-1: open).
        self.reached = np.full(size, -1, dtype=np.int64)
        for r in ranges:
            slot = self.slot(r.topic, r.partition)
            self.low[slot], self.end[slot] = r.start, r.end
            self.by_slot[slot] = r
        self.open = set(self.by_slot)

    def slot(self, topic: str, partition: int) -> int:
        return self.topic_index[topic] * self.stride + partition

    def close(self, slot: int, position: int) -> None:
        self.open.discard(slot)
        self.reached[slot] = position

    def positions(self) -> dict[tuple[str, int], int]:
        """Where the reader stopped in each range: what validation compares with the planned ends."""
        return {(r.topic, r.partition): int(self.reached[self.slot(r.topic, r.partition)]) for r in self.ranges}


class _Columns:
    """One consumed batch, column by column; turned into one Arrow batch at a time.

    Built with ``map`` over the C accessors of ``confluent_kafka.Message`` (``map(Message.offset,
    msgs)``): the loop over records then runs in C, with no Python bytecode per record. The
    integer columns go straight into numpy arrays, the timestamps as one flat run of
    ``(type, ms)`` pairs.
    """

    __slots__ = ("headers", "keys", "n", "offsets", "partitions", "topics", "ts", "ts_types", "values")

    def __init__(self, msgs: Sequence[Any], with_topics: bool) -> None:
        from confluent_kafka import Message

        n = self.n = len(msgs)
        self.topics: list[str] | None = list(map(Message.topic, msgs)) if with_topics else None
        self.partitions = np.fromiter(map(Message.partition, msgs), dtype=np.int32, count=n)
        self.offsets = np.fromiter(map(Message.offset, msgs), dtype=np.int64, count=n)
        pairs = np.fromiter(chain.from_iterable(map(Message.timestamp, msgs)), dtype=np.int64, count=2 * n)
        self.ts_types = pairs[0::2].astype(np.int32)
        self.ts = pairs[1::2]
        self.keys: list[bytes | None] = list(map(Message.key, msgs))
        self.values: list[bytes | None] = list(map(Message.value, msgs))
        self.headers: list[Any] = list(map(Message.headers, msgs))


def read_task(
    task: ReadTask,
    client_config: Mapping[str, Any],
    *,
    batch_records: int = DEFAULT_BATCH_RECORDS,
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
    positions: dict[tuple[str, int], int] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield ``task``'s records as Arrow batches of at most ``batch_records`` rows.

    Memory stays bounded by the batch size plus librdkafka's prefetch queue, whatever
    the size of the ranges. Raises :class:`ReadError` naming topic, partition and
    offsets when an offset is no longer available, when a partition errors, or when a
    range makes no progress for ``stall_timeout_s`` seconds. ``positions``, when given,
    receives for each range the next offset the reader reached when it closed the range
    (the record past the last one read, or the end-of-partition offset).
    """
    from confluent_kafka import Consumer

    ranges = [r for r in task.ranges if r.end > r.start]
    if not ranges:
        return
    schema = arrow_schema()
    consumer = Consumer(logged(consumer_config(task, client_config)))
    started, rows, payload = time.monotonic(), 0, 0
    measure = bool(os.environ.get(METRICS_ENV))  # payload bytes are only reported to benchmarks
    # Every consumed record is a fresh Message object that the cyclic garbage collector
    # tracks, so with it on a task spends about a third of its CPU in collections that
    # find nothing: the hot loop makes no reference cycles and frees each batch by
    # reference counting. Measured on 5M records: 9.5 → 6.8 CPU-s.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for wave_ranges in _waves(ranges):
            wave = _Wave(wave_ranges)
            for batch in _read_wave(consumer, wave, task, schema, batch_records, stall_timeout_s):
                rows += batch.num_rows
                if measure:
                    payload += _payload_bytes(batch)
                yield batch
            if positions is not None:
                positions.update(wave.positions())
    finally:
        if gc_was_enabled:
            gc.enable()
        consumer.close()
    _write_metrics(task, rows, payload, time.monotonic() - started)


def _payload_bytes(batch: pa.RecordBatch) -> int:
    import pyarrow.compute as pc

    total = 0
    for column in (batch.column(5), batch.column(6)):  # key, value
        total += int(pc.sum(pc.binary_length(column)).as_py() or 0)
    return total


def _write_metrics(task: ReadTask, rows: int, payload: int, seconds: float) -> None:
    """With ``TIDEMARK_READ_METRICS_DIR`` set (benchmarks), record what this task read.

    One small JSON file per task: records and payload bytes read (to prove Kafka is read
    once per run) and the worker's peak RSS (to prove memory does not grow with ranges).
    """
    folder = os.environ.get(METRICS_ENV)
    if not folder:
        return
    doc = {
        "plan_id": task.plan_id,
        "task": task.index,
        "records": rows,
        "payload_bytes": payload,
        "planned_offsets": task.records,
        "seconds": round(seconds, 3),
        "pid": os.getpid(),
        "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }
    path = Path(folder) / f"read-{task.plan_id[:8]}-{task.index}-{uuid.uuid4().hex[:8]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def _read_wave(
    consumer: Any, wave: _Wave, task: ReadTask, schema: pa.Schema, batch_records: int, stall_timeout_s: float
) -> Iterator[pa.RecordBatch]:
    from confluent_kafka import KafkaError, Message, TopicPartition

    message_error = Message.error
    consumer.assign([TopicPartition(r.topic, r.partition, r.start) for r in wave.ranges])
    single_topic = wave.topics[0] if len(wave.topics) == 1 else None
    eof_code = KafkaError._PARTITION_EOF
    last_progress = time.monotonic()
    while wave.open:
        # consume() waits for num_messages or the timeout: never ask for more than the ranges can
        # still hold, or the last batch of every range would sit out the whole timeout.
        remaining = sum(int(wave.end[s] - wave.low[s]) for s in wave.open)
        msgs = consumer.consume(num_messages=max(1, min(batch_records, remaining)), timeout=POLL_TIMEOUT_S)
        eofs: list[tuple[str, int, int]] = []
        # Errors are rare (partition EOF at the end of each range, broker hiccups): spot them
        # with one C-level pass, and only then sort messages one by one.
        # (No == None: KafkaError's == raises when compared with None. A KafkaError is always
        # true, None false, and any() tests that without a Python call: 4x faster than is_not.)
        errors = list(map(message_error, msgs))
        data = msgs
        if any(errors):
            data = [m for m, e in zip(msgs, errors, strict=True) if e is None]
            for m, err in zip(msgs, errors, strict=True):
                if err is None:
                    continue
                if err.code() == eof_code:
                    eofs.append((m.topic(), m.partition(), m.offset()))
                else:
                    _raise_or_skip(consumer, wave, m, err)
        progressed = False
        if data:
            batch, progressed = _to_batch(_Columns(data, single_topic is None), wave, task, schema, single_topic)
            if batch is not None and batch.num_rows:
                yield batch
        for topic, partition, offset in eofs:
            if topic in wave.topic_index:
                slot = wave.slot(topic, partition)
                if slot in wave.open and offset >= wave.end[slot]:
                    wave.close(slot, offset)
                    progressed = True
        done = [r for s, r in wave.by_slot.items() if s not in wave.open]
        if done:
            _unassign(consumer, done)
            wave.by_slot = {s: r for s, r in wave.by_slot.items() if s in wave.open}
        if progressed or msgs:
            last_progress = time.monotonic()
        elif wave.open and time.monotonic() - last_progress > stall_timeout_s:
            _raise_stalled(consumer, wave, stall_timeout_s)
    consumer.unassign()


def _to_batch(
    cols: _Columns, wave: _Wave, task: ReadTask, schema: pa.Schema, single_topic: str | None
) -> tuple[pa.RecordBatch | None, bool]:
    """Build the Arrow batch, dropping records outside the open ranges; close finished ranges."""
    n, partitions, offsets = cols.n, cols.partitions, cols.offsets
    if cols.topics is not None:
        index = wave.topic_index
        topic_idx = np.fromiter((index.get(t, -1) for t in cols.topics), dtype=np.int64, count=n)
    else:
        topic_idx = np.zeros(n, dtype=np.int64)
    slots = topic_idx * wave.stride + partitions
    valid_slot = (topic_idx >= 0) & (partitions < wave.stride)
    slots = np.where(valid_slot, slots, 0)
    keep = valid_slot & (offsets >= wave.low[slots]) & (offsets < wave.end[slots])
    progressed = False
    # Close every range whose end was reached (a record at or past end - 1 was seen).
    tops = np.full(len(wave.end), -1, dtype=np.int64)
    np.maximum.at(tops, slots[valid_slot], offsets[valid_slot])
    for slot in list(wave.open):
        top = int(tops[slot])
        if top < 0:
            continue
        wave.low[slot] = max(int(wave.low[slot]), top + 1)  # a redelivered offset is dropped, never doubled
        progressed = True
        if top >= wave.end[slot] - 1:
            wave.close(slot, int(wave.low[slot]))
    if not keep.any():
        return None, progressed
    all_kept = bool(keep.all())
    ts_types = cols.ts_types
    ts_arr = _timestamps(cols.ts, ts_types)
    if cols.topics is None and single_topic is not None:
        topic_arr = _repeated(single_topic, n)
    else:
        topic_arr = pa.array(cols.topics, type=pa.string())
    arrays = [
        topic_arr,
        pa.array(partitions, type=pa.int32()),
        pa.array(offsets, type=pa.int64()),
        ts_arr,
        pa.array(ts_types - 1, type=pa.int32()),
        pa.array(cols.keys, type=pa.binary()),
        pa.array(cols.values, type=pa.binary()),
        _headers_array(cols.headers, n, schema.field("headers").type),
        _repeated(task.plan_id, n),
    ]
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    if not all_kept:
        batch = batch.filter(pa.array(keep))
    return batch, progressed


_TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")


def _timestamps(ms: np.ndarray, types: np.ndarray) -> pa.Array:
    """Kafka's millisecond timestamps as Arrow microseconds, null where a record has none.

    Built from buffers: ``pa.array(..., mask=...)`` takes a slow path (1.3 ms per 10k
    records against 0.02 ms, measured in isolation).
    """
    micros = np.ascontiguousarray(ms * 1000, dtype=np.int64)
    valid = types != 0  # librdkafka's type 0: no timestamp
    n = len(micros)
    if valid.all():
        return pa.Array.from_buffers(_TIMESTAMP_TYPE, n, [None, pa.py_buffer(micros)])
    bits = np.packbits(valid, bitorder="little")
    return pa.Array.from_buffers(
        _TIMESTAMP_TYPE, n, [pa.py_buffer(bits), pa.py_buffer(micros)], null_count=int(n - valid.sum())
    )


def _repeated(text: str, n: int) -> pa.Array:
    """``n`` copies of ``text`` as an Arrow string array, built from its buffers.

    Over ten times faster than casting a one-entry dictionary array (10 against 138 µs per
    10k rows, measured in isolation); used for the topic and the plan id.
    """
    data = text.encode()
    if len(data) * n >= 2**31:  # past int32 offsets: let Arrow pick the layout
        return pa.array([text] * n, type=pa.string())
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(data))
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data * n)])


def _headers_array(headers: list[Any], n: int, arrow_type: pa.DataType) -> pa.Array:
    # Most topics carry no headers: skip converting a list of None element by element.
    return pa.array(headers, type=arrow_type) if any(headers) else pa.nulls(n, type=arrow_type)


def _unassign(consumer: Any, done: Sequence[Range]) -> None:
    from confluent_kafka import TopicPartition

    # Stop fetching finished partitions; anything still queued for them is filtered out.
    consumer.incremental_unassign([TopicPartition(r.topic, r.partition) for r in done])


def _range_for(wave: _Wave, topic: str | None, partition: int | None) -> Range | None:
    if topic is None or partition is None or topic not in wave.topic_index or partition >= wave.stride:
        return None
    return wave.by_slot.get(wave.slot(topic, partition))


def _log_start(consumer: Any, topic: str, partition: int) -> str:
    from confluent_kafka import KafkaException, TopicPartition

    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=5.0)
    except KafkaException:
        return ""
    return f"; the log now starts at {low} and ends at {high}"


def _raise_or_skip(consumer: Any, wave: _Wave, msg: Any, err: Any) -> None:
    """Fail on a partition's hard error; let librdkafka retry transient (broker) errors."""
    from confluent_kafka import KafkaError

    topic, partition = msg.topic(), msg.partition()
    rng = _range_for(wave, topic, partition)
    code = err.code()
    lost = code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)
    hard = lost or err.fatal() or code in (
        KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC, KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError._AUTHENTICATION,
    )  # fmt: skip
    if not hard:
        return  # broker down, leader moving, timeouts: librdkafka retries; the stall timeout bounds it
    where = rng.describe() if rng is not None else f"{topic}[{partition}]"
    if lost and rng is not None and topic is not None and partition is not None:
        position = wave.low[wave.slot(topic, partition)]
        raise ReadError(
            f"{where}: offset {position} is no longer available ({err.str()}){_log_start(consumer, topic, partition)}. "
            "Records were deleted (retention or DeleteRecords) after the plan was made; replan the run so the "
            "feed's data-loss policy decides, nothing was committed"
        )
    raise ReadError(f"reading {where} failed: {err.str()} (code {err.name()})")


def _raise_stalled(consumer: Any, wave: _Wave, stall_timeout_s: float) -> None:
    stuck = []
    for slot in sorted(wave.open):
        r = wave.by_slot[slot]
        position = int(wave.low[slot])
        stuck.append(f"{r.describe()} at offset {position}{_log_start(consumer, r.topic, r.partition)}")
    raise ReadError(f"no progress for {stall_timeout_s:.0f}s before reaching the planned end of: " + "; ".join(stuck))


# -- the Spark data source -------------------------------------------------------------


class TaskPartition(InputPartition):  # type: ignore[misc]
    """One Spark input partition holding one :class:`ReadTask`."""

    def __init__(self, task: ReadTask) -> None:
        super().__init__(task)
        self.task = task


class TidemarkKafkaSource(DataSource):  # type: ignore[misc]
    """Format ``tidemark_kafka``: the records of a Tidemark plan's offset ranges.

    Options: ``plan`` (the plan JSON, required), ``kafka.<librdkafka key>`` (connection;
    else the executors' ``TIDEMARK_*`` environment), ``batch.records`` (Arrow batch size,
    default 10000), ``stall.timeout.s`` (default 120), ``constant.columns`` (``omit``:
    leave out the columns whose value the plan fixes, see :func:`constant_columns`;
    :func:`read_plan` adds them back as literals). Schema: :data:`SCHEMA`.
    """

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        omitted = _omitted_columns(self.options)
        return StructType([f for f in SCHEMA.fields if f.name not in omitted]) if omitted else SCHEMA

    def reader(self, schema: StructType) -> TidemarkKafkaReader:
        return TidemarkKafkaReader(self.options)


class TidemarkKafkaReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: Mapping[str, str]) -> None:
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        self.plan = _plan_option(opts)
        self.kafka = {k[len(KAFKA_OPTION_PREFIX) :]: v for k, v in opts.items() if k.startswith(KAFKA_OPTION_PREFIX)}
        try:
            self.batch_records = int(opts.get("batch.records", DEFAULT_BATCH_RECORDS))
            self.stall_timeout_s = float(opts.get("stall.timeout.s", DEFAULT_STALL_TIMEOUT_S))
        except ValueError as exc:
            raise ConfigError(f"{SOURCE_NAME}: option batch.records / stall.timeout.s is not a number: {exc}") from exc
        if self.batch_records < 1 or self.stall_timeout_s <= 0:
            raise ConfigError(f"{SOURCE_NAME}: batch.records and stall.timeout.s must be positive")
        self.omitted = list(_omitted_columns(options, self.plan))

    def partitions(self) -> list[InputPartition]:
        return [TaskPartition(t) for t in tasks_of(self.plan)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, TaskPartition):
            # A plan with nothing to read has no tasks; Spark then still asks for one
            # partition (a bare InputPartition), which holds no records.
            return iter(())
        task: ReadTask = partition.task
        config = dict(self.kafka) if "bootstrap.servers" in self.kafka else from_env().client_config(**self.kafka)
        batches = read_task(task, config, batch_records=self.batch_records, stall_timeout_s=self.stall_timeout_s)
        if self.omitted:
            return (b.drop_columns(self.omitted) for b in batches)
        return batches


def constant_columns(plan: Plan) -> dict[str, str]:
    """The columns whose value is the same in every record of ``plan``, with that value.

    ``plan_id`` always; ``topic`` when the plan reads one topic. Every record's copy of
    them costs the reader's Arrow batches and Spark's conversion of those batches into
    rows about as much as the key (measured at 5M records: the read 3-7 % faster without
    them), so :func:`read_plan` has Spark add them as literals instead.
    """
    topics = {p.topic for p in plan.partitions}
    fixed = {"plan_id": plan.plan_id}
    if len(topics) == 1:
        fixed["topic"] = next(iter(topics))
    return fixed


def _omitted_columns(options: Mapping[str, str], plan: Plan | None = None) -> dict[str, str]:
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    mode = opts.get("constant.columns", "keep").lower()
    if mode not in ("keep", "omit"):
        raise ConfigError(f"{SOURCE_NAME}: option constant.columns must be 'keep' or 'omit', not '{mode}'")
    if mode == "keep":
        return {}
    return constant_columns(plan or _plan_option(opts))


def _plan_option(opts: Mapping[str, str]) -> Plan:
    text = opts.get("plan")
    if not text:
        raise ConfigError(f"the {SOURCE_NAME} data source needs option 'plan' (the plan JSON)")
    return Plan.from_json(text)


def register(spark: SparkSession) -> None:
    spark.dataSource.register(TidemarkKafkaSource)


def read_plan(
    spark: SparkSession,
    plan: Plan,
    connection: KafkaConnection | None = None,
    *,
    batch_records: int | None = None,
    stall_timeout_s: float | None = None,
) -> DataFrame:
    """A DataFrame of exactly ``plan``'s records (lazy: Kafka is read by the first action).

    ``connection`` travels to the executors as ``kafka.*`` options; leave it ``None`` to
    have executors use their own ``TIDEMARK_*`` environment instead.
    """
    register(spark)
    reader = spark.read.format(SOURCE_NAME).option("plan", plan.to_json(indent=None)).option("constant.columns", "omit")
    if connection is not None:
        for key, value in connection.client_config().items():
            reader = reader.option(KAFKA_OPTION_PREFIX + key, str(value))
    if batch_records is not None:
        reader = reader.option("batch.records", str(batch_records))
    if stall_timeout_s is not None:
        reader = reader.option("stall.timeout.s", str(stall_timeout_s))
    fixed = constant_columns(plan)
    df = reader.load()
    return df.select(*[F.lit(fixed[f.name]).alias(f.name) if f.name in fixed else f.name for f in SCHEMA.fields])


# spark.createDataFrame keeps Arrow data under spark.sql.execution.arrow.localRelationThreshold
# (48 MB) in the driver as a LocalRelation, and the optimizer then evaluates the job's
# decode and outcome projections over it row by row, interpreted, in one driver thread
# (ConvertToLocalRelation): 4 of the 5 s the write took at 100,000 records. Above this
# many records the batches go to Spark as an RDD instead, a partition per batch, and the
# write's tasks decode them in parallel (100,000 records: wall 16.3 -> 13.1 s; at 1,000 the
# LocalRelation is 0.6 s faster; docs/benchmarks/read.md, "Small runs").
LOCAL_RELATION_MAX_RECORDS = 10_000
# The driver holds a plan's Arrow batches until Spark has them. A plan of few but large
# records that passes this is left to the data source (read_plan_in_driver raises).
DRIVER_READ_MAX_BYTES = 64 << 20


class DriverReadTooLarge(TidemarkError):
    """The plan's records passed :data:`DRIVER_READ_MAX_BYTES` while the driver read them."""


def read_plan_in_driver(
    spark: SparkSession,
    plan: Plan,
    connection: KafkaConnection | None = None,
    *,
    batch_records: int | None = None,
    stall_timeout_s: float | None = None,
    max_bytes: int | None = None,
    positions: dict[tuple[str, int], int] | None = None,
) -> DataFrame:
    """``plan``'s records read now, by this process, as a DataFrame of :data:`SCHEMA`: for small plans.

    The same :func:`read_task` as the data source's executors run (the same consumer
    settings, batches and checks: a short read or a vanished offset raises here), one task
    after the other, and the Arrow batches handed to Spark as they are. Spark's Python data
    source costs, before a record is read, one Python process to create the source, one to
    plan its partitions and one per executor task, each importing pyarrow, numpy and
    confluent-kafka: seconds of fixed cost that a few thousand records do not repay. The
    whole plan is held in the driver's memory, so the job uses this only up to the feed's
    ``driver_read_max_records``, and with ``max_bytes`` it stops reading and raises
    :class:`DriverReadTooLarge` once the batches hold more than that. ``positions`` receives
    where the reader stopped in each range (see :func:`read_task`).
    """
    config = (connection or from_env()).client_config()
    batches: list[pa.RecordBatch] = []
    held = 0
    for task in tasks_of(plan):
        for batch in read_task(
            task, config, batch_records=batch_records or DEFAULT_BATCH_RECORDS,
            stall_timeout_s=stall_timeout_s or DEFAULT_STALL_TIMEOUT_S, positions=positions,
        ):  # fmt: skip
            batches.append(batch)
            held += batch.nbytes
            if max_bytes is not None and held > max_bytes:
                raise DriverReadTooLarge(
                    f"plan {plan.plan_id}: the first {sum(b.num_rows for b in batches)} of its {plan.total_records} "
                    f"records already hold {held} bytes, more than the driver read's {max_bytes}"
                )
    table = pa.Table.from_batches(batches, schema=arrow_schema())
    if table.num_rows <= LOCAL_RELATION_MAX_RECORDS:
        return spark.createDataFrame(table, schema=SCHEMA)
    # Read when the DataFrame is created, not when it is used.
    with session_conf(spark, "spark.sql.execution.arrow.localRelationThreshold", "0"):
        return spark.createDataFrame(table, schema=SCHEMA)
