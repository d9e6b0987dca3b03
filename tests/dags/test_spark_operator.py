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
    # The job itself ships the package when the master is not local[...] (tidemark.job.steps.should_ship):
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
