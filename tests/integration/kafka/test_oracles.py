"""The tests' own oracles over a range that ends in an aborted transaction's records.

When an aborted transaction's marker lands after the first record of the next (still open)
transaction, the last stable offset sits right after the aborted records: a plan's range
ends there, and a read_committed consumer's position stays at the last record it handed
over. An oracle that waits for the position to reach the range's end never finishes (a CI
run of fault 13 timed out so); both oracles must finish and return the committed records.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from tests.conftest import KafkaTestCluster
from tests.faults.harness import digest, scan
from tests.integration.read_helpers import consume_independently, plan_for
from tidemark.kafka.admin import Record

pytestmark = pytest.mark.integration


def open_transaction(kafka: KafkaTestCluster, topic: str, values: list[bytes]) -> Producer:
    producer = Producer(kafka.connection.client_config(**{"transactional.id": f"oracle-{time.time_ns()}"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    for v in values:
        producer.produce(topic, v, partition=0)
    producer.flush(30)
    return producer


def test_both_oracles_finish_a_range_that_ends_in_aborted_records(kafka: KafkaTestCluster) -> None:
    topic = kafka.new_topic(partitions=1)
    kafka.produce(topic, [Record(b"plain", partition=0)])  # offset 0
    aborted = open_transaction(kafka, topic, [b"a0", b"a1", b"a2"])  # offsets 1-3
    hanging = open_transaction(kafka, topic, [b"h0"])  # offset 4: the last stable offset from here on
    aborted.abort_transaction(30)  # its marker at offset 5, after the open transaction's record
    try:
        # The coordinator writes the abort marker after abort_transaction returns: until then the
        # aborted transaction holds the last stable offset at 1.
        deadline = time.monotonic() + 30
        while (end := kafka.adapter.end_offsets([(topic, 0)], "read_committed")[(topic, 0)]) < 4:
            assert time.monotonic() < deadline, f"the abort marker was never written (last stable offset {end})"
            time.sleep(0.1)
        assert end == 4, "the setup must leave the last stable offset right after the aborted records"

        rows = scan(kafka.connection, {(topic, 0): (0, end)})
        assert [row for row, _ in rows] == [(topic, 0, 0, digest(b"plain"))]

        plan = plan_for(kafka.adapter, [topic], isolation="read_committed")
        assert [(p.start, p.end) for p in plan.partitions] == [(0, 4)]
        assert [(r[2], r[4]) for r in consume_independently(kafka.connection, plan)] == [(0, b"plain")]
    finally:
        hanging.abort_transaction(30)
