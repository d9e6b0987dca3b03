"""Small-run benchmark: ``python -m tests.bench.small [--quick]``.

Periodic feeds mostly run small, so what a run costs before it reads anything matters
more than its records per second. For each size (0, 1,000 and 100,000 JSON order events,
the demo feed's shape and expectations, default task size) every measured round times, side by side:

- **T**  ``tidemark run FEED`` in a fresh process, end to end: plan, ``spark-submit`` of
         the job (read, decode, validate with the demo feed's GX suite, publish), commit,
         report. Nothing new to read starts no Spark.
- **S**  Spark's built-in Kafka source in its own ``spark-submit`` (JVM start included,
         like T) reading exactly the offsets T just read and writing the same Parquet
         layout (``topic``/``date`` folders), with no validation and no commit.

Each round produces the size's records, runs T (which commits them), then S over T's
ranges; the order of T and S alternates between rounds so that neither always runs on
a warmer machine. One warm-up round per size is dropped. Reported: medians, the ratio
S/T of the medians (≥ 1.0: Tidemark at least as fast) and the ratios within each round,
plus the job's own step timings for T. Results go to ``docs/benchmarks/bench-small[-quick].json``
and a chart beside it. ``--quick`` (0 and 1,000 records, one round) runs in the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from tests.bench import charts
from tests.support.kafka import KafkaTestAdmin
from tidemark.cli.demo import DEMO_FEED, DEMO_PARTITIONS, demo_events
from tidemark.config.models import package_root
from tidemark.devtools.kafka.cluster import connection_from_env
from tidemark.errors import TidemarkError
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.admin import produce
from tidemark.kafka.connection import KafkaConnection, from_env

SIZES = (0, 1_000, 100_000)
QUICK_SIZES = (0, 1_000)
FEED = "small"
# Issue 12's targets: T's seconds for 0 records; S/T for the others (and T's seconds for 1,000).
TARGET_EMPTY_S = 5.0
TARGET_SMALL_S = 15.0
TARGET_RATIO = 1.0


@dataclass
class SizeResult:
    records: int
    tidemark_s: list[float] = field(default_factory=list)
    spark_s: list[float] = field(default_factory=list)
    job_steps: list[dict[str, float]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        t, s = statistics.median(self.tidemark_s), statistics.median(self.spark_s)
        steps = sorted({k for d in self.job_steps for k in d})
        return {
            "records": self.records,
            "tidemark_s": round(t, 2),
            "spark_s": round(s, 2),
            "ratio": round(s / t, 3),
            "ratios_by_round": [round(b / a, 3) for a, b in zip(self.tidemark_s, self.spark_s, strict=True)],
            "tidemark_rounds_s": [round(x, 2) for x in self.tidemark_s],
            "spark_rounds_s": [round(x, 2) for x in self.spark_s],
            "job_steps_s": {k: round(statistics.median(d.get(k, 0.0) for d in self.job_steps), 2) for k in steps},
        }


class SmallRunBench:
    """A topic of the demo feed's shape, a feed over it, and the two runners."""

    def __init__(self, connection: KafkaConnection, work: Path, log: Callable[[str], None]) -> None:
        self.connection, self.work, self.log = connection, work, log
        self.topic = f"tidemark-small-{uuid.uuid4().hex[:8]}"
        self.feeds, self.state = work / "feeds", work / "state"
        self.feeds.mkdir(parents=True)
        adapter = KafkaTestAdmin(connection)
        brokers = len(adapter.admin.list_topics(timeout=10).brokers)
        adapter.create_topic(self.topic, DEMO_PARTITIONS, replication=min(3, brokers))
        feed = yaml.safe_load((package_root() / "feeds" / f"{DEMO_FEED}.yaml").read_text())
        feed.update(topics=[self.topic], group=f"{self.topic}-group", output=str(work / "tidemark-out"))
        feed["max_records_per_partition"] = max(SIZES)
        # The demo splits its few hundred records into 500-record tasks to show several; a
        # feed sized like these runs keeps the default (at 100,000 records that is 200 tasks,
        # each with its own consumer, against one per leader broker).
        feed.pop("records_per_task", None)
        (self.feeds / f"{FEED}.yaml").write_text(yaml.safe_dump(feed))
        self.sent = 0
        self.env = {
            **os.environ,
            **connection.to_env(),
            "TIDEMARK_FEEDS_DIR": str(self.feeds),
            "TIDEMARK_STATE_DIR": str(self.state),
            "PYSPARK_PYTHON": sys.executable,
        }

    def produce(self, records: int) -> None:
        if records:
            self.sent += produce(self.connection, self.topic, demo_events(records, start_id=self.sent))

    def tidemark_once(self, records: int) -> tuple[float, dict[str, Any], dict[str, Any]]:
        """``tidemark run`` in a fresh process: seconds, the job's result, the plan."""
        before = set(self._run_dirs())
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "tidemark.cli", "run", FEED], env=self.env, capture_output=True, text=True
        )
        seconds = time.monotonic() - started
        if proc.returncode != 0:
            raise TidemarkError(f"tidemark run failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        (run_dir,) = set(self._run_dirs()) - before
        job = json.loads((run_dir / "job.json").read_text())
        plan = json.loads((run_dir / "plan.json").read_text())
        if job["records_read"] != records:
            raise TidemarkError(f"tidemark run read {job['records_read']} records, expected {records}")
        return seconds, job, plan

    def spark_once(self, plan: dict[str, Any], jars: Sequence[Path], records: int) -> float:
        """Spark's Kafka source in its own ``spark-submit`` over ``plan``'s ranges, to Parquet."""
        target = self.work / f"spark-out-{time.time_ns()}"
        ranges = {str(p["partition"]): [p["start"], p["end"]] for p in plan["partitions"]}
        cmd = [
            str(Path(sys.executable).with_name("spark-submit")), "--master",
            os.environ.get("TIDEMARK_SPARK_MASTER", "local[*]"), "--name", "bench-small-spark-kafka",
            "--conf", "spark.ui.enabled=false", "--conf", f"spark.pyspark.python={sys.executable}",
            "--jars", ",".join(str(j) for j in jars), __file__, "spark-side",
            "--topic", self.topic, "--ranges", json.dumps(ranges), "--out", str(target),
        ]  # fmt: skip
        # spark-submit runs this file as a script: the repository root must be importable for ``tests.bench``.
        root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (root, self.env.get("PYTHONPATH", "")) if p)
        env = {**self.env, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": path}
        started = time.monotonic()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        seconds = time.monotonic() - started
        if proc.returncode != 0:
            raise TidemarkError(f"Spark's Kafka source failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        written = _parquet_rows(target)
        shutil.rmtree(target, ignore_errors=True)
        if written != records:
            raise TidemarkError(f"Spark's Kafka source wrote {written} records, expected {records}")
        return seconds

    def _run_dirs(self) -> list[Path]:
        return [p for p in (self.state / "runs" / FEED).glob("*") if p.is_dir()]


def _parquet_rows(root: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).metadata.num_rows for p in root.rglob("*.parquet"))


def spark_side(argv: Sequence[str]) -> int:
    """S inside ``spark-submit``: read the ranges with Spark's Kafka source, write Parquet."""
    parser = argparse.ArgumentParser(prog="bench_small spark-side")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--ranges", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    from pyspark.sql import SparkSession

    from tidemark.output.staging import utc_date

    spark = SparkSession.builder.config("spark.sql.session.timeZone", "UTC").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    ranges = {int(p): r for p, r in json.loads(args.ranges).items()}
    reader = (
        spark.read.format("kafka")
        .option("assign", json.dumps({args.topic: sorted(ranges)}))
        .option("startingOffsets", json.dumps({args.topic: {str(p): r[0] for p, r in ranges.items()}}))
        .option("endingOffsets", json.dumps({args.topic: {str(p): r[1] for p, r in ranges.items()}}))
        .option("includeHeaders", "true")
        .option("kafka.isolation.level", "read_committed")
    )
    for key, value in from_env().client_config().items():
        reader = reader.option(f"kafka.{key}", str(value))
    df = reader.load().withColumnRenamed("timestampType", "timestamp_type").withColumn("date", utc_date())
    df.write.partitionBy("topic", "date").parquet(args.out)
    spark.stop()
    return 0


def run_benchmark(
    sizes: Sequence[int], runs: int, warmups: int, connection: KafkaConnection, log: Callable[[str], None]
) -> dict[str, Any]:
    from tests.bench.read import spark_kafka_jars

    jars, connector = spark_kafka_jars(log)
    work = Path(tempfile.mkdtemp(prefix="tidemark-bench-small-"))
    try:
        bench = SmallRunBench(connection, work, log)
        results = {n: SizeResult(n) for n in sizes}
        for n in sizes:
            for round_no in range(warmups + runs):
                bench.produce(n)
                tidemark_first = round_no % 2 == 0
                t = s = 0.0
                plan: dict[str, Any] = {}
                job: dict[str, Any] = {}
                for side in ("T", "S") if tidemark_first else ("S", "T"):
                    if side == "T":
                        t, job, plan = bench.tidemark_once(n)
                    else:
                        # S reads what T reads; when S goes first it reads the same new offsets T will.
                        s = bench.spark_once(plan or _next_plan(bench), jars, n)
                measured = round_no >= warmups
                log(f"{n:>7} records, round {round_no + 1 - warmups if measured else 'warm-up'}: "
                    f"tidemark {t:.1f}s, spark kafka source {s:.1f}s")  # fmt: skip
                if measured:
                    results[n].tidemark_s.append(t)
                    results[n].spark_s.append(s)
                    results[n].job_steps.append({k: float(v) for k, v in job.get("timings_s", {}).items()})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = [results[n].summary() for n in sizes]
    return {
        "when": datetime.now(UTC).isoformat(),
        "sizes": list(sizes),
        "runs": runs,
        "warmups": warmups,
        "spark_kafka_connector": connector,
        "cores": os.cpu_count(),
        "table": table,
        "targets": _targets(table),
    }


def _next_plan(bench: SmallRunBench) -> dict[str, Any]:
    """The ranges ``tidemark run`` is about to read: the group's committed offsets to the ends."""
    adapter = KafkaAdapter(bench.connection)
    tps = [(bench.topic, p) for p in range(DEMO_PARTITIONS)]
    committed = adapter.committed(f"{bench.topic}-group", tps)
    ends = adapter.end_offsets(tps, "read_committed")
    starts = {tp: (c.offset if c is not None and c.offset is not None else 0) for tp, c in committed.items()}
    return {"partitions": [{"partition": p, "start": starts.get((t, p), 0), "end": ends[(t, p)]} for t, p in tps]}


def _targets(table: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    by_size = {row["records"]: row for row in table}
    out: dict[str, dict[str, Any]] = {}
    if 0 in by_size:
        out["0 records: tidemark seconds"] = _target(by_size[0]["tidemark_s"], TARGET_EMPTY_S, below=True)
    if 1_000 in by_size:
        out["1,000 records: tidemark seconds"] = _target(by_size[1_000]["tidemark_s"], TARGET_SMALL_S, below=True)
        out["1,000 records: spark/tidemark"] = _target(by_size[1_000]["ratio"], TARGET_RATIO)
    if 100_000 in by_size:
        out["100,000 records: spark/tidemark"] = _target(by_size[100_000]["ratio"], TARGET_RATIO)
    return out


def _target(value: float, target: float, *, below: bool = False) -> dict[str, Any]:
    return {"value": value, "target": target, "met": value < target if below else value >= target}


def print_report(doc: dict[str, Any]) -> None:
    print(f"\nsmall runs: medians of {doc['runs']} interleaved rounds ({doc['warmups']} warm-up dropped), "
          f"{doc['cores']} cores")  # fmt: skip
    print(f"{'records':>9} {'tidemark s':>11} {'spark s':>9} {'spark/tidemark':>15}  rounds")
    for row in doc["table"]:
        print(f"{row['records']:>9,} {row['tidemark_s']:>11.2f} {row['spark_s']:>9.2f} {row['ratio']:>15.3f}  "
              f"{row['ratios_by_round']}")  # fmt: skip
    for row in doc["table"]:
        steps = ", ".join(f"{k} {v}s" for k, v in row["job_steps_s"].items())
        print(f"  tidemark job steps at {row['records']:,}: {steps or 'no Spark application'}")
    for name, t in doc["targets"].items():
        sign = "<" if "seconds" in name else "≥"
        print(f"  {name}: {t['value']} (target {sign} {t['target']}): {'met' if t['met'] else 'NOT met'}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["spark-side"]:
        return spark_side(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m tests.bench.small", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="0 and 1,000 records, one round, no warm-up")
    parser.add_argument("--sizes", default=None, help="comma-separated record counts (default 0,1000,100000)")
    parser.add_argument("--runs", type=int, default=None, help="measured rounds per size (default 5; quick 1)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default docs/benchmarks)")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.sizes.split(",")] if args.sizes else QUICK_SIZES if args.quick else SIZES
    runs = args.runs or (1 if args.quick else 5)
    warmups = 0 if args.quick else 1
    connection = connection_from_env()

    def log(message: str) -> None:
        print(message, flush=True)

    doc = run_benchmark(sizes, runs, warmups, connection, log)
    print_report(doc)
    out = args.out or package_root().parent / "docs" / "benchmarks"
    out.mkdir(parents=True, exist_ok=True)
    name = "bench-small-quick" if args.quick else "bench-small"
    (out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    charts.save(charts.small_runs_figure(doc), out / f"{name}.png")
    print(f"wrote {out / name}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
