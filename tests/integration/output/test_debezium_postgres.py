"""A real change stream end to end: PostgreSQL's logical replication, Debezium in Kafka Connect, a keyed feed.

A PostgreSQL server with ``wal_level=logical`` (:mod:`tests.support.servers.postgres`) and one
standalone Kafka Connect worker with Debezium's PostgreSQL connector
(:mod:`tidemark.devtools.connect`) start once for the module, against the test cluster.
Seeded random transactions run on a source table: inserts, updates of other columns and of
the primary key (which Debezium sends as a delete of the old key, its tombstone and a create
of the new one), deletes, several rows per transaction. The connector's topic has three
partitions, created before it starts. A feed with ``iceberg.mode: upsert`` and
``change_format: debezium`` loads it; after every run the Iceberg table, read with pyiceberg,
equals ``SELECT *`` of the source table, read with psycopg. The faults on the way: the worker
killed (SIGKILL) after a round's changes were sent and loaded but before its source offsets
were flushed, then restarted: it sends those changes again, and a run that reads them only in
part (``max_records_per_partition``) must not take the table back (the merge orders Debezium
changes by ``source.sequence`` and drops one below its partition's clock as sent again; ordered by
offset, this run fails: older images of re-sent keys come back), nor bring back a deleted key
whose delete marker was pruned (issue 58); and a Tidemark run that crashes between its job
and its table commit, settled by the next run.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.faults.harness import FaultEnv
from tidemark.devtools import connect
from tidemark.faults import FAULTS_ENV, InjectedFault

# Six runs on a busy 2-core machine can take minutes: a longer timeout than the suite's.
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(1200)]

COLUMNS = ["id", "name", "qty"]
IDS = range(1, 41)  # the fixed ids the transactions draw from
AFTER = "id int, name string, qty int"
SOURCE = "ts_ms: long, lsn: long, sequence: string"  # sequence: the order the connector sends changes in
# Source offsets are flushed when a task stops, else this often: a round's changes are sent well before the next
# periodic flush (the kill round checks that none came).
OFFSET_FLUSH_MS = 600_000
WAIT_S = 60.0


class Source:
    """The PostgreSQL side: the server (logical replication) and the source table's connection."""

    def __init__(self, server: Any) -> None:
        import psycopg

        self.server = server
        self.conn = psycopg.connect(server.url, autocommit=True)

    def rows(self) -> dict[int, dict[str, Any]]:
        cur = self.conn.execute("SELECT * FROM items")
        names = [d.name for d in cur.description or ()]
        return {row[0]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}


@dataclass
class Lab:
    """What the module starts once: the source (PostgreSQL with logical replication) and the Connect worker."""

    source: Source
    worker: connect.LocalConnect


@pytest.fixture(scope="module")
def lab(kafka: KafkaTestCluster) -> Iterator[Lab]:
    from tests.support.servers import postgres as pg_local

    started = time.monotonic()
    server = pg_local.start(settings=pg_local.LOGICAL_REPLICATION)
    try:
        worker = connect.start(kafka.bootstrap_servers, offset_flush_ms=OFFSET_FLUSH_MS)
    except BaseException:
        server.stop()
        raise
    print(f"PostgreSQL and Kafka Connect started in {time.monotonic() - started:.1f} s")
    found = Lab(Source(server), worker)
    try:
        yield found
    finally:
        found.source.conn.close()
        found.worker.stop()
        server.stop()


class Stream:
    """One connector over the source tables, its topic (3 partitions), and the marks that say it caught up."""

    def __init__(self, kafka: KafkaTestCluster, lab: Lab, schema: str = "public") -> None:
        from tests.support.servers.postgres import DB_NAME, DB_USER

        self.kafka, self.lab = kafka, lab
        self.prefix = f"dbz{uuid.uuid4().hex[:8]}"
        self.topic = f"{self.prefix}.{schema}.items"
        self.marks = f"{self.prefix}.{schema}.marks"
        kafka.adapter.create_topic(self.topic, 3, 1, None)
        kafka.adapter.create_topic(self.marks, 1, 1, None)
        server = lab.source.server
        self.config = connect.debezium_postgres(
            host="127.0.0.1", port=server.port, user=DB_USER, password=server.password, database=DB_NAME,
            topic_prefix=self.prefix, tables=[f"{schema}.items", f"{schema}.marks"], slot=self.prefix,
        )  # fmt: skip
        self.mark = 0

    def start(self) -> None:
        self.lab.worker.put_connector(self.prefix, self.config)

    def caught_up(self) -> None:
        """Insert the next mark; wait until its change is on the marks topic and the items topic is quiet for 1 s."""
        self.mark += 1
        self.lab.source.conn.execute("INSERT INTO marks VALUES (%s)", (self.mark,))
        deadline = time.monotonic() + WAIT_S
        while self.mark not in self.marks_seen():
            assert time.monotonic() < deadline, f"mark {self.mark} never came ({self.lab.worker.log_file})"
            time.sleep(0.3)
        ends, quiet_since = end_offsets(self.kafka, self.topic), time.monotonic()
        while time.monotonic() - quiet_since < 1.0:
            time.sleep(0.25)
            if (later := end_offsets(self.kafka, self.topic)) != ends:
                ends, quiet_since = later, time.monotonic()

    def marks_seen(self) -> set[int]:
        return {doc["after"]["id"] for doc in read_topic(self.kafka, self.marks) if doc and doc.get("after")}


def end_offsets(kafka: KafkaTestCluster, topic: str) -> dict[int, int]:
    tps = [(topic, p.partition) for p in kafka.adapter.partitions([topic])]
    return {partition: end for (_, partition), end in kafka.adapter.end_offsets(tps, "read_uncommitted").items()}


def read_topic(kafka: KafkaTestCluster, topic: str) -> list[dict[str, Any] | None]:
    """Every value of ``topic`` up to its end now (JSON, or None for a tombstone), partition by partition."""
    from confluent_kafka import Consumer, TopicPartition

    ends = end_offsets(kafka, topic)
    consumer = Consumer(kafka.connection.client_config(**{"group.id": f"scan-{uuid.uuid4().hex[:8]}",
                                                          "enable.auto.commit": False}))  # fmt: skip
    found: dict[tuple[int, int], dict[str, Any] | None] = {}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end])
        deadline = time.monotonic() + WAIT_S
        while sum(ends.values()) > len(found):
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            for msg in consumer.consume(500, 0.5):
                if not msg.error() and msg.offset() < ends[msg.partition()]:
                    value = msg.value()
                    found[(msg.partition(), msg.offset())] = json.loads(value) if value is not None else None
    finally:
        consumer.close()
    return [found[k] for k in sorted(found)]


def transactions(source: Source, rng: random.Random, count: int) -> None:
    """``count`` transactions of 1 to 4 statements each, drawn by ``rng`` from the table as it is."""
    for _ in range(count):
        with source.conn.transaction():
            for _ in range(rng.randint(1, 4)):
                statement(source, rng)


def statement(source: Source, rng: random.Random) -> None:
    present = sorted(r[0] for r in source.conn.execute("SELECT id FROM items").fetchall())
    free = [i for i in IDS if i not in present]
    kind = rng.choice(["insert", "insert", "update", "update", "rekey", "delete"]) if present else "insert"
    if kind == "insert" and free:
        key = rng.choice(free)
        source.conn.execute(
            "INSERT INTO items VALUES (%s, %s, %s)",
            (key, f"n{key}-{rng.randint(0, 999)}", rng.choice([None, rng.randint(0, 99)])),
        )
    elif kind == "update" and present:
        source.conn.execute("UPDATE items SET name = %s, qty = %s WHERE id = %s",
                            (f"u{rng.randint(0, 999)}", rng.randint(0, 99), rng.choice(present)))  # fmt: skip
    elif kind == "rekey" and present and free:
        source.conn.execute("UPDATE items SET id = %s WHERE id = %s", (rng.choice(free), rng.choice(present)))
    elif kind == "delete" and present:
        source.conn.execute("DELETE FROM items WHERE id = %s", (rng.choice(present),))


def table_rows(fenv: FaultEnv) -> dict[int, dict[str, Any]]:
    from tidemark.config.models import load_feed
    from tidemark.output import publisher_for

    table = publisher_for(load_feed(fenv.feed)).load()  # type: ignore[attr-defined]
    assert table is not None
    rows = table.scan().to_arrow().to_pylist()
    keys = [r["id"] for r in rows]
    assert len(keys) == len(set(keys)), f"a key has more than one row: {sorted(keys)}"
    return {r["id"]: {c: r[c] for c in COLUMNS} for r in rows}


def assert_table_is_the_source(fenv: FaultEnv, source: Source) -> None:
    expected, got = source.rows(), table_rows(fenv)
    print(f"{time.strftime('%H:%M:%S')} the table has {len(got)} rows, the source {len(expected)}")
    missing = {k: v for k, v in expected.items() if got.get(k) != v}
    extra = {k: v for k, v in got.items() if k not in expected}
    assert got == expected, f"differs from the source: wrong or missing {missing}, not in the source {extra}"


def duplicates(kafka: KafkaTestCluster, topic: str) -> int:
    """Changes on ``topic`` more than once (same LSN, op and key): what a restarted worker sent again."""
    seen = [(d["source"]["lsn"], d["op"], json.dumps(d["before"] or d["after"])) for d in read_topic(kafka, topic) if d]
    return len(seen) - len(set(seen))


@pytest.fixture
def fenv(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultEnv:
    env = FaultEnv(kafka, spark, tmp_path, "debezium", partitions=1)
    env.install(monkeypatch)
    return env


def use_topic(fenv: FaultEnv, topic: str, **settings: Any) -> None:
    fenv.topic, fenv.iceberg = topic, "tidemark.items"
    fenv.write_feed(
        topics=[topic],
        **settings,
        records_per_task=50,
        deserialization={"format": "json", "schema_ddl": (f"before struct<{AFTER}>, after struct<{AFTER}>, op string, "
                                                          f"source struct<{SOURCE}>, ts_ms long")},
        output_format="iceberg",
        iceberg={"table": "tidemark.items", "mode": "upsert", "key": ["id"], "change_format": "debezium"},
        validation={"on_bad_records": "fail"},
    )  # fmt: skip


def test_a_postgres_table_through_debezium_equals_its_iceberg_table_after_every_run(
    lab: Lab, kafka: KafkaTestCluster, fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, rng = lab.source, random.Random(58)
    source.conn.execute("SET search_path TO public")
    source.conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, qty int)")
    source.conn.execute("CREATE TABLE marks (id int PRIMARY KEY)")
    transactions(source, rng, 6)  # rows before the connector starts: its snapshot ('r')
    stream = Stream(kafka, lab)
    stream.start()
    use_topic(fenv, stream.topic)

    # Round 1: the snapshot, then transactions streamed from the slot.
    transactions(source, rng, 25)
    stream.caught_up()
    fenv.run()
    assert_table_is_the_source(fenv, source)

    # Round 2: the worker killed after the round's changes were sent and loaded, before it flushed their offsets;
    # restarted, it sends them again. A run that reads the re-sent changes in part (3 a partition) finds each older,
    # by its LSN, than its key's row: the table does not go back.
    lab.worker.restart_tasks(stream.prefix)  # round 1's offsets flushed (if they were not); the next flush much later
    offsets, flushed = lab.worker.offsets_file, lab.worker.offsets_file.stat().st_mtime_ns
    transactions(source, rng, 25)
    stream.caught_up()
    fenv.run()
    assert_table_is_the_source(fenv, source)
    lab.worker.kill()
    assert offsets.stat().st_mtime_ns == flushed, "the worker flushed its offsets during the round: nothing re-sent"
    sent = sum(end_offsets(kafka, stream.topic).values())
    lab.worker = connect.restart(lab.worker)
    stream.start()
    stream.caught_up()
    assert sum(end_offsets(kafka, stream.topic).values()) > sent and duplicates(kafka, stream.topic) > 0
    use_topic(fenv, stream.topic, max_records_per_partition=3)
    fenv.run()
    assert_table_is_the_source(fenv, source)

    # Round 3: the rest of the re-sent changes and new ones; a run crashes between its job and its table commit, the
    # next run settles it.
    use_topic(fenv, stream.topic)
    transactions(source, rng, 25)
    stream.caught_up()
    monkeypatch.setenv(FAULTS_ENV, "iceberg.before_commit")
    with pytest.raises(InjectedFault):
        fenv.run()
    monkeypatch.delenv(FAULTS_ENV)
    fenv.run()
    assert_table_is_the_source(fenv, source)
    assert_the_stream_had_every_kind_of_change(kafka, stream.topic)


def assert_the_stream_had_every_kind_of_change(kafka: KafkaTestCluster, topic: str) -> None:
    """What the connector sent covers the test's cases: a snapshot, inserts, updates, deletes, primary-key changes
    (a delete and a create at one LSN), transactions of several changes, changes in every partition."""
    changes = [d for d in read_topic(kafka, topic) if d]
    ops = {d["op"] for d in changes}
    assert ops == {"r", "c", "u", "d"}, ops
    at = [(d["source"]["lsn"], d["op"]) for d in changes]
    assert any((lsn, "c") in at for lsn, op in at if op == "d"), "no primary-key change"
    per_transaction = Counter(d["source"]["txId"] for d in changes if d["op"] != "r")
    assert max(per_transaction.values()) > 1, "no transaction of several changes"
    assert all(end > 0 for end in end_offsets(kafka, topic).values()), "a partition got no change"


def test_a_key_deleted_before_a_worker_restart_stays_deleted_when_its_re_sent_insert_is_read_alone(
    lab: Lab, kafka: KafkaTestCluster, fenv: FaultEnv
) -> None:
    """Key 100 is inserted and deleted, then every partition gets later changes, and a run loads them all (the
    delete's marker may go: every partition's clock is past it). The worker is killed before it flushed those
    offsets and restarted: it sends them all again. A run that reads one record a partition reads the re-sent insert
    of 100 without its delete; the insert is older than the delete, and the key must stay deleted."""
    source = lab.source
    source.conn.execute("CREATE SCHEMA resend")
    source.conn.execute("SET search_path TO resend")
    source.conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, qty int)")
    source.conn.execute("CREATE TABLE marks (id int PRIMARY KEY)")
    source.conn.execute("INSERT INTO items SELECT i, 'n' || i, i FROM generate_series(1, 12) AS i")
    stream = Stream(kafka, lab, schema="resend")
    stream.start()
    use_topic(fenv, stream.topic)
    stream.caught_up()
    lab.worker.restart_tasks(stream.prefix)  # the snapshot's offsets flushed; the next flush much later
    offsets, flushed = lab.worker.offsets_file, lab.worker.offsets_file.stat().st_mtime_ns
    source.conn.execute("INSERT INTO items VALUES (100, 'gone', 0)")
    source.conn.execute("DELETE FROM items WHERE id = 100")
    source.conn.execute("UPDATE items SET qty = qty + 1")  # later changes in every partition
    stream.caught_up()
    assert all(end > 0 for end in end_offsets(kafka, stream.topic).values()), "a partition got no change"
    fenv.run()
    assert_table_is_the_source(fenv, source)
    lab.worker.kill()
    assert offsets.stat().st_mtime_ns == flushed, "the worker flushed its offsets: nothing re-sent"
    lab.worker = connect.restart(lab.worker)
    stream.start()
    stream.caught_up()
    assert duplicates(kafka, stream.topic) > 0, "the restarted worker sent nothing again"
    use_topic(fenv, stream.topic, max_records_per_partition=1)
    fenv.run()
    assert_table_is_the_source(fenv, source)
