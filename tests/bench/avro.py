"""Avro benchmark on the local cluster and a real schema registry: ``python -m tests.bench.avro [--quick]``.

One dataset (``--records`` Avro order records over 8 partitions, produced once and then
frozen like ``make bench``'s: the topic name encodes its size and is reused). Values are in
the Schema Registry wire format, serialized by confluent-kafka's own ``AvroSerializer``
through the registry with two versions of a ten-field schema: every partition's first
half is written with v1, its second half with v2 (an added field with a default, and
``customer`` promoted from int to long). The serializer encodes a pool of distinct
records per version (:data:`POOL`) that the producer cycles through: encoding every one
of 5M records in Python would take longer than everything measured here.

A warm-up round plus ``--runs`` measured rounds, each running every runner once, back to
back, one Spark application for all of them:

- A3b Tidemark's Spark read → its ``bytes`` decoding → ``noop``
- A3  Tidemark's Avro read of this topic as the job does it: the read tasks read, decode
      with polars and lay the records out as staged (:mod:`tidemark.spark.arrow_avro`), then
      drop them: A3/A3b is what decoding costs the read
- A3r the same read tasks without decoding: A3/A3r is what decoding costs them alone
- A3s Tidemark's Spark read → Spark's ``from_avro`` (the run's schemas, resolved once
      before the rounds) → ``noop``: the job's decode where the read tasks give way
- A6  Tidemark end to end (``tidemark.job.steps.run`` + commit) of an ``avro`` feed: the
      schema-id scan and registry lookups, read and decode into staged Parquet,
      validation, publish by rename, commit
- A4w Spark's Kafka source with ``from_avro`` per writer schema id (each resolved to the
      reader schema, as Tidemark does) writing the same Parquet layout (``topic``/``date``)

Every A6 and A4w output is checked after its timing: exactly the plan's records, none
quarantined, and the same content (a sum of per-row hashes over partition, offset and
every decoded field) on both sides, else the benchmark fails. The registry is
``TIDEMARK_SCHEMA_REGISTRY_URL`` when set, else a local Apicurio started for the run
(:mod:`tidemark.devtools.registry`). Results go to ``docs/benchmarks/bench-avro-<quick|full|N>.json``
and a bar chart beside it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.bench import charts
from tests.bench.read import (
    PARTITIONS,
    RunnerResult,
    Sample,
    _kafka_df,
    _parquet_layout,
    _timed_spark,
    bench_session,
    frozen_plan,
    frozen_topic,
    local_broker_pids,
    machine_facts,
    median_ratios,
    metrics_folder,
    print_cpu_splits,
    print_ratios,
    produce_numbered,
    read_metrics,
    round_line,
    spark_kafka_jars,
    targets_met,
)
from tidemark.devtools.kafka.cluster import connection_from_env
from tidemark.errors import TidemarkError
from tidemark.kafka.connection import KafkaConnection
from tidemark.kafka.registry import ENV_URL, RegistryConnection
from tidemark.planning.plan import compute_plan_id

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

BENCH_FEED = "tidemark-bench-avro"
POOL = 20_000  # distinct encoded records per schema version
TARGETS = {"A6/A4w": 1.2, "A3/A3b": 0.8}

ORDER_V1: dict[str, Any] = {
    "type": "record", "name": "Order", "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "int"},
        {"name": "sku", "type": "string"},
        {"name": "quantity", "type": "int"},
        {"name": "price", "type": "double"},
        {"name": "currency", "type": "string"},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
        {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "paid", "type": "boolean"},
    ],
}  # fmt: skip
ORDER_V2: dict[str, Any] = {**ORDER_V1, "fields": [
    ORDER_V1["fields"][0], {"name": "customer", "type": "long"}, *ORDER_V1["fields"][2:],
    {"name": "channel", "type": "string", "default": "web"},
]}  # fmt: skip
FIELDS = [f["name"] for f in ORDER_V2["fields"]]


def order(i: int, *, v2: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": i, "customer": 10_000 + i % 5_000, "sku": f"sku-{i % 977:05d}", "quantity": 1 + i % 9,
        "price": round(1.5 + (i % 1000) * 0.37, 2), "currency": ("EUR", "USD", "GBP")[i % 3],
        "status": ("NEW", "PAID", "SHIPPED")[i % 3],
        "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i),
        "note": None if i % 4 else f"note {i}", "paid": i % 2 == 0,
    }  # fmt: skip
    if v2:
        doc["channel"] = ("app", "store")[i % 2]
    return doc


# -- registry and dataset ----------------------------------------------------------------------


@contextmanager
def registry_url(log: Callable[[str], None]) -> Iterator[str]:
    """``TIDEMARK_SCHEMA_REGISTRY_URL``, else a local Apicurio for the benchmark's length."""
    url = os.environ.get(ENV_URL, "").strip()
    if url:
        yield url
        return
    from tidemark.devtools import registry as local_registry

    server = local_registry.start()
    log(f"started a schema registry at {server.url}")
    try:
        yield server.url
    finally:
        server.stop()


@dataclass(frozen=True)
class AvroDataset:
    topic: str
    writer_ids: tuple[int, int]  # v1, v2
    value_bytes: float  # mean encoded value size


def _pools(registry: str, topic: str, size: int) -> tuple[list[bytes], list[bytes]]:
    """``size`` records per schema version, serialized by confluent-kafka through the registry (v1 registered first)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    sr = SchemaRegistryClient({"url": registry})
    ctx = SerializationContext(topic, MessageField.VALUE)
    pools = []
    for schema, v2 in ((ORDER_V1, False), (ORDER_V2, True)):
        ser = AvroSerializer(sr, json.dumps(schema), conf={"auto.register.schemas": True})
        pools.append([ser(order(i, v2=v2), ctx) for i in range(size)])
    return pools[0], pools[1]


def _schema_id(value: bytes) -> int:
    return int.from_bytes(value[1:5], "big")


def ensure_avro_dataset(
    connection: KafkaConnection, registry: str, records: int, log: Callable[[str], None]
) -> AvroDataset:
    """The frozen Avro topic of ``records`` records, its two writer schema ids and its mean value size.

    The registry may be a fresh one (Apicurio's local one keeps schemas in memory): the two
    versions are registered again, and the ids they get must be the ones the topic carries.
    """
    topic = f"tidemark-bench-avro-{records}-v1"
    pool1, pool2 = _pools(registry, topic, min(POOL, records))
    ids = (_schema_id(pool1[0]), _schema_id(pool2[0]))
    half = records // 2
    value_bytes = sum(map(len, pool1)) / len(pool1) * half + sum(map(len, pool2)) / len(pool2) * (records - half)
    if frozen_topic(connection, topic, records):
        found = _ids_on_topic(connection, topic)
        if found != ids:
            raise TidemarkError(
                f"benchmark topic {topic} carries schema ids {found} (v1, v2), but the registry at {registry} "
                f"gave {ids}; delete the topic to produce it again against this registry"
            )
        return AvroDataset(topic, ids, value_bytes / records)
    log(f"producing {records:,} Avro records (schema ids {ids[0]} then {ids[1]} in every partition) to {topic} ...")
    # Record i goes to partition i % 8: the first half of the numbers is the first half of every partition.
    produce_numbered(connection, topic, records, lambda i: pool1[i % len(pool1)] if i < half else pool2[i % len(pool2)],
                     log)  # fmt: skip
    return AvroDataset(topic, ids, value_bytes / records)


def _ids_on_topic(connection: KafkaConnection, topic: str) -> tuple[int, int]:
    """The schema ids of partition 0's first and last records."""
    from confluent_kafka import Consumer, TopicPartition

    from tidemark.kafka.adapter import KafkaAdapter

    (end,) = KafkaAdapter(connection).end_offsets([(topic, 0)], "read_committed").values()
    consumer = Consumer(connection.client_config(**{"group.id": "tidemark-bench-avro-ids",
                                                    "enable.auto.commit": False}))  # fmt: skip
    try:
        found = []
        for offset in (0, end - 1):
            consumer.assign([TopicPartition(topic, 0, offset)])
            msg = consumer.poll(10)
            if msg is None or msg.error():
                raise TidemarkError(f"could not read {topic}[0] offset {offset}: {msg and msg.error()}")
            found.append(_schema_id(msg.value()))
        return found[0], found[1]
    finally:
        consumer.close()


# -- the two sides' outputs ---------------------------------------------------------------------


def content_digest(df: DataFrame, fields: Sequence[str]) -> tuple[int, int]:
    """(rows, sum of a 64-bit hash per row over partition, offset and ``fields``): equal outputs, equal digests."""
    from pyspark.sql import functions as F

    row_hash = F.xxhash64(F.col("partition").cast("int"), F.col("offset").cast("long"), *[F.col(f) for f in fields])
    got = df.select(F.count(F.lit(1)).alias("n"), F.sum(row_hash.cast("decimal(38,0)")).alias("h")).first()
    assert got is not None
    return int(got["n"]), int(got["h"] or 0)


def check_output(what: str, digest: tuple[int, int], expected: tuple[int, int] | None, records: int) -> tuple[int, int]:
    """``digest`` when it holds ``records`` rows and matches ``expected`` (the other side's); raises otherwise."""
    if digest[0] != records:
        raise TidemarkError(f"{what} wrote {digest[0]:,} records, expected {records:,} (the plan's)")
    if expected is not None and digest != expected:
        raise TidemarkError(
            f"{what} wrote other content than the other side: row-hash sum {digest[1]} against {expected[1]} "
            f"over {records:,} records (partition, offset and the decoded fields)"
        )
    return digest


def read_task_stage(spark: Any, source: DataFrame, deser: Any, schemas: Any) -> Any:
    """How the job's read tasks stage this topic (:func:`tidemark.job.stage.read_task_stage_plan`); raises if they
    cannot."""
    from pyspark.sql import functions as F

    from tidemark.job.stage import read_task_stage_plan
    from tidemark.spark.decode import annotate
    from tidemark.staged import ERROR_COLUMN, OUTCOME_COLUMN

    decoded = annotate(source, deser, schemas)
    columns = [c for c in decoded.columns if c not in (ERROR_COLUMN, "plan_id")]
    staged = decoded.select(*columns, F.current_date().alias("date"), F.lit("ok").alias(OUTCOME_COLUMN))
    stage = read_task_stage_plan(schemas, staged.schema)
    if isinstance(stage, str):
        raise TidemarkError(f"the read tasks cannot stage the benchmark's records: {stage}")
    return stage


def rows_read(tasks: Sequence[Any], config: dict[str, Any], stage: Any) -> int:
    """In a Spark task: the records of ``tasks`` read (and, with ``stage``, decoded and laid out as the job stages
    them), counted and dropped."""
    from tidemark.spark.arrow_avro import decoded_tables, staged_arrow_schema
    from tidemark.spark.source import read_task

    rows = 0
    for task in tasks:
        if stage is None:
            rows += sum(batch.num_rows for batch in read_task(task, config))
        else:
            schema = staged_arrow_schema(stage)
            rows += sum(table.num_rows for _, table in decoded_tables(task, config, stage, schema))
    return rows


def spark_from_avro(df: DataFrame, writers: dict[int, str], reader: str) -> Column:
    """Spark's own decoding: ``from_avro`` of the body with each writer schema, resolved to ``reader``."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    sid = F.conv(F.hex(F.substring(df["value"], 2, 4)), 16, 10).cast("long")
    body = F.expr("substr(value, 6)")
    out: Column | None = None
    for writer_id, writer in sorted(writers.items()):
        decoded = from_avro(body, writer, {"avroSchema": reader})
        out = F.when(sid == writer_id, decoded) if out is None else out.when(sid == writer_id, decoded)
    assert out is not None
    return out


# -- the benchmark -------------------------------------------------------------------------


def run_benchmark(
    records: int, runs: int, registry: str, only: set[str] | None, log: Callable[[str], None]
) -> dict[str, Any]:
    from tests.support.servers.spark import fetch_avro_jar
    from tidemark.config.models import Deserialization, Feed
    from tidemark.job.steps import run as run_job
    from tidemark.kafka.registry import RegistryClient
    from tidemark.spark.avro import resolve_schemas
    from tidemark.spark.decode import annotate
    from tidemark.spark.session import AVRO_JAR_ENV
    from tidemark.spark.source import read_plan, tasks_of
    from tidemark.spark.wire import scan_schema_ids

    connection = connection_from_env()
    data = ensure_avro_dataset(connection, registry, records, log)
    topic = data.topic
    plan = frozen_plan(connection, topic)
    plan = replace(plan, feed=BENCH_FEED, plan_id=compute_plan_id(BENCH_FEED, plan.group, plan.mode, plan.isolation,
                                                                   plan.partitions))  # fmt: skip
    data_bytes = round(records * data.value_bytes) + records * 10  # values + keys
    jars, connector = spark_kafka_jars(log)
    avro_jar = Path(os.environ.get(AVRO_JAR_ENV) or fetch_avro_jar())
    metrics_folder()
    spark = bench_session([*jars, avro_jar])
    work = Path(tempfile.mkdtemp(prefix="tidemark-bench-avro-"))
    brokers = local_broker_pids(connection)
    registry_connection = RegistryConnection(registry)
    avro_feed = Feed(name=BENCH_FEED, topics=(topic,), group=plan.group, output=str(work / "unused"),
                     deserialization=Deserialization(format="avro"))  # fmt: skip
    # The run's schemas as Tidemark resolves them (scan of the ids, the registry, Avro's resolution rules),
    # once: A3 measures decoding, not the lookups (A6 has them, step "schemas").
    schemas = resolve_schemas(spark, scan_schema_ids(read_plan(spark, plan, connection)), avro_feed,
                              RegistryClient(registry_connection))  # fmt: skip
    if sorted(schemas.writers) != sorted(data.writer_ids):
        raise TidemarkError(f"{topic}: Tidemark found writer ids {sorted(schemas.writers)}, expected {data.writer_ids}")
    results: dict[str, RunnerResult] = {}
    step_seconds: list[dict[str, Any]] = []
    digests: dict[str, tuple[int, int]] = {}

    def checked(side: str, digest: tuple[int, int]) -> None:
        other = digests.get("A4w" if side == "A6" else "A6")
        digests[side] = check_output(side, digest, other, records)

    def a6_once() -> None:
        from tidemark.checkpoints.store import SqliteCheckpointStore
        from tidemark.runs.commit import commit_plan

        target = work / f"a6-{time.time_ns()}"
        # A group of its own per round: every round commits for real, from no offsets, as the plan says.
        group = f"{plan.group}-{target.name}"
        ran = replace(plan, group=group, plan_id=compute_plan_id(BENCH_FEED, group, plan.mode, plan.isolation,
                                                                   plan.partitions))  # fmt: skip
        feed = avro_feed.model_copy(update={"group": group, "output": str(target / "out")})
        job = run_job(spark, ran, feed, connection, target / "run", registry=registry_connection)
        step_seconds.append({**job.timings_s, "validator": job.validator, "staged_by": job.staged_by})
        started = time.monotonic()
        commit_plan(ran, connection, SqliteCheckpointStore(work / "checkpoints.sqlite"), run_id=f"bench-{target.name}")
        step_seconds[-1]["commit"] = round(time.monotonic() - started, 3)
        pending.append(lambda: _after_a6(target, job.records_quarantined))

    def _after_a6(target: Path, quarantined: int) -> None:
        if quarantined:
            raise TidemarkError(f"A6 quarantined {quarantined} records of {topic}; every record decodes")
        checked("A6", content_digest(spark.read.parquet(str(target / "out")), FIELDS))
        shutil.rmtree(target, ignore_errors=True)

    def a4w_once() -> None:
        target = work / f"a4w-{time.time_ns()}"
        df = _kafka_df(spark, connection, plan)
        decoded = spark_from_avro(df, dict(schemas.writers), schemas.reader).alias("v")
        out = df.select(
            "topic", "partition", "offset", "timestamp", F.col("timestampType").alias("timestamp_type"),
            F.col("key").cast("string").alias("key"), decoded, "headers",
        ).select("*", "v.*").drop("v")  # fmt: skip
        _parquet_layout(out).write.partitionBy("topic", "date").parquet(str(target))
        pending.append(lambda: _after_a4w(target))

    def _after_a4w(target: Path) -> None:
        checked("A4w", content_digest(spark.read.parquet(str(target)), FIELDS))
        shutil.rmtree(target, ignore_errors=True)

    def noop(df: DataFrame) -> None:
        df.write.format("noop").mode("overwrite").save()

    from pyspark.sql import functions as F

    bytes_feed = Deserialization()
    avro_deser = avro_feed.deserialization
    pending: list[Callable[[], None]] = []  # the output checks, run after the timing
    stage = read_task_stage(spark, read_plan(spark, plan, connection), avro_deser, schemas)
    tasks = [t for t in tasks_of(plan) if t.records]
    config = dict(connection.client_config())

    def read_tasks_once(decode: bool) -> None:
        rows = (
            spark.sparkContext.parallelize(tasks, len(tasks))
            .mapPartitions(lambda ts: [rows_read(list(ts), config, stage if decode else None)])
            .sum()
        )
        if rows != records:
            raise TidemarkError(f"the read tasks returned {rows:,} records, expected {records:,} (the plan's)")

    runners: list[tuple[str, str, Callable[[], None], str]] = [
        ("A3b", "Tidemark Spark read, bytes → noop", lambda: noop(annotate(read_plan(spark, plan, connection),
                                                                          bytes_feed)),
         "the same topic undecoded: what the read costs without Avro"),
        ("A3", "Tidemark read tasks, Avro decoded → dropped", lambda: read_tasks_once(True),
         "the job's Avro read of this topic: polars in the read tasks, laid out as staged (tidemark.spark.arrow_avro)"),
        ("A3r", "Tidemark read tasks, bytes → dropped", lambda: read_tasks_once(False),
         "the same read tasks without decoding: A3/A3r is what decoding costs them"),
        ("A3s", "Tidemark Spark read, from_avro → noop",
         lambda: noop(annotate(read_plan(spark, plan, connection), avro_deser, schemas)),
         "Spark's from_avro per writer id, resolved to the reader: the job's decode where the read tasks give way"),
        ("A6", "Tidemark end to end, Avro → Parquet + commit", a6_once,
         "schema-id scan and registry, read and decode into staging, validate, publish by rename, commit"),
        ("A4w", "Spark Kafka source + from_avro → Parquet", a4w_once,
         f"spark-sql-kafka {connector}; same layout (topic/date), no validation, no commit"),
    ]  # fmt: skip

    active = [(n, label, once, note) for n, label, once, note in runners if not only or n in only]
    for name, label, _once, note in active:
        results[name] = RunnerResult(name, label, note=note)
    for round_no in range(runs + 1):  # round 0 is the warm-up
        for name, _label, once, _note in active:
            with read_metrics() as metrics:
                sample: Sample = _timed_spark(once, records, metrics if name != "A4w" else None, data_bytes, brokers)
            for check in pending:
                check()
            pending.clear()
            log(round_line(name, round_no, runs, sample))
            if round_no:
                results[name].samples.append(sample)
    shutil.rmtree(work, ignore_errors=True)

    ratios, by_round = median_ratios(results, ("A6/A4w", "A3/A3b", "A3/A3r", "A3s/A3b"))
    doc = {
        "when": datetime.now(UTC).isoformat(),
        "records": records,
        "value_bytes": round(data.value_bytes, 1),
        "what": f"Reading and decoding {records:,} Avro records (mean value {data.value_bytes:.0f} B, two versions)",
        "partitions": PARTITIONS,
        "runs": runs,
        "warmups": 1,
        "topic": topic,
        "writer_schema_ids": list(data.writer_ids),
        "plan_id": plan.plan_id,
        **machine_facts(spark, connector),
        "runners": {k: v.summary() for k, v in results.items()},
        "a6_steps_seconds": step_seconds[1:],  # per measured A6 run (warm-up left out)
        "content_digest": list(digests.get("A6") or digests.get("A4w") or ()),
        "ratios": ratios,
        "ratios_by_round": by_round,
        "targets": targets_met(ratios, TARGETS),
    }
    spark.stop()
    return doc


def print_report(doc: dict[str, Any]) -> None:
    print(
        f"\nTidemark Avro benchmark: {doc['records']:,} records (mean value {doc['value_bytes']} B, writer schema ids "
        f"{doc['writer_schema_ids']}) over {doc['partitions']} partitions, {doc['runs']} runs (+1 warm-up), "
        f"{doc['cpus']} CPUs, Spark {doc['spark_version']} {doc['spark_master']}"
    )
    print(f"{'runner':<6} {'rec/s (median)':>15} {'s (median)':>11} {'rec/CPU-s':>11} {'Kafka read ×':>13}  what")
    for r in doc["runners"].values():
        read = "" if r["kafka_payload_read_ratio"] is None else f"{r['kafka_payload_read_ratio']:.2f}"
        print(f"{r['name']:<6} {r['median_records_per_s']:>15,} {r['median_seconds']:>11} "
              f"{r['median_records_per_cpu_s']:>11,} {read:>13}  {r['label']}")  # fmt: skip
    print_cpu_splits(doc)
    steps = doc["a6_steps_seconds"]
    if steps:
        names = [k for k in steps[0] if k not in ("validator", "staged_by")]
        print("  A6 steps (median s): " + ", ".join(f"{k} {statistics.median(s.get(k, 0) for s in steps):.2f}"
                                                    for k in names))  # fmt: skip
        print("  A6 staged by: " + ", ".join(sorted({str(s.get("staged_by")) for s in steps})))
    if doc["content_digest"]:
        rows, digest = doc["content_digest"]
        print(f"both sides wrote the same {rows:,} records (row-hash sum {digest})")
    print_ratios(doc)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.avro", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500k records instead of 5M")
    parser.add_argument("--records", type=int, help="dataset size (default 5,000,000; 500,000 with --quick)")
    parser.add_argument("--runs", type=int, default=3, help="measured rounds (after 1 warm-up)")
    parser.add_argument("--only", help="comma-separated runners, e.g. A3,A3b")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "docs" / "benchmarks"))
    args = parser.parse_args(argv)
    records = args.records or (500_000 if args.quick else 5_000_000)
    only = {s.strip() for s in args.only.split(",")} if args.only else None

    def log(msg: str) -> None:
        print(msg, flush=True)

    with registry_url(log) as registry:
        doc = run_benchmark(records, max(1, args.runs), registry, only, log)
    print_report(doc)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    size = "quick" if args.quick and not args.records else "full" if records >= 5_000_000 else str(records)
    stem = f"bench-avro-{size}"
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=2, sort_keys=True))
    charts.save(charts.read_figure(doc), out / f"{stem}.png")
    print(f"wrote {out / f'{stem}.json'} and {out / f'{stem}.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
