"""A bad feed file in the view: listed with its error to those who may read that feed, the others unaffected.

The view reads the feeds folder as the DAG file does (``TIDEMARK_FEEDS_DIR``), with the
real cluster for the good feed's lag. Access is a fixed set of readable feed names (the
view's :class:`FeedAccess` protocol); Airflow's own per-DAG access is tested in
``test_web_access.py`` and answers the same question by DAG id.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from pathlib import Path

import pytest
from fastapi import Request
from fastapi.testclient import TestClient

from tests.conftest import KafkaTestCluster, keyed_records
from tidemark.checkpoints.store import SqliteCheckpointStore
from tidemark.web.app import Action, create_app

pytestmark = pytest.mark.integration


class Readable:
    """Lets every user read (and nothing more) exactly the feeds named."""

    def __init__(self, names: Collection[str]) -> None:
        self.names = set(names)

    def allowed(self, request: Request, action: Action, feeds: Collection[str]) -> set[str]:
        return self.names & set(feeds) if action == "read" else set()

    def who(self, request: Request) -> str:
        return "viewer"


@pytest.fixture
def client(kafka: KafkaTestCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    topic = kafka.new_topic(partitions=1, prefix="web-bad")
    kafka.produce(topic, keyed_records(4, partition=0))
    folder = tmp_path / "feeds"
    folder.mkdir()
    good = f"topics: [{topic}]\ngroup: g-{uuid.uuid4().hex[:8]}\nisolation: read_uncommitted\n"
    (folder / "good.yaml").write_text(good)
    (folder / "typo.yaml").write_text("topcs: [orders]\ngroup: g-typo\n")
    (folder / "hidden.yaml").write_text("topics: [orders\n")  # another team's broken feed
    monkeypatch.setenv("TIDEMARK_FEEDS_DIR", str(folder))
    store = SqliteCheckpointStore(tmp_path / "cp.sqlite")
    app = create_app(connection=lambda: kafka.connection, checkpoints=lambda: store, runs=lambda name: [],
                     timeout_s=3.0, access=Readable({"good", "typo"}))  # fmt: skip
    return TestClient(app)


def test_the_feeds_list_shows_a_bad_feed_file_with_its_error_beside_the_good_feeds(client: TestClient) -> None:
    rows = {row["name"]: row for row in client.get("/api/feeds").json()}

    assert sorted(rows) == ["good", "typo"]  # never the feed the user may not read, broken or not
    assert rows["good"]["error"] is None and "lag" in rows["good"] and not rows["good"].get("broken")  # Kafka answered
    typo = rows["typo"]
    assert typo["broken"] is True
    assert "typo.yaml" in typo["error"] and "field 'topcs'" in typo["error"] and "'tidemark_typo'" in typo["error"]
    page = client.get("/").text
    assert "typo.yaml" in page and "field &#39;topcs&#39;" in page and 'data-feed="good"' in page
    assert "hidden" not in page


def test_a_bad_feed_answers_with_its_error_and_one_the_user_may_not_read_stays_forbidden(
    client: TestClient,
) -> None:
    broken = client.get("/api/feeds/typo")
    assert broken.status_code == 409
    assert "typo.yaml" in broken.json()["detail"] and "field 'topcs'" in broken.json()["detail"]
    assert client.get("/feeds/typo").status_code == 409

    hidden = client.get("/api/feeds/hidden")
    assert hidden.status_code == 403 and "hidden.yaml" not in hidden.text
    assert client.get("/api/feeds/good").status_code == 200
