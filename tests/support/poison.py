"""A topic of good and poison records for the dead-letter and re-drive tests: records numbered on, where every
fifth does not decode as text, every seventh breaks the feed's rule (``x-<i>``), every eleventh is a tombstone
(null passes every rule) and the rest are good (``v-<i>``)."""

from __future__ import annotations

from tests.faults.harness import FaultEnv
from tidemark.kafka.admin import Record

UNDECODABLE = b"\xff\xfe-not-utf8"


def produce_with_poison(env: FaultEnv, count: int) -> None:
    """``count`` records numbered on from the last, each with an ``origin`` header (module docstring)."""
    records = []
    for i in range(env.sent, env.sent + count):
        value: bytes | None = f"v-{i}".encode()
        if i % 5 == 1:
            value = UNDECODABLE + str(i).encode()
        elif i % 7 == 2:
            value = f"x-{i}".encode()
        elif i % 11 == 3:
            value = None
        records.append(Record(value=value, key=f"k{i}".encode(), partition=i % env.partitions,
                              headers=(("origin", f"h{i}".encode()),)))  # fmt: skip
    env.sent += count
    env.kafka.produce(env.topic, records)
