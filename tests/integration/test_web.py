"""The offsets/lag page (the Airflow plugin's app) against the real cluster."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.conftest import KafkaTestCluster, keyed_records
from tidemark.checkpoints import SqliteCheckpointStore
from tidemark.config import Feed
from tidemark.connection import KafkaConnection
from tidemark.web import create_app

pytestmark = pytest.mark.integration


@pytest.fixture
def feed(kafka: KafkaTestCluster) -> Feed:
    topic = kafka.new_topic(partitions=2, prefix="web")
    kafka.produce(topic, keyed_records(7, partition=0))
    kafka.produce(topic, keyed_records(3, partition=1))
    return Feed(name="web-feed", topics=(topic,), group=f"g-web-{uuid.uuid4().hex[:8]}", isolation="read_uncommitted")


def _client(
    kafka: KafkaTestCluster, feed: Feed, tmp_path: Path, connection: KafkaConnection | None = None
) -> TestClient:
    store = SqliteCheckpointStore(tmp_path / "cp.sqlite")
    app = create_app(
        feeds=lambda: {feed.name: feed},
        connection=lambda: connection or kafka.connection,
        checkpoints=lambda: store,
        runs=lambda name: [],
        timeout_s=3.0,
    )
    return TestClient(app)


def test_page_shows_offsets_and_lag_after_a_commit(kafka: KafkaTestCluster, feed: Feed, tmp_path: Path) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic = feed.topics[0]
    consumer = Consumer(kafka.connection.client_config(**{"group.id": feed.group}))
    consumer.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    consumer.close()

    client = _client(kafka, feed, tmp_path)
    doc = client.get(f"/api/feeds/{feed.name}").json()["status"]
    rows = {p["partition"]: p for p in doc["partitions"]}
    assert rows[0]["committed"] == 4 and rows[0]["end"] == 7 and rows[0]["lag"] == 3
    assert rows[1]["committed"] is None and rows[1]["lag"] is None  # no position yet: by policy
    assert doc["total_lag"] == 3 and doc["unpositioned"] == 1

    page = client.get(f"/feeds/{feed.name}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert f"{topic}[0]" in page.text and "tidemark_replay" in page.text
    index = client.get("/")
    assert f'<a href="feeds/{feed.name}">{feed.name}</a>' in index.text


def test_unknown_feed_is_404_and_dead_brokers_show_an_error(
    kafka: KafkaTestCluster, feed: Feed, tmp_path: Path
) -> None:
    assert _client(kafka, feed, tmp_path).get("/feeds/nope").status_code == 404
    dead = KafkaConnection("127.0.0.1:1", {"sasl.password": "s3cret-value"})
    page = _client(kafka, feed, tmp_path, connection=dead).get(f"/feeds/{feed.name}")
    assert page.status_code == 200
    assert "offsets unavailable" in page.text
    assert "s3cret-value" not in page.text
