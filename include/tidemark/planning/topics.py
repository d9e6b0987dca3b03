"""Topic patterns: which topics a pattern feed reads in one run, and what changed since its last run.

A feed with ``topics: {pattern: ..., exclude: [...]}`` (:class:`~tidemark.config.models.TopicPattern`)
has no fixed topic list: each time a run is planned, :func:`resolve_feed_topics` matches the
pattern against the topics the cluster lists (full match; internal topics such as
``__consumer_offsets`` and ``_schemas`` never count) and the run reads exactly those, so the
plan records them (every partition of every matched topic is in it) and its retries and
commit use them, never a later listing. :func:`topic_events` compares the matches with the
positions the feed has: a topic none of whose partitions has a committed offset, a
checkpoint or a place in the output is ``topic_added`` (it starts by the feed's reset policy,
``on_missing``, like any partition without a position); a topic the feed's last shown run
read that is no longer matched is ``topic_removed``, once. Only scheduled plans carry them.
Pure code: the listing comes in as a callable, the run ledger's positions as plain values
(:mod:`tidemark.runs.gather` asks Kafka and the checkpoint store).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from tidemark._types import TopicPartition as TP
from tidemark.config.models import Feed, TopicPattern
from tidemark.errors import PlanningError
from tidemark.planning.plan import Event
from tidemark.planning.resolve import PartitionSnapshot

# Kafka's own topics (__consumer_offsets, __transaction_state, __cluster_metadata, ...) and the
# Schema Registry's and Confluent components' (_schemas, _confluent-*): never data a feed reads.
INTERNAL_PREFIXES = ("__", "_confluent")
INTERNAL_TOPICS = frozenset({"_schemas"})


def is_internal(topic: str) -> bool:
    """Whether ``topic`` is a cluster-internal topic that no pattern takes."""
    return topic in INTERNAL_TOPICS or topic.startswith(INTERNAL_PREFIXES)


def matching_topics(pattern: TopicPattern, names: Iterable[str]) -> tuple[str, ...]:
    """The topics among ``names`` that ``pattern`` takes (whole-name match, no exclusion, not internal), sorted."""
    return tuple(sorted({t for t in names if not is_internal(t) and pattern.matches(t)}))


def resolve_feed_topics(feed: Feed, list_topics: Callable[[], Iterable[str]], cluster: str) -> Feed:
    """``feed`` reading the topics its pattern matches now (one listing); a list feed, or a resolved one, as it is.

    ``list_topics`` lists the topics the cluster (``cluster``, for the message) shows the
    principal. A pattern matching none of them is refused: a typo would otherwise read
    nothing, run after run, without a word.
    """
    pattern = feed.topic_pattern
    if pattern is None or feed.topics:
        return feed
    listed = sorted(t for t in set(list_topics()) if not is_internal(t))
    matched = matching_topics(pattern, listed)
    if not matched:
        shown = ", ".join(listed[:10]) + (f", ... ({len(listed)} in all)" if len(listed) > 10 else "")
        raise PlanningError(
            f"feed '{feed.name}': its topics {pattern.label} match no topic on {cluster} (topics there: "
            f"{shown or 'none'}; internal ones are never matched, and the pattern must match the whole name). Fix "
            "the pattern or create a matching topic (nothing was read or committed)"
        )
    return feed.with_topics(matched)


def last_run_topics(shown_runs: Mapping[TP, str]) -> tuple[str | None, frozenset[str]]:
    """The feed's last shown run (its id) and the topics it read, from the run ledger's partition → run id."""
    if not shown_runs:
        return None, frozenset()
    last = max(shown_runs.values())  # run ids start with their UTC time (YYYYmmddTHHMMSS...)
    return last, frozenset(t for (t, _p), run in shown_runs.items() if run == last)


def topic_events(feed: Feed, snapshots: Sequence[PartitionSnapshot], shown_runs: Mapping[TP, str]) -> list[Event]:
    """``topic_added`` and ``topic_removed`` events of a resolved pattern feed (none for a list feed).

    ``snapshots`` are the partitions of the topics matched now, with their positions;
    ``shown_runs`` the run ledger's run id per partition the feed's output shows. Before the
    feed has any position at all (its first run), no topic counts as added: every one starts
    by the reset policy as a new feed's do (``reset`` events).
    """
    pattern = feed.topic_pattern
    if pattern is None:
        return []
    by_topic: dict[str, list[PartitionSnapshot]] = {}
    for snap in snapshots:
        by_topic.setdefault(snap.topic, []).append(snap)
    placed = {t for t, snaps in by_topic.items() if any(_has_position(s) for s in snaps)}
    events: list[Event] = []
    if placed or shown_runs:
        policy = feed.on_missing
        for topic in sorted(set(by_topic) - placed):
            count = len(by_topic[topic])
            events.append(
                Event(
                    kind="topic_added",
                    message=(
                        f"topic '{topic}' newly matches the {pattern.label} of feed '{feed.name}': its {count} "
                        f"partition(s) have no committed offset of group '{feed.group}', no checkpoint and no place "
                        f"in the output, so they start by the reset policy on_missing={policy}"
                    ),
                    topic=topic,
                    details={"pattern": pattern.pattern, "partitions": count, "policy": policy},
                )
            )
    last, previous = last_run_topics(shown_runs)
    for topic in sorted(previous - set(feed.topics)):
        matches = pattern.matches(topic)
        why = (
            "no longer exists on the cluster (deleted, or the principal may no longer describe it)"
            if matches
            else f"no longer matches the {pattern.label}"
        )
        message = (
            f"topic '{topic}' was read by the last run of feed '{feed.name}' ({last}) and {why}: it is not read "
            f"from now on; the committed offsets of group '{feed.group}' on it, if any, are left as they are"
        )
        reason = "missing" if matches else "not_matched"
        details = {"pattern": pattern.pattern, "last_run": last, "reason": reason}
        events.append(Event(kind="topic_removed", message=message, topic=topic, details=details))
    return events


def _has_position(snap: PartitionSnapshot) -> bool:
    return any(p is not None for p in (snap.committed, snap.checkpoint, snap.shown, snap.table))
