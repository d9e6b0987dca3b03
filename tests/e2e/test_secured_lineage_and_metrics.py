"""No credential in a feed run's lineage events or metrics, on the secured cluster with every connection set.

The feed DAG runs as in :mod:`tests.e2e.test_lineage` (DagBag, ``dag.test``, a fresh
interpreter) against the secured cluster over mTLS, its private key encrypted with a password
(both authenticate), its output and state on S3 (s3proxy, credentials from an Airflow ``aws``
connection), its checkpoints in PostgreSQL and an Iceberg catalog and a schema registry named by
connections with passwords. Lineage goes to the OpenLineage provider's file transport (the
tasks' events) and to OpenLineage's Spark listener's (the Spark application's), metrics to a
StatsD socket. Every event, every metric line, the task output, Airflow's home (its logs and
the metadata database with XCom and rendered fields), the run's state and the S3 objects are
searched for each secret's value: the key's password, the whole key and each line of its body,
the S3 secret key, the database password and the registry's password.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy.engine import make_url

from tests.conftest import S3_BUCKET, SecuredKafka
from tests.e2e.test_airflow_dags import airflow_home
from tests.e2e.test_lineage import lineage_env, read_events
from tests.e2e.test_metrics import _run_feed
from tests.support.servers.s3 import REGION, LocalS3
from tests.support.servers.spark import fetch_openlineage_jar
from tidemark.devtools.kafka.secure import feed_grants
from tidemark.kafka.admin import Record
from tidemark.spark.session import OPENLINEAGE_ENV, OPENLINEAGE_JAR_ENV

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PRINCIPAL = "feed"
REGISTRY_PASSWORD = f"registry-pa55-{uuid.uuid4().hex}"


def _encrypted_mtls(secure_kafka: SecuredKafka, password: str) -> tuple[dict[str, str], str]:
    """The principal's mTLS settings as a Kafka connection's extra, its key encrypted with ``password``."""
    from cryptography.hazmat.primitives import serialization as ser

    plain = secure_kafka.cluster.connection("mtls", PRINCIPAL, pem=True)
    key = ser.load_pem_private_key(plain.settings["ssl.key.pem"].encode(), password=None)
    encrypted = key.private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.BestAvailableEncryption(password.encode())
    ).decode()
    extra = {"bootstrap.servers": plain.bootstrap_servers, **plain.settings,
             "ssl.key.pem": encrypted, "ssl.key.password": password}  # fmt: skip
    return extra, encrypted


def _postgres_connection(url: str) -> dict[str, Any]:
    parsed = make_url(url)
    return {"conn_type": "postgres", "host": parsed.host, "port": parsed.port, "login": parsed.username,
            "password": parsed.password, "schema": parsed.database}  # fmt: skip


def test_no_secret_reaches_lineage_events_or_metrics_on_the_secured_cluster(
    secure_kafka: SecuredKafka, s3: LocalS3, s3a_jars: Path, postgres: str, tmp_path: Path
) -> None:
    key_password = f"key-pass-{uuid.uuid4().hex}"
    kafka_extra, key = _encrypted_mtls(secure_kafka, key_password)
    topic = secure_kafka.admin.new_topic(partitions=2, prefix="olsec")
    group = f"g-olsec-{uuid.uuid4().hex[:8]}"
    secure_kafka.cluster.grant(PRINCIPAL, feed_grants([topic], group))
    secure_kafka.admin.produce(topic, [Record(value=f"v{i}".encode(), partition=i % 2) for i in range(8)])
    prefix = f"s3://{S3_BUCKET}/olsec-{uuid.uuid4().hex[:12]}"

    base = airflow_home(
        tmp_path / "airflow-home", kafka_extra,
        tidemark_storage={"conn_type": "aws", "login": s3.access_key, "password": s3.secret_key,
                          "extra": {"endpoint_url": s3.endpoint, "region_name": REGION}},
        tidemark_checkpoints=_postgres_connection(postgres),
        tidemark_iceberg=_postgres_connection(postgres),
        tidemark_schema_registry={"conn_type": "http", "host": "http://127.0.0.1:9", "login": "ol",
                                  "password": REGISTRY_PASSWORD},
    )  # fmt: skip
    # The connections alone carry the credentials: none inherited from the test's own environment.
    for name in [*s3.env(), "TIDEMARK_CHECKPOINT_URL"]:
        base.pop(name, None)
    spark_events = tmp_path / "spark-lineage.jsonl"
    tasks_events = tmp_path / "lineage.jsonl"
    env = {
        **lineage_env(tasks_events),
        "AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD": "True",
        "AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO": "True",
        OPENLINEAGE_ENV: "on",
        OPENLINEAGE_JAR_ENV: str(fetch_openlineage_jar()),
        "OPENLINEAGE__TRANSPORT__TYPE": "file", "OPENLINEAGE__TRANSPORT__LOCATION": str(spark_events),
        "TIDEMARK_STATE_DIR": str(tmp_path / "state"),
    }  # fmt: skip
    feed = {"topics": [topic], "group": group, "deserialization": {"format": "string"},
            "output": f"{prefix}/out", "driver_read_max_records": 0}  # fmt: skip

    proc, metrics = _run_feed(base, tmp_path, "olsec", feed, **env)

    assert "DAGRUN_STATE=success" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-4000:]
    committed = secure_kafka.admin.adapter.committed(group, [(topic, 0), (topic, 1)])
    assert {tp: c.offset for tp, c in committed.items()} == {(topic, 0): 4, (topic, 1): 4}
    tasks, spark = read_events(tasks_events), read_events(spark_events)
    assert {e["eventType"] for e in tasks} >= {"START", "COMPLETE"}, "the tasks sent no lineage to search"
    assert [e for e in spark if e["eventType"] == "COMPLETE"], "the Spark listener sent no lineage to search"
    assert [m for m in metrics if m.startswith("airflow.tidemark.")], "the run sent no metric to search"

    db_password = str(make_url(postgres).password)
    body = [line for line in key.splitlines() if line and not line.startswith("-----")]
    secrets = {
        "ssl.key.password": [key_password], "ssl.key.pem": [key, *body],
        "AWS_SECRET_ACCESS_KEY": [s3.secret_key], "database password": [db_password, quote(db_password, safe="")],
        "registry password": [REGISTRY_PASSWORD],
    }  # fmt: skip
    searched: dict[str, bytes] = {
        "the tasks' lineage events": tasks_events.read_bytes(),
        "the Spark listener's lineage events": spark_events.read_bytes(),
        "the StatsD lines": "\n".join(metrics).encode(),
        "the task output": (proc.stdout + proc.stderr).encode(),
    }
    for root in (tmp_path / "airflow-home", tmp_path / "state", s3.data_dir):
        searched |= {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    leaks = sorted(
        (where, name)
        for where, data in searched.items()
        for name, values in secrets.items()
        if any(v.encode() in data for v in values)
    )
    assert leaks == [], leaks
    assert os.path.exists(tmp_path / "airflow-home" / "airflow.db")  # the metadata database was searched
