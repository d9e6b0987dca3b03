"""Side-by-side read benchmark on the local cluster: ``python -m tests.bench.read [--quick]``.

One dataset (``--records`` 200-byte records over 8 partitions, produced once and then
frozen: the topic name encodes its size and is reused), one plan over exactly those
offsets, and a warm-up round plus ``--runs`` measured rounds (default 5), each round running
every runner once, back to back (a slow spell of a shared machine then hits all alike):

- R0  Kafka's Java consumer perf tool (``org.apache.kafka.tools.ConsumerPerformance``,
      same jars as the brokers; its own fetch rate, JVM start excluded)
- R1  a raw confluent-kafka ``consume(N)`` loop in one process (touches every value)
- RF  Spark's Python data source path alone: pre-built Arrow batches shaped like R3's, no
      Kafka, to ``noop`` (the floor under R3: what Spark costs before any record is read)
- R3  Tidemark's Spark read (``tidemark_kafka``) to Spark's ``noop`` sink
- R4  Spark's built-in Kafka source over the same offsets to ``noop``
- R6  Tidemark end to end (``tidemark.job.steps.run`` + commit): Kafka read once into staged
      Parquet, statistics and validation on the staged files, publish by rename, commit
- R6s R6 with Spark's write staging the records (``TIDEMARK_READ_TASK_STAGING=0``): the
      path before the read tasks staged raw bytes and JSON (issue 61), so before/after are one run
- R4w Spark's Kafka source writing the same Parquet layout
- M   one read task's peak RSS for ranges of 1/8, 1/4, 1/2 and all of one partition, each
      in a fresh process: it must not grow with the range

Reported per runner: median records/s (ratios are of these medians; the ratios within
each round are listed beside them), records per CPU-second (driver, JVM and Python
workers; not the brokers), for Spark runners the CPU-seconds split into Spark's JVM, the
Python processes and, when the brokers run on this machine, the brokers (they share its
cores, so their work for a runner slows that runner), and for Tidemark runs the Python
workers' peak RSS and the
payload bytes read from Kafka relative to the data (1.0 = read once). Results go to
``docs/benchmarks/bench-<quick|full>.json`` and a bar chart PNG beside it (tests/bench/charts.py).
Spark's Kafka connector and its dependencies are
fetched with Maven into ``~/.cache/tidemark``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tests.bench import charts
from tidemark.devtools.kafka.cluster import connection_from_env, jars_dir
from tidemark.devtools.maven import copy_dependencies, fetch_once
from tidemark.errors import TidemarkError
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.admin import KafkaAdmin
from tidemark.kafka.connection import KafkaConnection
from tidemark.planning.plan import Chunk, PartitionPlan, Plan, Task, compute_plan_id
from tidemark.settings import cache_root

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PARTITIONS = 8
VALUE_BYTES = 200
SPARK_KAFKA_VERSIONS = ("4.3.0", "4.2.0")  # the first one Maven Central serves wins
BENCH_FEED = "tidemark-bench"
# Issue 12 raised them from 1.0, 0.8 and 1.0.
TARGETS = {"R3/R4": 1.5, "R3/R1": 0.8, "R6/R4w": 1.3}

# -- dataset and plan --------------------------------------------------------------------


def frozen_topic(connection: KafkaConnection, topic: str, records: int) -> bool:
    """Create ``topic`` (8 partitions, kept forever) if missing; True when it already holds exactly ``records``."""
    adapter = KafkaAdmin(connection)
    adapter.create_topic(topic, PARTITIONS, 1, {"retention.ms": "-1", "retention.bytes": "-1"})
    tps = [(topic, p) for p in range(PARTITIONS)]
    deadline = time.monotonic() + 60
    while any(i.leader < 0 for i in adapter.partitions([topic])) or len(adapter.partitions([topic])) < PARTITIONS:
        if time.monotonic() > deadline:
            raise TidemarkError(f"benchmark topic {topic} has partitions without a leader after 60s")
        time.sleep(0.5)
    time.sleep(1.0)  # a new topic's leaders reach every broker's metadata a moment later
    have = sum(adapter.end_offsets(tps, "read_uncommitted").values())
    if have and have != records:
        raise TidemarkError(f"benchmark topic {topic} holds {have} records, expected {records}; delete it to redo")
    return have == records


def ensure_dataset(connection: KafkaConnection, records: int, log: Callable[[str], None]) -> str:
    """The frozen benchmark topic holding exactly ``records`` records (produced on first use)."""
    topic = f"tidemark-bench-{records}-v1"
    if frozen_topic(connection, topic, records):
        return topic
    log(f"producing {records:,} records of {VALUE_BYTES} bytes to {topic} ...")
    payload = bytes(np.random.default_rng(7).integers(32, 127, VALUE_BYTES, dtype=np.uint8))
    produce_numbered(connection, topic, records, lambda i: payload, log)
    return topic


def produce_numbered(
    connection: KafkaConnection, topic: str, records: int, value_of: Callable[[int], bytes], log: Callable[[str], None]
) -> None:
    """Numbers 0 to ``records`` - 1 (key: the number as 10 digits, value: ``value_of(number)``) to partition n % 8."""
    from confluent_kafka import Producer

    producer = Producer(connection.client_config(**{"linger.ms": 50, "batch.size": 1_000_000,
                                                    "queue.buffering.max.kbytes": 262144, "acks": "1"}))  # fmt: skip
    started = time.monotonic()
    for i in range(records):
        value = value_of(i)
        while True:
            try:
                producer.produce(topic, value=value, key=b"%010d" % i, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 50_000 == 0:
            producer.poll(0)
    if producer.flush(300):
        raise TidemarkError(f"producing the benchmark data to {topic} did not finish")
    log(f"produced in {time.monotonic() - started:.1f}s")


def frozen_plan(connection: KafkaConnection, topic: str) -> Plan:
    """One plan over the whole topic, one task per partition (grouped by leader like the planner)."""
    adapter = KafkaAdapter(connection)
    infos = adapter.partitions([topic])
    tps = [(i.topic, i.partition) for i in infos]
    low = adapter.log_start_offsets(tps)
    high = adapter.end_offsets(tps, "read_committed")
    parts = tuple(
        PartitionPlan(topic=i.topic, partition=i.partition, leader=i.leader, committed=None, checkpoint=None,
                      log_start=low[(i.topic, i.partition)], high_watermark=high[(i.topic, i.partition)],
                      end_available=high[(i.topic, i.partition)], start=low[(i.topic, i.partition)],
                      end=high[(i.topic, i.partition)], reason="earliest")
        for i in infos
    )  # fmt: skip
    order = sorted(parts, key=lambda p: (p.leader, p.partition))
    tasks = tuple(Task(n, p.leader, (Chunk(p.topic, p.partition, p.start, p.end),)) for n, p in enumerate(order))
    group = f"{BENCH_FEED}-{topic}"
    return Plan(
        plan_id=compute_plan_id(BENCH_FEED, group, "scheduled", "read_committed", parts), feed=BENCH_FEED,
        group=group, mode="scheduled", commit=True, isolation="read_committed",
        created_at=datetime.now(UTC).isoformat(), partitions=parts, tasks=tasks,
    )  # fmt: skip


# -- measuring ---------------------------------------------------------------------------


@dataclass
class Sample:
    seconds: float
    cpu_seconds: float
    records: int
    peak_worker_rss_mb: float | None = None
    payload_read_ratio: float | None = None
    cpu_split: dict[str, float] | None = None  # CPU-s by process kind (see ProcessSampler.cpu_split)


@dataclass
class RunnerResult:
    name: str
    label: str
    samples: list[Sample] = field(default_factory=list)
    note: str = ""
    error: str | None = None

    @property
    def median_rate(self) -> float:
        return statistics.median(s.records / s.seconds for s in self.samples) if self.samples else 0.0

    @property
    def median_per_cpu(self) -> float:
        rates = [s.records / s.cpu_seconds for s in self.samples if s.cpu_seconds > 0]
        return statistics.median(rates) if rates else 0.0

    def summary(self) -> dict[str, Any]:
        rss = [s.peak_worker_rss_mb for s in self.samples if s.peak_worker_rss_mb is not None]
        ratio = [s.payload_read_ratio for s in self.samples if s.payload_read_ratio is not None]
        return {
            "name": self.name,
            "label": self.label,
            "note": self.note,
            "error": self.error,
            "median_records_per_s": round(self.median_rate),
            "median_records_per_cpu_s": round(self.median_per_cpu),
            "median_seconds": round(statistics.median(s.seconds for s in self.samples), 3) if self.samples else None,
            "peak_worker_rss_mb": max(rss) if rss else None,
            "kafka_payload_read_ratio": max(ratio) if ratio else None,
            "median_cpu_split": _median_split([s.cpu_split for s in self.samples if s.cpu_split]),
            "samples": [asdict(s) for s in self.samples],
        }


def _median_split(splits: Sequence[dict[str, float]]) -> dict[str, float] | None:
    if not splits:
        return None
    return {kind: round(statistics.median(s.get(kind, 0.0) for s in splits), 2) for kind in splits[0]}


def local_broker_pids(connection: KafkaConnection) -> list[int]:
    """The processes listening on the bootstrap servers' ports on this machine (none for a remote cluster)."""
    import psutil

    ports = set()
    for server in connection.bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        if host.strip("[]") in ("127.0.0.1", "localhost", "::1") and port.isdigit():
            ports.add(int(port))
    try:
        listening = psutil.net_connections(kind="tcp")
    except psutil.Error:
        return []
    return sorted({c.pid for c in listening if c.status == psutil.CONN_LISTEN and c.laddr.port in ports and c.pid})


class ProcessSampler:
    """CPU time and peak RSS of this process and its descendants (Spark's JVM and Python workers).

    ``others`` (the brokers, when they run on this machine) are sampled beside them and kept
    apart: their CPU is not in :attr:`cpu_seconds`, only in :attr:`cpu_split`.
    """

    def __init__(self, interval_s: float = 0.2, others: Sequence[int] = ()) -> None:
        import psutil

        self._psutil = psutil
        self.interval_s = interval_s
        self.me = psutil.Process()
        self.others = [p for p in (self._process(pid) for pid in others) if p is not None]
        self.cpu: dict[int, float] = {}
        self.base: dict[int, float] = {}
        self.kind: dict[int, str] = {}
        self.worker_rss: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _process(self, pid: int) -> Any:
        try:
            return self._psutil.Process(pid)
        except self._psutil.Error:
            return None

    def _procs(self) -> list[Any]:
        try:
            return [self.me, *self.me.children(recursive=True), *self.others]
        except self._psutil.Error:
            return [self.me, *self.others]

    def _sample(self, into: dict[int, float]) -> None:
        for proc in self._procs():
            try:
                times = proc.cpu_times()
                into[proc.pid] = times.user + times.system
                if proc.pid not in self.kind:
                    self.kind[proc.pid] = self._kind_of(proc)
                if self.kind[proc.pid] == "brokers":
                    continue
                cmd = " ".join(proc.cmdline())
                if proc.pid != self.me.pid and ("pyspark.daemon" in cmd or "pyspark.worker" in cmd):
                    self.worker_rss[proc.pid] = max(self.worker_rss.get(proc.pid, 0), proc.memory_info().rss)
            except self._psutil.Error:
                continue

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample(self.cpu)

    def __enter__(self) -> ProcessSampler:
        self._sample(self.base)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample(self.cpu)

    def _kind_of(self, proc: Any) -> str:
        if any(proc.pid == other.pid for other in self.others):
            return "brokers"
        return "jvm" if proc.name().startswith("java") else "python"

    def _used(self) -> dict[int, float]:
        return {pid: max(0.0, t - self.base.get(pid, 0.0)) for pid, t in self.cpu.items()}

    @property
    def cpu_seconds(self) -> float:
        """This process and its descendants: the driver, Spark's JVM, the Python workers."""
        return sum(t for pid, t in self._used().items() if self.kind.get(pid) != "brokers")

    @property
    def cpu_split(self) -> dict[str, float]:
        """CPU-s by kind: ``jvm`` (Spark), ``python`` (driver, daemon, workers), ``brokers``."""
        split = {"jvm": 0.0, "python": 0.0, **({"brokers": 0.0} if self.others else {})}
        for pid, used in self._used().items():
            split[self.kind.get(pid, "python")] += used
        return {k: round(v, 2) for k, v in split.items()}

    @property
    def peak_worker_rss_mb(self) -> float | None:
        return round(max(self.worker_rss.values()) / 2**20, 1) if self.worker_rss else None


def metrics_folder() -> Path:
    """Where the Tidemark reader writes per-task metrics (see tidemark.spark.source).

    Set before the Spark session starts: Python workers inherit the JVM's environment.
    """
    from tidemark.spark.source import METRICS_ENV

    folder = Path(os.environ.setdefault(METRICS_ENV, tempfile.mkdtemp(prefix="tidemark-read-metrics-")))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextmanager
def read_metrics() -> Iterator[Path]:
    """The metrics folder, emptied before a measured run."""
    folder = metrics_folder()
    for stale in folder.glob("read-*.json"):
        stale.unlink()
    yield folder


def _payload_ratio(folder: Path, data_bytes: int) -> tuple[float | None, float | None]:
    docs = [json.loads(p.read_text()) for p in folder.glob("read-*.json")]
    for p in folder.glob("read-*.json"):
        p.unlink()
    if not docs:
        return None, None
    read = sum(d["payload_bytes"] for d in docs)
    rss = max(d["peak_rss_kb"] for d in docs) / 1024
    return round(read / data_bytes, 3), round(rss, 1)


# -- runners -------------------------------------------------------------------------------


def run_r0(connection: KafkaConnection, topic: str, records: int) -> Sample:
    cmd = [
        shutil.which("java") or "java", "-Xmx512m", "-cp", f"{jars_dir()}/*",
        "org.apache.kafka.tools.ConsumerPerformance", "--bootstrap-server", connection.bootstrap_servers,
        "--topic", topic, "--num-records", str(records), "--timeout", "60000", "--hide-header",
        "--group", f"tidemark-bench-perf-{time.time_ns()}",
    ]  # fmt: skip
    before = os.times()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
    after = os.times()
    if proc.returncode != 0:
        raise TidemarkError(f"ConsumerPerformance failed: {proc.stderr[-800:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.count(",") >= 9][-1]
    fields = [f.strip() for f in line.split(",")]
    consumed = int(fields[4])
    fetch_rate = float(fields[9])  # fetch.nMsg.sec: excludes JVM start and the group's join
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return Sample(seconds=consumed / fetch_rate, cpu_seconds=cpu, records=consumed)


def r1_worker(bootstrap: str, plan_json: str) -> dict[str, Any]:
    """R1's body, run in its own process: a plain consume(N) loop over the plan's ranges."""
    from confluent_kafka import Consumer, TopicPartition

    from tidemark.spark.source import READ_TUNING

    plan = Plan.from_json(plan_json)
    # The same librdkafka tuning as Tidemark's reader, so the ratio measures per-record overhead.
    consumer = Consumer({**READ_TUNING, "bootstrap.servers": bootstrap, "group.id": "tidemark-bench-r1",
                         "enable.auto.commit": False, "auto.offset.reset": "error", "enable.partition.eof": True,
                         "isolation.level": plan.isolation})  # fmt: skip
    consumer.assign([TopicPartition(p.topic, p.partition, p.start) for p in plan.partitions])
    remaining = {p.partition: p.end for p in plan.partitions if p.end > p.start}
    total = plan.total_records
    count, nbytes = 0, 0
    started = time.monotonic()
    while count < total:
        for m in consumer.consume(num_messages=min(10_000, total - count), timeout=1.0):
            if m.error() is None:
                nbytes += len(m.value())
                count += 1
    seconds = time.monotonic() - started
    consumer.close()
    del remaining
    return {"seconds": seconds, "records": count, "bytes": nbytes}


def run_worker(worker: str, connection: KafkaConnection, plan: Plan, *numbers: int) -> tuple[dict[str, Any], float]:
    """``tests.bench.read.<worker>(bootstrap, plan JSON, *numbers)`` in a fresh interpreter.

    Returns the JSON it prints and the CPU seconds it used. Nothing is inherited from
    this process: no imports, no heap, no librdkafka threads.
    """
    code = (
        f"import json, sys; from tests.bench.read import {worker}; "
        f"print(json.dumps({worker}(sys.argv[1], sys.stdin.read(), *map(int, sys.argv[2:]))))"
    )
    cmd = [sys.executable, "-c", code, connection.bootstrap_servers, *map(str, numbers)]
    before = os.times()
    proc = subprocess.run(
        cmd,
        input=plan.to_json(),
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
        cwd=Path(__file__).resolve().parents[2],
    )  # where ``tests.bench`` imports from
    after = os.times()
    if proc.returncode != 0:
        raise TidemarkError(f"{worker} failed: {proc.stderr[-800:]}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return json.loads(proc.stdout.strip().splitlines()[-1]), cpu


def run_r1(connection: KafkaConnection, plan: Plan) -> Sample:
    doc, cpu = run_worker("r1_worker", connection, plan)
    return Sample(seconds=doc["seconds"], cpu_seconds=cpu, records=doc["records"])


MEMORY_FRACTIONS = (0.125, 0.25, 0.5, 1.0)


def memory_worker(bootstrap: str, plan_json: str, records: int, stage: int = 0) -> dict[str, Any]:
    """Read the first ``records`` offsets of the plan's first partition as one task; ``stage``: and stage them as
    R6's read task does for this bytes feed (:func:`tidemark.spark.arrow_avro.stage_task`, Parquet files in a
    temporary folder).

    Reports the process's resident memory (current RSS, sampled every 20 ms) at its
    highest during the read, and before it (imports done): the high-water mark of the
    imports alone would hide what the read itself holds.
    """
    import psutil

    from tidemark.spark.arrow_avro import stage_task, staged_arrow_schema
    from tidemark.spark.source import Range, ReadTask, read_task

    plan = Plan.from_json(plan_json)
    p = plan.partitions[0]
    task = ReadTask(0, p.leader, plan.plan_id, plan.group, plan.isolation,
                    (Range(p.topic, p.partition, p.start, p.start + records),))  # fmt: skip
    config = {"bootstrap.servers": bootstrap}
    staging = _bytes_stage_plan() if stage else None
    if staging is not None:
        staged_arrow_schema(staging)  # its imports before the baseline
    me = psutil.Process()
    before = me.memory_info().rss
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], me.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with tempfile.TemporaryDirectory(prefix="tidemark-bench-m-") as target:
        if staging is None:
            read = sum(batch.num_rows for batch in read_task(task, config))
        else:
            read = sum(stage_task(0, task, config, staging, target)[1].values())
    done.set()
    sampler.join()
    mb = 2**20
    return {"records": read, "peak_rss_mb": round(max(peak[0], me.memory_info().rss) / mb, 1),
            "before_read_rss_mb": round(before / mb, 1)}  # fmt: skip


def _bytes_stage_plan() -> Any:
    """The read tasks' staging plan of the benchmark's feed (bytes values, text keys), as the job builds it."""
    from pyspark.sql.types import StringType, StructField, StructType

    from tidemark.config.models import Deserialization
    from tidemark.spark.arrow_plain import PlainPlan
    from tidemark.spark.source import SCHEMA
    from tidemark.staged import OK_OUTCOME, RAW_VALUE_COLUMN, STAGED_PARTITION_COLUMNS

    columns = StructType([StructField("key", StringType()) if f.name == "key" else f for f in SCHEMA.fields
                          if f.name not in ("topic", "plan_id")])  # fmt: skip
    return PlainPlan.of(Deserialization(format="bytes"), columns, partition_columns=STAGED_PARTITION_COLUMNS,
                        ok=OK_OUTCOME, raw_value=RAW_VALUE_COLUMN)  # fmt: skip


def task_memory(connection: KafkaConnection, plan: Plan, log: Callable[[str], None]) -> dict[str, Any]:
    """Peak RSS of one read task per range size, each in a fresh process (nothing inherited)."""
    size = plan.partitions[0].records
    points: list[dict[str, Any]] = []
    staged: list[dict[str, Any]] = []
    for fraction in MEMORY_FRACTIONS:
        for stage, into in ((0, points), (1, staged)):
            point, _cpu = run_worker("memory_worker", connection, plan, max(1, int(size * fraction)), stage)
            log(f"  one task {'reading and staging' if stage else 'reading'} {point['records']:,} records: peak RSS "
                f"{point['peak_rss_mb']} MB ({point['before_read_rss_mb']} MB before reading)")  # fmt: skip
            into.append(point)
    peaks = [pt["peak_rss_mb"] for pt in points]
    staged_peaks = [pt["peak_rss_mb"] for pt in staged]
    return {"points": points, "growth": round(max(peaks) / min(peaks), 3),
            # the same task staging its records in Parquet files (R6's read tasks, a bytes feed)
            "staged_points": staged, "staged_growth": round(max(staged_peaks) / min(staged_peaks), 3)}  # fmt: skip


def spark_kafka_jars(log: Callable[[str], None]) -> tuple[list[Path], str]:
    """Spark's Kafka connector and the dependencies pyspark lacks, fetched once with Maven."""
    import pyspark

    errors = []
    for version in SPARK_KAFKA_VERSIONS:
        target = cache_root() / f"spark-sql-kafka-{version}" / "lib"
        if not (target / ".complete").exists():
            try:
                _maven_fetch(version, target)
            except TidemarkError as exc:
                errors.append(str(exc))
                continue
        bundled = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
        jars = [p for p in sorted(target.glob("*.jar")) if _artifact(p.name) not in bundled]
        if version != pyspark.__version__:
            log(f"note: spark-sql-kafka {pyspark.__version__} is not on Maven Central; using {version}")
        return jars, version
    raise TidemarkError("could not fetch Spark's Kafka connector: " + " | ".join(errors))


def _artifact(jar_name: str) -> str:
    return re.sub(r"-\d[\w.\-]*\.jar$", "", jar_name)


def _maven_fetch(version: str, target: Path) -> None:
    # Token provider releases lag on some mirrors; pin the newest one available as a fallback.
    token_version = {"4.3.0": "4.3.0", "4.2.0": "4.0.0"}.get(version, version)
    pom = f"""<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
  <groupId>dev.tidemark</groupId><artifactId>bench-spark-kafka</artifactId><version>1</version><packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.spark</groupId><artifactId>spark-sql-kafka-0-10_2.13</artifactId>
      <version>{version}</version><exclusions><exclusion><groupId>org.apache.spark</groupId>
      <artifactId>spark-token-provider-kafka-0-10_2.13</artifactId></exclusion></exclusions></dependency>
    <dependency><groupId>org.apache.spark</groupId><artifactId>spark-token-provider-kafka-0-10_2.13</artifactId>
      <version>{token_version}</version></dependency>
  </dependencies></project>"""
    # Spark's parent POM lists extra repositories; route everything to Maven Central.
    settings = (
        "<settings><mirrors><mirror><id>central-only</id><mirrorOf>*</mirrorOf>"
        "<url>https://repo.maven.apache.org/maven2</url></mirror></mirrors></settings>"
    )
    work = Path(tempfile.mkdtemp(prefix="tidemark-mvn-"))
    (work / "pom.xml").write_text(pom)
    (work / "settings.xml").write_text(settings)

    fetch_once(target, lambda partial: copy_dependencies(work / "pom.xml", partial, f"spark-sql-kafka {version}",
                                                         TidemarkError, settings=work / "settings.xml"))  # fmt: skip


def floor_source(records: int, tasks: int) -> type:
    """RF's data source: ``tasks`` partitions yielding one pre-built Arrow batch shaped like
    the reader's (same schema, 10-byte keys, 200-byte values) until ``records`` rows in all.

    No Kafka and no per-record Python: what is left is the cost of Spark's Python data
    source path itself (Arrow IPC to the JVM, rows, noop), a floor under R3.
    """
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from tidemark.spark.source import DEFAULT_BATCH_RECORDS, SCHEMA

    class FloorReader(DataSourceReader):  # type: ignore[misc]
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(i) for i in range(tasks)]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            import pyarrow as pa

            from tidemark.spark.source import _headers_array, _repeated, _timestamps, arrow_schema

            schema, rows = arrow_schema(), records // tasks + (partition.value < records % tasks)
            n = DEFAULT_BATCH_RECORDS
            offsets = np.arange(n, dtype=np.int64)
            columns = [
                _repeated("tidemark-bench-floor", n), pa.array(np.full(n, partition.value, np.int32)),
                pa.array(offsets), _timestamps(offsets + 1_767_225_600_000, np.ones(n, np.int32)),
                pa.array(np.zeros(n, np.int32)), pa.array([b"%010d" % i for i in range(n)], pa.binary()),
                pa.array([bytes(VALUE_BYTES)] * n, pa.binary()), _headers_array([None] * n, n, schema.field(7).type),
                _repeated("0" * 20, n),
            ]  # fmt: skip
            batch = pa.RecordBatch.from_arrays(columns, schema=schema)
            for start in range(0, rows, n):
                yield batch.slice(0, min(n, rows - start))

    class FloorSource(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "tidemark_bench_floor"

        def schema(self) -> Any:
            return SCHEMA

        def reader(self, schema: Any) -> DataSourceReader:
            return FloorReader()

    return FloorSource


def bench_session(jars: Sequence[Path]) -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.appName("tidemark-bench")
        .master(os.environ.get("TIDEMARK_SPARK_MASTER", "local[*]"))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", os.environ.get("TIDEMARK_SPARK_DRIVER_MEMORY", "3g"))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.jars", ",".join(str(j) for j in jars))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _kafka_df(spark: SparkSession, connection: KafkaConnection, plan: Plan) -> Any:
    topic = plan.partitions[0].topic
    starts = {topic: {str(p.partition): p.start for p in plan.partitions}}
    ends = {topic: {str(p.partition): p.end for p in plan.partitions}}
    reader = (
        spark.read.format("kafka")
        .option("assign", json.dumps({topic: [p.partition for p in plan.partitions]}))
        .option("startingOffsets", json.dumps(starts))
        .option("endingOffsets", json.dumps(ends))
        .option("includeHeaders", "true")
        .option("kafka.isolation.level", plan.isolation)
    )
    for key, value in connection.client_config().items():
        reader = reader.option(f"kafka.{key}", str(value))
    return reader.load()


def _parquet_layout(df: Any) -> Any:
    from tidemark.output.staging import utc_date

    return df.withColumn("date", utc_date())


def _timed_spark(
    action: Callable[[], Any], records: int, metrics: Path | None, data_bytes: int, brokers: Sequence[int] = ()
) -> Sample:
    with ProcessSampler(others=brokers) as sampler:
        started = time.monotonic()
        action()
        seconds = time.monotonic() - started
    ratio, task_rss = _payload_ratio(metrics, data_bytes) if metrics else (None, None)
    rss = sampler.peak_worker_rss_mb if metrics else None
    return Sample(seconds, sampler.cpu_seconds, records, rss if rss is not None else task_rss, ratio, sampler.cpu_split)


# -- the benchmark -------------------------------------------------------------------------


def run_benchmark(
    records: int, runs: int, out_dir: Path, only: set[str] | None, log: Callable[[str], None]
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from tidemark.config.models import Feed
    from tidemark.job.steps import run as run_job
    from tidemark.spark.source import read_plan

    connection = connection_from_env()
    topic = ensure_dataset(connection, records, log)
    plan = frozen_plan(connection, topic)
    data_bytes = records * VALUE_BYTES + records * 10  # values + keys
    jars, connector = spark_kafka_jars(log)
    metrics_folder()
    spark = bench_session(jars)
    work = Path(tempfile.mkdtemp(prefix="tidemark-bench-"))
    brokers = local_broker_pids(connection)
    results: dict[str, RunnerResult] = {}
    step_seconds: list[dict[str, Any]] = []

    def r6_spark_once() -> None:  # R6 with Spark's write staging the records: the path before issue 61
        from tidemark.spark.arrow_avro import SWITCH_ENV

        before = os.environ.get(SWITCH_ENV)
        os.environ[SWITCH_ENV] = "0"
        try:
            r6_once()
            step_seconds[-1]["staged_by"] = "spark"
        finally:
            if before is None:
                os.environ.pop(SWITCH_ENV, None)
            else:
                os.environ[SWITCH_ENV] = before

    def r6_once() -> None:
        from tidemark.checkpoints.store import SqliteCheckpointStore
        from tidemark.runs.commit import commit_plan

        target = work / f"r6-{time.time_ns()}"
        # A group of its own per round: every round commits for real, from no offsets, as the
        # plan says (the job refuses to publish a plan whose group moved since planning).
        group = f"{plan.group}-{target.name}"
        ran = replace(plan, group=group, plan_id=compute_plan_id(BENCH_FEED, group, plan.mode, plan.isolation,
                                                                   plan.partitions))  # fmt: skip
        feed = Feed(name=BENCH_FEED, topics=(topic,), group=group, output=str(target / "out"))
        job = run_job(spark, ran, feed, connection, target / "run")
        step_seconds.append({**job.timings_s, "validator": job.validator})
        started = time.monotonic()
        commit_plan(ran, connection, SqliteCheckpointStore(work / "checkpoints.sqlite"), run_id=f"bench-{target.name}")
        step_seconds[-1]["commit"] = round(time.monotonic() - started, 3)
        shutil.rmtree(target, ignore_errors=True)

    def r4w_once() -> None:
        target = work / f"r4w-{time.time_ns()}"
        df = _kafka_df(spark, connection, plan).withColumnRenamed("timestampType", "timestamp_type")
        _parquet_layout(df).write.partitionBy("topic", "date").parquet(str(target))
        shutil.rmtree(target, ignore_errors=True)

    def noop(df: Any) -> None:
        df.write.format("noop").mode("overwrite").save()

    spark.dataSource.register(floor_source(records, PARTITIONS))

    runners: list[tuple[str, str, Callable[[], Sample], str]] = [
        ("R0", "Kafka ConsumerPerformance (Java)", lambda: run_r0(connection, topic, records),
         "fetch.nMsg.sec of the tool; CPU includes JVM start"),
        ("R1", "confluent-kafka consume(N), 1 process", lambda: run_r1(connection, plan),
         "touches every value; same librdkafka tuning as the reader"),
        ("RF", "Spark Python data source alone → noop",
         lambda: _timed_spark(lambda: noop(spark.read.format("tidemark_bench_floor").load()), records, None, 0,
                              brokers),
         "pre-built Arrow batches shaped like R3's, no Kafka: the floor under R3"),
        ("R3", "Tidemark Spark read → noop", lambda: _tm(lambda: noop(read_plan(spark, plan, connection))), ""),
        ("R4", "Spark Kafka source → noop",
         lambda: _timed_spark(lambda: noop(_kafka_df(spark, connection, plan)), records, None, data_bytes, brokers),
         f"spark-sql-kafka {connector}"),
        ("R6", "Tidemark end to end → Parquet + commit", lambda: _tm(r6_once),
         "one read into staging, validate the staged files, publish by rename, commit"),
        ("R6s", "Tidemark end to end, Spark's write stages", lambda: _tm(r6_spark_once),
         "R6 with TIDEMARK_READ_TASK_STAGING=0: Spark's Parquet writer stages the records (before issue 61)"),
        ("R4w", "Spark Kafka source → Parquet", lambda: _timed_spark(r4w_once, records, None, data_bytes, brokers),
         f"spark-sql-kafka {connector}; same layout (topic/date)"),
    ]  # fmt: skip

    def _tm(action: Callable[[], None]) -> Sample:
        with read_metrics() as metrics:
            return _timed_spark(action, records, metrics, data_bytes, brokers)

    # Interleaved rounds: every runner once per round, so that a slow spell of this shared
    # machine hits all runners alike, and each ratio is also taken within a round.
    active: list[tuple[str, Callable[[], Sample]]] = []
    for name, label, once, note in runners:
        if not only or name in only:
            results[name] = RunnerResult(name, label, note=note)
            active.append((name, once))
    for round_no in range(runs + 1):  # round 0 is the warm-up
        for name, once in active:
            result = results[name]
            if result.error:
                continue
            try:
                sample = once()
            except Exception as exc:  # noqa: BLE001 - one runner failing must not hide the others' figures
                result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:400]}"
                log(f"  {name} failed: {result.error}")
                continue
            log(round_line(name, round_no, runs, sample))
            if round_no:
                result.samples.append(sample)
    del F
    shutil.rmtree(work, ignore_errors=True)
    memory = None
    if not only or "M" in only:
        log("M  peak memory of one read task, by range size (fresh process each):")
        try:
            memory = task_memory(connection, plan, log)
        except TidemarkError as exc:
            memory = {"error": str(exc)}

    ratios, by_round = median_ratios(
        results, ("R3/R4", "R3/R1", "R6/R4w", "R3/R0", "R6/R4", "R3/RF", "R6s/R4w", "R6/R6s")
    )
    doc = {
        "when": datetime.now(UTC).isoformat(),
        "records": records,
        "value_bytes": VALUE_BYTES,
        "partitions": PARTITIONS,
        "runs": runs,
        "warmups": 1,
        "topic": topic,
        "plan_id": plan.plan_id,
        **machine_facts(spark, connector),
        "runners": {k: v.summary() for k, v in results.items()},
        "r6_steps_seconds": step_seconds[1:],  # per measured R6 run (warm-up left out)
        "task_memory": memory,
        "ratios": ratios,
        # The same ratios taken within each round (runners ran back to back), and their median.
        "ratios_by_round": by_round,
        "targets": targets_met(ratios, TARGETS),
    }
    spark.stop()
    return doc


def median_ratios(
    results: Mapping[str, RunnerResult], pairs: Sequence[str]
) -> tuple[dict[str, float | None], dict[str, list[float]]]:
    """For each ``"A/B"`` of ``pairs``: A's median records/s over B's, and the same ratio within each round."""
    ratios: dict[str, float | None] = {}
    by_round: dict[str, list[float]] = {}
    for pair in pairs:
        a, b = (results.get(name) for name in pair.split("/"))
        ratios[pair], by_round[pair] = None, []
        if a is None or b is None or not a.samples or not b.samples:
            continue
        ratios[pair] = round(a.median_rate / b.median_rate, 3)
        if len(a.samples) == len(b.samples):
            by_round[pair] = [
                round((x.records / x.seconds) / (y.records / y.seconds), 3)
                for x, y in zip(a.samples, b.samples, strict=True)
            ]
    return ratios, by_round


def round_line(name: str, round_no: int, runs: int, sample: Sample) -> str:
    """One runner's line of one round, as the benchmarks print it while they run."""
    what = "warm-up" if round_no == 0 else f"run {round_no}/{runs}"
    return (f"{name:<3} {what}: {sample.records / sample.seconds:,.0f} rec/s, {sample.seconds:.2f}s, "
            f"{sample.cpu_seconds:.1f} CPU-s{_split_text(sample.cpu_split)}")  # fmt: skip


def machine_facts(spark: SparkSession, connector: str) -> dict[str, Any]:
    """What a benchmark ran on: Spark's master and version, the Kafka connector, the CPUs."""
    return {"spark_master": spark.sparkContext.master, "spark_version": spark.version,
            "spark_kafka_connector": connector, "cpus": os.cpu_count()}  # fmt: skip


def targets_met(ratios: Mapping[str, float | None], targets: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    return {k: {"target": t, "value": ratios.get(k), "met": (ratios.get(k) or 0) >= t} for k, t in targets.items()}


def print_cpu_splits(doc: dict[str, Any]) -> None:
    for r in doc["runners"].values():
        if r.get("median_cpu_split"):
            print(f"  {r['name']} CPU-s (median) by process:{_split_text(r['median_cpu_split'])}")


def print_ratios(doc: dict[str, Any]) -> None:
    """The ratios of the medians, round by round, and the targets of a benchmark's document."""
    print("ratios of the medians: " + ", ".join(f"{k} = {v}" for k, v in doc["ratios"].items()))
    for k, values in (doc.get("ratios_by_round") or {}).items():
        if values:
            listed = ", ".join(f"{v:.2f}" for v in values)
            print(f"  {k} round by round: {listed} (median {statistics.median(values):.2f})")
    for k, t in doc["targets"].items():
        print(f"target {k} ≥ {t['target']}: {t['value']} → {'met' if t['met'] else 'NOT met'}")


def _split_text(split: dict[str, float] | None) -> str:
    if not split:
        return ""
    return " (" + ", ".join(f"{kind} {seconds:.1f}" for kind, seconds in split.items()) + ")"


def print_report(doc: dict[str, Any]) -> None:
    print(
        f"\nTidemark read benchmark: {doc['records']:,} × {doc['value_bytes']} B over {doc['partitions']} "
        f"partitions, {doc['runs']} runs (+1 warm-up), {doc['cpus']} CPUs, Spark {doc['spark_version']} "
        f"{doc['spark_master']}"
    )
    print(f"{'runner':<5} {'rec/s (median)':>15} {'rec/CPU-s':>11} {'worker RSS MB':>14} {'Kafka read ×':>13}  what")
    for r in doc["runners"].values():
        if r["error"]:
            print(f"{r['name']:<5} {'failed':>15}  {r['error']}")
            continue
        rss = "" if r["peak_worker_rss_mb"] is None else f"{r['peak_worker_rss_mb']:.0f}"
        ratio = "" if r["kafka_payload_read_ratio"] is None else f"{r['kafka_payload_read_ratio']:.2f}"
        print(f"{r['name']:<5} {r['median_records_per_s']:>15,} {r['median_records_per_cpu_s']:>11,} {rss:>14} "
              f"{ratio:>13}  {r['label']}" + (f" ({r['note']})" if r["note"] else ""))  # fmt: skip
    print_cpu_splits(doc)
    print_ratios(doc)
    memory = doc.get("task_memory") or {}
    if memory.get("points"):
        sizes = ", ".join(f"{p['records']:,} → {p['peak_rss_mb']:.0f} MB" for p in memory["points"])
        print(f"one read task's peak RSS by range size: {sizes} (largest/smallest {memory['growth']})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.read", description=__doc__.splitlines()[0] if __doc__ else ""
    )
    parser.add_argument("--quick", action="store_true", help="300k records instead of 5M (CI-friendly)")
    parser.add_argument("--records", type=int, help="dataset size (default 5,000,000; 300,000 with --quick)")
    parser.add_argument("--runs", type=int, default=5, help="measured runs per runner (after 1 warm-up)")
    parser.add_argument("--only", help="comma-separated runners, e.g. R1,R3 (M: task memory by range size)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "docs" / "benchmarks"))
    args = parser.parse_args(argv)
    records = args.records or (300_000 if args.quick else 5_000_000)
    out = Path(args.out)
    only = {s.strip() for s in args.only.split(",")} if args.only else None

    def log(msg: str) -> None:
        print(msg, flush=True)

    doc = run_benchmark(records, max(1, args.runs), out, only, log)
    print_report(doc)
    out.mkdir(parents=True, exist_ok=True)
    stem = "bench-quick" if args.quick and not args.records else f"bench-{'full' if records >= 5_000_000 else records}"
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=2, sort_keys=True))
    charts.save(charts.read_figure(doc), out / f"{stem}.png")
    print(f"wrote {out / f'{stem}.json'} and {out / f'{stem}.png'}")
    failed = [r["name"] for r in doc["runners"].values() if r["error"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
