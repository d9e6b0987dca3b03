"""Feed runs, backfills and replays on the secured cluster, under SCRAM, mTLS and OAUTHBEARER.

The runs authenticate as the principal ``feed``, which holds only the least-privilege ACLs
(:data:`tidemark.devtools.kafka.secure.feed_grants`); the super user ``admin`` creates the
topic, produces and scans. Settings come from the CLI's environment (``tidemark run`` through
``spark-submit``, whose executors build their own consumers) or from an Airflow Kafka
connection's extra (certificates as PEM strings), read by ``orchestration.dags.kafka_connection``.
Every run's output is compared with an independent ``read_committed`` scan of its plan's ranges.
The ``spark-submit`` runs write Spark's event log, which is searched for the secrets with
the run's state and output, and every process's command line and environment is watched for
them while the run goes on; a token callback named in the settings (``oauth_cb``) is
imported by the executors themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SecuredKafka
from tests.faults.harness import FaultEnv, oracle
from tests.support.processes import watch_processes
from tidemark.devtools.kafka.secure import MECHANISMS, Mechanism, feed_grants
from tidemark.kafka.connection import KafkaConnection, is_secret
from tidemark.runs.pipeline import RunHandle, run_feed

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PRINCIPAL = "feed"


@pytest.fixture
def senv(secure_kafka: SecuredKafka, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultEnv:
    env = FaultEnv(secure_kafka.admin, spark, tmp_path, "secured", partitions=2)
    secure_kafka.cluster.grant(PRINCIPAL, feed_grants([env.topic], env.group))
    env.install(monkeypatch)
    return env


def _cli(env: FaultEnv, connection: KafkaConnection, *args: str) -> dict[str, Any]:
    """``tidemark <args> --json`` with the connection in the environment only, as a deployment sets it.

    Spark writes its event log (configuration, job properties, plans) under ``env.tmp/events``.
    """
    conf, events = env.tmp / "spark-conf", env.tmp / "events"
    if not conf.exists():
        conf.mkdir()
        events.mkdir()
        (conf / "spark-defaults.conf").write_text(
            f"spark.eventLog.enabled true\nspark.eventLog.dir file://{events}\nspark.eventLog.compress false\n"
        )
    cli_env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDEMARK_KAFKA_", "TIDEMARK_BOOTSTRAP"))}
    cli_env |= {**connection.to_env(), "TIDEMARK_FEEDS_DIR": str(env.feeds), "TIDEMARK_STATE_DIR": str(env.root),
                "SPARK_CONF_DIR": str(conf)}  # fmt: skip
    secrets = [v.encode() for k, v in connection.settings.items() if is_secret(k)]
    cli = subprocess.Popen(
        [sys.executable, "-m", "tidemark.cli", *args, env.feed, "--json"],
        env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # The process list and every environment but the CLI's own (which the test set): spark-submit's, the
    # driver's, Spark's workers'. The secrets reach the driver in a private file (tidemark.spark.secrets).
    with watch_processes(secrets, skip={cli.pid}) as in_processes:
        stdout, stderr = cli.communicate()
    proc = subprocess.CompletedProcess(cli.args, cli.returncode, stdout, stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert in_processes == {}, in_processes
    for name, value in connection.settings.items():
        if is_secret(name):
            assert value not in proc.stdout + proc.stderr, f"{name} printed by tidemark {args[0]}"
    doc: dict[str, Any] = json.loads(proc.stdout[proc.stdout.index("{") :])
    return doc


def _airflow_connection(connection: KafkaConnection, monkeypatch: pytest.MonkeyPatch) -> KafkaConnection:
    """The connection as Airflow hands it to Tidemark: a Kafka-provider connection's extra, read back."""
    from tidemark.orchestration.dags import kafka_connection

    extra = {"bootstrap.servers": connection.bootstrap_servers, **connection.settings}
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_KAFKA_SECURED", json.dumps({"conn_type": "kafka", "extra": extra}))
    return kafka_connection("tidemark_kafka_secured")


def _ranges(handle: RunHandle) -> dict[tuple[str, int], tuple[int, int]]:
    return {(p.topic, p.partition): (p.start, p.end) for p in handle.plan().partitions}


def _assert_published_as_scanned(env: FaultEnv, handle: RunHandle, admin: KafkaConnection) -> None:
    output = handle.plan().output
    assert output is not None
    expected = oracle(admin, _ranges(handle))
    assert sum(expected.values()) > 0
    assert env.published(Path(output)) == expected


def _no_secret_written(env: FaultEnv, connection: KafkaConnection) -> None:
    secrets = [v.encode() for k, v in connection.settings.items() if is_secret(k)]
    for path in [*env.root.rglob("*"), *env.tmp.glob("out*/**/*"), *env.tmp.glob("events/*")]:
        if path.is_file():
            data = path.read_bytes()
            assert not [s for s in secrets if s in data], path


# spark-submit costs a driver JVM per run: the CLI's path (settings in the environment, read by the
# executors' consumers) runs under SCRAM; the executors take mTLS and OAUTHBEARER settings the same way.
@pytest.mark.parametrize(
    ("mechanism", "source"), [("scram", "cli"), *((m, "airflow") for m in MECHANISMS)], ids=lambda v: str(v)
)
def test_feed_backfill_and_replay_on_the_secured_cluster(
    secure_kafka: SecuredKafka, senv: FaultEnv, mechanism: Mechanism, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = secure_kafka.admin.connection
    feed_conn = secure_kafka.cluster.connection(mechanism, PRINCIPAL, pem=source == "airflow")
    if source == "airflow":
        feed_conn = _airflow_connection(feed_conn, monkeypatch)

    def run(mode: str, params: Mapping[str, Any], *cli_args: str) -> RunHandle:
        # The CLI's own path is the scheduled run; its backfill and replay would each cost another
        # spark-submit for what the in-process runs below check with the same settings.
        if source == "cli" and mode == "scheduled":
            doc = _cli(senv, feed_conn, *cli_args)
            return RunHandle.from_xcom(doc["run"])
        handle, _, _ = run_feed(senv.feed, feed_conn, mode=mode, params=params, root=senv.root,
                                job_runner=senv.in_process)  # fmt: skip
        return handle

    started = time.time()
    senv.produce(10, bad={3})
    feed = run("scheduled", {}, "run")
    assert senv.committed() == {p: e for (_, p), (_, e) in _ranges(feed).items()} == {0: 5, 1: 5}
    senv.check(f"secured_{mechanism}_{source}")

    senv.produce(4)
    window = {"start_timestamp": datetime.fromtimestamp(started - 60, UTC).isoformat(),
              "end_timestamp": datetime.fromtimestamp(time.time() + 1, UTC).isoformat()}  # fmt: skip
    time.sleep(1.2)  # the window's end is in the past when it is planned
    backfill = run("backfill", window, "backfill", "--start", window["start_timestamp"],
                   "--end", window["end_timestamp"])  # fmt: skip
    _assert_published_as_scanned(senv, backfill, admin)
    replay = run("replay", {"start_from": "earliest"}, "replay", "--start-from", "earliest")
    _assert_published_as_scanned(senv, replay, admin)
    assert senv.committed() == {0: 5, 1: 5}  # neither moves the group unless asked
    if source == "cli":
        assert len(list(senv.tmp.glob("events/*"))) == 1  # the spark-submit's event log, searched below
    _no_secret_written(senv, feed_conn)


def test_a_token_callback_named_in_the_settings_reaches_the_executors(
    secure_kafka: SecuredKafka, senv: FaultEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``oauth_cb`` as the Kafka provider's connections give it: a dotted name, imported by each client's process."""
    cluster = secure_kafka.cluster
    settings = {
        **cluster.connection("oauthbearer", PRINCIPAL).settings,
        "oauth_cb": "tests.support.tokens.unsecured_jwt",
    }
    settings.pop("enable.sasl.oauthbearer.unsecure.jwt")  # the token comes from the callback alone
    conn = KafkaConnection(cluster.sasl_bootstrap(), settings)
    senv.produce(6)
    repo = str(Path(__file__).resolve().parents[2])  # the Spark workers import tests.support.tokens from here
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
    handle = RunHandle.from_xcom(_cli(senv, conn, "run")["run"])
    assert senv.committed() == {p: e for (_, p), (_, e) in _ranges(handle).items()} == {0: 3, 1: 3}
    senv.check("secured_oauth_cb")


def test_a_password_and_a_private_key_that_authenticate_are_written_nowhere(
    secure_kafka: SecuredKafka, senv: FaultEnv
) -> None:
    """mTLS with an encrypted key given as PEM text: the key and its password both really authenticate."""
    from cryptography.hazmat.primitives import serialization as ser

    password = f"key-pass-{uuid.uuid4().hex}"
    plain = secure_kafka.cluster.connection("mtls", PRINCIPAL, pem=True)
    key = ser.load_pem_private_key(plain.settings["ssl.key.pem"].encode(), password=None)
    encrypted = key.private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.BestAvailableEncryption(password.encode())
    )
    conn = KafkaConnection(
        plain.bootstrap_servers, {**plain.settings, "ssl.key.pem": encrypted.decode(), "ssl.key.password": password}
    )
    senv.produce(6, bad={1})

    handle = RunHandle.from_xcom(_cli(senv, conn, "run")["run"])

    assert senv.committed() == {0: 3, 1: 3}
    senv.check("secured_secrets")
    assert list(Path(handle.run_dir).glob("gx/**/*.html")), "the run wrote no Data Docs page to search"
    assert len(list(senv.tmp.glob("events/*"))) == 1
    # The password, the whole key and each line of its body (a partial dump would still leak).
    body = [line for line in encrypted.decode().splitlines() if line and not line.startswith("-----")]
    secrets = [password, encrypted.decode(), *body]
    for path in [*senv.root.rglob("*"), *senv.tmp.glob("out*/**/*"), *senv.tmp.glob("events/*")]:
        if path.is_file():
            data = path.read_bytes()
            assert not [s for s in secrets if s.encode() in data], path
    metadata = [c.metadata for c in secure_kafka.admin.adapter.committed(senv.group, senv.tps()).values()]
    assert metadata and not [s for s in secrets for m in metadata if s in m]
