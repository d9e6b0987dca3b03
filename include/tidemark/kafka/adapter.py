"""A thin typed adapter over confluent-kafka's admin and consumer calls.

Everything a run asks of Kafka outside the Spark read goes through here: partition
metadata and leaders, log start / high watermark / last stable offsets, offsets for
timestamps and the timestamps at offsets, the group's members and committed offsets,
committing them, topic and broker configs. Calls are batched (one request per kind per
call, which librdkafka fans out per broker) and every call has a timeout; per-partition
errors are raised with the topic and partition named. The adapter counts the admin
requests it issues so benchmarks can report them. Creating topics and producing records,
which only the demo and the tests do, are in :mod:`tidemark.kafka.admin`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    OffsetSpec,
    ResourceType,
)

from tidemark._types import Isolation
from tidemark._types import TopicPartition as TP
from tidemark.errors import AuthorizationError, KafkaUnavailableError, TidemarkError
from tidemark.kafka.connection import KafkaConnection, logged

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 15.0
ATTEMPT_TIMEOUT_S = 5.0  # one try of a retried metadata call
RETRY_BACKOFF_S = 0.2
# Answers that mean "leadership is moving, ask again" (librdkafka does not flag them retriable here).
_LEADER_MOVING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
    }
)


# Metadata answers that mean "ask again shortly", not "this is wrong".
_TRANSIENT_METADATA = frozenset({"_TIMED_OUT", "LEADER_NOT_AVAILABLE", "NOT_CONTROLLER", "_TRANSPORT"})


# Kafka's "not allowed" answers, by the kind of resource whose ACL is missing.
_DENIED = {"TOPIC_AUTHORIZATION_FAILED": "topic", "GROUP_AUTHORIZATION_FAILED": "group",
           "CLUSTER_AUTHORIZATION_FAILED": "cluster"}  # fmt: skip


# Group-coordinator answers that mean "ask again shortly".
_COORDINATOR_BUSY = frozenset({"COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR"})


class _CoordinatorBusyError(Exception):
    pass


def _raise_if_busy(error: Any) -> None:
    name = str(getattr(error, "name", lambda: "")())
    if name in _COORDINATOR_BUSY:
        raise _CoordinatorBusyError(name)


class TransientMetadataError(Exception):
    """A metadata answer worth asking again (no leader yet, no controller reachable); also raised by kafka.admin."""

    def __init__(self, topic: str, error: Any) -> None:
        super().__init__(f"{topic}: {error}")
        self.topic = topic
        self.error = error


@dataclass(frozen=True)
class PartitionInfo:
    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    # The topic's id: a topic deleted and recreated under the same name gets a new one ("" if unknown).
    topic_id: str = ""


@dataclass(frozen=True)
class Committed:
    offset: int | None
    metadata: str


@dataclass(frozen=True)
class GroupMember:
    member_id: str
    client_id: str
    host: str
    assignment: tuple[TP, ...]


# classic: JoinGroup/SyncGroup members; consumer: Kafka 4's KIP-848 protocol (group.protocol=consumer); other: a
# group id Kafka knows as a group of another type (share, KIP-932; streams, KIP-1071), whose progress is no offsets.
GroupType = Literal["classic", "consumer", "unknown", "other"]


@dataclass(frozen=True)
class GroupInfo:
    """A consumer group's coordinator-side state (``dead`` when no consumer group has that id)."""

    group: str
    state: str
    members: tuple[GroupMember, ...]
    coordinator: int | None
    group_type: GroupType = "unknown"


class KafkaAdapter:
    """Batched, timed admin calls against one cluster."""

    def __init__(
        self,
        connection: KafkaConnection,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        client_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        self.connection = connection
        self.timeout_s = timeout_s
        self.requests = 0
        # What the principal may do per topic, as the brokers said when describing it (None: not said).
        self.topic_operations: dict[str, frozenset[str] | None] = {}
        # client_overrides: extra librdkafka settings for this client only (e.g. stats_cb in benchmarks).
        self._config = logged(
            connection.client_config(**{"socket.timeout.ms": int(timeout_s * 1000), **(client_overrides or {})})
        )
        self._admin = AdminClient(self._config)
        self._renewed_at = float("-inf")

    # -- helpers ---------------------------------------------------------------------

    def _renew_client(self, at_most_every_s: float = 0.0) -> None:
        """Go on through a new admin client, which bootstraps fresh metadata and looks coordinators up afresh.

        librdkafka's admin client keeps what its caches say (a controller that is gone, a
        group coordinator that moved, a partition's old leader epoch) for longer than the
        adapter waits; ``at_most_every_s`` keeps a burst of answers from renewing it each time.
        """
        if time.monotonic() - self._renewed_at >= at_most_every_s:
            self._admin = AdminClient(self._config)
            self._renewed_at = time.monotonic()

    def denied(self, kind: str, name: str, operation: str, during: str, after: str = "") -> AuthorizationError:
        """The error for a missing ACL: who, on what, which operation to grant, and how (``after``: what happened)."""
        principal = self.connection.principal()
        target = "--cluster" if kind == "cluster" else f"--{kind} {name}"
        return AuthorizationError(
            f"{principal} may not {operation} {kind} '{name}' on {self.connection.bootstrap_servers} ({during}); "
            f"grant it, e.g. kafka-acls.sh --bootstrap-server {self.connection.bootstrap_servers} --add "
            f"--allow-principal {principal} --operation {operation} {target}, then rerun{after}"
        )

    def _result(self, future: Future[T], what: str, resource: tuple[str, str, str] | None = None) -> T:
        """``future``'s value; ``resource`` (kind, name, operation) names the ACL an authorization failure lacks."""
        try:
            return future.result(timeout=self.timeout_s)
        except KafkaException as exc:
            if resource is not None and _error_name(exc.args[0]) in _DENIED:
                raise self.denied(*resource, during=what) from exc
            raise KafkaUnavailableError(f"{what} failed: {exc.args[0]}") from exc
        except TimeoutError as exc:
            raise KafkaUnavailableError(
                f"{what} got no answer within {self.timeout_s:.0f}s from {self.connection.bootstrap_servers}; "
                "check that the brokers are reachable and the security settings are right"
            ) from exc
        finally:
            self._serve_log()

    def _serve_log(self) -> None:
        """Hand the admin client's queued librdkafka log lines to CLIENT_LOG (it queues them until polled)."""
        self._admin.poll(0)

    # -- metadata --------------------------------------------------------------------

    def partitions(self, topics: Sequence[str]) -> list[PartitionInfo]:
        """Every partition of ``topics`` with its leader, sorted by topic and partition.

        Transient answers (no controller reachable yet, leader elections after a broker
        stopped) are asked again until the adapter's timeout; a missing topic is not.
        """
        if not topics:
            return []

        return self._retry_metadata(
            lambda remaining_s: self._describe(topics, max(1.0, min(ATTEMPT_TIMEOUT_S, remaining_s))),
            lambda exc: f"describing topic '{exc.topic}'",
        )

    def topic_names(self) -> list[str]:
        """Every topic the cluster shows the principal without an error (internal ones included), in one request.

        For pattern feeds (:func:`tidemark.planning.topics.resolve_feed_topics`). Brokers list
        only topics the principal may describe; transient answers are asked again like
        :meth:`partitions`.
        """

        def listed(remaining_s: float) -> list[str]:
            self.requests += 1
            try:
                meta = self._admin.list_topics(timeout=max(1.0, min(ATTEMPT_TIMEOUT_S, remaining_s)))
            except KafkaException as exc:
                raise TransientMetadataError("*", exc.args[0]) from exc
            # A topic being deleted (or not yet led) may be listed with an error: not one to plan from.
            return sorted(name for name, topic in meta.topics.items() if topic.error is None)

        return self._retry_metadata(listed, lambda _exc: "listing the topics")

    def _retry_metadata(self, attempt: Callable[[float], T], doing: Callable[[TransientMetadataError], str]) -> T:
        """A metadata request, asked again on transient answers until the adapter's timeout, then refused naming
        what it was ``doing``.

        Each attempt is short (the caller bounds it by :data:`ATTEMPT_TIMEOUT_S`): one stuck on a broker
        that just stopped (KRaft brokers name a random live broker as "controller", and metadata lags)
        must not use up the budget.
        """
        return self._retry(
            attempt,
            TransientMetadataError,
            lambda exc: KafkaUnavailableError(
                f"{doing(exc)} on {self.connection.bootstrap_servers} failed for {self.timeout_s:.0f}s: {exc.error}; "
                "check that the brokers are up and reachable from here and that the security settings are right "
                "(nothing was read or committed)"
            ),
            pause_s=0.2,
            # librdkafka keeps waiting for the controller its cached metadata names, even when that broker is gone.
            on_retry=lambda _exc: self._renew_client(),
        )

    def _retry(
        self,
        attempt: Callable[[float], T],
        transient: type[Exception] | tuple[type[Exception], ...],
        give_up: Callable[[Any], Exception],
        *,
        pause_s: float,
        on_retry: Callable[[Any], None] | None = None,
    ) -> T:
        """``attempt(seconds left)`` until it stops raising ``transient`` or the adapter's timeout passes.

        Past the timeout the last transient error becomes ``give_up(error)``, raised from it.
        """
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return attempt(deadline - time.monotonic())
            except transient as exc:
                self._serve_log()  # before on_retry may replace the client and its queue
                if time.monotonic() > deadline:
                    raise give_up(exc) from exc
                if on_retry is not None:
                    on_retry(exc)
                time.sleep(pause_s)

    def _describe(self, topics: Sequence[str], timeout_s: float) -> list[PartitionInfo]:
        self.requests += 1
        futures = self._admin.describe_topics(
            TopicCollection(list(topics)), request_timeout=timeout_s, include_authorized_operations=True
        )
        out = []
        for topic, future in futures.items():
            try:
                desc = future.result(timeout=timeout_s + 1.0)
            except KafkaException as exc:
                err = exc.args[0]
                name = err.name()
                if name == "UNKNOWN_TOPIC_OR_PART":
                    raise TidemarkError(
                        f"topic '{topic}' does not exist on {self.connection.bootstrap_servers}; "
                        "create it or fix the feed's topic list"
                    ) from exc
                if name in _TRANSIENT_METADATA:
                    raise TransientMetadataError(topic, err) from exc
                if name == "TOPIC_AUTHORIZATION_FAILED":
                    raise self.denied("topic", topic, "Describe", "describing the topic") from exc
                raise KafkaUnavailableError(f"describing topic '{topic}' failed: {err}") from exc
            except TimeoutError as exc:
                raise TransientMetadataError(topic, f"no answer within {timeout_s:.0f}s") from exc
            self.topic_operations[topic] = _operations(desc.authorized_operations)
            topic_id = "" if desc.topic_id is None else str(desc.topic_id)
            for p in desc.partitions:
                leader = p.leader.id if p.leader is not None else -1
                out.append(PartitionInfo(topic, p.id, leader, tuple(r.id for r in p.replicas), topic_id))
        return sorted(out, key=lambda i: (i.topic, i.partition))

    # -- offsets ---------------------------------------------------------------------

    def _list_offsets(self, requests: Mapping[TP, OffsetSpec], isolation: Isolation) -> dict[TP, int]:
        if not requests:
            return {}
        level = IsolationLevel.READ_COMMITTED if isolation == "read_committed" else IsolationLevel.READ_UNCOMMITTED
        out: dict[TP, int] = {}
        pending = dict(requests)
        deadline = time.monotonic() + self.timeout_s
        while pending:
            self.requests += 1
            futures = self._admin.list_offsets(
                {TopicPartition(t, p): spec for (t, p), spec in pending.items()},
                isolation_level=level,
                request_timeout=self.timeout_s,
            )
            retry: dict[TP, OffsetSpec] = {}
            for tp, future in futures.items():
                key = (tp.topic, tp.partition)
                try:
                    out[key] = int(future.result(timeout=self.timeout_s).offset)
                except KafkaException as exc:
                    # Leadership moves (new topics, restarts) answer NOT_LEADER for a moment: ask again.
                    err = exc.args[0]
                    moving = err.code() in _LEADER_MOVING
                    if not (err.retriable() or moving) or time.monotonic() > deadline:
                        hint = (
                            f"; its leadership kept moving for {self.timeout_s:.0f}s (a broker restarting or "
                            "resuming): run again once the cluster has settled"
                            if moving
                            else ""
                        )
                        raise KafkaUnavailableError(
                            f"ListOffsets for {tp.topic}[{tp.partition}] failed: {exc.args[0]}{hint}"
                        ) from exc
                    retry[key] = pending[key]
                except TimeoutError as exc:
                    raise KafkaUnavailableError(
                        f"ListOffsets for {tp.topic}[{tp.partition}] got no answer within {self.timeout_s:.0f}s"
                    ) from exc
            if retry:
                # A new client's metadata carries the partitions' current leaders and epochs: one client
                # got FENCED_LEADER_EPOCH for 15 s after a paused broker resumed (fault 12c, a loaded box).
                self._renew_client(at_most_every_s=1.0)
                time.sleep(RETRY_BACKOFF_S)
            pending = retry
        return out

    def log_start_offsets(self, tps: Iterable[TP]) -> dict[TP, int]:
        return self._list_offsets({tp: OffsetSpec.earliest() for tp in tps}, "read_uncommitted")

    def end_offsets(self, tps: Iterable[TP], isolation: Isolation) -> dict[TP, int]:
        """High watermarks, or last stable offsets under ``read_committed``."""
        return self._list_offsets({tp: OffsetSpec.latest() for tp in tps}, isolation)

    def offsets_for_timestamp(self, tps: Iterable[TP], timestamp_ms: int, isolation: Isolation) -> dict[TP, int | None]:
        """First offset whose timestamp is ≥ ``timestamp_ms``; ``None`` when no record is."""
        raw = self._list_offsets({tp: OffsetSpec.for_timestamp(timestamp_ms) for tp in tps}, isolation)
        return {tp: (off if off >= 0 else None) for tp, off in raw.items()}

    def committed(self, group: str, tps: Sequence[TP]) -> dict[TP, Committed]:
        """The group's committed offsets (``offset=None`` where it has none), with metadata."""
        if not tps:
            return {}
        return self._while_coordinator_busy(lambda: self._committed(group, tps), f"OffsetFetch for group '{group}'")

    def _committed(self, group: str, tps: Sequence[TP]) -> dict[TP, Committed]:
        # A consumer's OffsetFetch, not AdminClient.list_consumer_group_offsets: librdkafka
        # 2.16's admin path crashes the process (SIGSEGV in rd_kafka_cgrp_op, an admin client
        # has no group handle) when the coordinator answers with a coordinator error, as a
        # fresh cluster does. The consumer never joins the group: it only asks.
        self.requests += 1
        consumer = Consumer(
            logged(
                self.connection.client_config(
                    **{
                        "group.id": group,
                        "enable.auto.commit": False,
                        "socket.timeout.ms": int(self.timeout_s * 1000),
                        "client.id": "tidemark-offset-fetch",
                    }
                )
            )
        )
        try:
            result = consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=self.timeout_s)
        except KafkaException as exc:
            _raise_if_busy(exc.args[0])
            raise KafkaUnavailableError(f"OffsetFetch for group '{group}' failed: {exc.args[0]}") from exc
        finally:
            consumer.close()
        out: dict[TP, Committed] = {}
        for tp in result:
            if tp.error is not None:
                _raise_if_busy(tp.error)
                if _error_name(tp.error) in _DENIED:
                    raise self.denied("topic", tp.topic, "Describe", f"OffsetFetch for group '{group}'")
                raise KafkaUnavailableError(
                    f"OffsetFetch for group '{group}' on {tp.topic}[{tp.partition}]: {tp.error}"
                )
            offset = int(tp.offset) if tp.offset >= 0 else None
            out[(tp.topic, tp.partition)] = Committed(offset, tp.metadata or "")
        return out

    def _while_coordinator_busy(self, call: Callable[[], T], what: str) -> T:
        """Ask again while the group coordinator is loading or moving (fresh clusters, failovers).

        A NOT_COORDINATOR answer means the broker asked no longer coordinates the group.
        librdkafka's admin client finds coordinators through a cache of its own, and one
        client got NOT_COORDINATOR on every attempt for 30 s after a paused coordinator
        resumed (fault 12b, on a loaded box): after such an answer (at most once a second)
        the next attempt goes through a new client, which looks the coordinator up afresh.
        """

        def renew_after_not_coordinator(exc: _CoordinatorBusyError) -> None:
            if str(exc) == "NOT_COORDINATOR":
                self._renew_client(at_most_every_s=1.0)

        return self._retry(
            lambda _remaining_s: call(),
            _CoordinatorBusyError,
            lambda exc: KafkaUnavailableError(
                f"{what}: the group coordinator stayed unavailable for {self.timeout_s:.0f}s ({exc})"
            ),
            pause_s=0.25,
            on_retry=renew_after_not_coordinator,
        )

    def describe_group(self, group: str) -> GroupInfo:
        """The group's state and live members (DescribeGroups / ConsumerGroupDescribe)."""
        return self._while_coordinator_busy(lambda: self._describe_group(group), f"describing group '{group}'")

    def _describe_group(self, group: str) -> GroupInfo:
        self.requests += 1
        futures = self._admin.describe_consumer_groups([group], request_timeout=self.timeout_s)
        try:
            desc = futures[group].result(timeout=self.timeout_s)
        except KafkaException as exc:
            err = exc.args[0]
            if getattr(err, "name", lambda: "")() == "GROUP_ID_NOT_FOUND":
                return GroupInfo(group, "dead", (), None, self._other_type(group))
            _raise_if_busy(err)
            raise KafkaUnavailableError(f"describing consumer group '{group}' failed: {err}") from exc
        except TimeoutError as exc:
            raise KafkaUnavailableError(f"describing consumer group '{group}' timed out") from exc
        members = tuple(
            GroupMember(
                member_id=str(m.member_id),
                client_id=str(m.client_id),
                host=str(m.host),
                assignment=tuple(
                    (tp.topic, tp.partition) for tp in (m.assignment.topic_partitions if m.assignment else [])
                ),
            )
            for m in desc.members
        )
        state = str(getattr(desc.state, "name", desc.state)).lower()
        coordinator = desc.coordinator.id if desc.coordinator is not None else None
        if state == "dead" and not members:
            return GroupInfo(group, state, (), coordinator, self._other_type(group))
        kinds: dict[str, GroupType] = {"CLASSIC": "classic", "CONSUMER": "consumer"}
        kind = kinds.get(str(getattr(desc.type, "name", "")), "unknown")
        return GroupInfo(group, state, members, coordinator, kind)

    def _other_type(self, group: str) -> GroupType:
        """``other`` if the brokers list ``group`` although no consumer group has that id, else ``unknown``.

        confluent-kafka 2.16 describes consumer groups only (its ``ConsumerGroupType`` has no
        share type; a share group's id describes as a dead classic group), while ListGroups
        lists groups of every type: listed but not describable is a share or streams group.
        Measured on Kafka 4.3.1: an id never used is not listed, a share group's is.
        """
        self.requests += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # list_groups is the one call that lists them all
            try:
                listed = self._admin.list_groups(group=group, timeout=self.timeout_s)
            except KafkaException as exc:
                raise KafkaUnavailableError(f"listing group '{group}' failed: {exc.args[0]}") from exc
        return "other" if any(g.id == group for g in listed) else "unknown"

    def group_operations(self, group: str) -> frozenset[str] | None:
        """What the principal may do with ``group`` (``None`` where the brokers do not say); a group it
        may not even describe raises :class:`AuthorizationError`. Works for groups that do not exist yet."""
        return self._while_coordinator_busy(lambda: self._group_operations(group), f"describing group '{group}'")

    def _group_operations(self, group: str) -> frozenset[str] | None:
        self.requests += 1
        futures = self._admin.describe_consumer_groups(
            [group], request_timeout=self.timeout_s, include_authorized_operations=True
        )
        try:
            desc = futures[group].result(timeout=self.timeout_s)
        except KafkaException as exc:
            err = exc.args[0]
            if _error_name(err) == "GROUP_AUTHORIZATION_FAILED":
                raise self.denied("group", group, "Describe", "describing the consumer group") from exc
            if _error_name(err) == "GROUP_ID_NOT_FOUND":
                return None
            _raise_if_busy(err)
            raise KafkaUnavailableError(f"describing consumer group '{group}' failed: {err}") from exc
        except TimeoutError as exc:
            raise KafkaUnavailableError(f"describing consumer group '{group}' timed out") from exc
        return _operations(desc.authorized_operations)

    def alter_committed(self, group: str, offsets: Mapping[TP, tuple[int, str]]) -> dict[TP, str | None]:
        """Set the group's committed offsets (offset, metadata) from outside the group.

        Returns each partition's error name, or ``None`` where it was committed. The
        coordinator accepts this only while the group has no members.
        """
        if not offsets:
            return {}

        def attempt() -> dict[TP, str | None]:
            # Setting the same offsets and metadata again is harmless, so a busy
            # coordinator's answer is simply asked again.
            out = self._alter_committed(group, offsets)
            busy = [e for e in out.values() if e in _COORDINATOR_BUSY]
            if busy:
                raise _CoordinatorBusyError(busy[0])
            return out

        return self._while_coordinator_busy(attempt, f"OffsetCommit for group '{group}'")

    def _alter_committed(self, group: str, offsets: Mapping[TP, tuple[int, str]]) -> dict[TP, str | None]:
        self.requests += 1
        request = ConsumerGroupTopicPartitions(
            group, [TopicPartition(t, p, o, metadata=m) for (t, p), (o, m) in offsets.items()]
        )
        futures = self._admin.alter_consumer_group_offsets([request], request_timeout=self.timeout_s)
        try:
            result = futures[group].result(timeout=self.timeout_s)
        except KafkaException as exc:
            err = exc.args[0]
            name = str(getattr(err, "name", lambda: err)())
            return {tp: name for tp in offsets}
        except TimeoutError as exc:
            raise KafkaUnavailableError(
                f"OffsetCommit for group '{group}' got no answer within {self.timeout_s:.0f}s"
            ) from exc
        out: dict[TP, str | None] = {tp: "MISSING_FROM_RESPONSE" for tp in offsets}
        for tp in result.topic_partitions:
            out[(tp.topic, tp.partition)] = None if tp.error is None else str(tp.error.name())
        return out

    # -- configs ---------------------------------------------------------------------

    def topic_and_broker_configs(
        self, topics: Sequence[str], topic_names: Sequence[str], broker_id: int | None, broker_names: Sequence[str]
    ) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
        """Topic configs and one broker's configs in a single DescribeConfigs request."""
        resources = [ConfigResource(ResourceType.TOPIC, t) for t in topics]
        if broker_id is not None:
            # One BROKER resource per request is allowed; librdkafka then sends it all to that broker.
            resources.append(ConfigResource(ResourceType.BROKER, str(broker_id)))
        wanted = {*topic_names, *broker_names}
        found = self._describe_configs(resources, sorted(wanted))
        topic_cfg = {t: {n: v for n, v in found.get(t, {}).items() if n in topic_names} for t in topics}
        broker_cfg = {} if broker_id is None else {n: v for n, v in found[str(broker_id)].items() if n in broker_names}
        return topic_cfg, broker_cfg

    def _describe_configs(self, resources: list[ConfigResource], names: Sequence[str]) -> dict[str, dict[str, str]]:
        if not resources:
            return {}
        self.requests += 1
        futures = self._admin.describe_configs(resources, request_timeout=self.timeout_s)
        out = {}
        for resource, future in futures.items():
            kind = "topic" if resource.restype == ResourceType.TOPIC else "cluster"
            name = resource.name if kind == "topic" else "kafka-cluster"
            entries = self._result(future, f"DescribeConfigs for {resource.name}", (kind, name, "DescribeConfigs"))
            out[resource.name] = {n: entries[n].value for n in names if n in entries}
        return out

    def timestamps_at(self, positions: Mapping[TP, int], isolation: Isolation) -> dict[TP, int | None]:
        """The timestamp (ms) of the first record at or after each position, ``None`` where none arrived.

        Kafka has no lookup from offset to timestamp, so one assign-only consumer fetches
        from every position at once and keeps the first record of each partition; fetch
        sizes are small because only one record per partition is wanted. Used for lag in
        time (the age of the oldest unread record); partitions past the deadline stay ``None``.
        """
        if not positions:
            return {}
        self.requests += 1
        consumer = Consumer(
            logged(
                self.connection.client_config(
                    **{
                        "group.id": "tidemark-lag-probe",  # never joins or commits: assign() only
                        "enable.auto.commit": False,
                        "isolation.level": isolation,
                        "auto.offset.reset": "latest",
                        "max.partition.fetch.bytes": 4096,
                        "fetch.wait.max.ms": 50,
                        "socket.timeout.ms": int(self.timeout_s * 1000),
                        "client.id": "tidemark-lag-probe",
                    }
                )
            )
        )
        found: dict[TP, int | None] = dict.fromkeys(positions)
        try:
            consumer.assign([TopicPartition(t, p, o) for (t, p), o in positions.items()])
            deadline = time.monotonic() + self.timeout_s
            waiting = set(positions)
            while waiting and time.monotonic() < deadline:
                for msg in consumer.consume(num_messages=len(waiting), timeout=0.1):
                    if msg.error() is not None:
                        continue
                    tp = (msg.topic(), msg.partition())
                    if tp in waiting:
                        found[tp] = int(msg.timestamp()[1])
                        waiting.discard(tp)
                        # one record is enough: stop fetching this partition
                        consumer.pause([TopicPartition(tp[0], tp[1])])
        finally:
            consumer.close()
        return found


def _error_name(error: Any) -> str:
    return str(getattr(error, "name", lambda: "")())


def _operations(ops: Any) -> frozenset[str] | None:
    """Authorized operations as upper-case names (``READ``, ``DESCRIBE``...); ``None`` when the brokers did not say."""
    if ops is None:
        return None
    return frozenset(str(getattr(op, "name", op)).upper() for op in ops)
