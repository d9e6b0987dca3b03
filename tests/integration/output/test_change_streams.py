"""Change streams into keyed Iceberg tables on the real cluster: the table equals an independent fold of Kafka.

A Debezium-shaped JSON topic (inserts, updates, deletes, repeated keys within and across
plans, tombstones, an unknown ``op``, a column added to ``after``) and a compacted topic of
latest-state records with tombstones are loaded with ``iceberg.mode: upsert``; after every
run the table's rows equal :func:`fold`, written here from the ``read_committed`` scan of the
topic and nothing of Tidemark's: the last change per key in production order (every record
carries an increasing timestamp, and each key stays in one partition, so that is its offset
order), deletes removed. Then a crash right after the table commit, a rerun of a published
plan's job and commit, and a replay of an old window: the table does not change, and the
replay reports every change it read as stale.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.faults.harness import FaultEnv
from tidemark.errors import PlanningError
from tidemark.faults import InjectedFault
from tidemark.kafka.admin import Record
from tidemark.kafka.registry import ENV_URL as REGISTRY_ENV_URL
from tidemark.output.deadletters import dead_letters
from tidemark.runs.pipeline import commit_run, plan_run

pytestmark = [pytest.mark.integration, pytest.mark.spark]

AFTER = "id long, name string, qty long"
AFTER_WIDER = "id long, name string, qty long, email string"  # the schema change: a column added to 'after'
# ms: every record gets T0 + its sequence number (seconds), so production order is plain; an hour ago, well inside
# the topics' retention (older timestamps would be deleted at once)
T0 = (int(time.time()) - 3600) * 1000


def debezium_ddl(after: str) -> str:
    return (
        f"before struct<{after}>, after struct<{after}>, op string, source struct<ts_ms: long, lsn: long>, ts_ms long"
    )


class Changes:
    """Debezium-shaped records: each key in partition ``id % 3``, every record one second after the last."""

    def __init__(self, fenv: FaultEnv) -> None:
        self.fenv, self.seq = fenv, 0
        self.state: dict[int, dict[str, Any]] = {}  # what the producer's "database" holds: the 'before' images

    def _record(self, key: int, value: dict[str, Any] | None) -> Record:
        self.seq += 1
        body = None if value is None else json.dumps(value).encode()
        return Record(value=body, key=str(key).encode(), partition=key % 3, timestamp_ms=T0 + self.seq * 1000)

    def change(self, op: str, key: int, **row: Any) -> Record:
        before = self.state.get(key)
        after = None if op == "d" else {"id": key, **row}
        if op == "d":
            self.state.pop(key, None)
        elif after is not None:
            self.state[key] = after
        source = {"ts_ms": T0 + self.seq, "lsn": 1000 + self.seq}
        return self._record(key, {"before": before, "after": after, "op": op, "source": source, "ts_ms": T0})

    def tombstone(self, key: int) -> Record:
        return self._record(key, None)

    def produce(self, records: list[Record]) -> None:
        self.fenv.kafka.produce(self.fenv.topic, records)


def keyed_scan(fenv: FaultEnv) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(partition, offset, key, value) of every record below the group's committed offsets, as a read_committed
    consumer of the test's own reads them."""
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    ends = {p: c or 0 for p, c in fenv.committed().items()}
    consumer = Consumer(fenv.kafka.connection.client_config(**{
        "group.id": f"fold-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False, "isolation.level": "read_committed",
    }))  # fmt: skip
    found = []
    try:
        consumer.assign([TopicPartition(fenv.topic, p, 0) for p, end in ends.items() if end])
        deadline = time.monotonic() + 60
        while any(consumer.position([TopicPartition(fenv.topic, p)])[0].offset < end
                  for p, end in ends.items() if end):  # fmt: skip
            assert time.monotonic() < deadline, "the scan did not reach the committed offsets"
            for msg in consumer.consume(500, 1.0):
                if not msg.error() and msg.offset() < ends[msg.partition()]:
                    found.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    return sorted(found, key=lambda r: (r[0], r[1]))


def fold(fenv: FaultEnv, columns: list[str]) -> dict[int, dict[str, Any]]:
    """The table a Debezium stream describes, from the read_committed scan alone: each partition's events in offset
    order (a key stays in one partition); an unknown op is skipped (the feed quarantines it), a tombstone follows
    its delete and changes nothing."""
    state: dict[int, dict[str, Any]] = {}
    for _, _, _, value in keyed_scan(fenv):
        doc = json.loads(value) if value is not None else None
        if doc is None:
            continue
        if doc["op"] in ("c", "u", "r"):
            state[doc["after"]["id"]] = {c: doc["after"].get(c) for c in columns}
        elif doc["op"] == "d":
            state.pop(doc["before"]["id"], None)
    return state


def state_fold(fenv: FaultEnv, columns: list[str]) -> dict[str, dict[str, Any]]:
    """The table a compacted topic of latest states describes: the last value per Kafka key; a tombstone deletes."""
    last: dict[str, dict[str, Any] | None] = {}
    for _, _, key, value in keyed_scan(fenv):
        assert key is not None
        last[key.decode()] = None if value is None else json.loads(value)
    return {k: {c: v.get(c) for c in columns} for k, v in last.items() if v is not None}


def table_rows(fenv: FaultEnv, columns: list[str], key: str = "id") -> dict[Any, dict[str, Any]]:
    from tidemark.config.models import load_feed
    from tidemark.output import publisher_for

    table = publisher_for(load_feed(fenv.feed)).load()  # type: ignore[attr-defined]
    assert table is not None
    rows = table.scan().to_arrow().to_pylist()
    keys = [r[key] for r in rows]
    assert len(keys) == len(set(keys)), f"a key has more than one row: {sorted(keys)}"
    return {r[key]: {c: r.get(c) for c in columns} for r in rows}


def assert_table_is_the_fold(fenv: FaultEnv, columns: list[str]) -> None:
    expected = fold(fenv, columns)
    got = table_rows(fenv, columns)
    assert got == expected, f"table {sorted(got.items())[:6]} != fold {sorted(expected.items())[:6]}"


def use_debezium(fenv: FaultEnv, after: str) -> None:
    fenv.iceberg = "tidemark.cdc"
    fenv.write_feed(
        deserialization={"format": "json", "schema_ddl": debezium_ddl(after)},
        output_format="iceberg",
        iceberg={"table": "tidemark.cdc", "mode": "upsert", "key": ["id"], "change_format": "debezium",
                 "change_columns": ["op", "source_ts_ms"]},
        validation={"on_bad_records": "quarantine", "quarantine_max_ratio": 0.5},
    )  # fmt: skip


@pytest.fixture
def fenv(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultEnv:
    env = FaultEnv(kafka, spark, tmp_path, "changes")
    env.install(monkeypatch)
    return env


def job_outside_any_run(fenv: FaultEnv, handle: Any) -> dict[str, Any]:
    """The Spark job of ``handle``'s plan, published to the feed's table, with no run around it: the table commit is
    made at once."""
    from tidemark.config.models import load_feed
    from tidemark.job.result import JobResult
    from tidemark.job.steps import run

    plan = replace(handle.plan(), output=None)
    result = JobResult(plan.plan_id, plan.feed)
    run(fenv.spark, plan, load_feed(plan.feed), fenv.kafka.connection, Path(handle.run_dir), result=result)
    return result.to_dict()


def test_a_debezium_stream_folds_into_the_table_through_crashes_reruns_and_replays(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_debezium(fenv, AFTER)
    columns = ["id", "name", "qty"]
    cdc = Changes(fenv)
    # Plan 1: inserts, updates of the same keys in the plan, a delete with its tombstone, an unknown op.
    first = [cdc.change("c", k, name=f"n{k}", qty=k) for k in range(9)]
    first += [cdc.change("u", k, name=f"n{k}-2", qty=k * 10) for k in (1, 2, 5)]
    first += [cdc.change("u", 2, name="n2-3", qty=22), cdc.change("d", 4), cdc.tombstone(4)]
    bad = cdc._record(99, {"before": None, "after": {"id": 99, "name": "x", "qty": 0}, "op": "t",
                           "source": {"ts_ms": T0}, "ts_ms": T0})  # fmt: skip
    cdc.produce([*first, bad])
    handle, job, outcome = fenv.run()
    assert outcome.committed and job["records_quarantined"] == 1
    assert_table_is_the_fold(fenv, columns)
    [event] = fenv.report_events("changes_applied")
    assert event["details"]["superseded"] == 5 and event["details"]["stale"] == 0, event

    # Plan 2: updates across plans, a delete, a key deleted then created again, a tombstone, an insert.
    cdc.produce([cdc.change("u", 0, name="n0-2", qty=1), cdc.change("d", 1), cdc.tombstone(1),
                 cdc.change("c", 4, name="n4-again", qty=44), cdc.change("u", 0, name="n0-3", qty=2),
                 cdc.change("c", 9, name="n9", qty=9)])  # fmt: skip
    fenv.run()
    assert_table_is_the_fold(fenv, columns)

    # Plan 3: 'after' gains a column (the feed's DDL with it): the table's schema evolves in the same commit.
    use_debezium(fenv, AFTER_WIDER)
    columns = ["id", "name", "qty", "email"]
    cdc.produce([cdc.change("u", 3, name="n3-2", qty=3, email="a@x"), cdc.change("c", 10, name="n10", qty=1,
                                                                                  email="b@x")])  # fmt: skip
    fenv.run()
    assert_table_is_the_fold(fenv, columns)

    # Plan 4 crashes right after its table commit, before the run ledger records it shown.
    cdc.produce([cdc.change("u", 5, name="n5-3", qty=5), cdc.change("d", 6), cdc.change("u", 7, name="n7-2", qty=7)])
    crashed = fenv.crash_after_table_commit(monkeypatch)
    assert_table_is_the_fold(fenv, columns)
    before = table_rows(fenv, columns)
    # The next run finishes the crashed one (found in the ledger: not applied again), then reads nothing new.
    nxt, _, _ = fenv.run()
    assert nxt.resumed == crashed.plan_id
    assert table_rows(fenv, columns) == before
    assert_table_is_the_fold(fenv, columns)

    # A rerun of a published plan's job and commit (a cleared DAG run): nothing read, nothing applied.
    from tidemark.config.models import load_feed
    from tidemark.output import publisher_for

    table = publisher_for(load_feed(fenv.feed)).load()  # type: ignore[attr-defined]
    snapshot = table.current_snapshot().snapshot_id
    assert fenv.in_process(handle, fenv.kafka.connection)["reused"] is True
    commit_run(handle, fenv.kafka.connection, root=fenv.root)
    assert table.refresh().current_snapshot().snapshot_id == snapshot
    assert_table_is_the_fold(fenv, columns)

    # A replay of an old window: a committing one that would move the group back is refused when it is planned;
    # one that does not commit publishes beside the table. If the old window still reaches the table (here: its
    # plan's job, outside any run, publishing to the feed's table), every change is older than what the table
    # holds: none is applied, each is counted stale.
    params = {"start_from": "earliest", "end_at": "offset", "end_offset": 4, "commit": True}
    with pytest.raises(PlanningError, match="would move the group back"):
        plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root, mode="replay", params=params)
    once = {**params, "commit": False}
    replay = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root, mode="replay", params=once)
    assert replay.plan().output and replay.plan_id != handle.plan_id
    result = job_outside_any_run(fenv, replay)
    counts = result["manifest"]["extra"]["changes"]
    good = result["records_published"]
    assert counts["stale"] == good and counts["upserts"] == 0 and counts["deletes"] == 0, counts
    assert table_rows(fenv, columns) == before
    assert_table_is_the_fold(fenv, columns)


def test_a_compacted_topic_of_latest_states_loads_as_its_fold(fenv: FaultEnv) -> None:
    """``change_format: state`` keyed by the Kafka key: a tombstone deletes; on a cleanup.policy=compact topic."""
    topic = fenv.kafka.new_topic(partitions=3, config={"cleanup.policy": "compact"}, prefix="compact")
    fenv.topic = topic
    fenv.iceberg = "tidemark.states"
    fenv.write_feed(
        deserialization={"format": "json", "fields": [{"name": "name", "type": "string", "required": False},
                                                      {"name": "qty", "type": "integer", "required": False}]},
        output_format="iceberg",
        iceberg={"table": "tidemark.states", "mode": "upsert", "key": "key", "change_format": "state"},
        validation={"on_bad_records": "quarantine", "quarantine_max_ratio": 0.5},
    )  # fmt: skip
    seq = iter(range(1, 1000))

    def state(key: str, value: Mapping[str, Any] | None) -> Record:
        body = None if value is None else json.dumps(value).encode()
        return Record(value=body, key=key.encode(), partition=int(key[1:]) % 3, timestamp_ms=T0 + next(seq) * 1000)

    fenv.kafka.produce(topic, [
        *(state(f"k{i}", {"name": f"s{i}", "qty": i}) for i in range(8)),
        state("k1", {"name": "s1-2", "qty": 11}), state("k2", None), state("k3", {"qty": 33}),
    ])  # fmt: skip
    fenv.run()
    assert table_rows(fenv, ["name", "qty"], key="key") == state_fold(fenv, ["name", "qty"])
    fenv.kafka.produce(topic, [
        state("k2", {"name": "back", "qty": 2}), state("k1", None), state("k5", {"name": "s5-2"}),
        state("k9", {"name": "s9", "qty": 9}),
    ])  # fmt: skip
    fenv.run()
    assert table_rows(fenv, ["name", "qty"], key="key") == state_fold(fenv, ["name", "qty"])


CRASH_POINTS = (
    "job.after_publish",
    "commit.before",
    "commit.after_kafka",
    "iceberg.before_commit",
    "commit.before_show",
)


def test_a_crash_at_each_step_of_a_run_leaves_the_table_equal_to_the_fold_once_the_next_run_settles(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidemark.faults import FAULTS_ENV

    use_debezium(fenv, AFTER)
    columns = ["id", "name", "qty"]
    cdc = Changes(fenv)
    cdc.produce([cdc.change("c", k, name=f"n{k}", qty=k) for k in range(6)])
    fenv.run()
    for round_no, point in enumerate(CRASH_POINTS):
        gone = round_no % 6
        cdc.produce([
            cdc.change("u", (round_no + 1) % 6, name=f"r{round_no}", qty=round_no),
            cdc.change("d", gone) if gone in cdc.state else cdc.change("c", gone, name=f"back{round_no}", qty=0),
            cdc.change("u", (round_no + 3) % 6, name=f"r{round_no}-b", qty=-round_no)
            if (round_no + 3) % 6 in cdc.state else cdc.change("c", (round_no + 3) % 6, name="new", qty=1),
        ])  # fmt: skip
        monkeypatch.setenv(FAULTS_ENV, point)
        with pytest.raises(InjectedFault):
            fenv.run()
        monkeypatch.delenv(FAULTS_ENV)
        fenv.run()  # settles the crashed run first, then reads what is new (nothing)
        assert_table_is_the_fold(fenv, columns)
    stale = sum(e["details"]["stale"] for e in fenv.report_events("changes_applied"))
    assert stale == 0, "no plan was applied twice"


def _envelope(value_fields: list[dict[str, Any]]) -> dict[str, Any]:
    value = {"type": "record", "name": "Value", "fields": value_fields}
    lsn = {"name": "lsn", "type": ["null", "long"], "default": None}
    source = {"type": "record", "name": "Source", "fields": [{"name": "ts_ms", "type": "long"}, lsn]}
    return {"type": "record", "name": "Envelope", "namespace": "dbserver1.inventory.customers", "fields": [
        {"name": "before", "type": ["null", value], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": source}, {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ]}  # fmt: skip


VALUE_V1 = [{"name": "id", "type": "long"}, {"name": "name", "type": ["null", "string"], "default": None},
            {"name": "qty", "type": ["null", "long"], "default": None}]  # fmt: skip
VALUE_V2 = [*VALUE_V1, {"name": "email", "type": ["null", "string"], "default": None}]


def test_a_debezium_avro_stream_through_the_registry_folds_into_the_table_and_takes_a_new_after_field(
    fenv: FaultEnv, registry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The envelope in Avro (Confluent's serializer, the registry's topic-name subject), a field added to 'after'
    by a second schema version: the table equals a fold of the scan decoded with fastavro, not with Tidemark."""
    import io

    import fastavro
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    fenv.iceberg = "tidemark.cdc_avro"
    fenv.write_feed(
        deserialization={"format": "avro"}, output_format="iceberg",
        iceberg={"table": "tidemark.cdc_avro", "mode": "upsert", "key": "id", "change_format": "debezium",
                 "change_columns": ["op", "source_ts_ms"]},
        validation={"on_bad_records": "quarantine", "quarantine_max_ratio": 0.5},
    )  # fmt: skip
    monkeypatch.setenv(REGISTRY_ENV_URL, registry)
    client = SchemaRegistryClient({"url": registry})
    context = SerializationContext(fenv.topic, MessageField.VALUE)
    seq = iter(range(1, 1000))

    def change(schema: dict[str, Any], op: str, key: int, before: Any, after: Any) -> Record:
        serializer = AvroSerializer(client, json.dumps(schema), conf={"auto.register.schemas": True})
        body = serializer({"before": before, "after": after, "op": op, "source": {"ts_ms": T0, "lsn": None},
                           "ts_ms": T0}, context)  # fmt: skip
        return Record(value=bytes(body), key=str(key).encode(), partition=key % 3, timestamp_ms=T0 + next(seq) * 1000)

    def fold_avro(columns: list[str]) -> dict[int, dict[str, Any]]:
        state: dict[int, dict[str, Any]] = {}
        for _, _, _, value in keyed_scan(fenv):
            assert value is not None
            writer = client.get_schema(int.from_bytes(value[1:5], "big"))
            doc = fastavro.schemaless_reader(
                io.BytesIO(value[5:]), fastavro.parse_schema(json.loads(writer.schema_str))
            )
            assert isinstance(doc, dict)
            if doc["op"] in ("c", "u", "r"):
                state[doc["after"]["id"]] = {c: doc["after"].get(c) for c in columns}
            elif doc["op"] == "d":
                state.pop(doc["before"]["id"], None)
        return state

    v1 = _envelope(VALUE_V1)
    row = {k: {"id": k, "name": f"n{k}", "qty": k} for k in range(6)}
    fenv.kafka.produce(fenv.topic, [
        *(change(v1, "r", k, None, row[k]) for k in range(6)),  # a snapshot's reads
        change(v1, "u", 1, row[1], {"id": 1, "name": "n1-2", "qty": 10}),
        change(v1, "d", 2, row[2], None), change(v1, "u", 1, None, {"id": 1, "name": "n1-3", "qty": 11}),
    ])  # fmt: skip
    fenv.run()
    assert table_rows(fenv, ["id", "name", "qty"]) == fold_avro(["id", "name", "qty"])
    v2 = _envelope(VALUE_V2)
    fenv.kafka.produce(fenv.topic, [
        change(v2, "u", 3, None, {"id": 3, "name": "n3-2", "qty": 3, "email": "a@x"}),
        change(v2, "c", 2, None, {"id": 2, "name": "n2-again", "qty": 2, "email": None}),
        change(v2, "d", 4, {"id": 4, "name": None, "qty": None, "email": None}, None),
    ])  # fmt: skip
    fenv.run()
    columns = ["id", "name", "qty", "email"]
    assert table_rows(fenv, columns) == fold_avro(columns)


STATE_V1 = [{"name": "name", "type": "string"}, {"name": "qty", "type": ["null", "long"], "default": None}]


@pytest.mark.parametrize("staged_by", ["read_tasks", "spark"])
def test_an_avro_state_feed_through_the_registry_deletes_by_its_tombstones(
    fenv: FaultEnv, registry: str, monkeypatch: pytest.MonkeyPatch, staged_by: str
) -> None:
    """``change_format: state`` with Avro values keyed by the Kafka key: a null value (a tombstone) deletes its key,
    staged by the read tasks themselves or by Spark's ``from_avro``; the table equals a fold of the scan."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    fenv.iceberg = "tidemark.states_avro"
    fenv.write_feed(
        deserialization={"format": "avro"}, output_format="iceberg",
        # 0: the data source reads every plan, so the read tasks may stage it (a small plan is read by the driver)
        driver_read_max_records=0 if staged_by == "read_tasks" else 250_000,
        iceberg={"table": "tidemark.states_avro", "mode": "upsert", "key": "key", "change_format": "state"},
        validation={"on_bad_records": "quarantine", "quarantine_max_ratio": 0.5},
    )  # fmt: skip
    monkeypatch.setenv(REGISTRY_ENV_URL, registry)
    client = SchemaRegistryClient({"url": registry})
    schema = {"type": "record", "name": "State", "namespace": "tidemark.test", "fields": STATE_V1}
    serializer = AvroSerializer(client, json.dumps(schema), conf={"auto.register.schemas": True})
    context = SerializationContext(fenv.topic, MessageField.VALUE)
    seq = iter(range(1, 1000))

    def state(key: str, value: Mapping[str, Any] | None) -> Record:
        body = None if value is None else bytes(serializer(dict(value), context))
        return Record(value=body, key=key.encode(), partition=int(key[1:]) % 3, timestamp_ms=T0 + next(seq) * 1000)

    def avro_fold() -> dict[str, dict[str, Any]]:
        """The last value per Kafka key of the scan, decoded with fastavro; a tombstone deletes."""
        import io

        import fastavro

        parsed = fastavro.parse_schema(schema)
        last: dict[str, dict[str, Any] | None] = {}
        for _, _, key, value in keyed_scan(fenv):
            assert key is not None
            doc = None if value is None else fastavro.schemaless_reader(io.BytesIO(value[5:]), parsed)
            last[key.decode()] = None if doc is None else dict(doc)  # type: ignore[arg-type]
        return {k: {c: v.get(c) for c in ("name", "qty")} for k, v in last.items() if v is not None}

    fenv.kafka.produce(fenv.topic, [
        *(state(f"k{i}", {"name": f"s{i}", "qty": i}) for i in range(8)),
        state("k1", {"name": "s1-2", "qty": 11}), state("k2", None), state("k3", {"name": "s3-2", "qty": None}),
        state("k6", None),
    ])  # fmt: skip
    _, job, _ = fenv.run()
    assert job["records_quarantined"] == 0 and job["staged_by"] == staged_by, job
    assert table_rows(fenv, ["name", "qty"], key="key") == avro_fold()
    assert set(avro_fold()) == {"k0", "k1", "k3", "k4", "k5", "k7"}
    fenv.kafka.produce(fenv.topic, [
        state("k2", {"name": "back", "qty": 2}), state("k1", None), state("k5", {"name": "s5-2", "qty": 5}),
        state("k9", {"name": "s9", "qty": 9}), state("k4", None),
    ])  # fmt: skip
    _, job, _ = fenv.run()
    assert job["records_quarantined"] == 0 and job["staged_by"] == staged_by, job
    assert table_rows(fenv, ["name", "qty"], key="key") == avro_fold()
    assert dead_letters(fenv.feed) == []


def test_a_debezium_avro_tombstone_after_its_delete_is_no_dead_letter(
    fenv: FaultEnv, registry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Debezium writes a tombstone (a null value) after each delete, for compaction: in an Avro feed keyed by a
    column of 'after' it changes nothing and is not quarantined."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    fenv.iceberg = "tidemark.cdc_avro_tombstones"
    fenv.write_feed(
        deserialization={"format": "avro"}, output_format="iceberg",
        iceberg={"table": "tidemark.cdc_avro_tombstones", "mode": "upsert", "key": "id", "change_format": "debezium"},
        validation={"on_bad_records": "quarantine", "quarantine_max_ratio": 0.5},
    )  # fmt: skip
    monkeypatch.setenv(REGISTRY_ENV_URL, registry)
    client = SchemaRegistryClient({"url": registry})
    serializer = AvroSerializer(client, json.dumps(_envelope(VALUE_V1)), conf={"auto.register.schemas": True})
    context = SerializationContext(fenv.topic, MessageField.VALUE)
    seq = iter(range(1, 1000))

    def change(op: str | None, key: int, before: Any = None, after: Any = None) -> Record:
        doc = {"before": before, "after": after, "op": op, "source": {"ts_ms": T0, "lsn": None}, "ts_ms": T0}
        body = None if op is None else bytes(serializer(doc, context))
        return Record(value=body, key=str(key).encode(), partition=key % 3, timestamp_ms=T0 + next(seq) * 1000)

    row = {k: {"id": k, "name": f"n{k}", "qty": k} for k in range(4)}
    fenv.kafka.produce(fenv.topic, [
        *(change("c", k, after=row[k]) for k in range(4)),
        change("d", 1, before=row[1]), change(None, 1), change("d", 3, before=row[3]), change(None, 3),
    ])  # fmt: skip
    _, job, _ = fenv.run()
    assert job["records_quarantined"] == 0, job
    assert dead_letters(fenv.feed) == []
    assert table_rows(fenv, ["id", "name", "qty"]) == {0: row[0], 2: row[2]}
    [event] = fenv.report_events("changes_applied")
    assert event["details"]["ignored_tombstones"] == 2, event


def test_a_debezium_change_without_its_keys_value_is_a_dead_letter_naming_the_key(fenv: FaultEnv) -> None:
    """A c/u/r change whose 'after' lacks the key's value (or is null), and a d whose 'before' does, cannot be
    applied: each is quarantined with a reason code naming the key, and reaches the feed's dead letters."""
    use_debezium(fenv, AFTER)
    cdc = Changes(fenv)
    good = [cdc.change("c", k, name=f"n{k}", qty=k) for k in range(4)]

    def envelope(key: int, op: str, before: Any, after: Any) -> Record:
        return cdc._record(key, {"before": before, "after": after, "op": op, "source": {"ts_ms": T0}, "ts_ms": T0})

    unkeyed = [
        envelope(5, "c", None, {"id": None, "name": "no id", "qty": 1}),
        envelope(6, "u", None, None),
        envelope(1, "d", None, None),
        envelope(2, "d", {"id": None, "name": "n2", "qty": 2}, None),
    ]
    cdc.produce([*good, *unkeyed, cdc.change("u", 3, name="n3-2", qty=33)])
    _, job, outcome = fenv.run()
    assert outcome.committed and job["records_quarantined"] == 4, job
    letters = dead_letters(fenv.feed)
    assert sorted((d.partition, d.offset) for d in letters) == sorted(
        (r.partition, offset) for r, offset in _offsets_of(fenv, unkeyed)
    )
    assert {d.reason_codes for d in letters} == {("change_without_key(id)",)}, letters
    assert {d.reason for d in letters} == {"change_without_key(id)"}
    assert table_rows(fenv, ["id", "name", "qty"]) == {
        0: {"id": 0, "name": "n0", "qty": 0}, 1: {"id": 1, "name": "n1", "qty": 1},
        2: {"id": 2, "name": "n2", "qty": 2}, 3: {"id": 3, "name": "n3-2", "qty": 33},
    }  # fmt: skip
    [event] = fenv.report_events("changes_applied")
    assert event["details"]["changes"] == 5, event


def _offsets_of(fenv: FaultEnv, records: list[Record]) -> list[tuple[Record, int]]:
    """Where each of ``records`` (values unique) landed in the topic, from the scan."""
    where = {value: offset for _, offset, _, value in keyed_scan(fenv)}
    return [(r, where[r.value]) for r in records]


def test_a_debezium_change_without_op_is_a_dead_letter_before_the_commit_not_a_stuck_merge(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Debezium change whose ``op`` is null but which carries an image (no tombstone) cannot be applied. GX's
    ``be_in_set`` passes a null, so it is Tidemark's own rule that quarantines it, in the job, before the group's
    commit: the run commits, the change is a dead letter naming its reason, and the table equals the fold of the
    scan (which skips it). The next run is not stuck."""
    use_debezium(fenv, AFTER)
    columns = ["id", "name", "qty"]
    cdc = Changes(fenv)
    good = [cdc.change("c", k, name=f"n{k}", qty=k) for k in range(4)]

    def envelope(key: int, op: Any, before: Any, after: Any) -> Record:
        return cdc._record(key, {"before": before, "after": after, "op": op, "source": {"ts_ms": T0}, "ts_ms": T0})

    opless = [
        envelope(7, None, None, {"id": 7, "name": "no op", "qty": 7}),
        envelope(1, None, {"id": 1, "name": "n1", "qty": 1}, None),
    ]
    cdc.produce([*good, *opless, cdc.change("u", 2, name="n2-2", qty=22)])
    _, job, outcome = fenv.run()
    assert outcome.committed and job["records_quarantined"] == 2, job
    letters = dead_letters(fenv.feed)
    assert sorted((d.partition, d.offset) for d in letters) == sorted(
        (r.partition, offset) for r, offset in _offsets_of(fenv, opless)
    )
    assert {d.reason_codes for d in letters} == {("change_without_op",)}, letters
    assert_table_is_the_fold(fenv, columns)
    cdc.produce([cdc.change("u", 3, name="n3-2", qty=33)])
    _, _, outcome = fenv.run()
    assert outcome.committed
    assert_table_is_the_fold(fenv, columns)

    # A plan staged without those checks (as an older Tidemark's job did) fails in the merge after the group's
    # commit; the error says so, and that the table is unchanged.
    from tidemark.output.changes import ChangesPublisher
    from tidemark.validation import rules

    before, was = table_rows(fenv, columns), fenv.committed()
    monkeypatch.setattr(rules, "change_rules", lambda feed, columns: [])
    cdc.produce([envelope(8, None, None, {"id": 8, "name": "no op", "qty": 8}), cdc.change("u", 0, name="x", qty=0)])
    # Without the rules, the job's own check of the staged changes still fails the run before the commit.
    with pytest.raises(Exception, match=r"offset \d+: change_without_op.*nothing was committed"):
        fenv.run()
    assert fenv.committed() == was and table_rows(fenv, columns) == before
    monkeypatch.setattr(ChangesPublisher, "check_staged", lambda self, plan_id, paths: None)
    with pytest.raises(Exception, match=r"offset \d+: change_without_op\. The table is unchanged .*ARE committed"):
        fenv.run()
    assert table_rows(fenv, columns) == before
    assert sum(c or 0 for c in fenv.committed().values()) == sum(c or 0 for c in was.values()) + 2  # as it says


def test_a_recreated_topics_changes_apply_over_the_old_topics_rows(fenv: FaultEnv) -> None:
    """The topic is deleted and created again under the same name: its offsets start at 0 again, below those of the
    rows the old topic left. Its updates and tombstones still apply (the rows' topic id is not the plan's), with a
    ``topic_recreated`` event of the merge; the table equals the fold of the old topic's scan, then the new one's."""
    from tests.integration.runs.test_topic_identity import recreate

    fenv.iceberg = "tidemark.recreated"
    fenv.write_feed(
        deserialization={"format": "json", "fields": [{"name": "name", "type": "string", "required": False},
                                                      {"name": "qty", "type": "integer", "required": False}]},
        output_format="iceberg",
        iceberg={"table": "tidemark.recreated", "mode": "upsert", "key": "key", "change_format": "state"},
        validation={"on_bad_records": "quarantine", "quarantine_max_ratio": 0.5},
    )  # fmt: skip
    seq = iter(range(1, 1000))

    def state(key: str, value: Mapping[str, Any] | None) -> Record:
        body = None if value is None else json.dumps(value).encode()
        return Record(value=body, key=key.encode(), partition=int(key[1:]) % 3, timestamp_ms=T0 + next(seq) * 1000)

    # Each key's partition holds a few updates, so the old rows sit at offsets the new topic starts below.
    fenv.kafka.produce(
        fenv.topic, [state(f"k{i}", {"name": f"s{i}-{n}", "qty": n}) for n in range(4) for i in range(6)]
    )
    fenv.run()
    old = state_fold(fenv, ["name", "qty"])
    assert table_rows(fenv, ["name", "qty"], key="key") == old
    rows = {r["key"]: r for r in fenv.iceberg_table().scan().to_arrow().to_pylist()}
    assert {r["_kafka_offset"] for r in rows.values()} >= {6, 7}

    recreate(fenv)
    fenv.kafka.produce(
        fenv.topic,
        [
            state("k1", {"name": "new-k1", "qty": 1}),
            state("k2", None),
            state("k3", {"name": "new-k3", "qty": 3}),
            state("k6", {"name": "s6", "qty": 6}),
        ],
    )
    _, _, outcome = fenv.run()
    assert outcome.committed
    expected = {**old, **state_fold(fenv, ["name", "qty"])}
    del expected["k2"]
    assert table_rows(fenv, ["name", "qty"], key="key") == expected
    [changes] = fenv.report_events("changes_applied")[-1:]
    assert changes["details"]["stale"] == 0, changes
    merged = [e for e in fenv.report_events("topic_recreated") if e.get("details", {}).get("table")]
    assert len(merged) == 1 and merged[0]["details"]["replaced"] == 3, merged


def test_a_key_deleted_in_one_partition_does_not_come_back_by_an_older_change_from_another(fenv: FaultEnv) -> None:
    """Debezium changes are ordered by their source position (here PostgreSQL's LSN), not by Kafka's timestamps: a
    key created and deleted in partition 0 by one run stays deleted when the next run reads an older change of it
    (a lower LSN) from partition 1 that carries a newer Kafka timestamp. No per-run cap is involved. The table
    equals the fold of the scan by LSN, and the late change is counted stale."""
    use_debezium(fenv, AFTER)
    columns = ["id", "name", "qty"]
    seq = iter(range(1, 1000))

    def change(partition: int, lsn: int, op: str, key: int, **row: Any) -> Record:
        image = {"id": key, "name": None, "qty": None, **row}
        doc = {"before": image if op == "d" else None, "after": None if op == "d" else image, "op": op,
               "source": {"ts_ms": T0, "lsn": lsn}, "ts_ms": T0}  # fmt: skip
        return Record(value=json.dumps(doc).encode(), key=str(key).encode(), partition=partition,
                      timestamp_ms=T0 + next(seq) * 1000)  # fmt: skip

    def fold_by_lsn() -> dict[int, dict[str, Any]]:
        docs = sorted((json.loads(v) for _, _, _, v in keyed_scan(fenv) if v is not None),
                      key=lambda d: d["source"]["lsn"])  # fmt: skip
        state: dict[int, dict[str, Any]] = {}
        for doc in docs:
            if doc["op"] == "d":
                state.pop(doc["before"]["id"], None)
            else:
                state[doc["after"]["id"]] = {c: doc["after"].get(c) for c in columns}
        return state

    fenv.kafka.produce(fenv.topic, [change(0, 100, "c", 5, name="five", qty=5), change(2, 110, "c", 6, name="six"),
                                    change(0, 300, "d", 5), change(2, 310, "u", 6, name="six-2")])  # fmt: skip
    fenv.run()
    assert table_rows(fenv, columns) == fold_by_lsn() == {6: {"id": 6, "name": "six-2", "qty": None}}
    # Read later, from another partition, with a newer Kafka timestamp: an update of 5 made before its delete.
    fenv.kafka.produce(fenv.topic, [change(1, 200, "u", 5, name="five-2", qty=55), change(1, 400, "c", 7, name="7")])
    fenv.run()
    assert table_rows(fenv, columns) == fold_by_lsn()
    assert 5 not in table_rows(fenv, columns)
    [*_, last] = fenv.report_events("changes_applied")
    assert last["details"]["stale"] == 1 and last["details"]["upserts"] == 1, last
