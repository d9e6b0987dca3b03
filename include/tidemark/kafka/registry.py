"""The schema registry: where it is, how to log in, and the questions Tidemark asks it.

Like the Kafka connection, the registry's settings never live in feed files. The CLI and
the Spark job take them from the environment (``TIDEMARK_SCHEMA_REGISTRY_URL``, and
``TIDEMARK_SCHEMA_REGISTRY_USERNAME`` / ``TIDEMARK_SCHEMA_REGISTRY_PASSWORD`` for HTTP
basic auth); DAG tasks take them from an Airflow connection (``tidemark_schema_registry``,
see :mod:`tidemark.orchestration.dags`). The object's ``repr`` and :meth:`describe` hide
the password and any credentials written into the URL, so it is safe to log.

:class:`RegistryClient` speaks the Confluent REST API (Confluent's registry, Apicurio's
``/apis/ccompat/v7``, Karapace): a schema by its id, a subject's versions, and one version. Each schema
is fetched once per client. Failures are typed: an unreachable or failing registry is a
:class:`~tidemark.errors.RegistryUnavailableError`, an id or subject it does not know a
:class:`~tidemark.errors.SchemaNotFoundError`.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tidemark.errors import ConfigError, RegistryUnavailableError, SchemaNotFoundError

ENV_URL = "TIDEMARK_SCHEMA_REGISTRY_URL"
ENV_USERNAME = "TIDEMARK_SCHEMA_REGISTRY_USERNAME"
ENV_PASSWORD = "TIDEMARK_SCHEMA_REGISTRY_PASSWORD"
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RegistryConnection:
    """The registry's base URL (the Confluent-compatible API) and optional basic-auth credentials."""

    url: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def describe(self) -> dict[str, str]:
        """The settings with the password (and any credentials in the URL) hidden, for logs and reports."""
        shown = {"url": _without_userinfo(self.url)}
        if self.username:
            shown["username"] = self.username
        if self.password:
            shown["password"] = "***"
        return shown

    def __repr__(self) -> str:
        return f"RegistryConnection({self.describe()!r})"

    def to_env(self) -> dict[str, str]:
        """Environment variables that make :func:`from_env` rebuild this connection."""
        env = {ENV_URL: self.url}
        if self.username:
            env[ENV_USERNAME] = self.username
        if self.password:
            env[ENV_PASSWORD] = self.password
        return env


def _without_userinfo(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def from_env(environ: Mapping[str, str] | None = None) -> RegistryConnection | None:
    """The registry from ``TIDEMARK_SCHEMA_REGISTRY_*``; ``None`` when no URL is set."""
    env = os.environ if environ is None else environ
    url = env.get(ENV_URL, "").strip()
    if not url:
        return None
    return RegistryConnection(url.rstrip("/"), env.get(ENV_USERNAME) or None, env.get(ENV_PASSWORD) or None)


def require(connection: RegistryConnection | None, feed: str) -> RegistryConnection:
    """``connection``, or a :class:`ConfigError` saying how to configure one for ``feed``."""
    if connection is None:
        raise ConfigError(
            f"feed '{feed}' decodes Schema Registry records but no registry is configured: set {ENV_URL} "
            f"(and {ENV_USERNAME}/{ENV_PASSWORD}) for the CLI, or define the Airflow connection "
            "'tidemark_schema_registry' (type http: host = the registry's URL, login and password)"
        )
    return connection


@dataclass(frozen=True)
class SchemaReference:
    """An import of a registered schema (a Protobuf file's dependency): its import name and where it is registered."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class SubjectVersion:
    subject: str
    version: int
    schema_id: int
    schema: str
    schema_type: str = "AVRO"
    references: tuple[SchemaReference, ...] = ()


class RegistryClient:
    """A small Confluent-REST client: schemas by id and subject versions, each fetched once."""

    def __init__(self, connection: RegistryConnection) -> None:
        self.connection = connection
        self._typed: dict[tuple[int, str | None], tuple[str, str, tuple[SchemaReference, ...]]] = {}

    def _get(self, path: str, what: str) -> Any:
        url = self.connection.url.rstrip("/") + path
        request = urllib.request.Request(url, headers={"Accept": "application/vnd.schemaregistry.v1+json"})
        if self.connection.username or self.connection.password:
            token = f"{self.connection.username or ''}:{self.connection.password or ''}".encode()
            request.add_header("Authorization", "Basic " + base64.b64encode(token).decode())
        shown = _without_userinfo(url)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise SchemaNotFoundError(f"the schema registry has no {what} ({shown} answered 404)") from None
            if exc.code in (401, 403):
                raise RegistryUnavailableError(
                    f"the schema registry refused the credentials asking for {what} ({shown} answered {exc.code}); "
                    "check the registry connection's username and password"
                ) from None
            raise RegistryUnavailableError(
                f"the schema registry failed asking for {what} ({shown} answered {exc.code}); retry the run "
                "once the registry is healthy"
            ) from None
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RegistryUnavailableError(
                f"the schema registry at {_without_userinfo(self.connection.url)} cannot be reached asking for "
                f"{what} ({reason}); start it or fix the registry connection's URL, then rerun"
            ) from None

    def typed_version(self, subject: str, version: int | None, fmt: str | None = None) -> SubjectVersion:
        """``version`` of ``subject`` (its latest when ``None``): its id, schema, type and references; ``fmt``:
        the API's ``format`` (``serialized``: a Protobuf schema as a base64 ``FileDescriptorProto``, not ``.proto``
        text)."""
        which = "latest" if version is None else str(version)
        quoted = urllib.parse.quote(subject, safe="")
        query = f"?format={fmt}" if fmt else ""
        doc = self._get(f"/subjects/{quoted}/versions/{which}{query}", f"version {which} of subject '{subject}'")
        return SubjectVersion(subject, int(doc["version"]), int(doc["id"]), str(doc["schema"]),
                              str(doc.get("schemaType", "AVRO")), _references(doc))  # fmt: skip

    def versions(self, subject: str) -> list[int]:
        """The versions registered under ``subject``, oldest first."""
        quoted = urllib.parse.quote(subject, safe="")
        return sorted(int(v) for v in self._get(f"/subjects/{quoted}/versions", f"versions of subject '{subject}'"))

    def typed_schema(self, schema_id: int, fmt: str | None = None) -> tuple[str, str, tuple[SchemaReference, ...]]:
        """The schema registered under ``schema_id`` of any type: its type, its text and its references."""
        key = (schema_id, fmt)
        if key not in self._typed:
            query = f"?format={fmt}" if fmt else ""
            doc = self._get(f"/schemas/ids/{schema_id}{query}", f"schema id {schema_id}")
            self._typed[key] = (str(doc.get("schemaType", "AVRO")), str(doc["schema"]), _references(doc))
        return self._typed[key]


def _references(doc: Mapping[str, Any]) -> tuple[SchemaReference, ...]:
    return tuple(
        SchemaReference(str(r["name"]), str(r["subject"]), int(r["version"])) for r in doc.get("references") or ()
    )
