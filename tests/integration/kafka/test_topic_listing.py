"""The adapter's topic listing (pattern feeds) on the real cluster: one request, internal topics listed as Kafka has
them and left out by the pattern matching."""

from __future__ import annotations

import uuid

from tests.conftest import KafkaTestCluster
from tidemark.config.models import TopicPattern
from tidemark.planning.topics import matching_topics


def test_the_listing_names_a_new_topic_in_one_request_and_patterns_skip_internal_ones(
    kafka: KafkaTestCluster,
) -> None:
    topic = kafka.new_topic(partitions=2, prefix="listing")
    # A committed offset makes sure the group offsets' internal topic exists.
    kafka.adapter.alter_committed(f"g-{uuid.uuid4().hex[:8]}", {(topic, 0): (0, "")})
    before = kafka.adapter.requests
    names = kafka.adapter.topic_names()
    assert kafka.adapter.requests - before == 1
    assert topic in names and "__consumer_offsets" in names and names == sorted(set(names))
    everything = matching_topics(TopicPattern(pattern=".*"), names)
    assert topic in everything and not [t for t in everything if t.startswith("__")]
