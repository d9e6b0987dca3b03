"""Metrics and lineage cost: ``python -m tests.bench.observe [--rounds N] [--records N] [--variants ...]``.

Runs a feed DAG (the demo feed's shape and expectations) with ``dag.test`` in a fresh
interpreter, as the e2e tests do, over ``--records`` new records per run, once per variant
and round: ``none`` (``statsd_on`` false, ``[openlineage] disabled``), or parts joined by
``+``: ``statsd`` (Airflow's StatsD client sending to a UDP socket), ``lineage`` (the
OpenLineage provider writing to its file transport), ``thread`` (``[openlineage]
execute_in_thread``: the provider emits from a thread of the task process, not from a
forked child). Each round shifts the variants' order by one; a warm-up round is dropped.
Prints each run's wall-clock and CPU seconds (user + system of the run's processes, which
the machine's other load disturbs less) and per variant the medians, the spread and the
ratio to the first variant; ``--doc PAGE`` appends that table to a Markdown page. Kafka:
``TIDEMARK_*`` variables, else the embedded cluster (``tidemark kafka up``,
``TIDEMARK_KAFKA_HOME``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import yaml

from tests.e2e.test_metrics import RUN_DAG, _received
from tidemark.cli.demo import DEMO_FEED, demo_events
from tidemark.devtools.kafka.cluster import connection_from_env
from tidemark.kafka.admin import KafkaAdmin, produce

ROOT = Path(__file__).resolve().parents[2]


def _airflow_env(home: Path, feeds: Path, connection_extra: dict[str, str]) -> dict[str, str]:
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"), "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW_CONN_TIDEMARK_KAFKA": json.dumps({"conn_type": "kafka", "extra": connection_extra}),
        "AIRFLOW_CONN_TIDEMARK_SPARK": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "GX_ANALYTICS_ENABLED": "False", "TIDEMARK_FEEDS_DIR": str(feeds), "TIDEMARK_STATE_DIR": str(home / "state"),
    }  # fmt: skip
    env.pop("TIDEMARK_BOOTSTRAP_SERVERS", None)
    subprocess.run([str(Path(sys.executable).with_name("airflow")), "db", "migrate"], env=env, check=True,
                   capture_output=True)  # fmt: skip
    return env


# What a variant's parts turn on; ``none`` is all off. ``thread``: the provider emits from a thread of
# the task process instead of a forked child ([openlineage] execute_in_thread).
PARTS = ("statsd", "lineage", "thread")


def _switches(variant: str, statsd_port: int, lineage_file: Path) -> dict[str, str]:
    """Airflow's settings of a variant: ``none`` or parts of :data:`PARTS` joined by ``+``."""
    parts = set() if variant == "none" else set(variant.split("+"))
    if parts - set(PARTS):
        raise SystemExit(f"unknown variant {variant!r}: 'none' or parts of {PARTS} joined by '+'")
    env = {"AIRFLOW__METRICS__STATSD_ON": str("statsd" in parts),
           "AIRFLOW__OPENLINEAGE__DISABLED": str("lineage" not in parts),
           "AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD": str("thread" in parts)}  # fmt: skip
    if "statsd" in parts:
        env.update({"AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1", "AIRFLOW__METRICS__STATSD_PORT": str(statsd_port),
                    "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True"})  # fmt: skip
    if "lineage" in parts:
        env["AIRFLOW__OPENLINEAGE__TRANSPORT"] = json.dumps(
            {"type": "file", "log_file_path": str(lineage_file), "append": True}
        )
    return env


def _run(
    env: dict[str, str], variant: str, lineage_file: Path, log: Path | None = None, profile: Path | None = None
) -> tuple[float, float]:
    """Wall-clock and CPU seconds (user + system, the DAG run's process and the children it waited for).

    ``profile``: cProfile's statistics of the run's own process to that file (forked children not included).
    """
    code = RUN_DAG if profile is None else f"import cProfile\ncProfile.run({RUN_DAG!r}, {str(profile)!r})"
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    switches = _switches(variant, listener.getsockname()[1], lineage_file)
    events_before = len(lineage_file.read_text().splitlines()) if lineage_file.exists() else 0
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", code, "tidemark_observe", str(ROOT / "dags")],
                              env={**env, **switches}, capture_output=True, text=True, check=False)  # fmt: skip
        seconds = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        datagrams = [line for line in _received(listener) if line.startswith("airflow.tidemark.")]
    finally:
        listener.close()
    if log is not None:
        log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if "DAGRUN_STATE=success" not in proc.stdout:
        raise SystemExit(f"the feed DAG failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    # A variant measures what it names only if its switches took: metrics and lineage arrive exactly when on.
    events = (len(lineage_file.read_text().splitlines()) if lineage_file.exists() else 0) - events_before
    on = set() if variant == "none" else set(variant.split("+"))
    if bool(datagrams) != ("statsd" in on) or bool(events) != ("lineage" in on):
        raise SystemExit(f"variant {variant}: {len(datagrams)} Tidemark StatsD datagrams and {events} lineage "
                         "events arrived; its settings did not take effect")  # fmt: skip
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return seconds, cpu


def _table(variants: list[str], wall: dict[str, list[float]], cpu: dict[str, list[float]]) -> str:
    """Markdown: per variant the medians, the spread (fastest to slowest round) and the ratio to the first."""
    base_wall, base_cpu = statistics.median(wall[variants[0]]), statistics.median(cpu[variants[0]])
    rows = ["| variant | wall median | wall spread | vs first | CPU median | CPU spread | vs first |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    for v in variants:
        w, c = statistics.median(wall[v]), statistics.median(cpu[v])
        rows.append(f"| {v} | {w:.1f} s | {min(wall[v]):.1f}-{max(wall[v]):.1f} s | {w / base_wall:.2f}x "
                    f"| {c:.1f} s | {min(cpu[v]):.1f}-{max(cpu[v]):.1f} s | {c / base_cpu:.2f}x |")  # fmt: skip
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=1_000)
    parser.add_argument("--variants", default="none,statsd+lineage,statsd+lineage+thread",
                        help=f"comma-separated, the first is the baseline: 'none' or parts of {PARTS} "
                        "joined by '+'")  # fmt: skip
    parser.add_argument("--keep-logs", action="store_true", help="keep each run's output in the work folder")
    parser.add_argument("--profile", action="store_true", help="and its cProfile statistics (times include the "
                        "profiler's overhead): where a variant's time goes, e.g. in the listener's hooks")  # fmt: skip
    parser.add_argument("--doc", type=Path, help="append the table to this Markdown page")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    for variant in variants:
        _switches(variant, 0, Path())
    connection = connection_from_env()
    work = Path(tempfile.mkdtemp(prefix="tidemark-bench-observe-"))
    topic = f"bench-observe-{uuid.uuid4().hex[:8]}"
    KafkaAdmin(connection).create_topic(topic, partitions=3)
    feeds = work / "feeds"
    feeds.mkdir()
    feed = {**yaml.safe_load((ROOT / "include" / "feeds" / f"{DEMO_FEED}.yaml").read_text()),
            "topics": [topic], "group": f"g-bench-observe-{uuid.uuid4().hex[:8]}", "output": str(work / "out"),
            "schedule": "@daily"}  # fmt: skip
    (feeds / "observe.yaml").write_text(yaml.safe_dump(feed))
    env = _airflow_env(work / "airflow", feeds, connection.client_config())
    wall: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    loads = []
    sent = 0
    for round_no in range(args.rounds + 1):
        # Each round shifts the order by one, so no variant always runs first or after the same one.
        for variant in variants[round_no % len(variants) :] + variants[: round_no % len(variants)]:
            sent += produce(connection, topic, demo_events(args.records, start_id=sent))
            name = work / f"run-{round_no}-{variant}"
            seconds, cpu_seconds = _run(env, variant, work / "lineage.jsonl",
                                        name.with_suffix(".log") if args.keep_logs or args.profile else None,
                                        name.with_suffix(".prof") if args.profile else None)  # fmt: skip
            loads.append(os.getloadavg()[0])
            print(f"round {round_no}{' (warm-up)' if round_no == 0 else ''}: {variant} {seconds:.1f} s, "
                  f"CPU {cpu_seconds:.1f} s, load {loads[-1]:.1f}", flush=True)  # fmt: skip
            if round_no:
                wall[variant].append(seconds)
                cpu[variant].append(cpu_seconds)
    table = _table(variants, wall, cpu)
    summary = (f"{args.records} records/run, {args.rounds} rounds after a warm-up, 1-minute load average "
               f"{min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores")  # fmt: skip
    print(f"{summary}\n{table}")
    if args.doc:
        command = "python -m tests.bench.observe " + " ".join(argv if argv is not None else sys.argv[1:])
        with args.doc.open("a") as page:
            page.write(f"\n### {datetime.date.today().isoformat()}: `{command}`\n\n{summary}.\n\n{table}\n")
    if args.keep_logs or args.profile:
        print(f"task logs (and profiles) in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
