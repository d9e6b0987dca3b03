"""Connection settings: env parsing and secret redaction."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemark.errors import ConfigError
from tidemark.kafka.connection import KafkaConnection, allowed_settings, from_airflow_extra, from_env


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


@pytest.mark.parametrize(
    "setting",
    ["plugin.library.paths", "ssl.engine.location", "ssl.engine.id", "ssl.providers", "sasl.kerberos.kinit.cmd",
     "interceptors", "error_cb", "made.up.setting", "offset.store.path", "offset.store.method", "open_cb",
     "ssl.certificate.verify_cb", "oauthbearer_token_refresh_cb"],
)  # fmt: skip
def test_a_connection_may_not_set_code_loading_or_unknown_client_settings(setting: str) -> None:
    extra = {"bootstrap.servers": "b:9092", "security.protocol": "SSL", setting: "/tmp/libevil.so"}
    with pytest.raises(ConfigError) as refused:
        from_airflow_extra(extra, conn_id="kafka_prod")
    message = str(refused.value)
    assert "'kafka_prod'" in message and f"'{setting}'" in message and "remove" in message
    assert "/tmp/libevil.so" not in message  # the value is not echoed: it may be anything
    env = {"TIDEMARK_BOOTSTRAP_SERVERS": "b:9092", "TIDEMARK_KAFKA_" + setting.upper().replace(".", "_"): "x"}
    with pytest.raises(ConfigError, match="TIDEMARK_KAFKA_"):
        from_env(env)
    with pytest.raises(ConfigError, match=f"'{setting}'"):
        KafkaConnection("b:9092", {setting: "x"})  # however the connection is built


def test_the_documented_client_settings_are_accepted() -> None:
    settings = {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER", "sasl.mechanisms": "OAUTHBEARER",
        "sasl.username": "u", "sasl.password": "p", "sasl.oauthbearer.config": "principal=p",
        "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": "c", "sasl.oauthbearer.client.secret": "s",
        "sasl.oauthbearer.token.endpoint.url": "https://idp/token", "sasl.oauthbearer.scope": "kafka",
        "sasl.oauthbearer.extensions": "a=b", "enable.sasl.oauthbearer.unsecure.jwt": "true",
        "sasl.kerberos.service.name": "kafka", "sasl.kerberos.principal": "p", "sasl.kerberos.keytab": "/k",
        "ssl.ca.location": "/ca", "ssl.ca.pem": "-", "ssl.certificate.location": "/c", "ssl.certificate.pem": "-",
        "ssl.key.location": "/k", "ssl.key.pem": "-", "ssl.key.password": "p", "ssl.keystore.location": "/ks",
        "ssl.keystore.password": "p", "ssl.endpoint.identification.algorithm": "https", "ssl.cipher.suites": "x",
        "enable.ssl.certificate.verification": "true", "ssl.crl.location": "/crl", "client.id": "tidemark",
        "client.rack": "r1", "socket.timeout.ms": "1000", "socket.connection.setup.timeout.ms": "2000",
        "request.timeout.ms": "1000", "metadata.max.age.ms": "1000", "reconnect.backoff.ms": "10",
        "retry.backoff.ms": "10", "broker.address.family": "v4", "group.id": "g", "isolation.level": "read_committed",
        "fetch.wait.max.ms": "10", "max.partition.fetch.bytes": "1024", "queued.max.messages.kbytes": "1024",
        "debug": "broker", "https.ca.location": "/ca", "oauth_cb": "pkg.module.fn",
    }  # fmt: skip
    allowed = {"sasl.oauthbearer.token.endpoint.url", "sasl.kerberos.keytab", "ssl.ca.location",
               "ssl.crl.location", "ssl.certificate.location", "ssl.key.location", "ssl.keystore.location",
               "https.ca.location"}  # fmt: skip
    extra = {"bootstrap.servers": "b:9092", **settings}
    assert from_airflow_extra(extra, conn_id="kafka_prod", allowed=allowed).settings == settings


# Every documented librdkafka setting that reads a local file, sends data to an address it chooses, or hands the
# host's own identity to the connection's brokers (librdkafka's CONFIGURATION.md, every *.location, *.file, *.url).
LOCAL_RESOURCE = {
    "ssl.key.location": "/etc/airflow/airflow.cfg", "ssl.certificate.location": "/etc/airflow/airflow.cfg",
    "ssl.ca.location": "/etc/airflow", "ssl.crl.location": "/etc/airflow/airflow.cfg",
    "ssl.keystore.location": "/etc/airflow/airflow.cfg", "https.ca.location": "/etc/airflow/airflow.cfg",
    "sasl.kerberos.keytab": "/etc/krb5.keytab", "sasl.oauthbearer.assertion.file": "/etc/airflow/airflow.cfg",
    "sasl.oauthbearer.assertion.private.key.file": "/etc/airflow/airflow.cfg",
    "sasl.oauthbearer.assertion.jwt.template.file": "/etc/airflow/airflow.cfg",
    "sasl.oauthbearer.token.endpoint.url": "https://attacker.example/collect",
    "sasl.oauthbearer.metadata.authentication.type": "azure_imds",
}  # fmt: skip


@pytest.mark.parametrize("setting", sorted(LOCAL_RESOURCE))
def test_a_connection_may_set_a_file_or_url_reading_setting_only_when_the_deployment_allows_it_by_name(
    setting: str,
) -> None:
    value = LOCAL_RESOURCE[setting]
    extra = {"bootstrap.servers": "b:9092", "security.protocol": "SASL_SSL", setting: value}
    with pytest.raises(ConfigError) as refused:
        from_airflow_extra(extra, conn_id="kafka_prod", allowed=set())
    message = str(refused.value)
    assert "'kafka_prod'" in message and f"'{setting}'" in message and "TIDEMARK_ALLOWED_KAFKA_SETTINGS" in message
    assert value not in message  # the path (or address) is not echoed
    others = set(LOCAL_RESOURCE) - {setting}  # allowing every other one does not allow this one
    with pytest.raises(ConfigError, match=f"'{setting}'"):
        from_airflow_extra(extra, conn_id="kafka_prod", allowed=others)
    with pytest.raises(ConfigError, match=f"'{setting}'"):  # the deployment's default: nothing allowed
        from_airflow_extra(extra, conn_id="kafka_prod", allowed=allowed_settings({}))
    assert from_airflow_extra(extra, allowed={setting}).settings[setting] == value
    env = {"TIDEMARK_ALLOWED_KAFKA_SETTINGS": f"https.ca.location, {setting} "}  # comma-separated, spaces ignored
    assert from_airflow_extra(extra, allowed=allowed_settings(env)).settings[setting] == value
    assert allowed_settings({}, extra=f" {setting} ,") == {setting}  # Airflow's [tidemark] allowed_kafka_settings


def test_the_allow_list_refuses_a_name_that_needs_no_allowing_and_the_system_ca_probe_needs_none() -> None:
    with pytest.raises(ConfigError, match=r"'ssl\.key\.locaton'.*not a setting that needs allowing"):
        allowed_settings({"TIDEMARK_ALLOWED_KAFKA_SETTINGS": "ssl.key.locaton"})
    with pytest.raises(ConfigError, match=r"'sasl\.password'"):
        allowed_settings({}, extra="sasl.password")
    assert allowed_settings({"TIDEMARK_ALLOWED_KAFKA_SETTINGS": " , "}) == frozenset()
    probe = {"bootstrap.servers": "b:9092", "ssl.ca.location": "probe", "https.ca.location": "probe"}
    assert from_airflow_extra(probe, allowed=set()).settings["ssl.ca.location"] == "probe"
    with pytest.raises(ConfigError, match=r"'ssl\.ca\.location'"):
        from_airflow_extra({**probe, "ssl.ca.location": "probe/"}, allowed=set())


@pytest.mark.parametrize(
    "setting", ["sasl.oauthbearer.config", "sasl.oauthbearer.extensions", "sasl.oauthbearer.client.secret",
                "ssl.key.pem", "sasl.oauthbearer.assertion.private.key.passphrase", "sasl.password"],
)  # fmt: skip
def test_every_credential_bearing_setting_is_secret(setting: str) -> None:
    from tidemark.kafka.connection import is_secret
    from tidemark.runs.report import secret_values

    value = "principal=admin extension_token=tm-credential"
    conn = KafkaConnection("b:9092", {"security.protocol": "SASL_SSL", setting: value})
    assert is_secret(setting) and conn.describe()[setting] == "***" and value not in repr(conn)
    assert value in secret_values(conn, environ={})
    assert value in secret_values(None, environ={k: v for k, v in conn.to_env().items()})
    assert not is_secret("ssl.certificate.pem") and not is_secret("sasl.username")


def test_passwords_written_into_connection_urls_are_secret_values_raw_and_encoded() -> None:
    from urllib.parse import quote

    from tidemark.redaction import redact
    from tidemark.runs.report import secret_values

    password = "p@ss/w:rd-catalog"
    env = {"TIDEMARK_ICEBERG_CATALOG_URI": f"postgresql+psycopg://iceberg:{quote(password, safe='')}@db:5432/c",
           "TIDEMARK_SCHEMA_REGISTRY_URL": "https://reader:sr%2Fpw@registry:8081"}  # fmt: skip
    values = secret_values(None, environ=env)
    assert {password, quote(password, safe=""), "sr/pw", "sr%2Fpw"} <= values
    shown = redact(f"cannot reach {env['TIDEMARK_ICEBERG_CATALOG_URI']} ({password})", values)
    assert password not in shown and quote(password, safe="") not in shown
