"""The view's Kafka clients: built once per process and connection, not per request."""

from __future__ import annotations

import threading

from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.connection import KafkaConnection


def test_one_adapter_per_connection_and_timeout_is_shared_by_every_caller() -> None:
    from tidemark.runs.status import shared_adapter

    conn = KafkaConnection("127.0.0.1:9", {"client.id": "view"})
    same = KafkaConnection("127.0.0.1:9", {"client.id": "view"})  # an equal connection, read again per request
    first = shared_adapter(conn, timeout_s=2.0)
    assert isinstance(first, KafkaAdapter)
    assert shared_adapter(same, timeout_s=2.0) is first
    seen: list[KafkaAdapter] = []
    threads = [threading.Thread(target=lambda: seen.append(shared_adapter(same, timeout_s=2.0))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(adapter is first for adapter in seen)
    # An edited connection (or another timeout) gets its own client; the old one is let go.
    edited = KafkaConnection("127.0.0.1:9", {"client.id": "view", "sasl.password": "new"})
    assert shared_adapter(edited, timeout_s=2.0) is not first
    assert shared_adapter(conn, timeout_s=3.0) is not first
