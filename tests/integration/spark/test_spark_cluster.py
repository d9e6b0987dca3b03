"""``tidemark run`` against a Spark standalone cluster: package shipped, Kafka secrets redacted.

The master and worker are separate JVMs started from pyspark's distribution (the
``spark_cluster`` fixture); the worker's environment has no ``PYTHONPATH``. The run goes
through the CLI and ``spark-submit`` unchanged, only ``TIDEMARK_SPARK_MASTER`` points at
the cluster, with the event log on (through ``SPARK_CONF_DIR``'s ``spark-defaults.conf``,
as a deployment would configure it) and a Kafka secret (``sasl.password``, ignored under
PLAINTEXT) in the connection, which travels inside the read's tasks. A second Kafka
secret takes the route Spark configuration offers (``spark.executorEnv.TIDEMARK_KAFKA_SSL_KEY_PEM``,
a name Spark's default redaction pattern does not cover): Tidemark's pattern must redact
it. Neither value may appear anywhere Spark records: the event log (environment, SQL
plans), the master's, worker's and executors' logs, spark-submit's output or the run folder.

Three more secrets take the routes a YARN or Kubernetes submit would show (issue 43): the
client's private key (``ssl.key.pem``), ``sasl.oauthbearer.config`` and the Iceberg catalog's
URL with its password percent-encoded. They reach the driver only through the private file
(:mod:`tidemark.spark.secrets`): besides every place above, no process's command line and no
process's environment (but the CLI's own, which the test sets) holds them while the run goes on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml

from tests.conftest import KafkaTestCluster
from tests.support.processes import watch_processes
from tests.support.servers.spark import LocalSpark
from tidemark.kafka.admin import Record

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# Values without a secret-looking word: Spark also redacts by value, which would hide a bad pattern.
SECRET = f"tm-{uuid.uuid4().hex}"
ENV_SECRET = f"tm-{uuid.uuid4().hex}"
REDACTED = "*********(redacted)"
KEY_LINE = f"MIIE{uuid.uuid4().hex}"
KEY_PEM = f"-----BEGIN PRIVATE KEY-----\n{KEY_LINE}\n-----END PRIVATE KEY-----\n"
OAUTH_SECRET = f"tm-{uuid.uuid4().hex}"
CATALOG_PASSWORD = f"p@ss/w:rd-{uuid.uuid4().hex}"


def _files_with(root: Path, needle: bytes) -> list[Path]:
    return [p for p in sorted(root.rglob("*")) if p.is_file() and needle in p.read_bytes()]


def test_tidemark_run_on_a_standalone_cluster_ships_the_package_and_redacts_kafka_secrets(
    kafka: KafkaTestCluster, spark_cluster: LocalSpark, tmp_path: Path
) -> None:
    topic = kafka.new_topic(partitions=2, prefix="cluster")
    group = f"g-cluster-{uuid.uuid4().hex[:8]}"
    feeds, state, output, events, conf = (tmp_path / d for d in ("feeds", "state", "out", "events", "conf"))
    for folder in (feeds, events, conf):
        folder.mkdir()
    (feeds / "onspark.yaml").write_text(yaml.safe_dump({
        "topics": [topic], "group": group, "records_per_task": 50, "output": str(output),
        "deserialization": {"format": "json", "fields": [{"name": "n", "type": "integer"}]},
    }))  # fmt: skip
    kafka.produce(topic, [Record(value=json.dumps({"n": i}).encode(), partition=i % 2) for i in range(6)])
    (conf / "spark-defaults.conf").write_text(
        "spark.eventLog.enabled true\n"
        f"spark.eventLog.dir file://{events}\n"
        "spark.eventLog.compress false\n"  # plain JSON lines, so that the search below sees everything
        f"spark.executorEnv.TIDEMARK_KAFKA_SSL_KEY_PEM {ENV_SECRET}\n"
    )
    env = {
        **os.environ,
        **kafka.connection.to_env(),
        "TIDEMARK_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT",
        "TIDEMARK_KAFKA_SASL_PASSWORD": SECRET,  # a secret the executors receive, unused under PLAINTEXT
        "TIDEMARK_KAFKA_SSL_KEY_PEM": KEY_PEM,  # unused under PLAINTEXT too
        "TIDEMARK_KAFKA_SASL_OAUTHBEARER_CONFIG": f"principal=reader extension_credential={OAUTH_SECRET}",
        # Not used by a Parquet feed: it travels with the other connections all the same.
        "TIDEMARK_ICEBERG_CATALOG_URI": f"postgresql+psycopg://iceberg:{quote(CATALOG_PASSWORD, safe='')}@db:1/c",
        "TIDEMARK_SPARK_MASTER": spark_cluster.master_url,
        "TIDEMARK_FEEDS_DIR": str(feeds),
        "TIDEMARK_STATE_DIR": str(state),
        "SPARK_CONF_DIR": str(conf),
    }
    env.pop("TIDEMARK_SHIP_PACKAGE", None)  # shipping is decided by the master alone

    new_secrets = [KEY_LINE, OAUTH_SECRET, CATALOG_PASSWORD, quote(CATALOG_PASSWORD, safe="")]
    cli = subprocess.Popen(
        [sys.executable, "-m", "tidemark.cli", "run", "onspark"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    with watch_processes([s.encode() for s in new_secrets], skip={cli.pid}) as in_processes:
        stdout, stderr = cli.communicate()
    proc = subprocess.CompletedProcess(cli.args, cli.returncode, stdout, stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert in_processes == {}, in_processes  # spark-submit, the driver, the executors: none holds them
    assert "validated passed: 6 good" in proc.stdout

    run_dir = next((state / "runs" / "onspark").iterdir())
    job = json.loads((run_dir / "job.json").read_text())
    assert job["published"] and job["records_read"] == 6
    assert job["spark"]["master"] == spark_cluster.master_url
    # Executors imported tidemark from the shipped zip, not from the checkout's include/.
    assert "tidemark.zip" in job["spark"]["executor_package"], job["spark"]
    # The application ran on the cluster: the worker started its executor and fetched the zip.
    apps = spark_cluster.state()["completedapps"] + spark_cluster.state()["activeapps"]
    assert [a["name"] for a in apps if a["name"] == "tidemark-onspark"]
    assert list(spark_cluster.work_dir.glob("app-*/*/tidemark.zip"))
    read_by_executor = [p for p in spark_cluster.work_dir.glob("app-*/*/stderr") if "Running task" in p.read_text()]
    assert read_by_executor

    # The event log is there and holds what the checks below look into.
    logs = [p for p in events.rglob("events_*") if p.is_file()]  # rolling event log: a folder per app
    assert logs
    records = [json.loads(line) for p in logs for line in p.read_text().splitlines() if line.strip()]
    kinds = {r["Event"] for r in records}
    assert "SparkListenerEnvironmentUpdate" in kinds
    assert "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart" in kinds
    environment = next(r for r in records if r["Event"] == "SparkListenerEnvironmentUpdate")
    properties = dict(environment["Spark Properties"])
    assert properties["spark.executorEnv.TIDEMARK_KAFKA_SSL_KEY_PEM"] == REDACTED  # Spark's redaction hid it
    assert properties["spark.eventLog.enabled"] == "true"
    # The driver had the connections (it read Kafka with them); the report shows none of their secrets.
    report = json.loads((run_dir / "report.json").read_text())
    assert report["connection"]["sasl.oauthbearer.config"] == "***"

    for secret in (SECRET, ENV_SECRET, *new_secrets):
        needle = secret.encode()
        leaks = {
            "event log": _files_with(events, needle),
            "master/worker logs": _files_with(spark_cluster.log_dir, needle),
            "executors' folders": _files_with(spark_cluster.work_dir, needle),
            "run folder": _files_with(run_dir, needle),
        }
        assert leaks == {k: [] for k in leaks}, secret
        assert secret not in proc.stdout + proc.stderr
