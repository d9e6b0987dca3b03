"""Shared fixtures: the real local Kafka cluster, per-test topics, a local SparkSession, a real PostgreSQL.

The ``kafka`` fixture starts a 3-broker KRaft cluster from the project's own scripts
once per test session (under pytest-xdist, once for all workers), under a temporary home,
and stops it at the end; ``own_kafka`` is one of the process's own, for the tests that stop,
pause or restart brokers (the fault suite's ``kafka`` is that one). Two ways to
reuse a running cluster instead (handy while developing):

- ``TIDEMARK_TEST_KAFKA_HOME=DIR``: a local cluster under DIR, started if needed and
  left running; broker stop/restart works.
- ``TIDEMARK_BOOTSTRAP_SERVERS=host:port``: any cluster; broker stop/restart tests
  are skipped (they need to own the processes).

The ``postgres`` fixture starts one throwaway PostgreSQL server per session
(:mod:`tests.support.servers.postgres`: Debian's binaries, installed first if missing and we are root)
and yields its URL; ``checkpoint_store`` gives each test a fresh store of either kind.
The ``s3`` fixture starts one s3proxy (:mod:`tests.support.servers.s3`) per session with a
bucket ``tidemark`` and puts its endpoint and credentials in the environment, as a
deployment would; tests use fresh prefixes under that bucket. ``spark_cluster`` starts a
Spark standalone master and worker (:mod:`tests.support.servers.spark`) from pyspark's own
distribution, once per session, only for the tests that ask for it. ``registry`` starts one
Apicurio Registry (:mod:`tidemark.devtools.registry`, fetched by Maven on first use) per
session and yields the URL of its Confluent-compatible API.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.kafka import KafkaTestAdmin
from tests.support.servers.s3 import LocalS3
from tests.support.servers.spark import LocalSpark
from tidemark.checkpoints.store import CheckpointStore, PostgresCheckpointStore, SqliteCheckpointStore
from tidemark.devtools.kafka.cluster import LocalCluster
from tidemark.devtools.kafka.secure import SecureCluster
from tidemark.devtools.maven import file_lock
from tidemark.kafka.admin import Record, produce
from tidemark.kafka.connection import KafkaConnection
from tidemark.settings import cache_root
from tidemark.spark.session import CLASS_ARCHIVE_ENV

# Every small spark-submit of the suite starts its driver from one class-data archive
# (tidemark.spark.session.driver_class_archive), also in tests that give a run its own HOME.
os.environ.setdefault(CLASS_ARCHIVE_ENV, str(cache_root() / "jvm"))

os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")


@dataclass
class KafkaTestCluster:
    connection: KafkaConnection
    cluster: LocalCluster | None
    adapter: KafkaTestAdmin = field(init=False)

    def __post_init__(self) -> None:
        self.adapter = KafkaTestAdmin(self.connection)

    @property
    def bootstrap_servers(self) -> str:
        return self.connection.bootstrap_servers

    def new_topic(
        self, partitions: int = 3, replication: int = 1, config: Mapping[str, str] | None = None, prefix: str = "t"
    ) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        self.adapter.create_topic(name, partitions, replication, config)
        return name

    def produce(self, topic: str, records: Iterable[Record], **settings: Any) -> int:
        return produce(self.connection, topic, records, **settings)

    def require_local(self) -> LocalCluster:
        if self.cluster is None:
            pytest.skip("needs a cluster started by the fixture (TIDEMARK_BOOTSTRAP_SERVERS points elsewhere)")
        return self.cluster


def keyed_records(
    count: int,
    partition: int | None = None,
    base_ts_ms: int | None = None,
    step_ms: int = 1000,
    prefix: str = "k",
) -> list[Record]:
    """``count`` records with keys ``{prefix}-{i}``, values ``v-{i}`` and increasing timestamps.

    Timestamps start an hour ago by default: the test cluster checks retention every
    second, and records older than a topic's retention would vanish under the test.
    """
    if base_ts_ms is None:
        base_ts_ms = int(time.time() * 1000) - 3_600_000
    return [
        Record(
            value=f"v-{i}".encode(),
            key=f"{prefix}-{i}".encode(),
            timestamp_ms=base_ts_ms + i * step_ms,
            partition=partition,
        )
        for i in range(count)
    ]


# Every JVM the tests start (the session's Spark, the brokers, s3proxy, the registry, the Spark
# clusters and every spark-submit) compiles with C1 only, as Tidemark's small runs already do for
# their driver (spark/session.py, small_run_conf): test runs are short, and C2's compiles cost more
# CPU than they win back on them (the spark-submit and validation tests took 60 CPU-s instead of
# 85-90, 47 s instead of 57 s of wall time). Set before any fixture starts a JVM; inherited by
# xdist's workers and every subprocess. Outside the tests nothing changes.
_C1_ONLY = "-XX:TieredStopAtLevel=1"
if _C1_ONLY not in os.environ.get("JAVA_TOOL_OPTIONS", ""):
    os.environ["JAVA_TOOL_OPTIONS"] = f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {_C1_ONLY}".strip()

OWNER_FILE = "pytest.pid"
# Under pytest-xdist (`make test` runs three workers), these groups of tests stay on one worker
# each, so that what they share starts once, not once per worker: the fault suite counts its
# scenarios in one process, and it shares the Schema Registry with the registry formats' tests;
# the e2e tests share one Airflow; the secured tests one SASL/TLS cluster; the Spark cluster
# tests their standalone clusters. Every other test is scheduled on its own, as xdist's "load"
# does. (Not xdist_group: xdist 3.8 marks groups by rewriting a node id that pytest 9 no longer
# reads.)
ONE_WORKER_GROUPS = {
    "faults+registry": ("tests/faults/", "tests/integration/job/test_avro.py", "tests/integration/job/test_registry_",
                        "tests/integration/job/test_planned_reader.py",
                        # The other tests that stop a broker: on the fault suite's own cluster.
                        "tests/integration/devtools/test_cluster.py::test_broker_can_be_stopped_and_restarted",
                        "tests/integration/spark/test_read.py::test_leader_stopped_mid_read"),
    # The e2e tests of the one Airflow the package's `airflow` fixture starts; the other e2e files start
    # their own (or none) and go out a file at a time (:func:`one_worker_scope`).
    "e2e": tuple(f"tests/e2e/test_{name}.py" for name in ("cleared_run", "plugin_auth", "team_key", "team_per_feed",
                                                          "view_runs", "view_security", "view_ui")),
    "secured": ("tests/integration/test_secured_runs.py", "tests/integration/runs/test_secured_acls.py",
                "tests/integration/devtools/test_secured_cluster.py"),
    "spark-clusters": ("tests/integration/spark/test_cluster_without_shared_disk.py",
                       "tests/integration/spark/test_spark_cluster.py", "tests/integration/test_iceberg_runs.py"),
}  # fmt: skip


def one_worker_group(nodeid: str) -> str | None:
    """The :data:`ONE_WORKER_GROUPS` name a test belongs to, if any."""
    for group, prefixes in ONE_WORKER_GROUPS.items():
        if nodeid.startswith(prefixes):
            return group
    return None


def one_worker_scope(nodeid: str) -> str:
    """What xdist schedules as one unit: a :data:`ONE_WORKER_GROUPS` group; an e2e file outside them (its
    module fixtures start an Airflow or a DAG's environment once); else the single test."""
    group = one_worker_group(nodeid)
    if group is not None:
        return group
    if nodeid.startswith("tests/e2e/"):
        return nodeid.split("::", 1)[0]
    return nodeid


_STARTED = time.time()  # before any worker of this run wrote a fault count


def pytest_configure(config: pytest.Config) -> None:
    from tests.support.cputime import CpuTimes

    config.pluginmanager.register(CpuTimes(), "tidemark-cputime")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The fault suite's closing line: scenarios, oracle checks, records compared; lost, duplicated, misrouted.

    In one process the scoreboard is here; under xdist the controller ran no test, so it
    merges the counts its workers wrote at their end (if written by this run).
    """
    from tests.faults.harness import SCOREBOARD, merge_scoreboards, write_scoreboard

    doc = write_scoreboard() if SCOREBOARD else merge_scoreboards(since=_STARTED)
    if doc is None:
        return
    terminalreporter.write_line(
        f"fault suite: {doc['scenarios_run']} scenario tests, {doc['checks']} oracle checks compared "
        f"{doc['records_checked']} records ({doc.get('good_checked', 0)} good, {doc.get('quarantined_checked', 0)} "
        f"quarantined); found {doc['records_lost']} lost, {doc['records_duplicated']} duplicated, "
        f"{doc.get('records_misrouted', 0)} misrouted"
    )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerDirs(LoadScopeScheduling):  # type: ignore[misc]
        """Scopes as :func:`one_worker_scope` gives them. The biggest go out first."""

        def _split_scope(self, nodeid: str) -> str:
            return one_worker_scope(nodeid)

    return OneWorkerDirs(config, log)


def _stop_orphaned_test_clusters(runs_root: Path) -> None:
    """Stop brokers left by earlier test sessions that died without their teardown.

    A session killed outright (a native crash, a CI timeout) never reaches the fixture's
    ``down``; its brokers would keep running and hold memory and CPU that later runs need.
    """
    for owner in runs_root.glob(f"*/kafka*/{OWNER_FILE}"):
        try:
            pid = int(owner.read_text())
        except (OSError, ValueError):
            continue
        if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            LocalCluster(owner.parent).down()
            owner.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def own_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaTestCluster]:
    """A 3-broker cluster of this process alone, for the tests that stop, pause or restart brokers."""
    servers = os.environ.get("TIDEMARK_BOOTSTRAP_SERVERS")
    if servers:
        yield KafkaTestCluster(KafkaConnection(servers), None)
        return
    shared_home = os.environ.get("TIDEMARK_TEST_KAFKA_HOME")
    if not shared_home:
        _stop_orphaned_test_clusters(tmp_path_factory.getbasetemp().parent)
    home = Path(shared_home) if shared_home else tmp_path_factory.mktemp("kafka")
    cluster = LocalCluster(home)
    if not shared_home:
        (home / OWNER_FILE).write_text(str(os.getpid()))  # before starting: a crash may come at any time
    state = cluster.up(brokers=3)
    try:
        yield KafkaTestCluster(KafkaConnection(state.bootstrap_servers), cluster)
    finally:
        if not shared_home:
            cluster.down(purge=True)


@pytest.fixture(scope="session")
def kafka(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaTestCluster]:
    """The session's cluster: under xdist one cluster for all of the run's workers (:func:`_workers_cluster`),
    else :func:`own_kafka`'s. Tests that stop brokers ask for ``own_kafka`` (the fault suite's ``kafka`` is it)."""
    reuse = os.environ.get("TIDEMARK_BOOTSTRAP_SERVERS") or os.environ.get("TIDEMARK_TEST_KAFKA_HOME")
    if reuse or not os.environ.get("PYTEST_XDIST_WORKER"):
        yield request.getfixturevalue("own_kafka")
        return
    with _workers_cluster(tmp_path_factory.getbasetemp().parent) as cluster:
        yield KafkaTestCluster(KafkaConnection(cluster.state().bootstrap_servers), cluster)  # type: ignore[union-attr]


@contextmanager
def _workers_cluster(run_root: Path) -> Iterator[LocalCluster]:
    """One 3-broker cluster shared by the xdist workers of this run (``run_root``: their common temp folder).

    An idle cluster costs about 4 CPU-s a minute and starting one about 15: on two cores, one
    per worker was that much less for the tests. The first worker to ask starts it, each one
    counts itself in and out under a file lock, and the last one out stops it. Its owner is
    the xdist controller (the workers' parent), so a later session stops it if the run died.
    """
    home, users = run_root / "kafka-workers", run_root / "kafka-workers.users"
    cluster = LocalCluster(home)
    with file_lock(run_root / "kafka-workers.lock"):
        count = int(users.read_text()) if users.exists() else 0
        if count == 0:
            home.mkdir(exist_ok=True)
            (home / OWNER_FILE).write_text(str(os.getppid()))
        cluster.up(brokers=3)
        users.write_text(str(count + 1))
    try:
        yield cluster
    finally:
        with file_lock(run_root / "kafka-workers.lock"):
            count = int(users.read_text()) - 1
            users.write_text(str(count))
            if count == 0:
                cluster.down(purge=True)


@dataclass
class SecuredKafka:
    """The session's secured cluster; ``admin`` (a super user over SCRAM) makes topics and records."""

    cluster: SecureCluster
    admin: KafkaTestCluster
    start_s: float


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    """A one-broker secured cluster (TLS, SCRAM, OAUTHBEARER, ACLs) for the tests that need it.

    Its own home and ports; never the shared cluster, which stays PLAINTEXT.
    """
    _stop_orphaned_test_clusters(tmp_path_factory.getbasetemp().parent)
    home = tmp_path_factory.mktemp("kafka-secure")
    cluster = SecureCluster(home)
    (home / OWNER_FILE).write_text(str(os.getpid()))
    started = time.monotonic()
    cluster.up(brokers=1)
    try:
        yield SecuredKafka(cluster, KafkaTestCluster(cluster.admin_connection(), cluster), time.monotonic() - started)
    finally:
        cluster.down(purge=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """The URL (with its password) of a database on a PostgreSQL server started for this session."""
    from tests.support.servers import postgres as pg_local

    server = pg_local.start()
    try:
        yield server.url
    finally:
        server.stop(purge=True)


S3_BUCKET = "tidemark"


@pytest.fixture(scope="session")
def s3() -> Iterator[LocalS3]:
    """A real S3 endpoint (s3proxy) for the session, its settings in the environment (``AWS_*``)."""
    from tests.support.servers import s3 as s3_local

    server = s3_local.start()
    try:
        with pytest.MonkeyPatch.context() as patch:
            for key, value in server.env().items():
                patch.setenv(key, value)
            server.create_bucket(S3_BUCKET)
            yield server
    finally:
        server.stop(purge=True)


@pytest.fixture(scope="session")
def s3a_jars() -> Iterator[Path]:
    """Hadoop's s3a connector jars (fetched once with Maven), named by ``TIDEMARK_S3A_JARS`` for the session.

    In-process sessions put them on their classpath and ``spark-submit`` ships them
    (:func:`tidemark.spark.session.s3a_jars`): Spark then stages on an object store wherever asked.
    """
    from tests.support.servers import s3 as s3_local
    from tidemark.spark.session import S3A_JARS_ENV

    folder = s3_local.fetch_s3a_jars()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(S3A_JARS_ENV, str(folder))
        yield folder


@pytest.fixture(scope="session")
def s3a_store() -> Iterator[LocalS3]:
    """An S3 server Spark's s3a can commit to: s3proxy's in-memory backend (its filesystem backend
    refuses s3a's renames). Tests put its ``env()`` into theirs; it has the bucket ``S3_BUCKET``."""
    from tests.support.servers import s3 as s3_local

    server = s3_local.start(backend="transient")
    try:
        server.create_bucket(S3_BUCKET)
        yield server
    finally:
        server.stop(purge=True)


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port on 127.0.0.1 that another socket listens on for the whole test."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.fixture
def s3_prefix(s3: LocalS3) -> str:
    """A fresh ``s3://tidemark/<test>-<uuid>`` prefix for one test."""
    return f"s3://{S3_BUCKET}/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["sqlite", "postgres"])
def checkpoint_store(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStore:
    """A fresh checkpoint store: SQLite in the test's tmp dir, or the session's PostgreSQL database.

    Tests use fresh group names, so PostgreSQL rows of other tests never meet theirs.
    """
    if request.param == "sqlite":
        return SqliteCheckpointStore(tmp_path / "checkpoints.sqlite")
    return PostgresCheckpointStore(request.getfixturevalue("postgres"))


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSpark]:
    """A Spark standalone master and one worker (:mod:`tests.support.servers.spark`) for the session."""
    from tests.support.servers import spark as spark_local

    cluster = spark_local.start(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield cluster
    finally:
        cluster.stop(purge=True)


@pytest.fixture(scope="session")
def registry() -> Iterator[str]:
    """The URL of a real schema registry's Confluent API (``.../apis/ccompat/v7``), empty, for the session."""
    from tests.support.servers.spark import fetch_avro_jar
    from tidemark.devtools import registry as local_registry
    from tidemark.spark.session import AVRO_JAR_ENV

    os.environ.setdefault(AVRO_JAR_ENV, str(fetch_avro_jar()))  # for the spark-submits of Avro runs
    server = local_registry.start()
    try:
        yield server.url
    finally:
        server.stop(purge=True)


@pytest.fixture(scope="session")
def spark(s3a_jars: Path) -> Iterator[Any]:
    from tests.support.servers.spark import fetch_avro_jar
    from tidemark.spark.session import AVRO_JAR_ENV, local_session

    # With spark-avro (from_avro): one session per worker serves the Avro tests too.
    os.environ.setdefault(AVRO_JAR_ENV, str(fetch_avro_jar()))
    session = local_session("tidemark-tests", avro=True)
    yield session
    session.stop()
