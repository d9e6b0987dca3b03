"""The calls to Kafka only tests and benchmarks make: deleting topics and records, adding partitions.

:class:`KafkaTestAdmin` is the library's :class:`~tidemark.kafka.admin.KafkaAdmin` with what
a test needs to stage a situation (retention deleting records, a topic deleted and
recreated, partitions added) and the raw admin client for the calls nothing wraps.
Nothing in ``tidemark`` imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from tidemark._types import TopicPartition as TP
from tidemark.kafka.admin import KafkaAdmin


class KafkaTestAdmin(KafkaAdmin):
    """The adapter with topic creation, plus the calls tests use to stage what a run meets."""

    def broker_ids(self) -> list[int]:
        self.requests += 1
        meta = self._admin.list_topics(timeout=self.timeout_s)
        return sorted(meta.brokers)

    def delete_topic(self, topic: str) -> None:
        self.requests += 1
        self._result(self._admin.delete_topics([topic], request_timeout=self.timeout_s)[topic], f"deleting {topic}")

    def add_partitions(self, topic: str, total: int) -> None:
        self.requests += 1
        future = self._admin.create_partitions([NewPartitions(topic, total)], request_timeout=self.timeout_s)[topic]
        self._result(future, f"adding partitions to {topic}")

    def delete_records(self, offsets: Mapping[TP, int]) -> dict[TP, int]:
        """Move log start offsets forward (as retention would); returns the new ones."""
        self.requests += 1
        futures = self._admin.delete_records([TopicPartition(t, p, o) for (t, p), o in offsets.items()])
        out = {}
        for tp, future in futures.items():
            res: Any = self._result(future, f"DeleteRecords on {tp.topic}[{tp.partition}]")
            out[(tp.topic, tp.partition)] = int(res.low_watermark)
        return out

    @property
    def admin(self) -> AdminClient:
        """The underlying client, for the few calls this adapter does not wrap."""
        return self._admin
