"""The registry client against a registry that is hostile or broken: a real HTTP server on 127.0.0.1.

Each test starts a small ``http.server`` in a thread whose answers the test sets: redirects to
another origin or to plain HTTP, endless or deeply nested bodies, a recursive JSON Schema, Protobuf
references that import each other. The client must send its credentials nowhere but its own origin,
stop reading at a bound, and fail with a typed, clear error that holds no secret.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tidemark.errors import RegistryUnavailableError, SchemaError, TidemarkError
from tidemark.kafka import registry as registry_module
from tidemark.kafka.registry import RegistryClient, RegistryConnection

MAX_RESPONSE_BYTES = getattr(registry_module, "MAX_RESPONSE_BYTES", 8 << 20)

PASSWORD = "sr-p@ss/w0rd-not-for-logs"
Answer = Callable[[BaseHTTPRequestHandler], None]


@dataclass
class Server:
    """An HTTP(S) server whose answer per path the test sets; it records each request's Authorization header."""

    httpd: ThreadingHTTPServer
    scheme: str
    routes: dict[str, Answer] = field(default_factory=dict)
    seen: list[tuple[str, str | None]] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.httpd.server_address[1]}"


def _serve(tls: ssl.SSLContext | None = None) -> Server:
    server: Server

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            server.seen.append((path, self.headers.get("Authorization")))
            answer = server.routes.get(path)
            if answer is None:
                self.send_error(404)
            else:
                answer(self)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    server = Server(httpd, "https" if tls else "http")
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def servers() -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(tls: ssl.SSLContext | None = None) -> Server:
        started.append(_serve(tls))
        return started[-1]

    yield start
    for server in started:
        server.httpd.shutdown()
        server.httpd.server_close()


def json_answer(doc: Any) -> Answer:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        body = json.dumps(doc).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return answer


def redirect(to: str, status: int = 302) -> Answer:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Location", to)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


def endless(declare_length: bool) -> Answer:
    """A body that never ends (or claims 1 GiB): the client must stop reading at its bound."""

    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        if declare_length:
            handler.send_header("Content-Length", str(1 << 30))
        handler.end_headers()
        chunk = b'{"schema": "' + b"x" * 65536
        try:
            for _ in range(1 << 14):  # 1 GiB at most, should the client never stop
                handler.wfile.write(chunk)
        except OSError:
            pass  # the client hung up: what it should do

    return answer


def client(url: str, username: str | None = "reader", password: str | None = PASSWORD) -> RegistryClient:
    return RegistryClient(RegistryConnection(url, username, password))


def _basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def _refused(call: Callable[[], Any], kind: type[TidemarkError] = RegistryUnavailableError) -> str:
    with pytest.raises(kind) as refused:
        call()
    message = str(refused.value)
    assert PASSWORD not in message and "p%40ss" not in message, message
    return message


SCHEMA = {"schema": '{"type": "string"}', "schemaType": "AVRO"}


def test_a_redirect_within_the_registry_is_followed_with_the_credentials(servers: Callable[..., Server]) -> None:
    registry = servers()
    registry.routes["/schemas/ids/1"] = redirect("/moved/schemas/ids/1", 307)
    registry.routes["/moved/schemas/ids/1"] = json_answer(SCHEMA)
    assert client(registry.base).typed_schema(1)[:2] == ("AVRO", '{"type": "string"}')
    assert registry.seen == [("/schemas/ids/1", _basic("reader", PASSWORD)),
                             ("/moved/schemas/ids/1", _basic("reader", PASSWORD))]  # fmt: skip


@pytest.mark.parametrize("other", ["another port", "another host name"])
def test_a_redirect_to_another_origin_is_refused_and_gets_no_credentials(
    servers: Callable[..., Server], other: str
) -> None:
    registry, elsewhere = servers(), servers()
    elsewhere.routes["/schemas/ids/1"] = json_answer(SCHEMA)
    target = elsewhere.base if other == "another port" else elsewhere.base.replace("127.0.0.1", "localhost")
    registry.routes["/schemas/ids/1"] = redirect(f"{target}/schemas/ids/1")
    message = _refused(lambda: client(registry.base).typed_schema(1))
    assert "redirect" in message and target in message and "schema id 1" in message
    assert elsewhere.seen == []  # not even asked, so no credentials could reach it


def test_a_downgrade_from_https_to_http_is_refused(
    servers: Callable[..., Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls, ca = _tls_for_loopback(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))  # the client trusts the test's certificate as a CA
    registry, plain = servers(tls), servers()
    registry.routes["/schemas/ids/2"] = json_answer(SCHEMA)
    assert client(registry.base).typed_schema(2)[0] == "AVRO"  # TLS itself works
    # Same host, the same path: only the scheme (and its port) changes.
    plain.routes["/schemas/ids/1"] = json_answer(SCHEMA)
    registry.routes["/schemas/ids/1"] = redirect(f"{plain.base}/schemas/ids/1", 301)
    message = _refused(lambda: client(registry.base).typed_schema(1))
    assert "https" in message and "http://" in message and plain.seen == []


def test_credentials_in_a_url_without_a_port_are_used_and_never_shown(servers: Callable[..., Server]) -> None:
    quoted = PASSWORD.replace("@", "%40").replace("/", "%2F")
    # No port: the client must not take the password for one (http.client's "nonnumeric port: 'p@ss...'").
    message = _refused(lambda: client(f"http://reader:{quoted}@127.0.0.1/", None, None).typed_schema(1))
    assert "at http://127.0.0.1 cannot be reached" in message and "reader" not in message
    registry = servers()
    registry.routes["/schemas/ids/1"] = json_answer(SCHEMA)
    url = registry.base.replace("://", f"://reader:{quoted}@")
    assert client(url, None, None).typed_schema(1)[0] == "AVRO"
    assert registry.seen == [("/schemas/ids/1", _basic("reader", PASSWORD))]
    assert PASSWORD not in repr(RegistryConnection(url)) and quoted not in repr(RegistryConnection(url))


@pytest.mark.parametrize("declare_length", [True, False])
def test_a_response_beyond_the_bound_is_refused_without_reading_it_all(
    servers: Callable[..., Server], declare_length: bool
) -> None:
    registry = servers()
    registry.routes["/schemas/ids/1"] = endless(declare_length)
    started = time.monotonic()
    message = _refused(lambda: client(registry.base).typed_schema(1))
    assert f"{MAX_RESPONSE_BYTES}" in message and "schema id 1" in message
    assert time.monotonic() - started < 10


def test_a_deeply_nested_answer_is_a_clear_error_not_a_recursion_error(servers: Callable[..., Server]) -> None:
    registry = servers()

    def nested(handler: BaseHTTPRequestHandler) -> None:
        body = b"[" * 200_000 + b"]" * 200_000
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    registry.routes["/schemas/ids/1"] = nested
    message = _refused(lambda: client(registry.base).typed_schema(1))
    assert "nest" in message and "schema id 1" in message


def test_a_recursive_json_schema_is_refused_with_a_clear_error() -> None:
    from tidemark.spark.json_schema import spark_type

    node = {"type": "object", "properties": {"name": {"type": "string"}, "child": {"$ref": "#/$defs/Node"}}}
    doc = {"type": "object", "properties": {"root": {"$ref": "#/$defs/Node"}}, "$defs": {"Node": node}}
    with pytest.raises(ValueError, match=r"recursive|deeper") as refused:
        spark_type(doc)
    assert "$.root.child" in str(refused.value)
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(5000):  # not recursive, only deeper than any record a Spark column holds
        deep = {"type": "array", "items": deep}
    with pytest.raises(ValueError, match="deeper"):
        spark_type({"type": "object", "properties": {"x": deep}})


def test_protobuf_references_that_import_each_other_are_refused(servers: Callable[..., Server]) -> None:
    from google.protobuf import descriptor_pb2

    from tidemark.kafka.registry import SchemaReference
    from tidemark.spark.protobuf import _file_set

    def serialized(name: str, imports: str) -> str:
        proto = descriptor_pb2.FileDescriptorProto(name=name, dependency=[imports], syntax="proto3")
        return base64.b64encode(proto.SerializeToString()).decode()

    registry = servers()
    for name, imports in (("a", "b"), ("b", "a")):
        registry.routes[f"/subjects/{name}/versions/1"] = json_answer({
            "subject": name, "version": 1, "id": ord(name), "schemaType": "PROTOBUF",
            "schema": serialized(f"{name}.proto", f"{imports}.proto"),
            "references": [{"name": f"{imports}.proto", "subject": imports, "version": 1}],
        })  # fmt: skip
    top = serialized("top.proto", "a.proto")
    refs = (SchemaReference("a.proto", "a", 1),)
    message = _refused(lambda: _file_set(client(registry.base), top, refs, "the reader"), SchemaError)
    assert "cycle" in message and "a.proto" in message and "b.proto" in message
    assert len(registry.seen) <= 2  # each referenced file asked for once, then the cycle is seen


def _tls_for_loopback(folder: Path) -> tuple[ssl.SSLContext, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA) and a server context that presents it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_file, key_file = folder / "registry.crt", folder / "registry.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return context, cert_file
