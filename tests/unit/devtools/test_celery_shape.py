"""The Celery shape's settings and the namespace script its workers start through (no process started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemark.devtools.airflow import AirflowStartError
from tidemark.devtools.celery import CeleryAirflow, driver_url, namespace_script, under_tmp

URL = "postgresql://u:pw@127.0.0.1:5432/airflow"


def test_metadata_broker_and_results_share_one_database_through_psycopg(tmp_path: Path) -> None:
    env = CeleryAirflow(home=tmp_path, database_url=URL).env()
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == "postgresql+psycopg://u:pw@127.0.0.1:5432/airflow"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"] == env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert env["AIRFLOW__CELERY__BROKER_URL"] == "sqla+postgresql+psycopg://u:pw@127.0.0.1:5432/airflow"
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"] == "db+postgresql+psycopg://u:pw@127.0.0.1:5432/airflow"
    assert env["AIRFLOW__CELERY__WORKER_ENABLE_REMOTE_CONTROL"] == "False"  # the database transport cannot broadcast
    assert driver_url("postgresql+psycopg://a@b/c", "sqla+postgresql+psycopg") == "sqla+postgresql+psycopg://a@b/c"


def test_without_a_database_the_error_names_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIDEMARK_AIRFLOW_DATABASE_URL", raising=False)
    with pytest.raises(AirflowStartError, match="TIDEMARK_AIRFLOW_DATABASE_URL=postgresql://"):
        CeleryAirflow(home=tmp_path).env()


def test_a_worker_gets_its_hostname_a_fresh_tmp_and_only_the_installation_bound_back() -> None:
    script = namespace_script("tidemark-worker-2", ["work/checkout", "pytest-of-root/p0/dags"])
    assert script.startswith("hostname tidemark-worker-2 && cd /tmp && mount -t tmpfs")
    assert "mount --no-canonicalize --bind ./work/checkout /tmp/work/checkout" in script
    assert "mount --no-canonicalize --bind ./pytest-of-root/p0/dags /tmp/pytest-of-root/p0/dags" in script
    assert script.endswith('exec "$0" "$@"')
    # Only folders under /tmp need binding back, and only the outermost of nested ones.
    assert under_tmp([Path("/tmp/a"), Path("/tmp/a/b"), Path("/usr/lib"), Path("/tmp/c")]) == ["a", "c"]
    assert CeleryAirflow(database_url=URL).processes()[-2:] == ("worker-1", "worker-2")
