"""The ground is real: a multi-broker KRaft cluster started by the project's scripts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.conftest import KafkaTestCluster, keyed_records
from tidemark.devtools.kafka.cluster import LocalCluster
from tidemark.kafka.admin import Record

pytestmark = pytest.mark.integration


def test_cluster_has_three_brokers_and_spreads_leaders(kafka: KafkaTestCluster) -> None:
    assert len(kafka.adapter.broker_ids()) == 3
    topic = kafka.new_topic(partitions=6)
    leaders = {p.leader for p in kafka.adapter.partitions([topic])}
    assert len(leaders) > 1, f"all 6 partitions led by {leaders}"


def test_produced_records_read_back_with_confluent_kafka(kafka: KafkaTestCluster) -> None:
    topic = kafka.new_topic(partitions=2)
    sent = keyed_records(50, partition=1)
    assert kafka.produce(topic, sent) == 50
    consumer = Consumer(kafka.connection.client_config(**{"group.id": "smoke", "enable.auto.commit": False}))
    consumer.assign([TopicPartition(topic, 1, 0)])
    got = []
    while len(got) < 50:
        msgs = consumer.consume(100, timeout=10)
        assert msgs, f"no records after reading {len(got)}"
        for m in msgs:
            assert m.error() is None
            got.append((m.key(), m.value(), m.timestamp()[1], m.offset()))
    consumer.close()
    assert [(k, v, ts) for k, v, ts, _ in got] == [(r.key, r.value, r.timestamp_ms) for r in sent]
    assert [o for *_, o in got] == list(range(50))


def test_broker_can_be_stopped_and_restarted(own_kafka: KafkaTestCluster) -> None:
    kafka = own_kafka  # a broker stopped here must not be one another worker's tests are using
    cluster = kafka.require_local()
    topic = kafka.new_topic(partitions=3, replication=3)
    victim = kafka.adapter.partitions([topic])[0].leader
    cluster.stop_node(victim)
    try:
        assert victim not in {n.node_id for n in cluster.running_nodes()}
        # With replication 3 the topic stays writable: leadership moved to a live broker.
        assert kafka.produce(topic, keyed_records(10), **{"message.timeout.ms": 30000}) == 10
    finally:
        cluster.start_node(victim)
    assert victim in {n.node_id for n in cluster.running_nodes()}
    assert len(kafka.adapter.broker_ids()) == 3


def _tidemark(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TIDEMARK_KAFKA_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "tidemark.cli", "kafka", *args], env=env, capture_output=True, text=True, check=False
    )


def test_cli_up_is_idempotent_and_down_leaves_no_process(tmp_path: Path) -> None:
    home = tmp_path / "cli-cluster"
    first = _tidemark(home, "up", "--brokers", "1")
    assert first.returncode == 0, first.stderr
    assert "bootstrap.servers=127.0.0.1:" in first.stdout
    pids = {n.pid for n in LocalCluster(home).running_nodes()}
    assert len(pids) == 1

    second = _tidemark(home, "up", "--brokers", "1")
    assert second.returncode == 0, second.stderr
    assert "already running" in second.stdout
    assert {n.pid for n in LocalCluster(home).running_nodes()} == pids

    down = _tidemark(home, "down")
    assert down.returncode == 0, down.stderr
    assert LocalCluster(home).running_nodes() == []
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or str(home).encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    status = _tidemark(home, "status")
    assert status.returncode == 1 and "down" in status.stdout


def test_records_carry_headers(kafka: KafkaTestCluster) -> None:
    topic = kafka.new_topic(partitions=1)
    kafka.produce(topic, [Record(value=b"x", key=b"k", partition=0, headers=(("h", b"1"),))])
    consumer = Consumer(kafka.connection.client_config(**{"group.id": "smoke-h"}))
    consumer.assign([TopicPartition(topic, 0, 0)])
    msgs = consumer.consume(1, timeout=10)
    consumer.close()
    assert msgs and msgs[0].headers() == [("h", b"1")]
