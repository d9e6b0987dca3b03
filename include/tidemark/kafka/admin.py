"""What the demo, ``tidemark airflow up`` and the tests ask of Kafka besides a run: topics and records.

A run never creates a topic or produces a record, so these live beside the adapter, not
in it: :class:`KafkaAdmin` is the adapter plus topic creation (waiting until every broker
knows the new topic's leaders), and :func:`produce` writes :class:`Record`\\s and waits
for every acknowledgement. Calls that only tests make (deleting topics and records,
adding partitions, the raw admin client) are in ``tests/support/kafka.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tidemark.errors import KafkaUnavailableError, TidemarkError
from tidemark.kafka.adapter import ATTEMPT_TIMEOUT_S, KafkaAdapter, TransientMetadataError
from tidemark.kafka.connection import KafkaConnection, logged


class KafkaAdmin(KafkaAdapter):
    """The adapter with topic creation, for the demo, the local Airflow and the tests."""

    def create_topic(
        self, topic: str, partitions: int, replication: int = 1, config: Mapping[str, str] | None = None
    ) -> None:
        """Create ``topic`` (an existing one is kept as it is) and wait until its partitions have leaders."""
        self.requests += 1
        new = NewTopic(topic, num_partitions=partitions, replication_factor=replication, config=dict(config or {}))
        future = self._admin.create_topics([new], request_timeout=self.timeout_s)[topic]
        try:
            future.result(timeout=self.timeout_s)
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise KafkaUnavailableError(f"creating topic '{topic}' failed: {exc.args[0]}") from exc
        self._await_topic(topic)

    def _await_topic(self, topic: str) -> None:
        """Wait until every partition of a just-created topic has a leader brokers know of.

        CreateTopics returns once the controller accepted the topic; brokers learn of it a
        moment later, and a describe or produce in between sees "unknown topic".
        """

        def led(_remaining_s: float) -> None:
            infos = self._describe([topic], ATTEMPT_TIMEOUT_S)
            if not infos or any(i.leader < 0 for i in infos):
                raise TransientMetadataError(topic, "partitions without a leader")
            # One broker knowing it is not enough: the next request may go to one that lags
            # (seen on a loaded machine: "unknown topic" right after this returned).
            for broker in self._admin.list_topics(timeout=ATTEMPT_TIMEOUT_S).brokers.values():
                one = AdminClient({**self._config, "bootstrap.servers": f"{broker.host}:{broker.port}"})
                try:
                    meta = one.list_topics(topic, timeout=ATTEMPT_TIMEOUT_S).topics.get(topic)
                except KafkaException as exc:
                    raise TransientMetadataError(topic, exc.args[0]) from exc
                if meta is None or meta.error is not None or any(p.leader < 0 for p in meta.partitions.values()):
                    raise TransientMetadataError(topic, f"broker {broker.id} does not know it yet")

        self._retry(
            led,
            # "Unknown topic" too: the brokers have not heard of it yet.
            (TidemarkError, TransientMetadataError),
            lambda _exc: KafkaUnavailableError(
                f"topic '{topic}' was created but has no leaders after {self.timeout_s:.0f}s"
            ),
            pause_s=0.1,
        )


@dataclass(frozen=True)
class Record:
    """A record to produce: tests and the demo build these."""

    value: bytes | None
    key: bytes | None = None
    timestamp_ms: int | None = None
    partition: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


def produce(connection: KafkaConnection, topic: str, records: Iterable[Record], **settings: Any) -> int:
    """Produce ``records`` to ``topic`` and wait until every one is acknowledged."""
    config = connection.client_config(**{"linger.ms": 20, "enable.idempotence": True, **settings})
    producer = Producer(logged(config))
    failures: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(f"{msg.topic()}[{msg.partition()}]: {err}")

    count = 0
    for rec in records:
        kwargs: dict[str, Any] = {"value": rec.value, "key": rec.key, "on_delivery": on_delivery}
        if rec.timestamp_ms is not None:
            kwargs["timestamp"] = rec.timestamp_ms
        if rec.partition is not None:
            kwargs["partition"] = rec.partition
        if rec.headers:
            kwargs["headers"] = list(rec.headers)
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.1)
        count += 1
        if count % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(60)
    if remaining or failures:
        raise KafkaUnavailableError(
            f"producing to '{topic}': {remaining} records unacknowledged, {len(failures)} failed "
            f"(first: {failures[:3]})"
        )
    return count
