"""The Airflow Spark task's spark-submit command: the master from ``tidemark_spark``, Tidemark's redaction."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def airflow_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", os.environ.get("AIRFLOW_HOME", str(tmp_path / "airflow")))
    monkeypatch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


def test_the_operator_submits_to_the_connections_cluster_master(monkeypatch: pytest.MonkeyPatch) -> None:
    from tidemark.orchestration.dags import TidemarkSparkSubmitOperator, spark_job_path
    from tidemark.spark.session import REDACTION_REGEX

    conn = {"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077}
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_SPARK_TEST", json.dumps(conn))
    op = TidemarkSparkSubmitOperator(
        task_id="read_validate_publish", application=spark_job_path(), conn_id="tidemark_spark_test",
        name="tidemark", application_args=["--plan", "p.json", "--run-dir", "runs/r1"],
        conf={"spark.executor.memory": "2g"},
    )  # fmt: skip
    cmd = op._get_hook()._build_spark_submit_command(op.application)

    assert cmd[cmd.index("--master") + 1] == "spark://127.0.0.1:7077"
    confs = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--conf"]
    assert f"spark.redaction.regex={REDACTION_REGEX}" in confs
    assert "spark.executor.memory=2g" in confs  # the DAG's own settings are kept
    # The job itself ships the package when the master is not local[...] (tidemark.job.entry.should_ship):
    # the command runs the same entry point as the CLI's, with nothing that turns shipping off.
    assert cmd[-5:] == [spark_job_path(), "--plan", "p.json", "--run-dir", "runs/r1"]
    assert not any("TIDEMARK_SHIP_PACKAGE" in arg for arg in cmd)


def test_a_small_run_gets_the_small_run_driver_options_and_the_dags_own_settings_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tidemark.orchestration.dags import TidemarkSparkSubmitOperator, spark_job_path
    from tidemark.spark.session import SMALL_RUN_JAVA_OPTIONS, SMALL_RUN_JAVA_OPTIONS_ENV, SMALL_RUN_MAX_RECORDS

    monkeypatch.delenv(SMALL_RUN_JAVA_OPTIONS_ENV, raising=False)
    op = TidemarkSparkSubmitOperator(task_id="read_validate_publish", application=spark_job_path(), name="tidemark")
    assert "spark.driver.extraJavaOptions" not in op.conf_for_run(SMALL_RUN_MAX_RECORDS + 1)
    op.conf = op.conf_for_run(1_000)  # as execute() does once the plan's size is known
    cmd = op._get_hook()._build_spark_submit_command(op.application)
    assert f"spark.driver.extraJavaOptions={SMALL_RUN_JAVA_OPTIONS}" in cmd

    own = TidemarkSparkSubmitOperator(task_id="t", application=spark_job_path(), name="tidemark",
                                      conf={"spark.driver.extraJavaOptions": "-Xss4m"})  # fmt: skip
    assert own.conf_for_run(1_000)["spark.driver.extraJavaOptions"] == "-Xss4m"


def test_the_class_archive_option_is_dropped_when_the_dag_adds_driver_classpath(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tidemark.orchestration.dags import TidemarkSparkSubmitOperator, spark_job_path
    from tidemark.spark.session import SMALL_RUN_JAVA_OPTIONS, SMALL_RUN_JAVA_OPTIONS_ENV

    monkeypatch.delenv(SMALL_RUN_JAVA_OPTIONS_ENV, raising=False)
    option = "-XX:SharedArchiveFile=/cache/spark.jsa"
    op = TidemarkSparkSubmitOperator(task_id="t", application=spark_job_path(), name="tidemark")
    assert op.conf_for_run(1_000, option)["spark.driver.extraJavaOptions"] == f"{SMALL_RUN_JAVA_OPTIONS} {option}"
    # Folders on the classpath make the JVM fail when it archives: no archive then.
    for extra in ({"driver_class_path": "/etc/hadoop"}, {"conf": {"spark.driver.extraClassPath": "/etc/hadoop"}}):
        op = TidemarkSparkSubmitOperator(task_id="t", application=spark_job_path(), name="tidemark", **extra)
        assert op.conf_for_run(1_000, option)["spark.driver.extraJavaOptions"] == SMALL_RUN_JAVA_OPTIONS


def test_the_openlineage_listener_joins_the_dags_own_listeners_when_turned_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from tidemark.errors import ConfigError
    from tidemark.orchestration.dags import TidemarkSparkSubmitOperator, spark_job_path
    from tidemark.spark.session import (
        OPENLINEAGE_ENV,
        OPENLINEAGE_JAR_ENV,
        OPENLINEAGE_LISTENER,
        OPENLINEAGE_PACKAGE,
        merge_conf,
    )  # fmt: skip

    monkeypatch.delenv(OPENLINEAGE_JAR_ENV, raising=False)
    op = TidemarkSparkSubmitOperator(task_id="t", application=spark_job_path(), name="tidemark",
                                     conf={"spark.extraListeners": "com.example.Own"})  # fmt: skip
    monkeypatch.delenv(OPENLINEAGE_ENV, raising=False)
    assert op.conf_for_feed("orders") == {}
    monkeypatch.setenv(OPENLINEAGE_ENV, "on")
    op.conf = merge_conf(op.conf_for_feed("orders"), op.conf_for_run(1_000))  # as execute() does
    cmd = op._get_hook()._build_spark_submit_command(op.application)
    confs = {cmd[i + 1].partition("=")[0]: cmd[i + 1].partition("=")[2] for i, a in enumerate(cmd) if a == "--conf"}
    assert confs["spark.extraListeners"] == f"{OPENLINEAGE_LISTENER},com.example.Own"
    assert confs["spark.jars.packages"] == OPENLINEAGE_PACKAGE
    for facet in ("debug", "spark.logicalPlan", "spark_unknown"):  # they could carry settings: always off
        assert confs[f"spark.openlineage.facets.{facet}.disabled"] == "true"
    monkeypatch.setenv(OPENLINEAGE_JAR_ENV, "/opt/jars/openlineage-spark.jar")
    assert op.conf_for_feed("orders")["spark.jars"] == "/opt/jars/openlineage-spark.jar"
    # spark-submit's --jars/--packages would replace the listener's jar: a DAG that sets them names it there.
    own_jars = TidemarkSparkSubmitOperator(task_id="t", application=spark_job_path(), name="tidemark", jars="x.jar")
    assert own_jars.conf_for_feed("orders") == {}
    monkeypatch.setenv(OPENLINEAGE_ENV, "yes please")
    with pytest.raises(ConfigError, match=OPENLINEAGE_ENV):
        op.conf_for_feed("orders")


def test_merged_spark_conf_joins_jar_and_listener_lists() -> None:
    from tidemark.spark.session import merge_conf

    merged = merge_conf(
        {"spark.jars.packages": "a:b:1", "spark.jars": "/x.jar", "spark.executor.memory": "1g"},
        {"spark.jars.packages": "c:d:2,a:b:1", "spark.jars": "", "spark.executor.memory": "2g"},
    )
    assert merged == {"spark.jars.packages": "a:b:1,c:d:2", "spark.jars": "/x.jar", "spark.executor.memory": "2g"}


def test_an_injected_transport_api_key_is_masked_in_the_logged_command() -> None:
    from airflow.sdk.log import redact

    from tidemark.orchestration.dags import TidemarkSparkSubmitOperator, spark_job_path

    key = "ol-api-k3y-not-for-logs"
    # What [openlineage] spark_inject_transport_info adds for an HTTP transport with an API key.
    injected = {
        "spark.openlineage.transport.type": "http",
        "spark.openlineage.transport.url": "http://ol:5000",
        "spark.openlineage.transport.auth.type": "api_key",
        "spark.openlineage.transport.auth.apiKey": key,
    }
    op = TidemarkSparkSubmitOperator(task_id="t", application=spark_job_path(), name="tidemark", conf=injected)
    hook = op._get_hook()
    logged = redact(hook._mask_cmd(hook._build_spark_submit_command(op.application)))
    assert key not in str(logged) and "spark.openlineage.transport.url=http://ol:5000" in str(logged)


# What the stub spark-submit records while it "runs": every process's command line (the process list), its own
# environment (what a driver pod's spec would carry), the secrets file it was handed and that file's mode.
STUB_SPARK_SUBMIT = """#!/bin/bash
out="$TIDEMARK_TEST_STUB_OUT"
for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < "$f" 2>/dev/null; echo; done > "$out/cmdlines"
tr '\\0' '\\n' < /proc/$$/environ > "$out/environ"
if [ -n "$TIDEMARK_SECRETS_FILE" ]; then
  cp "$TIDEMARK_SECRETS_FILE" "$out/secrets.json"
  stat -c %a "$TIDEMARK_SECRETS_FILE" > "$out/file_mode"
  stat -c %a "$(dirname "$TIDEMARK_SECRETS_FILE")" > "$out/dir_mode"
  echo "$TIDEMARK_SECRETS_FILE" > "$out/secrets_path"
fi
echo "Exit code: 0"
"""


@pytest.mark.parametrize("master", ["yarn", "k8s://https://127.0.0.1:6443"])
def test_no_secret_reaches_the_command_line_the_environment_or_the_log_on_yarn_or_kubernetes(
    master: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The Spark task on a ``yarn`` or ``k8s://`` master, through the provider's own hook, against a stub
    ``spark-submit`` on PATH: the provider turns ``env_vars`` into ``--conf spark.*Env.K=V`` arguments there and
    logs the command. Every connection secret must reach the driver only through the private file."""
    import uuid
    from urllib.parse import quote

    from airflow.providers.apache.spark.hooks import spark_submit
    from airflow.sdk.log import redact

    from tidemark.orchestration.dags import TidemarkSparkSubmitOperator, spark_job_path
    from tidemark.runs.pipeline import RunHandle

    token = uuid.uuid4().hex
    key_pem = f"-----BEGIN PRIVATE KEY-----\nMIIE{token}key\n-----END PRIVATE KEY-----\n"
    oauth_config = f"principal=feed extension_credential=oauth-{token}"
    sasl_password = f"sasl-{token}"
    catalog_password = f"p@ss/w:rd-{token}"  # percent-encoded in the catalog's URL
    registry_password, s3_secret = f"sr-{token}", f"s3-{token}"
    secrets = {
        "ssl.key.pem": key_pem.splitlines()[1], "sasl.oauthbearer.config": oauth_config,
        "sasl.password": sasl_password, "catalog": catalog_password, "catalog (encoded)": quote(catalog_password),
        "registry": registry_password, "s3": s3_secret,
    }  # fmt: skip
    kafka = {"bootstrap.servers": "broker:9093", "security.protocol": "SASL_SSL", "ssl.key.pem": key_pem,
             "sasl.oauthbearer.config": oauth_config, "sasl.password": sasl_password}  # fmt: skip
    connections = {
        "TIDEMARK_SPARK_SECRETS": {"conn_type": "spark", "host": master},
        "TIDEMARK_KAFKA_SECRETS": {"conn_type": "kafka", "extra": kafka},
        "TIDEMARK_ICEBERG": {"conn_type": "postgres", "host": "catalog-db", "port": 5432, "login": "iceberg",
                             "password": catalog_password, "schema": "catalog"},
        "TIDEMARK_SCHEMA_REGISTRY": {"conn_type": "http", "host": "https://registry:8081", "login": "reader",
                                     "password": registry_password},
        "TIDEMARK_STORAGE": {"conn_type": "aws", "login": "key-id", "password": s3_secret},
    }  # fmt: skip
    for name, conn in connections.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{name}", json.dumps(conn))
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    out.mkdir()
    stub = bin_dir / "spark-submit"
    stub.write_text(STUB_SPARK_SUBMIT)
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("TIDEMARK_TEST_STUB_OUT", str(out))
    monkeypatch.setenv("TIDEMARK_CLASS_ARCHIVE_DIR", "off")
    dag_token = f"dag-token-{token}"
    # A secret the worker has in its own environment (a deployment that sets variables, not connections).
    worker_token = f"worker-session-{token}"
    monkeypatch.setenv("AWS_SESSION_TOKEN", worker_token)
    secrets["worker's own AWS_SESSION_TOKEN"] = worker_token
    # The hook wants the Kubernetes provider for a k8s:// master only to kill a driver pod; not installed here.
    monkeypatch.setattr(
        spark_submit, "kube_client", getattr(spark_submit, "kube_client", None) or object(), raising=False
    )
    handle = RunHandle(run_id="r1", feed="no-such-feed", plan_id="p1", plan_path=str(tmp_path / "plan.json"),
                       run_dir=str(tmp_path / "run"), mode="scheduled", commit=True, records=10)  # fmt: skip

    class TaskInstance:
        def xcom_pull(self, task_ids: str) -> dict[str, object]:
            return handle.to_xcom()

    op = TidemarkSparkSubmitOperator(
        task_id="read_validate_publish", application=spark_job_path(), name="tidemark",
        conn_id="tidemark_spark_secrets", kafka_conn_id="tidemark_kafka_secrets",
        application_args=["--plan", handle.plan_path, "--run-dir", handle.run_dir],
        # A DAG's own variables: a Tidemark connection variable (to the file, like the connections), a
        # secret-named one of its own (masked in the log), and an ordinary one (passed on as the provider does).
        env_vars={"TIDEMARK_KAFKA_SASL_USERNAME": "dag-user", "MY_API_TOKEN": dag_token, "HADOOP_CONF_DIR": "/etc/h"},
    )  # fmt: skip
    capfd.readouterr()
    op.execute({"ti": TaskInstance()})

    captured = capfd.readouterr()
    logged = str(redact(captured.out + captured.err))  # the task log, as Airflow's masker writes it
    assert f"Spark-Submit cmd: spark-submit --master {master}" in logged
    cmdlines = (out / "cmdlines").read_text()
    assert f"spark-submit --master {master}" in cmdlines  # the stub's own command line is in the list
    # The stub's environment, less the test's own AIRFLOW_CONN_* variables (a secrets backend has none).
    environ = "\n".join(line for line in (out / "environ").read_text().splitlines()
                        if not line.startswith("AIRFLOW_CONN_"))  # fmt: skip
    for what, value in secrets.items():
        assert value not in logged, f"{what} in the task log"
        assert value not in cmdlines, f"{what} in the process list"
        assert value not in environ, f"{what} in spark-submit's environment"
    # The driver got every setting, through a file only its user may read, removed once spark-submit is done.
    handed = json.loads((out / "secrets.json").read_text())
    assert handed["TIDEMARK_KAFKA_SSL_KEY_PEM"] == key_pem
    assert handed["TIDEMARK_KAFKA_SASL_OAUTHBEARER_CONFIG"] == oauth_config
    assert catalog_password not in handed["TIDEMARK_ICEBERG_CATALOG_URI"]  # percent-encoded there, as before
    assert quote(catalog_password, safe="") in handed["TIDEMARK_ICEBERG_CATALOG_URI"]
    assert handed["TIDEMARK_SCHEMA_REGISTRY_PASSWORD"] == registry_password
    assert handed["AWS_SECRET_ACCESS_KEY"] == s3_secret and handed["AWS_SESSION_TOKEN"] == worker_token
    assert os.environ["AWS_SESSION_TOKEN"] == worker_token  # the task's own environment, as it was
    assert handed["TIDEMARK_KAFKA_SASL_USERNAME"] == "dag-user" and "dag-user" not in cmdlines
    assert dag_token not in logged  # the provider still passes it on (as --conf on YARN/Kubernetes): the DAG's own
    assert "Env.HADOOP_CONF_DIR=/etc/h" in cmdlines
    assert (out / "file_mode").read_text().strip() == "600" and (out / "dir_mode").read_text().strip() == "700"
    path = Path((out / "secrets_path").read_text().strip())
    assert not path.exists() and not path.parent.exists()
    assert "TIDEMARK_SECRETS_FILE" not in os.environ  # set only while spark-submit ran
