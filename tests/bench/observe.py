"""Metrics and lineage cost: ``python -m tests.bench.observe [--rounds N] [--records N]``.

Runs a feed DAG (the demo feed's shape and expectations) with ``dag.test`` in a fresh
interpreter, as the e2e tests do, over ``--records`` new records per run: once with
Airflow's StatsD client sending to a UDP socket and the OpenLineage provider writing to
its file transport ("on"), once with both off (``statsd_on`` false, ``[openlineage]
disabled``). The order alternates between rounds; one warm-up pair is dropped. Prints
the wall-clock seconds of each run and the medians side by side. Kafka: ``TIDEMARK_*``
variables, else the embedded cluster (``tidemark kafka up``).
"""

from __future__ import annotations

import argparse
import json
import os
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

from tests.e2e.test_metrics import RUN_DAG
from tidemark.cli.demo import DEMO_FEED, demo_events
from tidemark.devtools.kafka.cluster import connection_from_env
from tidemark.kafka.adapter import KafkaAdapter, produce

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


def _run(env: dict[str, str], observed: bool, lineage_file: Path) -> float:
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    switches = (
        {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
         "AIRFLOW__METRICS__STATSD_PORT": str(listener.getsockname()[1]),
         "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True",
         "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(lineage_file),
                                                       "append": True})}
        if observed
        else {"AIRFLOW__METRICS__STATSD_ON": "False", "AIRFLOW__OPENLINEAGE__DISABLED": "True"}
    )  # fmt: skip
    try:
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", RUN_DAG, "tidemark_observe", str(ROOT / "dags")],
                              env={**env, **switches}, capture_output=True, text=True, check=False)  # fmt: skip
        seconds = time.monotonic() - started
    finally:
        listener.close()
    if "DAGRUN_STATE=success" not in proc.stdout:
        raise SystemExit(f"the feed DAG failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=1_000)
    args = parser.parse_args(argv)
    connection = connection_from_env()
    work = Path(tempfile.mkdtemp(prefix="tidemark-bench-observe-"))
    topic = f"bench-observe-{uuid.uuid4().hex[:8]}"
    KafkaAdapter(connection).create_topic(topic, partitions=3)
    feeds = work / "feeds"
    feeds.mkdir()
    feed = {**yaml.safe_load((ROOT / "include" / "feeds" / f"{DEMO_FEED}.yaml").read_text()),
            "topics": [topic], "group": f"g-bench-observe-{uuid.uuid4().hex[:8]}", "output": str(work / "out"),
            "schedule": "@daily"}  # fmt: skip
    (feeds / "observe.yaml").write_text(yaml.safe_dump(feed))
    env = _airflow_env(work / "airflow", feeds, connection.client_config())
    times: dict[bool, list[float]] = {True: [], False: []}
    sent = 0
    for round_no in range(args.rounds + 1):
        for observed in (True, False) if round_no % 2 else (False, True):
            sent += produce(connection, topic, demo_events(args.records, start_id=sent))
            seconds = _run(env, observed, work / "lineage.jsonl")
            print(f"round {round_no}{' (warm-up)' if round_no == 0 else ''}: {'on ' if observed else 'off'} "
                  f"{seconds:.1f} s", flush=True)  # fmt: skip
            if round_no:
                times[observed].append(seconds)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"{args.records} records/run, {args.rounds} rounds: median on {on:.1f} s, off {off:.1f} s, "
          f"difference {on - off:+.1f} s ({(on - off) / off:+.1%})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
