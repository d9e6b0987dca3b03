"""Spark across machines without a shared disk: the worker sees none of the driver's files.

The worker (and so its executors and their Python workers) runs in a mount namespace of
its own with a private ``/tmp`` and its own work and scratch folders
(:func:`tests.support.servers.spark.start` with ``private_tmp``), as on a cluster whose
machines share no disk. State and output are on a real S3 server (s3proxy), checkpoints
and the Iceberg catalog in PostgreSQL, and each run goes through ``spark-submit`` to the
cluster. A Parquet feed and an Iceberg feed each publish exactly the records an independent
``read_committed`` scan of the committed offsets holds, good ones in the output and bad
ones in its quarantine (the fault suite's oracle, :meth:`tests.faults.harness.FaultEnv.check`),
commit the plan's ends, and a second run adds nothing; the S3 secret appears nowhere Spark
records anything. An executor killed mid-write leaves offsets and output untouched, and the
rerun publishes once. The executors stage on the object
store through Hadoop's s3a connector, whose jars ``spark-submit --jars`` ships to them
(``TIDEMARK_S3A_JARS``); s3proxy runs on its in-memory backend, where s3a's commit renames work.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import S3_BUCKET, KafkaTestCluster
from tests.faults.harness import FaultEnv
from tests.integration.spark.test_spark_cluster import _files_with
from tests.support.servers import spark as spark_local
from tests.support.servers.s3 import LocalS3
from tests.support.servers.spark import LocalSpark
from tidemark.checkpoints.store import URL_ENV
from tidemark.errors import TidemarkError
from tidemark.output.iceberg import CATALOG_URI_ENV
from tidemark.storage import Location

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture(scope="module")
def apart_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSpark]:
    """One standalone cluster whose worker has a /tmp of its own, shared by the module's tests."""
    cluster = spark_local.start(tmp_path_factory.mktemp("spark-apart"), cores=2, private_tmp=True)
    try:
        yield cluster
    finally:
        cluster.stop(purge=True)


@pytest.fixture
def apart_s3(s3a_store: LocalS3, s3a_jars: Path, monkeypatch: pytest.MonkeyPatch) -> LocalS3:
    """The session's S3 server that s3a can commit to, in this test's environment (``spark-submit`` inherits it)."""
    for key, value in s3a_store.env().items():
        monkeypatch.setenv(key, value)
    return s3a_store


# Iceberg on a cluster with S3 and PostgreSQL runs in `make test` too (tests/integration/test_iceberg_runs.py);
# its variant here, without a shared disk, is left to `make test-extended`.
@pytest.mark.parametrize("kind", ["parquet", pytest.param("iceberg", marks=pytest.mark.extended)])
def test_a_cluster_without_a_shared_disk_publishes_each_record_once(
    kind: str, apart_cluster: LocalSpark, apart_s3: LocalS3, kafka: KafkaTestCluster, postgres: str,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    env = FaultEnv(kafka, None, tmp_path, f"apart-{kind}", remote=f"s3://{S3_BUCKET}/apart-{uuid.uuid4().hex[:12]}")
    if kind == "iceberg":
        env.use_iceberg(f"apart.t{uuid.uuid4().hex[:10]}")
    for key, value in {"TIDEMARK_FEEDS_DIR": str(env.feeds), "TIDEMARK_STATE_DIR": str(env.root),
                       URL_ENV: postgres, CATALOG_URI_ENV: postgres}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    for key in ("TIDEMARK_STAGING_DIR", "TIDEMARK_SHIP_PACKAGE", "TIDEMARK_FAULTS"):
        monkeypatch.delenv(key, raising=False)
    events = _event_log(tmp_path, monkeypatch)
    # The premise: this test's folder (and every other file under the driver's /tmp) is not
    # there for the worker and the processes it starts.
    assert tmp_path.is_dir() and not Path(f"/proc/{apart_cluster.worker_pid}/root{tmp_path}").exists()

    env.produce(90, bad=(7, 40))
    handle, job, outcome = env.run(master=apart_cluster.master_url)

    assert job["published"] and job["records_read"] == 90, job
    assert job["spark"]["master"] == apart_cluster.master_url
    ends = {p.partition: p.end for p in handle.plan().partitions}
    assert outcome.committed and env.committed() == ends == {0: 30, 1: 30, 2: 30}
    checked = env.check(f"apart-{kind}")  # the whole output against the read_committed scan
    assert checked.checked == 90
    if kind == "iceberg":
        from tidemark.config.models import load_feed
        from tidemark.output.iceberg import IcebergPublisher, plan_history

        def publications() -> int:
            table = IcebergPublisher(load_feed(env.feed)).load()
            return 0 if table is None else len(plan_history(table))
    else:

        def publications() -> int:
            return len([c for c in Location.of(str(env.output)).children() if c.name.startswith("plan_id=")])

    assert publications() == 1

    again, job_again, _ = env.run(master=apart_cluster.master_url)
    assert again.records == 0 and not job_again.get("records_published"), job_again
    assert env.committed() == ends
    assert env.check(f"apart-{kind}").checked == 90
    assert publications() == 1

    # The S3 secret reached the executors inside their tasks: nowhere Spark records anything.
    assert list(events.iterdir())
    secret = apart_s3.secret_key.encode()
    leaks = {"event log": _files_with(events, secret), "master/worker logs": _files_with(apart_cluster.log_dir, secret),
             "executors' folders": _files_with(_worker_view(apart_cluster), secret)}  # fmt: skip
    assert leaks == {k: [] for k in leaks}
    assert _files_with(_worker_view(apart_cluster), b"Running task")  # the executors' logs were searched


def test_an_executor_killed_mid_write_leaves_offsets_and_output_untouched(
    apart_cluster: LocalSpark, apart_s3: LocalS3, kafka: KafkaTestCluster, postgres: str,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """SIGKILL to the executor JVM while the write stage runs; one task failure fails the job."""
    env = FaultEnv(kafka, None, tmp_path, "apart-kill", remote=f"s3://{S3_BUCKET}/apart-{uuid.uuid4().hex[:12]}")
    env.write_feed(driver_read_max_records=0, records_per_task=4000)  # the executors read Kafka while they write
    for key, value in {"TIDEMARK_FEEDS_DIR": str(env.feeds), "TIDEMARK_STATE_DIR": str(env.root),
                       URL_ENV: postgres}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TIDEMARK_FAULTS", raising=False)
    _event_log(tmp_path, monkeypatch, "spark.task.maxFailures 1\n")
    env.produce(24_000)
    staging = Location.of(f"{env.output}/_staging")
    failed: list[BaseException] = []

    def run() -> None:
        try:
            env.run(master=apart_cluster.master_url)
        except TidemarkError as exc:
            failed.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    killed = None
    deadline = time.monotonic() + 300
    while killed is None and runner.is_alive() and time.monotonic() < deadline:
        # The write job has begun when its first task file is on the store: its tasks run on the
        # executor. (Polled gently: the run shares the machine with this loop; the write lasts seconds.)
        executors = _executor_pids(apart_cluster)
        if executors and any("/_temporary/" in f"/{name}" for name, _ in staging.files()):
            os.kill(executors[0], signal.SIGKILL)
            killed = executors[0]
        time.sleep(0.25)
    runner.join(300)
    assert killed is not None, "the run ended before its write stage could be interrupted"
    assert failed and "Offsets were not committed" in str(failed[0]), failed
    assert env.committed() == {0: None, 1: None, 2: None}
    assert not [c for c in Location.of(str(env.output)).children() if c.name.startswith("plan_id=")]

    _, job, outcome = env.run(master=apart_cluster.master_url)  # the rerun publishes once
    assert job["published"] and job["records_read"] == 24_000 and outcome.committed
    assert env.committed() == {0: 8000, 1: 8000, 2: 8000}
    assert env.check("apart-kill").checked == 24_000
    assert len([c for c in Location.of(str(env.output)).children() if c.name.startswith("plan_id=")]) == 1


def _event_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: str = "") -> Path:
    """spark-submit's configuration folder with the event log on (plain JSON lines, to search)."""
    conf, events = tmp_path / "spark-conf", tmp_path / "events"
    conf.mkdir()
    events.mkdir()
    (conf / "spark-defaults.conf").write_text(
        f"spark.eventLog.enabled true\nspark.eventLog.dir file://{events}\nspark.eventLog.compress false\n{extra}"
    )
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    return events


def _worker_view(cluster: LocalSpark) -> Path:
    """The worker's work folder as seen through its own mount namespace (``/proc/<pid>/root``)."""
    return Path(f"/proc/{cluster.worker_pid}/root{cluster.work_dir}")


def _executor_pids(cluster: LocalSpark) -> list[int]:
    """The executor JVMs this cluster's worker started (its children), oldest first."""
    found = []
    for task in Path(f"/proc/{cluster.worker_pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:  # the thread ended meanwhile
            continue
        for pid in children:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"CoarseGrainedExecutorBackend" in cmdline:
                found.append(int(pid))
    return sorted(found)
