"""Connection settings: env parsing and secret redaction."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemark.errors import ConfigError
from tidemark.kafka.connection import KafkaConnection, from_airflow_extra, from_env


def test_from_env_maps_prefixed_settings_to_librdkafka_keys() -> None:
    conn = from_env(
        {
            "TIDEMARK_BOOTSTRAP_SERVERS": "b1:9092,b2:9092",
            "TIDEMARK_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "TIDEMARK_KAFKA_SASL_PASSWORD": "hunter2",
            "TIDEMARK_KAFKA_HOME": "/tmp/cluster",
            "TIDEMARK_KAFKA_CONN_ID": "kafka_prod",
            "OTHER": "x",
        }
    )
    assert conn.client_config() == {
        "bootstrap.servers": "b1:9092,b2:9092",
        "security.protocol": "SASL_SSL",
        "sasl.password": "hunter2",
    }


def test_secrets_never_show_in_repr_or_describe() -> None:
    conn = KafkaConnection("b:9092", {"sasl.password": "hunter2", "sasl.username": "bob", "ssl.key.location": "/k"})
    assert "hunter2" not in repr(conn)
    assert "hunter2" not in str(conn.describe())
    assert conn.describe()["sasl.username"] == "bob"
    assert conn.describe()["ssl.key.location"] == "/k"


def test_env_roundtrip() -> None:
    conn = KafkaConnection("b:9092", {"sasl.mechanism": "PLAIN"})
    assert from_env(conn.to_env()) == conn


def test_airflow_extra_requires_bootstrap_servers() -> None:
    with pytest.raises(ConfigError, match=r"bootstrap\.servers"):
        from_airflow_extra('{"security.protocol": "SSL"}')
    assert from_airflow_extra({"bootstrap.servers": "b:1", "group.id": "g"}).settings == {"group.id": "g"}


def test_principal_named_in_acl_errors_comes_from_each_mechanisms_settings(tmp_path: Path) -> None:
    from tidemark.devtools.kafka.secure import SecureCluster

    cluster = SecureCluster(tmp_path)
    cluster._make_tls()  # the CA and a client certificate only: no broker is started
    cert, _ = cluster._client_files("reader-tls")
    scram = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "reader"}
    oauth = {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
             "sasl.oauthbearer.config": "principal=reader-jwt lifeSeconds=600"}  # fmt: skip
    oidc = {**oauth, "sasl.oauthbearer.config": "", "sasl.oauthbearer.client.id": "reader-app"}
    mtls = {"security.protocol": "SSL", "ssl.certificate.location": str(cert)}
    assert [KafkaConnection("b:9093", s).principal() for s in (scram, oauth, oidc, mtls, {})] == [
        "User:reader", "User:reader-jwt", "User:reader-app", "User:reader-tls", "User:ANONYMOUS",
    ]  # fmt: skip
    pem = {"security.protocol": "SSL", "ssl.certificate.pem": cert.read_text()}
    assert KafkaConnection("b:9093", pem).principal() == "User:reader-tls"


def test_a_token_callback_travels_by_name_and_is_imported_where_a_client_is_built() -> None:
    from tests.support.tokens import unsecured_jwt
    from tidemark.kafka.connection import logged

    conn = KafkaConnection(
        "b:9093", {"sasl.mechanism": "OAUTHBEARER", "oauth_cb": "tests.support.tokens.unsecured_jwt"}
    )
    env = conn.to_env()
    assert env["TIDEMARK_KAFKA_OAUTH_CB"] == "tests.support.tokens.unsecured_jwt"
    assert from_env(env) == conn  # the name survives the environment, as it does Spark options
    assert logged(conn.client_config())["oauth_cb"] is unsecured_jwt
    for path in ("tests.support.tokens.missing", "no_such_module.cb", "tests.support.tokens.LIFETIME_S"):
        with pytest.raises(ConfigError, match=f"'oauth_cb'.*{path}"):
            logged(KafkaConnection("b:9093", {"oauth_cb": path}).client_config())
