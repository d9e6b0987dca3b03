"""The spark-submit command and the shipping decision, for local and cluster masters."""

from __future__ import annotations

import os
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tidemark.job.entry import _ship_setting, should_ship
from tidemark.kafka.connection import is_secret
from tidemark.runs.pipeline import RunHandle, spark_submit_command
from tidemark.spark.session import REDACTION_REGEX, SMALL_RUN_MAX_RECORDS

HANDLE = RunHandle("r1", "orders", "p1", "/state/plan.json", "/state/runs/r1", "incremental", True, 5)

# librdkafka settings Tidemark treats as secret, and ones it shows.
SECRET_SETTINGS = ("sasl.password", "ssl.key.password", "ssl.keystore.password", "sasl.oauthbearer.client.secret",
                   "ssl.key.pem", "ssl_key", "ssl.certificate.pem.key", "sasl.jaas.config", "sasl.oauthbearer.token",
                   "sasl.credentials", "sasl.oauthbearer.config", "sasl.oauthbearer.extensions")  # fmt: skip
PLAIN_SETTINGS = ("security.protocol", "sasl.mechanism", "sasl.username", "bootstrap.servers", "client.id")


def _conf(cmd: list[str]) -> dict[str, str]:
    pairs = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--conf"]
    return dict(p.split("=", 1) for p in pairs)


@pytest.mark.parametrize("master", ["local[*]", "spark://127.0.0.1:7077"])
def test_the_command_names_the_master_and_widens_redaction(master: str) -> None:
    cmd = spark_submit_command(HANDLE, master)
    assert cmd[cmd.index("--master") + 1] == master
    conf = _conf(cmd)
    assert conf["spark.redaction.regex"] == REDACTION_REGEX
    assert conf["spark.ui.enabled"] == "false"
    assert cmd[-4:] == ["--plan", HANDLE.plan_path, "--run-dir", HANDLE.run_dir]


def test_small_runs_get_a_short_lived_driver_jvm(monkeypatch: pytest.MonkeyPatch) -> None:
    from tidemark.spark.session import SMALL_RUN_JAVA_OPTIONS, SMALL_RUN_JAVA_OPTIONS_ENV, SMALL_RUN_MAX_RECORDS

    monkeypatch.delenv(SMALL_RUN_JAVA_OPTIONS_ENV, raising=False)
    options = "spark.driver.extraJavaOptions"
    assert _conf(spark_submit_command(HANDLE, "local[*]"))[options] == SMALL_RUN_JAVA_OPTIONS
    small = replace(HANDLE, records=SMALL_RUN_MAX_RECORDS)
    assert _conf(spark_submit_command(small, "local[*]"))[options] == SMALL_RUN_JAVA_OPTIONS
    # Larger runs keep whatever the deployment configures (C2 pays off in a long run).
    assert options not in _conf(spark_submit_command(replace(small, records=SMALL_RUN_MAX_RECORDS + 1), "local[*]"))
    monkeypatch.setenv(SMALL_RUN_JAVA_OPTIONS_ENV, "-XX:+UseSerialGC")
    assert _conf(spark_submit_command(HANDLE, "local[*]"))[options] == "-XX:+UseSerialGC"
    monkeypatch.setenv(SMALL_RUN_JAVA_OPTIONS_ENV, "")
    assert options not in _conf(spark_submit_command(HANDLE, "local[*]"))


def test_the_package_ships_to_cluster_executors_only_unless_told() -> None:
    assert not should_ship("local[*]", None) and not should_ship("local[2]", None)
    assert should_ship("spark://127.0.0.1:7077", None) and should_ship("yarn", None)
    assert should_ship("k8s://https://k:6443", None)
    assert should_ship("local[*]", True) and not should_ship("spark://h:7077", False)
    assert [_ship_setting(v) for v in ("", "1", "true", "0", "false", "no")] == [None, True, True, False, False, False]


def test_the_redaction_pattern_covers_every_secret_setting() -> None:
    # Spark applies the pattern to keys (and values) with Java's find(): re.search is the same here.
    pattern = re.compile(REDACTION_REGEX.removeprefix("(?i)"), re.IGNORECASE)
    for name in SECRET_SETTINGS:
        assert is_secret(name), name
        env_name = "TIDEMARK_KAFKA_" + name.upper().replace(".", "_")
        for key in (f"kafka.{name}", f"spark.executorEnv.{env_name}", f"spark.kubernetes.driverEnv.{env_name}"):
            assert pattern.search(key), key
    for name in PLAIN_SETTINGS:
        assert not is_secret(name) and not pattern.search(f"kafka.{name}"), name
    # The Iceberg catalog's URL carries its database password.
    assert pattern.search("spark.yarn.appMasterEnv.TIDEMARK_ICEBERG_CATALOG_URI")
    # Spark's own default pattern stays covered.
    for key in ("spark.authenticate.secret", "fs.s3a.access.key", "spark.ssl.keyPassword", "x.token"):
        assert pattern.search(key), key


def test_a_small_run_starts_from_the_class_archive_and_the_first_one_writes_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tidemark.spark.session import CLASS_ARCHIVE_ENV, SMALL_RUN_JAVA_OPTIONS, SMALL_RUN_JAVA_OPTIONS_ENV
    from tidemark.spark.session import driver_class_archive as archive

    for name in (SMALL_RUN_JAVA_OPTIONS_ENV, "SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, str(tmp_path / "jvm"))
    with archive() as run:  # none yet: this run's JVM writes one, under its own name, at exit
        option = run.option
        flag, path = option.split()[0].split("=", 1)
        assert flag == "-XX:ArchiveClassesAtExit" and Path(path).parent == tmp_path / "jvm"
        options = _conf(spark_submit_command(HANDLE, "local[*]", class_archive=option))["spark.driver.extraJavaOptions"]
        assert options == f"{SMALL_RUN_JAVA_OPTIONS} {option}"
        Path(path).write_bytes(b"archive")
        run.succeeded = True  # spark-submit exited 0
    [final] = (tmp_path / "jvm").iterdir()  # moved into place once spark-submit returned
    assert final.read_bytes() == b"archive" and final.suffix == ".jsa"
    with archive() as run:
        assert run.option.split()[0] == f"-XX:SharedArchiveFile={final}"
        # A larger run gets no JVM options at all.
        larger = replace(HANDLE, records=SMALL_RUN_MAX_RECORDS + 1)
        assert "spark.driver.extraJavaOptions" not in _conf(
            spark_submit_command(larger, "local[*]", class_archive=run.option)
        )


def test_a_failed_run_leaves_no_archive_and_stale_partial_ones_are_removed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tidemark.spark.session import CLASS_ARCHIVE_ENV, STALE_ARCHIVE_S, class_archive_path, driver_class_archive

    for name in ("SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, str(tmp_path))
    final = class_archive_path(tmp_path)
    old = final.with_name(f"{final.name}.dead.tmp")
    old.write_bytes(b"half")
    os.utime(old, (time.time() - STALE_ARCHIVE_S - 1,) * 2)

    with driver_class_archive() as run:  # spark-submit exited 1: whatever its JVM wrote may be torn
        Path(run.option.split()[0].split("=", 1)[1]).write_bytes(b"written by a JVM that died")
    assert list(tmp_path.iterdir()) == []  # neither the stale partial archive nor this run's

    def raising_run() -> None:
        with driver_class_archive() as run:
            Path(run.option.split()[0].split("=", 1)[1]).write_bytes(b"written before the task failed")
            run.succeeded = True
            raise RuntimeError("the operator's spark-submit failed after all")

    with pytest.raises(RuntimeError):
        raising_run()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("setting", ["off", "conf", "hadoop"])
def test_no_archive_when_turned_off_or_when_the_classpath_has_folders(
    setting: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tidemark.spark.session import CLASS_ARCHIVE_ENV, driver_class_archive

    for name in ("SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, "off" if setting == "off" else str(tmp_path / "jvm"))
    if setting == "conf":  # a JVM cannot archive with a folder holding files on its classpath: it fails at exit
        (tmp_path / "conf").mkdir()
        (tmp_path / "conf" / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
        monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "conf"))
    if setting == "hadoop":
        monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path))
    with driver_class_archive() as run:
        assert run.option == ""
    assert not (tmp_path / "jvm").exists()


def test_the_archive_is_keyed_by_spark_conf_folder_and_java(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tidemark.spark.session import class_archive_path

    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    plain = class_archive_path(tmp_path)
    assert class_archive_path(tmp_path) == plain
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert class_archive_path(tmp_path) != plain
    monkeypatch.delenv("SPARK_CONF_DIR")
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert class_archive_path(tmp_path) != plain


def test_the_openlineage_listeners_local_jar_joins_the_s3a_jars(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tidemark.spark.session import OPENLINEAGE_ENV, OPENLINEAGE_JAR_ENV, OPENLINEAGE_LISTENER, S3A_JARS_ENV

    s3a = tmp_path / "hadoop-aws.jar"
    s3a.write_bytes(b"")
    monkeypatch.setenv(S3A_JARS_ENV, str(s3a))
    monkeypatch.setenv(OPENLINEAGE_JAR_ENV, "/opt/jars/openlineage-spark.jar")
    monkeypatch.delenv(OPENLINEAGE_ENV, raising=False)
    assert "spark.extraListeners" not in _conf(spark_submit_command(HANDLE, "local[*]"))
    monkeypatch.setenv(OPENLINEAGE_ENV, "on")
    cmd = spark_submit_command(HANDLE, "local[*]")
    assert cmd[cmd.index("--jars") + 1] == f"{s3a},/opt/jars/openlineage-spark.jar"
    assert _conf(cmd)["spark.extraListeners"] == OPENLINEAGE_LISTENER
    assert "spark.jars" not in _conf(cmd)  # --jars would replace it
