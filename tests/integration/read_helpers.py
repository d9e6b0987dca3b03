"""Hand-built plans for the read/publish tests (independent of the planner module)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from tidemark._types import Isolation
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.connection import KafkaConnection
from tidemark.planning.plan import Chunk, PartitionPlan, Plan, Task, compute_plan_id


def plan_for(
    adapter: KafkaAdapter,
    topics: Sequence[str],
    *,
    isolation: Isolation = "read_committed",
    starts: Mapping[tuple[str, int], int] | None = None,
    ends: Mapping[tuple[str, int], int] | None = None,
    chunk_records: int = 1_000_000,
    feed: str = "test-feed",
    group: str = "test-group",
) -> Plan:
    """A plan over every partition of ``topics``: log start (or ``starts``) → end offset (or ``ends``)."""
    infos = adapter.partitions(topics)
    tps = [(i.topic, i.partition) for i in infos]
    low = adapter.log_start_offsets(tps)
    high = adapter.end_offsets(tps, "read_uncommitted")
    stable = adapter.end_offsets(tps, isolation)
    parts = []
    for info in infos:
        tp = (info.topic, info.partition)
        start = (starts or {}).get(tp, low[tp])
        end = (ends or {}).get(tp, stable[tp])
        parts.append(
            PartitionPlan(
                topic=info.topic, partition=info.partition, leader=info.leader, committed=None, checkpoint=None,
                log_start=low[tp], high_watermark=high[tp], end_available=stable[tp], start=start, end=end,
                reason="earliest",
            )
        )  # fmt: skip
    by_leader: dict[int, list[Chunk]] = defaultdict(list)
    for p in parts:
        for s in range(p.start, p.end, chunk_records):
            by_leader[p.leader].append(Chunk(p.topic, p.partition, s, min(p.end, s + chunk_records)))
    tasks = tuple(Task(i, leader, tuple(chunks)) for i, (leader, chunks) in enumerate(sorted(by_leader.items())))
    pp = tuple(parts)
    return Plan(
        plan_id=compute_plan_id(feed, group, "replay", isolation, pp),
        feed=feed, group=group, mode="replay", commit=False, isolation=isolation,
        created_at="2026-01-01T00:00:00+00:00", partitions=pp, tasks=tasks,
    )  # fmt: skip


def consume_independently(
    connection: KafkaConnection, plan: Plan, isolation: Isolation = "read_committed"
) -> list[tuple[Any, ...]]:
    """Every record of the plan's ranges, read one by one with a plain consumer (the oracle)."""
    out: list[tuple[Any, ...]] = []
    for p in plan.partitions:
        if p.end <= p.start:
            continue
        consumer = Consumer(
            connection.client_config(
                **{"group.id": "oracle", "enable.auto.commit": False, "isolation.level": isolation,
                   "enable.partition.eof": True, "auto.offset.reset": "error"}
            )
        )  # fmt: skip
        try:
            consumer.assign([TopicPartition(p.topic, p.partition, p.start)])
            while True:
                msg = consumer.poll(10)
                assert msg is not None, f"oracle stalled on {p.topic}[{p.partition}]"
                if msg.error():
                    if msg.error().code() == -191:  # _PARTITION_EOF
                        if msg.offset() >= p.end:
                            break
                        continue
                    raise AssertionError(str(msg.error()))
                if msg.offset() >= p.end:
                    break
                out.append((msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value()))
                if msg.offset() >= p.end - 1:
                    break
        finally:
            consumer.close()
    return sorted(out)


def chunk_layout(parquet_file: Any, columns: Sequence[str]) -> dict[str, tuple[bool, bool]]:
    """``{column: (has min/max statistics, has a dictionary page)}`` in a Parquet file's first row group."""
    import pyarrow.parquet as pq

    group = pq.ParquetFile(parquet_file).metadata.row_group(0)
    chunks = [group.column(i) for i in range(group.num_columns)]
    return {c.path_in_schema: (c.is_stats_set, c.has_dictionary_page) for c in chunks if c.path_in_schema in columns}


def published_pairs(files: Sequence[str]) -> list[tuple[int, int]]:
    """(partition, offset) of every row in the given Parquet files (paths or URLs), sorted."""
    import pyarrow.parquet as pq

    from tidemark.storage import Location

    rows: list[tuple[int, int]] = []
    for url in files:
        loc = Location.of(url)
        table = pq.read_table(loc.fs_path, filesystem=loc.fs, columns=["partition", "offset"], partitioning=None)
        rows += zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True)
    return sorted(rows)


def produce_transactions(
    connection: KafkaConnection,
    adapter: KafkaAdapter,
    topic: str,
    batches: Sequence[tuple[Sequence[bytes], bool]],
    partition: int = 0,
) -> None:
    """Each batch of values in its own transaction, committed or aborted, on one empty partition;
    waits until the last marker is stable (a ``read_committed`` plan then covers all of it)."""
    import time

    from confluent_kafka import Producer

    producer = Producer(connection.client_config(**{"transactional.id": f"tx-{topic}-{time.time_ns()}"}))
    producer.init_transactions(30)
    for values, commit in batches:
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value=value, partition=partition)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    want = sum(len(values) + 1 for values, _ in batches)  # every record, and one marker per transaction
    deadline = time.monotonic() + 30
    while adapter.end_offsets([(topic, partition)], "read_committed")[(topic, partition)] < want:
        assert time.monotonic() < deadline, f"{topic}[{partition}]: the last transaction marker never became stable"
        time.sleep(0.2)


def run_job_in_process(spark: Any, handle: Any, connection: KafkaConnection) -> dict[str, Any]:
    """A run's Spark job in the test's own session (the code ``spark-submit`` runs), ``job.json`` written
    as it would be; for ``run_feed(job_runner=...)``."""
    from pathlib import Path

    from tidemark.config.models import load_feed
    from tidemark.job.result import JobResult, write_result
    from tidemark.job.steps import run

    plan = handle.plan()
    result = JobResult(plan.plan_id, plan.feed)
    try:
        run(spark, plan, load_feed(plan.feed), connection, Path(handle.run_dir), result=result, run_id=handle.run_id)
    except Exception as exc:
        result.error = str(exc)
        raise
    finally:
        write_result(Path(handle.run_dir), result)
    return result.to_dict()


def published_rows(output: Path) -> Counter[tuple[str, int, int, str]]:
    """``(topic, partition, offset, sha256(value))`` of every record under a local output's plan folders, counted:
    the shape of the fault oracle's rows (:func:`tests.faults.harness.oracle`). The topic comes from the
    ``topic=`` folder where the files have no such column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.faults.harness import digest

    rows: Counter[tuple[str, int, int, str]] = Counter()
    for path in sorted(output.glob("plan_id=*/**/*.parquet")):
        folder_topic = next((p[len("topic=") :] for p in path.parts if p.startswith("topic=")), None)
        table = pq.read_table(path, partitioning=None)
        topics = table.column("topic").to_pylist() if "topic" in table.column_names else [folder_topic] * len(table)
        values = table.column("value").cast(pa.binary()).to_pylist()
        for t, p, o, v in zip(topics, table.column("partition").to_pylist(), table.column("offset").to_pylist(),
                              values, strict=True):  # fmt: skip
            rows[(str(t), int(p), int(o), digest(v))] += 1
    return rows
