"""Kafka connection settings: where the brokers are and how to authenticate.

Connection settings never live in feed files. The CLI and the Spark job take them from
the environment (``TIDEMARK_BOOTSTRAP_SERVERS`` plus ``TIDEMARK_KAFKA_*`` librdkafka
settings, e.g. ``TIDEMARK_KAFKA_SASL_PASSWORD`` → ``sasl.password``), falling back to the
embedded local cluster; DAG tasks take them from an Airflow connection of the Kafka
provider's type. The object's ``repr`` and :meth:`describe` hide every secret, so it is
safe to log; only :meth:`client_config` hands secrets to librdkafka.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tidemark.errors import ConfigError

ENV_BOOTSTRAP = "TIDEMARK_BOOTSTRAP_SERVERS"
ENV_PREFIX = "TIDEMARK_KAFKA_"
SECRET_MARKERS = ("password", "secret", "token", "key", "credential", "jaas")
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
    import importlib

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
    lowered = name.lower()
    return any(marker in lowered for marker in SECRET_MARKERS) and not lowered.endswith(".location")


@dataclass(frozen=True)
class KafkaConnection:
    """Bootstrap servers plus extra librdkafka settings (security, timeouts)."""

    bootstrap_servers: str
    settings: Mapping[str, str] = field(default_factory=dict, repr=False)

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """The full librdkafka config, secrets included: pass it to a client, never log it."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.settings, **overrides}

    def describe(self) -> dict[str, str]:
        """The settings with secret values replaced, for logs and reports."""
        shown = {k: ("***" if is_secret(k) else v) for k, v in self.settings.items()}
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
    servers = env.get(ENV_BOOTSTRAP, "").strip()
    if not servers:
        raise ConfigError(
            f"no Kafka brokers configured: set {ENV_BOOTSTRAP} (and TIDEMARK_KAFKA_* security settings) "
            "to the cluster this run reads"
        )
    return KafkaConnection(servers, settings)


def from_airflow_extra(extra: str | Mapping[str, Any]) -> KafkaConnection:
    """Connection from a Kafka-provider Airflow connection's ``extra`` (librdkafka keys)."""
    doc = json.loads(extra) if isinstance(extra, str) else dict(extra)
    servers = str(doc.pop("bootstrap.servers", "")).strip()
    if not servers:
        raise ConfigError("the Airflow Kafka connection's extra has no 'bootstrap.servers'")
    return KafkaConnection(servers, {k: str(v) for k, v in doc.items()})
