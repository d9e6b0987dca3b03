"""Hundred-feed benchmark on the distributed shape: ``make bench-celery`` (``BENCH_CELERY_ARGS='--feeds 10'``).

Starts (or reuses) the local Kafka cluster unless ``TIDEMARK_BOOTSTRAP_SERVERS`` names one,
and the Celery shape of :class:`tidemark.devtools.celery.CeleryAirflow` (CeleryExecutor,
broker and results on PostgreSQL, two workers with one task slot each, every worker in
namespaces of its own) with state on an S3 server (s3proxy) and checkpoints in the same
PostgreSQL server; writes ``--feeds`` feed files (each its own 3-partition topic holding
``--records`` records), waits until the dag-processor has parsed them, triggers each
feed's DAG once, all at once, and waits for every run. With ``--records 0`` (the default)
no run starts Spark: the numbers are what Tidemark and Airflow cost per run (three tasks:
plan, the empty read, commit); with records each run also pays a ``spark-submit``.

Prints: total wall time from the first trigger to the last run's end; per run, its
duration and its overhead (duration minus the time its tasks ran: queueing, Celery's
broker polling, the scheduler's loops) as median and p90; and the metadata database's
rows written per run (inserted, updated, deleted, from PostgreSQL's statistics, Airflow's
tables apart from Celery's broker and result tables), with the tables writing most.
Not a test: timings depend on the machine. Needs root (the workers' namespaces).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import yaml

from tidemark.devtools.airflow import project_root

BROKER_TABLES = ("kombu_message", "kombu_queue", "celery_taskmeta", "celery_tasksetmeta")


def _api(base: str, token: str, path: str, body: Any = None, method: str | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    req = urllib.request.Request(base + path, data=data, method=method or ("POST" if data else "GET"), headers=headers)
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def _writes(url: str) -> dict[str, int]:
    """Rows inserted + updated + deleted per table since the server started (PostgreSQL's statistics)."""
    with psycopg.connect(url) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        rows = conn.execute("SELECT relname, n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables").fetchall()
    return {str(name): int(n) for name, n in rows}


def _seconds(start: str | None, end: str | None) -> float:
    if not start or not end:
        return 0.0
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--feeds", type=int, default=100)
    parser.add_argument("--records", type=int, default=0, help="records per feed (0: no Spark application)")
    parser.add_argument("--timeout", type=float, default=3600)
    args = parser.parse_args(argv)

    from tests.support.servers import postgres as pg_local
    from tests.support.servers import s3 as s3_local
    from tidemark.devtools.celery import CeleryAirflow
    from tidemark.devtools.kafka.cluster import LocalCluster
    from tidemark.kafka.admin import KafkaAdmin, Record, produce
    from tidemark.kafka.connection import KafkaConnection

    base = Path(tempfile.mkdtemp(prefix="tidemark-bench-celery-"))
    feeds, dags = base / "feeds", base / "dags"
    feeds.mkdir()
    dags.mkdir()
    (dags / "tidemark_dags.py").write_text((project_root() / "dags" / "tidemark_dags.py").read_text())
    bootstrap = os.environ.get("TIDEMARK_BOOTSTRAP_SERVERS") or LocalCluster().up().bootstrap_servers
    conn = KafkaConnection(bootstrap)
    adapter = KafkaAdmin(conn)
    tag = uuid.uuid4().hex[:6]
    for i in range(args.feeds):
        topic = f"bench-celery-{tag}-{i:03d}"
        adapter.create_topic(topic, 3, replication=1)
        if args.records:
            produce(conn, topic, [Record(value=f"v-{n}".encode(), partition=n % 3) for n in range(args.records)])
        doc = {"topics": [topic], "group": f"g-{topic}", "deserialization": {"format": "string"},
               "output": f"s3://bench/{tag}/out/{i:03d}"}  # fmt: skip
        (feeds / f"bench_{i:03d}.yaml").write_text(yaml.safe_dump(doc))
    pg = pg_local.start()
    s3 = s3_local.start()
    s3.create_bucket("bench")
    database = f"airflow_{tag}"
    with psycopg.connect(pg.url, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {database}")
    db_url = pg.url.rsplit("/", 1)[0] + "/" + database
    airflow = CeleryAirflow(
        home=base / "home", port=0, bootstrap_servers=bootstrap, database_url=db_url,
        extra_env={**s3.env(), "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "TIDEMARK_FEEDS_DIR": str(feeds),
                   "TIDEMARK_STATE_DIR": f"s3://bench/{tag}/state", "TIDEMARK_CHECKPOINT_URL": pg.url,
                   "AIRFLOW__CORE__MAX_ACTIVE_RUNS_PER_DAG": "1"},
    )  # fmt: skip
    try:
        airflow.up()
        token = airflow.token("admin")
        dag_ids = [f"tidemark_bench_{i:03d}" for i in range(args.feeds)]
        deadline = time.monotonic() + 600
        while _api(airflow.url, token, "/api/v2/dags?limit=1000&dag_id_pattern=tidemark_bench")["total_entries"] < len(
            dag_ids
        ):
            if time.monotonic() > deadline:
                raise SystemExit("the feeds' DAGs were not parsed in 600 s")
            time.sleep(2)
        before = _writes(db_url)
        started = time.monotonic()
        runs = {d: _api(airflow.url, token, f"/api/v2/dags/{d}/dagRuns", {"logical_date": None})["dag_run_id"]
                for d in dag_ids}  # fmt: skip
        docs: dict[str, Any] = {}
        while len(docs) < len(runs) and time.monotonic() - started < args.timeout:
            for d, r in runs.items():
                if d not in docs:
                    doc = _api(airflow.url, token, f"/api/v2/dags/{d}/dagRuns/{r}")
                    if doc["state"] in ("success", "failed"):
                        docs[d] = doc
            time.sleep(2)
        wall = time.monotonic() - started
        time.sleep(2)
        after = _writes(db_url)
        durations, overheads, failed = [], [], []
        for d, doc in docs.items():
            if doc["state"] != "success":
                failed.append(d)
            tis = _api(airflow.url, token, f"/api/v2/dags/{d}/dagRuns/{runs[d]}/taskInstances")["task_instances"]
            ran = sum(_seconds(t.get("start_date"), t.get("end_date")) for t in tis)
            duration = _seconds(doc.get("start_date"), doc.get("end_date"))
            durations.append(duration)
            overheads.append(duration - ran)
        delta = {t: after.get(t, 0) - before.get(t, 0) for t in after}
        airflow_rows = sum(n for t, n in delta.items() if t not in BROKER_TABLES)
        broker_rows = sum(n for t, n in delta.items() if t in BROKER_TABLES)
        n = max(len(docs), 1)

        def p90(values: list[float]) -> float:
            return sorted(values)[int(0.9 * (len(values) - 1))] if values else 0.0

        print(f"feeds: {args.feeds}, records per feed: {args.records}, runs: {len(docs)} done, {len(failed)} failed")
        print(f"total wall time: {wall:.0f} s ({wall / n:.1f} s per run, two workers with one slot each)")
        print(f"run duration: median {statistics.median(durations):.1f} s, p90 {p90(durations):.1f} s")
        print(f"per-run overhead (duration minus task time): median {statistics.median(overheads):.1f} s, "
              f"p90 {p90(overheads):.1f} s")  # fmt: skip
        print(f"metadata DB rows written per run: {airflow_rows / n:.0f} (Airflow's tables), "
              f"{broker_rows / n:.0f} (Celery's broker and results)")  # fmt: skip
        top = sorted(delta.items(), key=lambda kv: -kv[1])[:8]
        print("most written: " + ", ".join(f"{t} {v / n:.1f}" for t, v in top if v))
        return 1 if failed or len(docs) < len(runs) else 0
    finally:
        airflow.down(timeout_s=10)
        s3.stop(purge=True)
        pg.stop(purge=True)


if __name__ == "__main__":
    sys.exit(main())
