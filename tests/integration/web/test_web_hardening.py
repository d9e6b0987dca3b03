"""The view's run history, trigger and previews against the real cluster: nothing leaks, nothing is sent astray.

Stored errors (``job.json``/``run.json`` reach the page through the run reports) are
scrubbed as live ones are; with no ``[api] base_url`` the trigger sends nobody's token to
the request's ``Host``; previews are limited per user.
"""

from __future__ import annotations

import html
import http.server
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import Request
from fastapi.testclient import TestClient

from tests.conftest import KafkaTestCluster, keyed_records
from tidemark.checkpoints.store import SqliteCheckpointStore
from tidemark.config.models import Feed
from tidemark.kafka.connection import KafkaConnection
from tidemark.runs.report import RunReport
from tidemark.web.app import create_app

pytestmark = pytest.mark.integration

SECRET = "s3cret-in-a-stored-error"


@pytest.fixture
def feed(kafka: KafkaTestCluster, tmp_path: Path) -> Feed:
    topic = kafka.new_topic(partitions=1, prefix="harden")
    kafka.produce(topic, keyed_records(3, partition=0))
    return Feed(name="hard", topics=(topic,), group=f"g-hard-{uuid.uuid4().hex[:8]}", isolation="read_uncommitted",
                output=str(tmp_path / "out"))  # fmt: skip


def test_stored_run_errors_are_scrubbed_when_rendered(kafka: KafkaTestCluster, feed: Feed, tmp_path: Path) -> None:
    # A PLAINTEXT cluster ignores SASL settings without a mechanism: the password is only there to be a secret.
    connection = KafkaConnection(kafka.bootstrap_servers, {"sasl.password": SECRET})
    host = kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)[0]
    failed = RunReport(
        run_id="r1", feed=feed.name, status="failed",
        error=f"KafkaException: connect to {kafka.bootstrap_servers} failed (sasl.password={SECRET})",
        events=[{"kind": "reset", "topic": feed.topics[0], "partition": 0,
                 "message": f"reset after {kafka.bootstrap_servers} lost the group; password {SECRET}"}],
    )  # fmt: skip
    store = SqliteCheckpointStore(tmp_path / "cp.sqlite")
    client = TestClient(create_app(feeds=lambda: {feed.name: feed}, connection=lambda: connection,
                                   checkpoints=lambda: store, runs=lambda name: [failed]))  # fmt: skip
    page = client.get(f"/feeds/{feed.name}")
    doc = client.get(f"/api/feeds/{feed.name}")
    listing = client.get("/api/feeds")
    assert page.status_code == doc.status_code == listing.status_code == 200
    assert "KafkaException: connect to the feed's brokers failed" in html.unescape(page.text)
    assert doc.json()["runs"][0]["error"].startswith("KafkaException: connect to the feed's brokers failed")
    for text in (page.text, doc.text, listing.text, client.get("/").text):
        assert SECRET not in text
        assert kafka.bootstrap_servers not in text and host not in text


@pytest.fixture
def host_server() -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """A server that would accept a trigger: what it receives is recorded."""
    received: list[dict[str, Any]] = []

    class Capture(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append({"path": self.path, "authorization": self.headers.get("Authorization")})
            body = json.dumps({"dag_run_id": "manual__stolen", "state": "queued"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1]), received
    finally:
        server.shutdown()
        server.server_close()


def test_without_a_base_url_no_token_goes_to_the_requests_host(
    kafka: KafkaTestCluster, feed: Feed, tmp_path: Path, host_server: tuple[int, list[dict[str, Any]]]
) -> None:
    port, received = host_server
    store = SqliteCheckpointStore(tmp_path / "cp.sqlite")
    app = create_app(feeds=lambda: {feed.name: feed}, connection=lambda: kafka.connection, checkpoints=lambda: store,
                     runs=lambda name: [], api_base=lambda: None)  # fmt: skip
    client = TestClient(app, base_url=f"http://127.0.0.1:{port}")  # the Host header names the other server
    answer = client.post(f"/api/feeds/{feed.name}/replay", json={"start_from": "earliest"},
                         headers={"Authorization": "Bearer the-callers-token"})  # fmt: skip
    assert received == []
    assert answer.status_code == 503 and "[api] base_url" in answer.json()["detail"]


def test_previews_are_rate_limited_per_user(kafka: KafkaTestCluster, feed: Feed, tmp_path: Path) -> None:
    store = SqliteCheckpointStore(tmp_path / "cp.sqlite")

    class ByHeader:  # the user named by a header: the limit is per user, not per app
        def allowed(self, request: Request, action: str, names: Any) -> set[str]:
            return set(names)

        def who(self, request: Request) -> str:
            return request.headers["x-user"]

    app = create_app(feeds=lambda: {feed.name: feed}, connection=lambda: kafka.connection, checkpoints=lambda: store,
                     runs=lambda name: [], access=ByHeader(), preview_rate=(2, 60.0))  # fmt: skip
    client = TestClient(app)
    body = {"start_from": "earliest"}
    path = f"/api/feeds/{feed.name}/replay/preview"
    answers = [client.post(path, json=body, headers={"x-user": "a"}) for _ in range(3)]
    assert [r.status_code for r in answers] == [200, 200, 429]
    assert int(answers[2].headers["retry-after"]) >= 1 and "at most 2 every 60s" in answers[2].json()["detail"]
    assert client.post(path, json=body, headers={"x-user": "b"}).status_code == 200
