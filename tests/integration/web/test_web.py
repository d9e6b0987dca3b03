"""The offsets/lag page (the Airflow plugin's app) against the real cluster."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from tests.conftest import KafkaTestCluster, keyed_records
from tidemark.checkpoints.store import SqliteCheckpointStore
from tidemark.config.models import Feed, load_feed
from tidemark.kafka.admin import Record
from tidemark.kafka.connection import KafkaConnection
from tidemark.web.app import create_app

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
    dead = KafkaConnection("127.0.0.1:1,tidemark-broker.invalid:9092", {"sasl.password": "s3cret-value"})
    client = _client(kafka, feed, tmp_path, connection=dead)
    page = client.get(f"/feeds/{feed.name}")
    assert page.status_code == 200
    assert "offsets unavailable" in page.text
    preview = client.post(f"/api/feeds/{feed.name}/replay/preview", json={"start_from": "earliest"})
    assert preview.status_code == 502
    for text in (page.text, client.get("/api/feeds").text, preview.text):
        assert "s3cret-value" not in text
        assert "127.0.0.1:1" not in text and "tidemark-broker.invalid" not in text  # not even broker addresses


def test_a_200_partition_feed_renders_every_partition_as_status_says(kafka: KafkaTestCluster, tmp_path: Path) -> None:
    """Correctness of a big view (its speed is ``make bench-view``'s business, not a test's)."""
    from confluent_kafka import Consumer, TopicPartition

    from tidemark.runs.status import feed_status

    topic = kafka.new_topic(partitions=200, prefix="web200")
    stamp = int(time.time() * 1000) - 3_600_000  # an hour old: inside the test cluster's retention
    kafka.produce(topic, [Record(value=b"v", partition=p % 200, timestamp_ms=stamp) for p in range(600)])
    feed = Feed(name="big", topics=(topic,), group=f"g-big-{uuid.uuid4().hex[:8]}")
    consumer = Consumer(kafka.connection.client_config(**{"group.id": feed.group}))
    consumer.commit(offsets=[TopicPartition(topic, p, 1) for p in range(0, 200, 2)], asynchronous=False)
    consumer.close()
    store = SqliteCheckpointStore(tmp_path / "cp.sqlite")
    client = TestClient(create_app(feeds=lambda: {"big": feed}, connection=lambda: kafka.connection,
                                   checkpoints=lambda: store, runs=lambda name: []))  # fmt: skip

    page = client.get("/feeds/big")
    status = feed_status(feed, kafka.adapter, store)

    assert page.status_code == 200
    assert page.text.count("<tr data-partition=") == 200
    for p in status.partitions:
        assert f'data-partition="{p.label}"' in page.text
    doc = client.get("/api/feeds/big").json()["status"]
    assert [(r["partition"], r["committed"], r["end"], r["lag"]) for r in doc["partitions"]] == [
        (p.partition, p.committed, p.end, p.lag) for p in status.partitions
    ]
    assert doc["total_lag"] == 200 and doc["unpositioned"] == 100
    lagging = [r for r in doc["partitions"] if r["lag"]]
    assert lagging and all(r["position_ts_ms"] == stamp for r in lagging)  # lag in time: the record's age
    assert all(r["lag_ms"] > 0 for r in lagging)


def test_trouble_stands_out_and_the_preview_is_the_dry_run_plan(
    kafka: KafkaTestCluster, feed: Feed, tmp_path: Path
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    from tidemark.planning.requests import run_request
    from tidemark.runs.pipeline import plan_request, run_feed
    from tidemark.runs.report import list_runs

    topic = feed.topics[0]
    consumer = Consumer(kafka.connection.client_config(**{"group.id": feed.group}))
    consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
    consumer.close()
    kafka.adapter.delete_records({(topic, 0): 3})  # retention took records 1-2 the group never read
    state = tmp_path / "state"
    state.mkdir()
    store = SqliteCheckpointStore(state / "checkpoints.sqlite")  # the store the pipeline's runs use
    store.put(feed.group, "p" * 16, {(topic, 1): 2}, run_id="earlier")  # Tidemark committed here; Kafka forgot it
    feeds_dir = tmp_path / "feeds"
    feeds_dir.mkdir()
    (feeds_dir / "web-feed.yaml").write_text(
        yaml.safe_dump(
            {
                "topics": [topic],
                "group": feed.group,
                "isolation": "read_uncommitted",
                "on_data_loss": "skip",
                "output": str(tmp_path / "out"),
            }
        )
    )
    feed = load_feed(str(feeds_dir / "web-feed.yaml"))
    env = {"TIDEMARK_FEEDS_DIR": str(feeds_dir), "TIDEMARK_STATE_DIR": str(state)}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        for _ in range(2):  # two real dry-run replays: reports with events, nothing read
            run_feed("web-feed", kafka.connection, mode="replay", params={"start_from": "committed", "dry_run": True})
        client = TestClient(create_app(feeds=lambda: {feed.name: feed}, connection=lambda: kafka.connection,
                                       checkpoints=lambda: store, runs=lambda name: list_runs(name, root=state),
                                       runs_root=state))  # fmt: skip
        page = client.get(f"/feeds/{feed.name}").text
        preview = client.post(f"/api/feeds/{feed.name}/replay/preview", json={"start_from": "committed"}).json()
        dry = {"start_from": "committed", "dry_run": True}  # the replay form's default
        request = run_request("replay", dry)
        plan = plan_request(feed, kafka.adapter, store, request)
        dry_run = request.dry_run

    assert "data lost" in page and "offsets expired" in page and 'class="trouble"' in page
    assert page.count('class="bar"') == 2  # one bar per run in the chart
    assert "data_loss" in page and "group_offsets_expired" in page  # the runs' events, with their times
    assert dry_run and preview["dry_run"] is True and preview["plan_id"] == plan.plan_id
    assert [(r["partition"], r["start"], r["end"]) for r in preview["ranges"]] == [
        (p.partition, p.start, p.end) for p in plan.partitions
    ]
    assert "keeps its offsets" in preview["group_effect"]
    bad = client.post(f"/api/feeds/{feed.name}/replay/preview", json={"start_from": "offset"})
    assert bad.status_code == 400 and "start_offset" in bad.json()["detail"]
    strict = feed.model_copy(update={"on_data_loss": "fail"})
    refused = TestClient(create_app(feeds=lambda: {feed.name: strict}, connection=lambda: kafka.connection,
                                    checkpoints=lambda: store, runs=lambda name: [])).post(
        f"/api/feeds/{feed.name}/replay/preview", json={"start_from": "committed"}
    )  # fmt: skip
    assert refused.status_code == 400 and "deleted by retention" in refused.json()["detail"]


def test_a_pattern_feed_shows_its_pattern_and_every_matching_topics_partitions(
    kafka: KafkaTestCluster, tmp_path: Path
) -> None:
    prefix = f"webpat{uuid.uuid4().hex[:8]}"
    for name, partitions in ((f"{prefix}.orders.eu", 2), (f"{prefix}.orders.us", 1), (f"{prefix}.other", 1)):
        kafka.adapter.create_topic(name, partitions)
        kafka.produce(name, keyed_records(3, partition=0))
    pattern = rf"{prefix}\.orders\..*"
    feed = Feed(name="web-pattern", topics={"pattern": pattern}, group=f"g-web-{uuid.uuid4().hex[:8]}")
    client = _client(kafka, feed, tmp_path)

    doc = client.get(f"/api/feeds/{feed.name}").json()["status"]
    assert sorted(f"{p['topic']}[{p['partition']}]" for p in doc["partitions"]) == [
        f"{prefix}.orders.eu[0]", f"{prefix}.orders.eu[1]", f"{prefix}.orders.us[0]",
    ]  # fmt: skip
    assert doc["unpositioned"] == 3
    [row] = client.get("/api/feeds").json()
    assert row["topics"] == [f"pattern '{pattern}'"] and row["error"] is None
    page = client.get(f"/feeds/{feed.name}").text
    assert f"topics pattern &#39;{prefix}" in page and f"{prefix}.orders.us[0]" in page
    body = {"start_from": "earliest", "topics": [f"{prefix}.orders.us"]}
    preview = client.post(f"/api/feeds/{feed.name}/replay/preview", json=body)
    assert preview.status_code == 200, preview.text
    assert {r["topic"] for r in preview.json()["ranges"]} == {f"{prefix}.orders.us"}


def test_an_iceberg_feeds_page_shows_the_tables_last_maintenance(kafka: KafkaTestCluster, tmp_path: Path) -> None:
    from tidemark.output.maintenance import MaintenanceReport, save_record

    topic = kafka.new_topic(partitions=1, prefix="web")
    feed = Feed(name="kept", topics=(topic,), group="g-kept", output=str(tmp_path / "out"), output_format="iceberg")
    app = create_app(feeds=lambda: {feed.name: feed}, connection=lambda: kafka.connection,
                     checkpoints=lambda: SqliteCheckpointStore(tmp_path / "cp.sqlite"), runs=lambda name: [],
                     timeout_s=3.0, runs_root=tmp_path)  # fmt: skip
    client = TestClient(app)
    assert 'id="last-maintenance"' not in client.get(f"/feeds/{feed.name}").text  # never maintained
    report = MaintenanceReport(feed="kept", table="tidemark.kept", started_at="2026-11-27T05:00:00+00:00",
                               finished_at="2026-11-27T05:00:09+00:00", files_before=1000, bytes_before=9 << 20,
                               files_after=3, bytes_after=8 << 20, partitions_compacted=2, files_rewritten=1000,
                               files_written=3, snapshots_before=1001, snapshots_expired=990)  # fmt: skip
    save_record(report, tmp_path)
    page = client.get(f"/feeds/{feed.name}").text
    assert 'id="last-maintenance"' in page and "tidemark.kept" in page
    assert "1000 files (9.0 MB) -&gt; 3 files (8.0 MB)" in page and "990 of 1001 snapshots expired" in page
