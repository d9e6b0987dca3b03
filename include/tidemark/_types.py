"""Value shapes shared by every layer: one definition each, imported from here."""

from __future__ import annotations

from typing import Literal

TopicPartition = tuple[str, int]
"""A Kafka partition as ``(topic, partition)``."""

Isolation = Literal["read_committed", "read_uncommitted"]
"""The isolation level a plan's reads use (a plan's end offsets depend on it)."""
