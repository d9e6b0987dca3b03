"""Spark across machines without a shared disk: the worker sees none of the driver's files.

The worker (and so its executors and their Python workers) runs in a mount namespace of
its own with a private ``/tmp`` and its own work and scratch folders
(:func:`tests.support.servers.spark.start` with ``private_tmp``), as on a cluster whose
machines share no disk. State and output are on a real S3 server (s3proxy), checkpoints
and the Iceberg catalog in PostgreSQL, and each run goes through ``spark-submit`` to the
cluster. A Parquet feed and an Iceberg feed each publish exactly the records an independent
``read_committed`` scan of the committed offsets holds, good ones in the output and bad
ones in its quarantine (the fault suite's oracle, :meth:`tests.faults.harness.FaultEnv.check`),
commit the plan's ends, and a second run adds nothing. The executors stage on the object
store through Hadoop's s3a connector, whose jars ``spark-submit --jars`` ships to them
(``TIDEMARK_S3A_JARS``); s3proxy runs on its in-memory backend, where s3a's commit renames work.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import S3_BUCKET, KafkaTestCluster
from tests.faults.harness import FaultEnv
from tests.support.servers import s3 as s3_local
from tests.support.servers import spark as spark_local
from tests.support.servers.s3 import LocalS3
from tests.support.servers.spark import LocalSpark
from tidemark.checkpoints.store import URL_ENV
from tidemark.output.iceberg import CATALOG_URI_ENV
from tidemark.runs.pipeline import S3A_JARS_ENV
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


@pytest.fixture(scope="module")
def apart_s3() -> Iterator[LocalS3]:
    """An S3 server Spark's s3a can commit to (s3proxy's in-memory backend), with the s3a jars for spark-submit."""
    server = s3_local.start(backend="transient")
    try:
        with pytest.MonkeyPatch.context() as patch:
            for key, value in {**server.env(), S3A_JARS_ENV: str(s3_local.fetch_s3a_jars())}.items():
                patch.setenv(key, value)
            server.create_bucket(S3_BUCKET)
            yield server
    finally:
        server.stop(purge=True)


@pytest.mark.parametrize("kind", ["parquet", "iceberg"])
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
