"""The private file that hands the connections to the Spark driver (tidemark.spark.secrets)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tidemark.errors import ConfigError
from tidemark.spark.secrets import SECRETS_FILE_ENV, load_secrets, secrets_file, split_env


def test_the_file_is_private_holds_the_connections_and_is_gone_after_the_block() -> None:
    values = {"TIDEMARK_KAFKA_SSL_KEY_PEM": "-----BEGIN PRIVATE KEY-----\nabc\n", "AWS_SECRET_ACCESS_KEY": "s"}
    with secrets_file(values) as path:
        assert path is not None
        file, folder = Path(path), Path(path).parent
        assert stat.S_IMODE(file.stat().st_mode) == 0o600 and stat.S_IMODE(folder.stat().st_mode) == 0o700
        env = {SECRETS_FILE_ENV: path, "OTHER": "x"}
        assert load_secrets(env) == sorted(values)
        assert env == {SECRETS_FILE_ENV: path, "OTHER": "x", **values}
    assert not file.exists() and not folder.exists()
    with secrets_file({}) as nothing:
        assert nothing is None
    assert load_secrets({}) == []


def test_a_mounted_secret_folder_gives_one_variable_per_file(tmp_path: Path) -> None:
    """The layout of a Kubernetes secret volume: a file per key, ``..data`` links and dot files beside them."""
    (tmp_path / "TIDEMARK_KAFKA_SASL_PASSWORD").write_text("pw")
    (tmp_path / "TIDEMARK_ICEBERG_CATALOG_URI").write_text("postgresql+psycopg://u:p%40ss@db/c")
    (tmp_path / "..data").mkdir()
    (tmp_path / ".hidden").write_text("x")
    env: dict[str, str] = {SECRETS_FILE_ENV: str(tmp_path)}
    assert load_secrets(env) == ["TIDEMARK_ICEBERG_CATALOG_URI", "TIDEMARK_KAFKA_SASL_PASSWORD"]
    assert env["TIDEMARK_KAFKA_SASL_PASSWORD"] == "pw"


def test_an_unreadable_or_malformed_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        load_secrets({SECRETS_FILE_ENV: str(tmp_path / "missing.json")})
    bad = tmp_path / "bad.json"
    for text in ("not json", json.dumps(["a"]), json.dumps({"A": 1})):
        bad.write_text(text)
        with pytest.raises(ConfigError, match="JSON object of variables"):
            load_secrets({SECRETS_FILE_ENV: str(bad)})


def test_only_the_connection_variables_leave_the_environment() -> None:
    env = {"TIDEMARK_BOOTSTRAP_SERVERS": "b:9092", "TIDEMARK_KAFKA_SASL_PASSWORD": "pw", "TIDEMARK_KAFKA_HOME": "/k",
           "AWS_SECRET_ACCESS_KEY": "s", "TIDEMARK_ICEBERG_CATALOG_URI": "u", "TIDEMARK_SPARK_MASTER": "yarn",
           "PATH": "/bin"}  # fmt: skip
    kept, moved = split_env(env)
    assert kept == {"TIDEMARK_KAFKA_HOME": "/k", "TIDEMARK_SPARK_MASTER": "yarn", "PATH": "/bin"}
    assert set(moved) == set(env) - set(kept)
