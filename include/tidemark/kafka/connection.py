"""Kafka connection settings: where the brokers are and how to authenticate.

Connection settings never live in feed files. The CLI and the Spark job take them from
the environment (``TIDEMARK_BOOTSTRAP_SERVERS`` plus ``TIDEMARK_KAFKA_*`` librdkafka
settings, e.g. ``TIDEMARK_KAFKA_SASL_PASSWORD`` → ``sasl.password``), falling back to the
embedded local cluster; DAG tasks take them from an Airflow connection of the Kafka
provider's type. The object's ``repr`` and :meth:`describe` hide every secret, so it is
safe to log; only :meth:`client_config` hands secrets to librdkafka.

A connection may set only librdkafka's documented client settings (:data:`CLIENT_SETTINGS`). Those that
load or run code in the process that builds a client (``plugin.library.paths``, ``ssl.engine.location``,
``ssl.providers``, ``sasl.kerberos.kinit.cmd``, callbacks other than a token callback the deployment
allows) are refused however the connection is built: whoever may edit an Airflow connection must not
thereby run code in the api-server, whose view builds clients to show lag.

An Airflow connection may set a setting that makes librdkafka read a local file (``ssl.key.location``,
``sasl.oauthbearer.assertion.file``, ...), send something to an address the setting chooses
(``sasl.oauthbearer.token.endpoint.url``: librdkafka POSTs its assertion there, a whole file with
``sasl.oauthbearer.assertion.file``) or hand the host's own identity to the connection's brokers
(``sasl.oauthbearer.metadata.authentication.type``) only when the deployment names that setting in
``TIDEMARK_ALLOWED_KAFKA_SETTINGS`` or Airflow's ``[tidemark] allowed_kafka_settings``
(:data:`LOCAL_RESOURCE_SETTINGS`): whoever may edit a connection must not thereby read ``airflow.cfg`` out of
the api-server. Settings from the environment are the deployment's own and need no such listing.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidemark.errors import ConfigError
from tidemark.redaction import REDACTED

ENV_BOOTSTRAP = "TIDEMARK_BOOTSTRAP_SERVERS"
ENV_PREFIX = "TIDEMARK_KAFKA_"
SECRET_MARKERS = ("password", "secret", "token", "key", "credential", "jaas", "passphrase")
# Settings that carry credentials though no marker is in their name: the OAUTHBEARER login's configuration
# (an unsecured JWT's claims, a metadata login's client id) and the SASL extensions sent with the token.
SECRET_SETTINGS = ("sasl.oauthbearer.config", "sasl.oauthbearer.extensions")
# The same names as Spark's redaction regex sees them: ``kafka.sasl.oauthbearer.config`` options and
# ``spark.*Env.TIDEMARK_KAFKA_SASL_OAUTHBEARER_CONFIG`` variables (tidemark.spark.session.REDACTION_REGEX).
SECRET_SETTING_PATTERNS = tuple(name.replace(".", "[._]") for name in SECRET_SETTINGS)
# Settings whose value is a path: the file holds the secret, the name of the file is not one.
PATH_SUFFIXES = (".location", ".file")
# Tidemark's own variables that share the prefix but are not librdkafka settings.
NOT_CLIENT_SETTINGS = frozenset({"TIDEMARK_KAFKA_HOME", "TIDEMARK_KAFKA_CONN_ID"})

# librdkafka's own log lines (``%3|...|FAIL|...``, ``%4|...|GETPID|...``) go through Python logging under
# this name instead of straight to stderr: Airflow's task logs keep them, the CLI shows them only when asked
# (``tidemark --kafka-log LEVEL``). Tidemark's own errors already say what failed and what to do.
CLIENT_LOG = logging.getLogger("tidemark.kafka.client")


# Settings whose value names a Python callable (``package.module.function``), as the Airflow Kafka
# provider's connection extra gives them (MSK IAM's token callback, for instance). They travel as that
# name (environment, Spark options) and each process that builds a client, Spark executors included,
# imports the callable itself: a callable cannot be sent through an environment variable.
CALLBACK_SETTINGS = ("oauth_cb",)
# Settings with underscores in their name, which TIDEMARK_KAFKA_* variables cannot tell from dots.
_ENV_NAMES = {name.replace("_", "."): name for name in CALLBACK_SETTINGS}

# The librdkafka client settings a connection may set: the documented ones (librdkafka's CONFIGURATION.md,
# 2.x) for brokers, security, timeouts, retries and the consumer, producer and topic knobs, without those
# that load or run code (REFUSED_SETTINGS) and without the callbacks and pointers set through librdkafka's
# C API, which no text value can be. ``bootstrap.servers`` is the connection's own field.
CLIENT_SETTINGS = frozenset({
    # where and who
    "client.id", "client.rack", "client.dns.lookup", "metadata.broker.list", "broker.address.family",
    "broker.address.ttl", "enable.metrics.push",
    # security: TLS
    "security.protocol", "ssl.cipher.suites", "ssl.curves.list", "ssl.sigalgs.list", "ssl.key.location",
    "ssl.key.password", "ssl.key.pem", "ssl.certificate.location", "ssl.certificate.pem", "ssl.ca.location",
    "ssl.ca.pem", "ssl.ca.certificate.stores", "ssl.crl.location", "ssl.keystore.location", "ssl.keystore.password",
    "enable.ssl.certificate.verification", "ssl.endpoint.identification.algorithm", "https.ca.location",
    "https.ca.pem",
    # security: SASL
    "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password", "sasl.kerberos.service.name",
    "sasl.kerberos.principal", "sasl.kerberos.keytab", "sasl.kerberos.min.time.before.relogin",
    "sasl.oauthbearer.config", "enable.sasl.oauthbearer.unsecure.jwt", "sasl.oauthbearer.method",
    "sasl.oauthbearer.client.id", "sasl.oauthbearer.client.secret", "sasl.oauthbearer.client.credentials.client.id",
    "sasl.oauthbearer.client.credentials.client.secret", "sasl.oauthbearer.scope", "sasl.oauthbearer.extensions",
    "sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.grant.type", "sasl.oauthbearer.assertion.algorithm",
    "sasl.oauthbearer.assertion.private.key.file", "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem", "sasl.oauthbearer.assertion.file",
    "sasl.oauthbearer.assertion.claim.aud", "sasl.oauthbearer.assertion.claim.exp.seconds",
    "sasl.oauthbearer.assertion.claim.iss", "sasl.oauthbearer.assertion.claim.jti.include",
    "sasl.oauthbearer.assertion.claim.nbf.seconds", "sasl.oauthbearer.assertion.claim.sub",
    "sasl.oauthbearer.assertion.jwt.template.file", "sasl.oauthbearer.metadata.authentication.type",
    # network, timeouts, retries, metadata
    "socket.timeout.ms", "socket.send.buffer.bytes", "socket.receive.buffer.bytes", "socket.keepalive.enable",
    "socket.nagle.disable", "socket.max.fails", "socket.connection.setup.timeout.ms", "connections.max.idle.ms",
    "reconnect.backoff.ms", "reconnect.backoff.max.ms", "retry.backoff.ms", "retry.backoff.max.ms", "retries",
    "message.send.max.retries", "request.timeout.ms", "metadata.request.timeout.ms", "metadata.max.age.ms",
    "metadata.recovery.strategy", "metadata.recovery.rebootstrap.trigger.ms", "topic.metadata.refresh.interval.ms",
    "topic.metadata.refresh.fast.interval.ms", "topic.metadata.refresh.sparse", "topic.metadata.propagation.max.ms",
    "api.version.request", "api.version.request.timeout.ms", "api.version.fallback.ms", "broker.version.fallback",
    "message.max.bytes", "message.copy.max.bytes", "receive.message.max.bytes", "max.in.flight",
    "max.in.flight.requests.per.connection", "allow.auto.create.topics", "statistics.interval.ms",
    "debug", "log_level", "log.connection.close", "log.thread.name", "log.queue", "topic.blacklist",
    # consumer
    "group.id", "group.instance.id", "group.protocol", "group.protocol.type", "group.remote.assignor",
    "partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms", "coordinator.query.interval.ms",
    "max.poll.interval.ms", "enable.auto.commit", "auto.commit.interval.ms", "enable.auto.offset.store",
    "queued.min.messages", "queued.max.messages.kbytes", "fetch.wait.max.ms", "fetch.queue.backoff.ms",
    "fetch.message.max.bytes", "max.partition.fetch.bytes", "fetch.max.bytes", "fetch.min.bytes",
    "fetch.error.backoff.ms", "isolation.level", "enable.partition.eof", "check.crcs", "auto.offset.reset",
    # producer and topic
    "transactional.id", "transaction.timeout.ms", "enable.idempotence", "enable.gapless.guarantee",
    "queue.buffering.max.messages", "queue.buffering.max.kbytes", "queue.buffering.max.ms", "linger.ms",
    "batch.num.messages", "batch.size", "delivery.report.only.error", "sticky.partitioning.linger.ms",
    "compression.codec", "compression.type", "compression.level", "acks", "request.required.acks",
    "message.timeout.ms", "delivery.timeout.ms", "partitioner", "queuing.strategy",
    # a token callback, by name: Airflow's [apache_kafka] callback_allowlist decides (orchestration.dags)
    *CALLBACK_SETTINGS,
})  # fmt: skip
# Documented settings that load a shared library or run a command where the client is built, with what to
# do instead.
REFUSED_SETTINGS = {
    "plugin.library.paths": "librdkafka loads (dlopen) each library it names",
    "ssl.engine.location": "OpenSSL loads the engine library it names",
    "ssl.engine.id": "it selects an OpenSSL engine, which is code loaded into the process",
    "ssl.providers": "OpenSSL loads the provider modules it names",
    "sasl.kerberos.kinit.cmd": "librdkafka runs it as a shell command",
    "interceptors": "interceptors are code added to the client",
}
# Documented settings that read a local file, send data to an address the setting chooses, or send the host's
# own credentials: an Airflow connection may set them only when the deployment allow-lists each by name
# (ALLOWED_SETTINGS_ENV, or Airflow's [tidemark] allowed_kafka_settings).
LOCAL_RESOURCE_SETTINGS = {
    "ssl.key.location": "librdkafka reads the private key file it names",
    "ssl.certificate.location": "librdkafka reads the certificate file it names",
    "ssl.ca.location": "librdkafka reads the CA file (or every file of the folder) it names",
    "ssl.crl.location": "librdkafka reads the CRL file it names",
    "ssl.keystore.location": "librdkafka reads the PKCS#12 keystore it names",
    "https.ca.location": "librdkafka reads the CA file it names",
    "sasl.kerberos.keytab": "librdkafka hands the keytab file it names to Kerberos",
    "sasl.oauthbearer.assertion.file": "librdkafka reads the file it names and POSTs it to the token endpoint",
    "sasl.oauthbearer.assertion.private.key.file": "librdkafka reads the private key file it names",
    "sasl.oauthbearer.assertion.jwt.template.file": "librdkafka reads the template file it names into a token",
    "sasl.oauthbearer.token.endpoint.url": "librdkafka sends its credentials (an assertion: a whole file) there",
    "sasl.oauthbearer.metadata.authentication.type": "librdkafka fetches the host's own identity token "
    "(cloud metadata) and sends it to the connection's brokers",
}
# Values of those settings that read only the system's own files: the CA bundles OpenSSL probes for.
_HARMLESS_VALUES = frozenset({("ssl.ca.location", "probe"), ("https.ca.location", "probe")})
# The deployment's allow-list: comma-separated names of LOCAL_RESOURCE_SETTINGS that Airflow connections may set.
ALLOWED_SETTINGS_ENV = "TIDEMARK_ALLOWED_KAFKA_SETTINGS"


def allowed_settings(environ: Mapping[str, str] | None = None, extra: str | None = None) -> frozenset[str]:
    """The :data:`LOCAL_RESOURCE_SETTINGS` an Airflow connection may set: those named in
    :data:`ALLOWED_SETTINGS_ENV` and in ``extra`` (Airflow's ``[tidemark] allowed_kafka_settings``), comma-separated.

    A name that is no such setting is refused: a misspelt entry would otherwise allow nothing, silently.
    """
    text = (os.environ if environ is None else environ).get(ALLOWED_SETTINGS_ENV, "")
    names = {n.strip() for n in f"{text},{extra or ''}".split(",") if n.strip()}
    unknown = sorted(names - LOCAL_RESOURCE_SETTINGS.keys())
    if unknown:
        raise ConfigError(
            f"{ALLOWED_SETTINGS_ENV} / [tidemark] allowed_kafka_settings names {', '.join(map(repr, unknown))}, "
            f"which is not a setting that needs allowing (those are: {', '.join(sorted(LOCAL_RESOURCE_SETTINGS))})"
        )
    return frozenset(names)


def logged(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` for building one client, its log lines routed to :data:`CLIENT_LOG`, callbacks imported.

    Only for constructing a client: the logger and the callbacks are objects, never settings to pass
    on as text (Spark options, environment variables). Consumers and producers hand their lines over
    when polled, an admin client when its ``poll`` is called (:class:`~tidemark.kafka.adapter.KafkaAdapter`
    does after every call).
    """
    return {**resolve_callbacks(config), "logger": CLIENT_LOG}


def resolve_callbacks(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with each :data:`CALLBACK_SETTINGS` value given as a dotted name replaced by the callable."""
    out = dict(config)
    for key in CALLBACK_SETTINGS:
        path = out.get(key)
        if not isinstance(path, str):
            continue
        module, _, name = path.rpartition(".")
        try:
            out[key] = getattr(importlib.import_module(module), name) if module else None
        except (ImportError, AttributeError) as exc:
            raise ConfigError(
                f"Kafka setting '{key}': cannot import '{path}' ({exc}); it must name a function importable "
                "where the client runs (the Airflow worker, the Spark driver and every executor)"
            ) from exc
        if not callable(out[key]):
            raise ConfigError(f"Kafka setting '{key}': '{path}' is not a callable (give package.module.function)")
    return out


def is_secret(name: str) -> bool:
    """Whether the setting ``name`` (``sasl.password``, or as a variable's tail ``SASL_PASSWORD``) holds a secret."""
    lowered = name.lower().replace("_", ".")
    if lowered.endswith(PATH_SUFFIXES):
        return False
    return any(marker in lowered for marker in SECRET_MARKERS) or lowered.endswith(SECRET_SETTINGS)


def check_settings(settings: Mapping[str, Any], source: str, *, variables: bool = False) -> None:
    """Refuse any of ``settings`` that is not a :data:`CLIENT_SETTINGS` entry, naming ``source`` and what to do.

    ``variables``: ``source`` is the environment, so the error names the ``TIDEMARK_KAFKA_*`` variable.
    The value is never repeated: it may be a secret set under a mistyped name.
    """
    for key in settings:
        name = str(key)
        if name in CLIENT_SETTINGS:
            continue
        shown = ENV_PREFIX + name.upper().replace(".", "_") if variables else name
        if name in REFUSED_SETTINGS:
            raise ConfigError(
                f"{source} sets '{shown}', which Tidemark refuses: {REFUSED_SETTINGS[name]}, in every process "
                "that builds a Kafka client (the Airflow api-server's view among them); remove it. TLS keys and "
                "certificates go in ssl.key.pem/ssl.certificate.pem or ssl.*.location, tokens in "
                "sasl.oauthbearer.* (or a token callback allowed by [apache_kafka] callback_allowlist)"
            )
        raise ConfigError(
            f"{source} sets '{shown}', which is not a librdkafka client setting Tidemark allows "
            "(tidemark.kafka.connection.CLIENT_SETTINGS: brokers, security.protocol, sasl.*, ssl.* without "
            "engines and providers, timeouts, consumer settings); remove it, or fix its spelling"
        )


@dataclass(frozen=True)
class KafkaConnection:
    """Bootstrap servers plus extra librdkafka settings (security, timeouts)."""

    bootstrap_servers: str
    settings: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # However the connection is built (Airflow, the environment, code): no client ever gets a refused setting.
        check_settings(self.settings, "the Kafka connection")

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """The full librdkafka config, secrets included: pass it to a client, never log it."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.settings, **overrides}

    def describe(self) -> dict[str, str]:
        """The settings with secret values replaced, for logs and reports."""
        shown = {k: (REDACTED if is_secret(k) else v) for k, v in self.settings.items()}
        return {"bootstrap.servers": self.bootstrap_servers, **shown}

    def __repr__(self) -> str:
        return f"KafkaConnection({self.describe()!r})"

    def principal(self) -> str:
        """The Kafka principal these settings authenticate as, as ACLs name it (``User:...``), for error messages.

        Taken from the settings, not asked of the brokers: the SASL user, the unsecured JWT's
        ``principal``, the client certificate's CN (brokers that map subjects to principals by CN,
        ``ssl.principal.mapping.rules``), else the OAUTHBEARER client id.
        """
        settings = {k.lower(): v for k, v in self.settings.items()}
        mechanism = settings.get("sasl.mechanism", settings.get("sasl.mechanisms", "")).upper()
        protocol = settings.get("security.protocol", "plaintext").upper()
        if protocol.startswith("SASL") and mechanism != "OAUTHBEARER" and settings.get("sasl.username"):
            return f"User:{settings['sasl.username']}"
        if protocol.startswith("SASL") and mechanism == "OAUTHBEARER":
            config = dict(
                part.split("=", 1) for part in settings.get("sasl.oauthbearer.config", "").split() if "=" in part
            )
            name = config.get("principal") or settings.get("sasl.oauthbearer.client.id")
            return f"User:{name}" if name else "the OAUTHBEARER token's principal"
        if protocol == "SSL":
            return _certificate_principal(settings) or "the client certificate's principal"
        return "User:ANONYMOUS"

    def to_env(self) -> dict[str, str]:
        """Environment variables that make :func:`from_env` rebuild this connection."""
        env = {ENV_BOOTSTRAP: self.bootstrap_servers}
        for key, value in self.settings.items():
            env[ENV_PREFIX + key.upper().replace(".", "_")] = value
        return env


def _certificate_principal(settings: Mapping[str, str]) -> str | None:
    pem = settings.get("ssl.certificate.pem")
    if pem is None and settings.get("ssl.certificate.location"):
        try:
            with open(settings["ssl.certificate.location"], "rb") as handle:
                pem_bytes = handle.read()
        except OSError:
            return None
    elif pem is None:
        return None
    else:
        pem_bytes = pem.encode()
    # cryptography takes 0.7 s to import (measured): only a client certificate's principal needs it.
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    try:
        names = x509.load_pem_x509_certificate(pem_bytes).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    except ValueError:
        return None
    return f"User:{names[0].value!s}" if names else None


def from_env(environ: Mapping[str, str] | None = None) -> KafkaConnection:
    """Connection from ``TIDEMARK_*`` variables; without ``TIDEMARK_BOOTSTRAP_SERVERS`` a :class:`ConfigError`."""
    env = os.environ if environ is None else environ
    keys = {name: name[len(ENV_PREFIX) :].lower().replace("_", ".") for name in env if name.startswith(ENV_PREFIX)}
    settings = {_ENV_NAMES.get(key, key): env[name] for name, key in keys.items() if name not in NOT_CLIENT_SETTINGS}
    check_settings(settings, "the environment", variables=True)
    servers = env.get(ENV_BOOTSTRAP, "").strip()
    if not servers:
        raise ConfigError(
            f"no Kafka brokers configured: set {ENV_BOOTSTRAP} (and TIDEMARK_KAFKA_* security settings) "
            "to the cluster this run reads"
        )
    return KafkaConnection(servers, settings)


def check_local_resources(settings: Mapping[str, Any], source: str, allowed: Collection[str]) -> None:
    """Refuse every :data:`LOCAL_RESOURCE_SETTINGS` entry of ``settings`` that ``allowed`` does not name, naming
    ``source``, each setting, why, and the remedy (never the value: it may be the path of a secret)."""
    refused = sorted(
        k for k, v in settings.items()
        if k in LOCAL_RESOURCE_SETTINGS and k not in allowed and (k, v) not in _HARMLESS_VALUES
    )  # fmt: skip
    if refused:
        why = "; ".join(f"'{k}': {LOCAL_RESOURCE_SETTINGS[k]}" for k in refused)
        raise ConfigError(
            f"{source} sets {', '.join(repr(k) for k in refused)}, which the deployment does not allow ({why}), in "
            "every process that builds a Kafka client (the Airflow api-server's view among them). Give keys and "
            "certificates inline (ssl.key.pem, ssl.certificate.pem, ssl.ca.pem), or have the deployment name each "
            f"setting in {ALLOWED_SETTINGS_ENV} or Airflow's [tidemark] allowed_kafka_settings"
        )


def from_airflow_extra(
    extra: str | Mapping[str, Any], conn_id: str = "the Kafka connection", *, allowed: Collection[str] | None = None
) -> KafkaConnection:
    """Connection from a Kafka-provider Airflow connection's ``extra`` (librdkafka keys), checked against
    :data:`CLIENT_SETTINGS` and, for :data:`LOCAL_RESOURCE_SETTINGS`, against ``allowed`` (default: the
    deployment's :func:`allowed_settings`); ``conn_id`` names the connection in errors."""
    doc = json.loads(extra) if isinstance(extra, str) else dict(extra)
    servers = str(doc.pop("bootstrap.servers", "")).strip()
    if not servers:
        raise ConfigError(f"the Airflow connection '{conn_id}' has no 'bootstrap.servers' in its extra")
    source = f"the Airflow connection '{conn_id}' (its extra)"
    check_settings(doc, source)
    check_local_resources(doc, source, allowed_settings() if allowed is None else allowed)
    return KafkaConnection(servers, {k: str(v) for k, v in doc.items()})
