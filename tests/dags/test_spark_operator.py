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
