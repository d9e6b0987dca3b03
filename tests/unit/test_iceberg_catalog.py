"""Which Iceberg catalog Tidemark opens, from the environment only (no catalog server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemark.errors import ConfigError
from tidemark.output.iceberg import CATALOG_TYPE_ENV, CATALOG_URI_ENV, catalog_properties, catalog_uri, open_catalog


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in (CATALOG_URI_ENV, CATALOG_TYPE_ENV, "TIDEMARK_S3_ENDPOINT", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TIDEMARK_STATE_DIR", str(tmp_path / "state"))


def test_the_default_is_sqlite_in_the_state_dir_and_postgresql_goes_through_psycopg3(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert catalog_uri() == f"sqlite:///{tmp_path / 'state' / 'iceberg_catalog.sqlite'}"
    assert type(open_catalog()).__name__ == "SqlCatalog"
    monkeypatch.setenv(CATALOG_URI_ENV, "postgresql://u:p@db:5432/lake")
    assert catalog_uri() == "postgresql+psycopg://u:p@db:5432/lake"


def test_rest_and_glue_are_chosen_by_uri_or_type_and_no_secret_becomes_a_property(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CATALOG_URI_ENV, "https://catalog.example.com/api")
    assert catalog_uri() == "https://catalog.example.com/api"
    monkeypatch.delenv(CATALOG_URI_ENV)
    monkeypatch.setenv(CATALOG_TYPE_ENV, "glue")
    assert catalog_uri() is None  # Glue needs no URI
    props = catalog_properties(None, "glue", "http://s3.local:9000", "eu-west-1")
    assert props == {"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO", "type": "glue",
                     "s3.endpoint": "http://s3.local:9000", "s3.region": "eu-west-1"}  # fmt: skip


def test_a_catalog_that_cannot_open_is_refused_with_the_settings_to_fix_and_no_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CATALOG_URI_ENV, "ftp://user:hunter2@catalog/")
    with pytest.raises(ConfigError) as info:
        open_catalog()
    message = str(info.value)
    assert CATALOG_URI_ENV in message and CATALOG_TYPE_ENV in message
    assert "hunter2" not in message
