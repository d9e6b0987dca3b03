"""Topic patterns in planning: resolving a pattern against a listing, and the topic_added / topic_removed events."""

from __future__ import annotations

from typing import Any

import pytest

from tidemark.config.models import Feed
from tidemark.errors import PlanningError
from tidemark.planning.resolve import PartitionSnapshot
from tidemark.planning.topics import (
    is_internal,
    last_run_topics,
    matching_topics,
    resolve_feed_topics,
    topic_events,
)

CLUSTER = ["__consumer_offsets", "__transaction_state", "_schemas", "_confluent-command", "orders.eu", "orders.us",
           "orders.dlq", "payments", "old.orders.eu"]  # fmt: skip


def pattern_feed(**kw: Any) -> Feed:
    return Feed(name="orders", group="g", topics={"pattern": r"orders\..*", "exclude": [r"orders\.dlq"]}, **kw)


def snap(topic: str, partition: int = 0, **kw: Any) -> PartitionSnapshot:
    base: dict[str, Any] = {"leader": 1, "committed": None, "checkpoint": None, "log_start": 0, "high_watermark": 10,
                            "last_stable": 10}  # fmt: skip
    return PartitionSnapshot(topic=topic, partition=partition, **{**base, **kw})


@pytest.mark.parametrize(
    ("topic", "internal"),
    [("__consumer_offsets", True), ("__cluster_metadata", True), ("_schemas", True), ("_confluent-metrics", True),
     ("_orders", False), ("orders", False), ("schemas", False)],
)  # fmt: skip
def test_internal_topics(topic: str, internal: bool) -> None:
    assert is_internal(topic) is internal


def test_matching_skips_internal_topics_even_when_the_pattern_takes_everything() -> None:
    everything = Feed(name="all", group="g", topics={"pattern": ".*"}).topic_pattern
    assert everything is not None
    assert matching_topics(everything, CLUSTER) == ("old.orders.eu", "orders.dlq", "orders.eu", "orders.us", "payments")


def test_resolving_takes_the_full_matches_sorted_with_one_listing() -> None:
    calls: list[int] = []

    def listing() -> list[str]:
        calls.append(1)
        return list(reversed(CLUSTER))

    resolved = resolve_feed_topics(pattern_feed(), listing, "k:9092")
    assert resolved.topics == ("orders.eu", "orders.us")  # not orders.dlq (excluded), not old.orders.eu (full match)
    assert resolved.topic_pattern == pattern_feed().topic_pattern
    assert resolve_feed_topics(resolved, listing, "k:9092") is resolved  # resolved once: no second listing
    listed = Feed(name="l", group="g", topics=["a"])
    assert resolve_feed_topics(listed, listing, "k:9092") is listed
    assert calls == [1]


def test_a_pattern_matching_nothing_is_refused_naming_the_feed_the_pattern_and_the_topics_there() -> None:
    with pytest.raises(PlanningError) as err:
        resolve_feed_topics(pattern_feed(), lambda: ["__consumer_offsets", "payments", "orders"], "k:9092")
    message = str(err.value)
    for part in ("feed 'orders'", r"pattern 'orders\..*'", r"excluding 'orders\.dlq'", "k:9092",
                 "topics there: orders, payments;", "whole name", "nothing was read or committed"):  # fmt: skip
        assert part in message, (part, message)
    assert "__consumer_offsets" not in message


def test_last_run_topics_are_those_of_the_newest_run_id() -> None:
    assert last_run_topics({}) == (None, frozenset())
    shown = {("a", 0): "20261127T010000000000Z-aa", ("a", 1): "20261127T010000000000Z-aa",
             ("b", 0): "20261127T020000000000Z-bb", ("c", 0): "20261127T020000000000Z-bb"}  # fmt: skip
    assert last_run_topics(shown) == ("20261127T020000000000Z-bb", frozenset({"b", "c"}))


RUN1 = "20261127T010000000000Z-aaaaaaaa"
RUN2 = "20261127T020000000000Z-bbbbbbbb"


def test_a_topic_without_positions_beside_one_with_them_is_added_with_the_reset_policy() -> None:
    feed = pattern_feed(on_missing="latest").with_topics(("orders.eu", "orders.us"))
    snaps = [snap("orders.eu", 0, committed=4), snap("orders.eu", 1, committed=5), snap("orders.us", 0),
             snap("orders.us", 1), snap("orders.us", 2)]  # fmt: skip
    shown = {("orders.eu", 0): RUN1, ("orders.eu", 1): RUN1}
    events = topic_events(feed, snaps, shown)
    assert [(e.kind, e.topic) for e in events] == [("topic_added", "orders.us")]
    added = events[0]
    assert added.partition is None
    assert added.details == {"pattern": r"orders\..*", "partitions": 3, "policy": "latest"}
    assert "on_missing=latest" in added.message and "group 'g'" in added.message


@pytest.mark.parametrize(
    "position",
    [{"committed": 3}, {"checkpoint": 3}, {"shown": 3}, {"table": 3}],
    ids=["committed", "checkpoint", "shown", "table"],
)
def test_a_topic_with_any_position_is_not_added(position: dict[str, int]) -> None:
    feed = pattern_feed().with_topics(("orders.eu", "orders.us"))
    snaps = [snap("orders.eu", committed=1), snap("orders.us", 0), snap("orders.us", 1, **position)]
    assert topic_events(feed, snaps, {("orders.eu", 0): RUN1}) == []


def test_the_first_run_adds_nothing_every_topic_starts_by_the_reset_policy() -> None:
    feed = pattern_feed().with_topics(("orders.eu", "orders.us"))
    assert topic_events(feed, [snap("orders.eu"), snap("orders.us")], {}) == []


def test_a_topic_the_last_run_read_is_removed_once_deleted_or_no_longer_matching() -> None:
    feed = pattern_feed().with_topics(("orders.eu",))
    snaps = [snap("orders.eu", committed=4)]
    # orders.us: matches but is gone (deleted); orders.dlq: now excluded; orders.old: read by an older run only.
    shown = {("orders.eu", 0): RUN2, ("orders.us", 0): RUN2, ("orders.us", 1): RUN2, ("orders.dlq", 0): RUN2,
             ("orders.old", 0): RUN1}  # fmt: skip
    events = topic_events(feed, snaps, shown)
    assert [(e.kind, e.topic, e.details["reason"]) for e in events] == [
        ("topic_removed", "orders.dlq", "not_matched"),
        ("topic_removed", "orders.us", "missing"),
    ]
    assert all(e.details["last_run"] == RUN2 for e in events)
    assert "no longer exists" in events[1].message
    assert r"no longer matches the pattern 'orders\..*'" in events[0].message
    # The next run's ledger has orders.eu only under the newest run: nothing is removed twice.
    assert topic_events(feed, snaps, {**shown, ("orders.eu", 0): "20261127T030000000000Z-cccccccc"}) == []


def test_a_list_feed_has_no_topic_events() -> None:
    feed = Feed(name="l", group="g", topics=["a", "b"])
    assert topic_events(feed, [snap("a", committed=1), snap("b")], {("c", 0): RUN1}) == []


# Boundaries: names that are a prefix or a suffix of what a pattern or an exclusion takes; internal-name prefixes.


@pytest.mark.parametrize(
    ("topic", "taken"),
    [
        ("orders.eu", True),
        ("orders.", True),  # the pattern's own prefix with an empty rest: .* takes nothing
        ("orders", False),  # a prefix of every taken name, without the dot
        ("xorders.eu", False),  # a taken name with a character before it: whole-name match
        ("old.orders.eu", False),
        ("orders.dlq", False),  # excluded exactly
        ("orders.dlq2", True),  # the exclusion is a prefix of it: excluded names are whole names too
        ("orders.dl", True),  # a prefix of the excluded name
        ("orders.xdlq", True),  # the exclusion is a suffix of it
    ],
)
def test_a_pattern_and_its_exclusions_take_whole_names_only(topic: str, taken: bool) -> None:
    feed = pattern_feed()
    assert feed.topic_pattern is not None
    assert feed.topic_pattern.matches(topic) is taken
    assert matching_topics(feed.topic_pattern, [topic]) == ((topic,) if taken else ())


@pytest.mark.parametrize(
    ("topic", "internal"),
    [("_", False), ("__", True), ("_confluent", True), ("_confluen", False), ("_schemas2", False),
     ("x_schemas", False), ("x__offsets", False), ("_confluentx", True)],
)  # fmt: skip
def test_internal_names_at_their_prefix_boundaries(topic: str, internal: bool) -> None:
    assert is_internal(topic) is internal


@pytest.mark.parametrize("count", [0, 1, 10, 11])
def test_the_refusal_lists_at_most_ten_topics_and_says_how_many_there_are(count: int) -> None:
    names = [f"t{i:02d}" for i in range(count)]
    with pytest.raises(PlanningError) as err:
        resolve_feed_topics(pattern_feed(), lambda: names, "k:9092")
    message = str(err.value)
    if count == 0:
        assert "(topics there: none;" in message
    else:
        shown = ", ".join(names[:10])
        assert f"(topics there: {shown}{f', ... ({count} in all)' if count > 10 else ''};" in message
    assert "t10" not in message  # the eleventh is not named
    assert "in all" in message if count > 10 else "in all" not in message
    assert message.endswith("Fix the pattern or create a matching topic (nothing was read or committed)")


def test_a_new_topic_is_added_when_the_feed_has_positions_or_shown_runs_only_one_of_them() -> None:
    feed = pattern_feed().with_topics(("orders.eu", "orders.us"))
    # Positions on orders.eu, no shown run yet (the output never showed a run): orders.us is added.
    events = topic_events(feed, [snap("orders.eu", committed=3), snap("orders.us")], {})
    assert [(e.kind, e.topic) for e in events] == [("topic_added", "orders.us")]
    # No position on the topics matched now, but the output showed a run (of a topic no longer matched): both added.
    events = topic_events(feed, [snap("orders.eu"), snap("orders.us")], {("orders.old", 0): RUN1})
    assert [(e.kind, e.topic) for e in events] == [
        ("topic_added", "orders.eu"),
        ("topic_added", "orders.us"),
        ("topic_removed", "orders.old"),
    ]


def test_a_removed_topics_event_names_the_pattern_the_run_and_why() -> None:
    feed = pattern_feed().with_topics(("orders.eu",))
    events = topic_events(feed, [snap("orders.eu", committed=4)], {("orders.eu", 0): RUN2, ("orders.us", 0): RUN2})
    assert [(e.kind, e.topic) for e in events] == [("topic_removed", "orders.us")]
    assert events[0].details == {"pattern": r"orders\..*", "last_run": RUN2, "reason": "missing"}
    assert (
        "no longer exists on the cluster (deleted, or the principal may no longer describe it): it is not read"
        in events[0].message
    )
