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

The client trusts neither its server nor its URL: credentials written into the URL are taken out of it
(and sent as basic auth, never as part of an address an error could show); a redirect is followed only
within the registry's own origin (scheme, host and port), so the credentials never reach another host
and https never turns into http; an answer is read up to :data:`MAX_RESPONSE_BYTES` and parsed only
if it nests at most :data:`MAX_JSON_DEPTH` deep. Every failure is one of the typed errors above, its
text built from the URL without credentials and scrubbed of the password.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from tidemark.errors import ConfigError, RegistryUnavailableError, SchemaNotFoundError
from tidemark.redaction import REDACTED, password_forms, redact

ENV_URL = "TIDEMARK_SCHEMA_REGISTRY_URL"
ENV_USERNAME = "TIDEMARK_SCHEMA_REGISTRY_USERNAME"
ENV_PASSWORD = "TIDEMARK_SCHEMA_REGISTRY_PASSWORD"
TIMEOUT_S = 10.0
# A registry's answer is one schema or a list of versions: kilobytes, a large Protobuf descriptor a few
# hundred. Anything beyond this is not an answer Tidemark reads to its end.
MAX_RESPONSE_BYTES = 8 << 20
# Python's JSON parser recurses per level and raises RecursionError near a thousand; no schema nests so deep.
MAX_JSON_DEPTH = 200
MAX_REDIRECTS = 5


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
            shown["password"] = REDACTED
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
    """``url`` without the ``user:password@`` part; never an error (a port that is not a number stays as text)."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _userinfo(url: str) -> tuple[str | None, str | None]:
    """The (percent-decoded) username and password written into ``url``, if any."""
    netloc = urllib.parse.urlsplit(url).netloc
    if "@" not in netloc:
        return None, None
    user, colon, password = netloc.rpartition("@")[0].partition(":")
    return urllib.parse.unquote(user) or None, urllib.parse.unquote(password) if colon else None


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1  # not a number: matches no other origin
    return parts.scheme.lower(), (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(parts.scheme)


def json_depth(data: bytes) -> int:
    """How deep ``data``'s arrays and objects nest (brackets inside strings do not count)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Hands every redirect back to the client as an HTTPError, which decides where (and whether) to go."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


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
        url_user, url_password = _userinfo(connection.url)
        # Credentials in the URL are basic auth like the connection's own; the URL keeps only the address.
        self._base = _without_userinfo(connection.url).rstrip("/")
        self._username = connection.username or url_user
        self._password = connection.password or url_password
        self._opener = urllib.request.build_opener(_NoRedirects)
        self._typed: dict[tuple[int, str | None], tuple[str, str, tuple[SchemaReference, ...]]] = {}
        self._versions: dict[tuple[str, int, str | None], SubjectVersion] = {}

    def _scrub(self, text: str) -> str:
        return str(redact(text, password_forms(self._password)))

    def _get(self, path: str, what: str) -> Any:
        try:
            return self._fetch(path, what)
        except (RegistryUnavailableError, SchemaNotFoundError) as exc:
            raise type(exc)(self._scrub(str(exc))) from None

    def _fetch(self, path: str, what: str) -> Any:
        url = self._base + path
        origin = _origin(self._base)
        for _ in range(MAX_REDIRECTS + 1):
            request = urllib.request.Request(url, headers={"Accept": "application/vnd.schemaregistry.v1+json"})
            if self._username or self._password:
                token = f"{self._username or ''}:{self._password or ''}".encode()
                request.add_header("Authorization", "Basic " + base64.b64encode(token).decode())
            try:
                with self._opener.open(request, timeout=TIMEOUT_S) as response:
                    return _parse(_read_bounded(response, url, what), url, what)
            except urllib.error.HTTPError as exc:
                with exc:
                    if exc.code in (301, 302, 303, 307, 308) and exc.headers.get("Location"):
                        url = urllib.parse.urljoin(url, exc.headers["Location"])
                        _check_redirect(origin, self._base, url, what)
                        continue
                    _raise_for_status(exc.code, url, what)
            except (OSError, ValueError, http.client.HTTPException) as exc:
                reason = getattr(exc, "reason", exc)
                raise RegistryUnavailableError(
                    f"the schema registry at {self._base} cannot be reached asking for {what} "
                    f"({type(exc).__name__}: {reason}); start it or fix the registry connection's URL, then rerun"
                ) from None
        raise RegistryUnavailableError(
            f"the schema registry at {self._base} redirected more than {MAX_REDIRECTS} times asking for {what} "
            f"(last to {_without_userinfo(url)}); point the registry connection at the registry's final URL"
        )

    def typed_version(self, subject: str, version: int | None, fmt: str | None = None) -> SubjectVersion:
        """``version`` of ``subject`` (its latest when ``None``): its id, schema, type and references; ``fmt``:
        the API's ``format`` (``serialized``: a Protobuf schema as a base64 ``FileDescriptorProto``, not ``.proto``
        text). A numbered version is fetched once per client (it never changes); ``latest`` each time."""
        key = (subject, version, fmt) if version is not None else None
        if key is not None and key in self._versions:
            return self._versions[key]
        which = "latest" if version is None else str(version)
        quoted = urllib.parse.quote(subject, safe="")
        query = f"?format={fmt}" if fmt else ""
        what = f"version {which} of subject '{subject}'"
        doc = self._get(f"/subjects/{quoted}/versions/{which}{query}", what)
        try:
            found = SubjectVersion(subject, int(doc["version"]), int(doc["id"]), str(doc["schema"]),
                                   str(doc.get("schemaType", "AVRO")), _references(doc))  # fmt: skip
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise RegistryUnavailableError(_malformed(self._base, what, exc)) from None
        if key is not None:
            self._versions[key] = found
        return found

    def versions(self, subject: str) -> list[int]:
        """The versions registered under ``subject``, oldest first."""
        quoted = urllib.parse.quote(subject, safe="")
        what = f"versions of subject '{subject}'"
        try:
            return sorted(int(v) for v in self._get(f"/subjects/{quoted}/versions", what))
        except (TypeError, ValueError) as exc:
            raise RegistryUnavailableError(_malformed(self._base, what, exc)) from None

    def typed_schema(self, schema_id: int, fmt: str | None = None) -> tuple[str, str, tuple[SchemaReference, ...]]:
        """The schema registered under ``schema_id`` of any type: its type, its text and its references."""
        key = (schema_id, fmt)
        if key not in self._typed:
            query = f"?format={fmt}" if fmt else ""
            what = f"schema id {schema_id}"
            doc = self._get(f"/schemas/ids/{schema_id}{query}", what)
            try:
                self._typed[key] = (str(doc.get("schemaType", "AVRO")), str(doc["schema"]), _references(doc))
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                raise RegistryUnavailableError(_malformed(self._base, what, exc)) from None
        return self._typed[key]


def _references(doc: Mapping[str, Any]) -> tuple[SchemaReference, ...]:
    return tuple(
        SchemaReference(str(r["name"]), str(r["subject"]), int(r["version"])) for r in doc.get("references") or ()
    )


def _check_redirect(origin: tuple[str, str, int | None], base: str, target: str, what: str) -> None:
    """Refuse a redirect that leaves the registry's origin: its credentials go nowhere else."""
    shown = _without_userinfo(target)
    if origin[0] == "https" and _origin(target)[0] != "https":
        raise RegistryUnavailableError(
            f"the schema registry at {base} redirected the request for {what} from https to {shown}; Tidemark "
            "does not send the registry's credentials unencrypted: fix the registry's (or its proxy's) redirect"
        )
    if _origin(target) != origin:
        raise RegistryUnavailableError(
            f"the schema registry at {base} redirected the request for {what} to {shown}, another host or port; "
            "Tidemark sends the registry's credentials to no other address: point the registry connection at "
            "that URL if it is the registry"
        )


def _raise_for_status(code: int, url: str, what: str) -> NoReturn:
    shown = _without_userinfo(url)
    if code == 404:
        raise SchemaNotFoundError(f"the schema registry has no {what} ({shown} answered 404)")
    if code in (401, 403):
        raise RegistryUnavailableError(
            f"the schema registry refused the credentials asking for {what} ({shown} answered {code}); "
            "check the registry connection's username and password"
        )
    raise RegistryUnavailableError(
        f"the schema registry failed asking for {what} ({shown} answered {code}); retry the run "
        "once the registry is healthy"
    )


def _read_bounded(response: Any, url: str, what: str) -> bytes:
    """The answer's body, refused past :data:`MAX_RESPONSE_BYTES` (declared or sent) without reading on."""
    declared = response.headers.get("Content-Length")
    too_big = (
        f"the schema registry's answer for {what} ({_without_userinfo(url)}) is larger than {MAX_RESPONSE_BYTES} "
        "bytes; Tidemark reads no schema that large: check that the URL is the registry's API"
    )
    if declared is not None and declared.strip().isdigit() and int(declared) > MAX_RESPONSE_BYTES:
        raise RegistryUnavailableError(too_big)
    data = bytes(response.read(MAX_RESPONSE_BYTES + 1))
    if len(data) > MAX_RESPONSE_BYTES:
        raise RegistryUnavailableError(too_big)
    return data


def _parse(data: bytes, url: str, what: str) -> Any:
    """``data`` as JSON, refused when it nests deeper than :data:`MAX_JSON_DEPTH` or is not JSON."""
    shown = _without_userinfo(url)
    if json_depth(data) > MAX_JSON_DEPTH:
        raise RegistryUnavailableError(
            f"the schema registry's answer for {what} ({shown}) nests deeper than {MAX_JSON_DEPTH} levels; "
            "Tidemark reads no schema that deep: check that the URL is the registry's API"
        )
    try:
        return json.loads(data)
    except ValueError as exc:
        raise RegistryUnavailableError(
            f"the schema registry's answer for {what} ({shown}) is not JSON ({exc}); check that the URL is the "
            "registry's API"
        ) from None


def _malformed(base: str, what: str, exc: Exception) -> str:
    return (
        f"the schema registry at {base} answered the request for {what} without the fields of the Confluent API "
        f"({type(exc).__name__}: {exc}); check that the URL is the registry's API"
    )
