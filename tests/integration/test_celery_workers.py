"""A feed, a backfill and a replay on a real distributed Airflow: two Celery workers, no shared disk.

:class:`tidemark.devtools.celery.CeleryAirflow` (the code behind ``make airflow-celery``) runs
the CeleryExecutor with its broker and result backend on the session's PostgreSQL, an
api-server, a scheduler, a dag-processor and two Celery workers, each in mount and UTS
namespaces of its own (a private ``/tmp`` holding its home; its own hostname, which Airflow
records for every task try it runs). State and output are on the S3 server, checkpoints in
PostgreSQL: a task finds nothing another task wrote locally. A cluster policy
(tests/support/celery_settings) puts each run's plan on worker 1; the Spark task and the
commit go to whichever worker takes them.

The feed's run has its worker killed mid-task (every process of its namespace, the Spark
task's ``spark-submit`` with it, SIGKILL, as a machine dies): the scheduler fails the try
once its heartbeats stop and the retry runs on the other worker. The output must then be
exactly what an independent ``read_committed`` scan of the committed offsets holds, each
record once (the fault suite's oracle, :meth:`tests.faults.harness.FaultEnv.check`). The
backfill and the replay then each publish every record once beside the output.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import S3_BUCKET, KafkaTestCluster
from tests.faults.harness import FaultEnv
from tests.support.celery_settings.airflow_local_settings import PLAN_QUEUE
from tests.support.servers.s3 import LocalS3
from tidemark.checkpoints.store import URL_ENV
from tidemark.devtools.airflow import project_root
from tidemark.devtools.celery import CeleryAirflow
from tidemark.storage import Location, s3_settings

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# A feed name of its own: the checkpoint store (the session's PostgreSQL) keeps runs by feed name, and the fault
# suite's feeds on that server are all "faults"; their runs are no runs of this feed.
FEED = "celery_faults"
DAG = f"tidemark_{FEED}"
SPARK_TASK = "read_validate_publish"
SETTINGS = Path(__file__).parents[1] / "support" / "celery_settings"


@dataclass
class Shape:
    airflow: CeleryAirflow
    env: FaultEnv
    token: str

    def request(self, path: str, body: Any = None, method: str | None = None) -> Any:
        import urllib.request

        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.airflow.url + path, data=data, method=method or ("POST" if data is not None else "GET"),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        doc = self.request(f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})
        return str(doc["dag_run_id"])

    def tries(self, dag_id: str, run_id: str, task_id: str) -> list[dict[str, Any]]:
        """Every try of one task: state and the hostname of the worker that ran it."""
        doc = self.request(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/tries")
        return sorted(doc["task_instances"], key=lambda t: int(t["try_number"]))

    def wait_run(self, dag_id: str, run_id: str, timeout_s: float = 420) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                state = self.request(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"]
            except TimeoutError:  # an api-server slow to answer on a loaded machine: ask again
                continue
            if state in ("success", "failed"):
                return str(state)
            time.sleep(1)
        raise AssertionError(f"{dag_id} {run_id} not finished in {timeout_s:.0f}s; {self.diagnose()}")

    def where(self, dag_id: str, run_id: str) -> dict[str, list[tuple[str, str]]]:
        """Per task, (hostname, state) of each try."""
        return {task: [(t["hostname"], t["state"]) for t in self.tries(dag_id, run_id, task)]
                for task in ("plan", SPARK_TASK, "commit")}  # fmt: skip

    def diagnose(self) -> str:
        """First the errors and warnings of every task log a living worker holds (a failed task says why only there),
        then the tail of each service's log."""
        text = []
        for worker in self.airflow.worker_names():
            try:
                tasks = sorted(self.airflow.worker_file(worker, "home/logs").rglob("attempt=*.log"))
            except (KeyError, OSError):  # a killed worker's files are gone with its namespace
                continue
            for p in tasks:
                lines = p.read_text(errors="replace").splitlines()
                said = [line[:1500] for line in lines if '"level":"error"' in line or '"level":"warning"' in line]
                text.append(f"--- {worker}: {p.relative_to(p.parents[3])}\n" + "\n".join(said[-20:] or lines[-3:]))
        logs = sorted((self.airflow.home / "logs").glob("*.log"))
        text += [f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in logs]
        return "\n".join(text)


def _database(postgres: str) -> str:
    """A database of its own on the session's server for Airflow's metadata, Celery's broker and results."""
    name = f"airflow_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="module")
def shape(
    kafka: KafkaTestCluster, postgres: str, s3: LocalS3, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Shape]:
    base = tmp_path_factory.mktemp("celery")
    s3_settings()  # the SDK's checksum settings s3proxy needs, before this process's first S3 call (the oracle's)
    env = FaultEnv(kafka, None, base, "celery", remote=f"s3://{S3_BUCKET}/celery-{uuid.uuid4().hex[:12]}", feed=FEED)
    env.write_feed(records_per_task=2000)  # one Spark task per partition
    dags = base / "dags"
    dags.mkdir()
    shutil.copy(project_root() / "dags" / "tidemark_dags.py", dags / "tidemark_dags.py")
    airflow = CeleryAirflow(
        home=base / "home",
        port=0,
        bootstrap_servers=kafka.bootstrap_servers,
        database_url=_database(postgres),
        queues={1: f"{PLAN_QUEUE},default", 2: "default"},
        heartbeat_timeout_s=15,  # a dead worker's task is failed (and retried) after 15 s, not 5 min
        unpause=False,
        extra_env={
            **s3.env(),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW_CONN_TIDEMARK_SPARK": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            "TIDEMARK_FEEDS_DIR": str(env.feeds),
            "TIDEMARK_STATE_DIR": str(env.root),
            URL_ENV: postgres,
            "PYTHONPATH": os.pathsep.join([str(SETTINGS), str(project_root())]),
        },
    )
    try:
        airflow.up()
        shape = Shape(airflow, env, airflow.token("admin"))
        deadline = time.monotonic() + 180
        for dag_id in (DAG, "tidemark_backfill", "tidemark_replay"):
            while True:
                try:
                    shape.request(f"/api/v2/dags/{dag_id}", {"is_paused": False}, method="PATCH")
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"{dag_id} not parsed in 180 s; {shape.diagnose()}") from None
                    time.sleep(2)
        yield shape
    finally:
        airflow.down(timeout_s=10)


def _spark_submit_in(airflow: CeleryAirflow, worker: str) -> bool:
    """Whether ``worker``'s namespace runs a spark-submit (the Spark task's driver JVM)."""
    for pid in airflow.namespace_pids(worker):
        try:
            if b"SparkSubmit" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def test_a_worker_killed_mid_spark_task_is_retried_on_the_other_and_publishes_once(shape: Shape) -> None:
    airflow, env = shape.airflow, shape.env
    hosts = {airflow.hostname(w): w for w in airflow.worker_names()}
    env.produce(6_000, bad=(11, 4_000))
    run_id = shape.trigger(DAG)
    # The Spark task's first try starts on some worker; once its spark-submit runs there, that machine dies.
    deadline = time.monotonic() + 300
    victim = None
    while victim is None and time.monotonic() < deadline:
        try:
            tries = shape.tries(DAG, run_id, SPARK_TASK)
        except OSError:  # no task instance yet (404)
            tries = []
        running = [t for t in tries if t["state"] == "running" and t["hostname"] in hosts]
        if running and _spark_submit_in(airflow, hosts[running[0]["hostname"]]):
            time.sleep(1)  # spark-submit's driver is starting: the task is mid-way, nothing published yet
            victim = hosts[running[0]["hostname"]]
        else:
            time.sleep(0.5)
    assert victim is not None, f"the Spark task never started on a worker; {shape.diagnose()}"
    killed = airflow.kill_worker(victim)
    assert killed

    assert shape.wait_run(DAG, run_id) == "success", shape.diagnose()
    where = shape.where(DAG, run_id)
    spark = where[SPARK_TASK]
    # Try 1 died with its worker, try 2 ran on the other one; the plan ran on worker 1 (its queue).
    assert [h for h, _ in spark] == [airflow.hostname(victim), *(h for h in hosts if hosts[h] != victim)], where
    assert spark[-1][1] == "success" and spark[0][1] == "failed", where
    assert where["plan"] == [(airflow.hostname("worker-1"), "success")], where
    assert {h for h, _ in where["commit"]} <= set(hosts) - {airflow.hostname(victim)}, where
    # Every record the group committed is in the output once, good ones apart from bad ones.
    assert env.committed() == {0: 2_000, 1: 2_000, 2: 2_000}
    assert env.check("celery-kill").checked == 6_000
    airflow.start_worker(victim)  # the dead machine replaced: a fresh, empty /tmp


@pytest.mark.extended  # two more runs of three Celery tasks each: about 4-5 min on a shared 2-core box
def test_a_backfill_and_a_replay_run_across_the_workers_and_publish_each_record_once(shape: Shape) -> None:
    airflow, env = shape.airflow, shape.env
    start = datetime.now(UTC) - timedelta(seconds=2)
    env.produce(600, bad=(3,))
    end = datetime.now(UTC) + timedelta(seconds=1)
    time.sleep(2)
    backfill = shape.trigger("tidemark_backfill", {
        "feed": FEED, "start_timestamp": start.isoformat(), "end_timestamp": end.isoformat(),
        "window_mode": "offset_cut"})  # fmt: skip
    assert shape.wait_run("tidemark_backfill", backfill) == "success", shape.diagnose()
    replay = shape.trigger("tidemark_replay", {"feed": FEED, "start_from": "earliest", "end_at": "latest",
                                               "dry_run": False})  # fmt: skip
    assert shape.wait_run("tidemark_replay", replay) == "success", shape.diagnose()
    hosts = {airflow.hostname(w) for w in airflow.worker_names()}
    for dag_id, run_id in (("tidemark_backfill", backfill), ("tidemark_replay", replay)):
        where = shape.where(dag_id, run_id)
        assert where["plan"] == [(airflow.hostname("worker-1"), "success")], where
        assert all(h in hosts for tries in where.values() for h, _ in tries), where
    # The backfill holds the 600 records of its window, the replay every record of the topic: each exactly
    # once, as the independent read_committed scan of those ranges has them.
    before = {p: (env.sent - 600) // env.partitions for p in range(env.partitions)}
    after = {p: env.sent // env.partitions for p in range(env.partitions)}
    for output, ranges in ((f"{env.output}.backfills", {(env.topic, p): (before[p], after[p]) for p in after}),
                           (f"{env.output}.replays", {(env.topic, p): (0, after[p]) for p in after})):  # fmt: skip
        expected, _ = env.expect(ranges)
        assert env.published(Location.of(output)) == expected, output
