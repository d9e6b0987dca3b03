"""The spark-submit command and the shipping decision, for local and cluster masters."""

from __future__ import annotations

import re

import pytest

from tidemark.connection import is_secret
from tidemark.job import _ship_setting, should_ship
from tidemark.pipeline import RunHandle, spark_submit_command
from tidemark.spark_session import REDACTION_REGEX

HANDLE = RunHandle("r1", "orders", "p1", "/state/plan.json", "/state/runs/r1", "incremental", True, 5)

# librdkafka settings Tidemark treats as secret, and ones it shows.
SECRET_SETTINGS = ("sasl.password", "ssl.key.password", "ssl.keystore.password", "sasl.oauthbearer.client.secret",
                   "ssl.key.pem", "ssl_key", "ssl.certificate.pem.key", "sasl.jaas.config", "sasl.oauthbearer.token",
                   "sasl.credentials")  # fmt: skip
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
    from dataclasses import replace

    from tidemark.spark_session import SMALL_RUN_JAVA_OPTIONS, SMALL_RUN_JAVA_OPTIONS_ENV, SMALL_RUN_MAX_RECORDS

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
