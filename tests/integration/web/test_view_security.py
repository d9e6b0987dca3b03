"""What the view shows of record data, against the real cluster: no raw digest of a masked feed, record values only
with the ``runs`` right, dead letters unredacted (no oracle for a guessed password) and bounded.

A masked feed's JSON shows no ``checksum`` or ``bytes`` of its ranges, even of runs written
before its checksums were of masked records (an unmasked feed's keep them). GX's observed
values, exception texts and the bad records' samples reach users with ``runs`` only. A dead
letter is shown as the record holds it, never through the connection's redaction: a header
holding the connection's password and one holding a wrong guess come back alike. The
dead-letter page is paginated (25 reasons and days a page), shows at most three examples a
group and sixteen headers an example (names and values clipped), and answers each user
at most its rate.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import Request
from fastapi.testclient import TestClient

from tests.conftest import KafkaTestCluster
from tidemark.checkpoints.store import SqliteCheckpointStore
from tidemark.config.masking import Masking
from tidemark.config.models import Feed
from tidemark.kafka.connection import KafkaConnection
from tidemark.output.deadletters import DeadLetter
from tidemark.runs.report import RunReport
from tidemark.web.app import DEAD_LETTER_GROUPS, HEADER_CHARS, HEADERS_SHOWN, Action, create_app

pytestmark = pytest.mark.integration

SECRET = "pw-" + uuid.uuid4().hex
RANGE = {"topic": "t", "partition": 0, "start": 0, "end": 1, "records": 1, "checksum": "ab" * 16, "bytes": 42}
VALIDATION = {
    "success": False, "counts": {"rows": 1, "bad": 1},
    "expectations": [{"type": "expect_column_max_to_be_between", "success": False,
                      "observed_value": "alice@example.com", "exception": "bad value alice@example.com"}],
    "sample_bad_records": [{"offset": 0, "value": "alice@example.com"}],
}  # fmt: skip


class ReadOnly:
    """User ``reader`` may read every feed; ``runner`` may also read its runs."""

    def allowed(self, request: Request, action: Action, feeds: Collection[str]) -> set[str]:
        user = request.headers.get("x-user", "")
        return set(feeds) if action == "read" or (action == "runs" and user == "runner") else set()

    def who(self, request: Request) -> str:
        return request.headers.get("x-user", "-")


def feeds_of(kafka: KafkaTestCluster, tmp_path: Path) -> dict[str, Feed]:
    topic = kafka.new_topic(partitions=1, prefix="viewsec")
    common: dict[str, Any] = {"topics": (topic,), "isolation": "read_uncommitted"}
    return {
        "masked": Feed(name="masked", group=f"g-vs-{uuid.uuid4().hex[:8]}", output=str(tmp_path / "m"),
                       masking=Masking(key="redact"), **common),
        "plain": Feed(name="plain", group=f"g-vs-{uuid.uuid4().hex[:8]}", output=str(tmp_path / "p"), **common),
    }  # fmt: skip


def letter(i: int, *, reason: str = "decode_error", day: int = 0, headers: tuple[Any, ...] = ()) -> DeadLetter:
    stamp = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=day)
    return DeadLetter(topic="t", partition=0, offset=i, timestamp=stamp, key=b"k", value=f"v{i}".encode(),
                      headers=headers, plan_id="p1", run_id="r1", reason_codes=(reason,), reason=reason)  # fmt: skip


def test_a_masked_feeds_json_shows_no_checksum_or_bytes_of_any_run_even_one_written_before(
    kafka: KafkaTestCluster, tmp_path: Path
) -> None:
    feeds = feeds_of(kafka, tmp_path)
    report = RunReport(run_id="r1", feed="x", status="succeeded", ranges=[RANGE])
    app = create_app(feeds=lambda: feeds, connection=lambda: kafka.connection, access=ReadOnly(),
                     checkpoints=lambda: SqliteCheckpointStore(tmp_path / "cp.sqlite"),
                     runs=lambda name: [report])  # fmt: skip
    client = TestClient(app, headers={"x-user": "runner"})
    (masked,) = client.get("/api/feeds/masked").json()["runs"][0]["ranges"]
    (plain,) = client.get("/api/feeds/plain").json()["runs"][0]["ranges"]
    assert "checksum" not in masked and "bytes" not in masked and masked["records"] == 1
    assert plain["checksum"] == RANGE["checksum"] and plain["bytes"] == 42  # an unmasked feed keeps them


def test_gx_observed_values_exception_texts_and_samples_reach_only_users_who_may_read_runs(
    kafka: KafkaTestCluster, tmp_path: Path
) -> None:
    feeds = feeds_of(kafka, tmp_path)
    report = RunReport(run_id="r1", feed="plain", status="failed", ranges=[RANGE], validation=VALIDATION)
    app = create_app(feeds=lambda: feeds, connection=lambda: kafka.connection, access=ReadOnly(),
                     checkpoints=lambda: SqliteCheckpointStore(tmp_path / "cp.sqlite"),
                     runs=lambda name: [report])  # fmt: skip
    reader = TestClient(app, headers={"x-user": "reader"}).get("/api/feeds/plain")
    runner = TestClient(app, headers={"x-user": "runner"}).get("/api/feeds/plain")
    assert reader.status_code == runner.status_code == 200
    assert "alice@example.com" not in reader.text
    shown = reader.json()["runs"][0]["validation"]
    assert shown["counts"] == VALIDATION["counts"] and shown["expectations"][0]["success"] is False
    assert "sample_bad_records" not in shown and "observed_value" not in shown["expectations"][0]
    assert runner.json()["runs"][0]["validation"] == VALIDATION


def test_a_dead_letter_is_shown_as_the_record_holds_it_so_no_guess_of_a_password_is_confirmed(
    kafka: KafkaTestCluster, tmp_path: Path
) -> None:
    feeds = feeds_of(kafka, tmp_path)
    connection = KafkaConnection(kafka.bootstrap_servers, {"sasl.password": SECRET})
    guesses = [letter(0, headers=(("x-guess", SECRET.encode()),)), letter(1, headers=(("x-guess", b"pw-wrong"),))]
    app = create_app(feeds=lambda: feeds, connection=lambda: connection, letters=lambda feed: guesses,
                     checkpoints=lambda: SqliteCheckpointStore(tmp_path / "cp.sqlite"))  # fmt: skip
    (group,) = TestClient(app).get("/api/feeds/plain/deadletters").json()["groups"]
    assert [e["headers"] for e in group["examples"]] == [[["x-guess", SECRET]], [["x-guess", "pw-wrong"]]]


def test_the_dead_letter_page_is_paginated_clips_headers_and_is_rate_limited_per_user(
    kafka: KafkaTestCluster, tmp_path: Path
) -> None:
    feeds = feeds_of(kafka, tmp_path)
    many = tuple((f"h{i}-" + "n" * 300, b"v" * 1000) for i in range(HEADERS_SHOWN + 4))
    letters = [letter(i, reason=f"rule_{i % (DEAD_LETTER_GROUPS + 1)}", headers=many) for i in range(200)]
    app = create_app(feeds=lambda: feeds, connection=lambda: kafka.connection, letters=lambda feed: letters,
                     access=ReadOnly(), dead_letter_rate=(4, 60.0),
                     checkpoints=lambda: SqliteCheckpointStore(tmp_path / "cp.sqlite"))  # fmt: skip
    alice = TestClient(app, headers={"x-user": "runner"})
    first = alice.get("/api/feeds/plain/deadletters").json()
    second = alice.get("/api/feeds/plain/deadletters?page=2").json()
    assert first["records"] == 200 and first["pages"] == 2 and first["groups_total"] == DEAD_LETTER_GROUPS + 1
    assert len(first["groups"]) == DEAD_LETTER_GROUPS and len(second["groups"]) == 1  # 25 a page, one short
    assert sum(g["count"] for g in first["groups"] + second["groups"]) == 200
    assert all(len(g["examples"]) == 3 for g in first["groups"] + second["groups"])
    shown = first["groups"][0]["examples"][0]
    assert shown["headers_total"] == HEADERS_SHOWN + 4 and len(shown["headers"]) == HEADERS_SHOWN
    assert all(len(k) == len(v) == HEADER_CHARS + 1 for k, v in shown["headers"])  # cut, marked with "…"
    assert alice.get("/api/feeds/plain/deadletters?page=3").status_code == 404
    limited = alice.get("/feeds/plain/deadletters")  # the fourth call of this user in the window
    assert limited.status_code == 200 and 'rel="next"' in limited.text
    refused = alice.get("/feeds/plain/deadletters")
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    reader = TestClient(app, headers={"x-user": "reader"})  # no runs right: refused before counting
    assert reader.get("/api/feeds/plain/deadletters").status_code == 403
    assert TestClient(app, headers={"x-user": "runner2"}).get("/api/feeds/plain/deadletters").status_code == 403
