"""The group's commit: move the consumer group's offsets to a staged plan's ends (a compare-and-set).

One step of :mod:`tidemark.runs.protocol`, which runs it after the job staged the plan's
publication and shows the publication only after it succeeded. A commit belongs to a *run* (the run
id), not to a plan id: the plan id names what is read and published, and two runs at
different times can plan the same ranges (an idle feed, offsets that expired, a group
reset to offsets it already had); each of them must commit. In order:

1. Already done? The group's offsets are at the plan's ends with metadata naming this
   run, or the checkpoint store records this run as committed: a no-op (a missing
   checkpoint is repaired). A retry of a run that committed never rewinds a group that
   has moved on since.
2. Refuse while the group has live members (a streaming consumer with the same group id
   would race us, and the coordinator rejects outside commits for a non-empty group),
   of either protocol (classic, or Kafka 4's ``group.protocol=consumer``), and refuse a
   group id that Kafka knows as a share (KIP-932) or streams group: it has no offsets.
3. Compare-and-set against the offsets this run's plan saw. A position that *vanished*
   (the plan saw an offset, the group now has none: expired after
   ``offsets.retention.minutes`` or deleted) is not a move and is committed back (the
   result lists it); a position that *another writer changed* blocks the commit.
4. Commit every partition of the plan, including those with nothing new (an idle
   partition's offset is refreshed, so it does not expire), with metadata naming the
   plan, the run and the id of the partition's topic; read the offsets back and fail
   unless each partition holds exactly the plan's end with that metadata; then record
   the checkpoint (with the topic ids). The planner compares those ids with the topic
   ids it sees later, so an offset is never resumed on a topic recreated under the
   same name.

Consumers that commit with ``assign()`` never join the group, so only the
compare-and-set (not the member check) can notice them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from tidemark._types import TopicPartition as TP
from tidemark.checkpoints.store import CheckpointStore
from tidemark.errors import AuthorizationError, CommitError, GroupInUseError, KafkaUnavailableError, OffsetsMovedError
from tidemark.faults import fault_point
from tidemark.job.guard import moved_since_planning, recreated_since_planning
from tidemark.kafka.adapter import Committed, GroupInfo, KafkaAdapter
from tidemark.kafka.connection import KafkaConnection
from tidemark.planning.metadata import METADATA_MAX_BYTES, metadata_run_id, partition_metadata, plan_topic_ids
from tidemark.planning.plan import Plan

METADATA_LIMIT_CONFIG = "offset.metadata.max.bytes"
DEFAULT_COMMIT_TIMEOUT_S = 30.0
# States in which the group has, or is getting, members; "dead" means it does not exist.
_IDLE_STATES = frozenset({"empty", "dead", "unknown"})
# Errors the coordinator answers when the group gained members between our check and the commit.
_MEMBER_ERRORS = frozenset({"UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION", "REBALANCE_IN_PROGRESS"})

CommitStatus = Literal["committed", "already_committed"]


@dataclass(frozen=True)
class CommitResult:
    """What the commit did, for the run report."""

    plan_id: str
    run_id: str
    group: str
    status: CommitStatus
    offsets: Mapping[TP, int]
    started_at: str
    finished_at: str
    expired: tuple[TP, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan_id": self.plan_id,
            "run_id": self.run_id,
            "group": self.group,
            "status": self.status,
            "offsets": [{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(self.offsets.items())],
            "expired": [{"topic": t, "partition": p} for t, p in self.expired],
            "notes": list(self.notes),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _fmt(tp: TP) -> str:
    return f"{tp[0]}[{tp[1]}]"


def metadata_limit(kafka: KafkaAdapter, plan: Plan) -> int:
    """The longest metadata the brokers accept: below ``offset.metadata.max.bytes`` (asked of a leader).

    A broker with a smaller limit rejects the whole commit (OFFSET_METADATA_TOO_LARGE), so
    the metadata is fitted to the limit the cluster really has. A client that may not
    describe broker configs (ACLs) gets Kafka's default.
    """
    leaders = sorted({p.leader for p in plan.partitions if p.leader >= 0})
    configured = METADATA_MAX_BYTES
    if leaders:
        try:
            _, broker = kafka.topic_and_broker_configs([], [], leaders[0], [METADATA_LIMIT_CONFIG])
        except (KafkaUnavailableError, AuthorizationError):
            broker = {}
        value = broker.get(METADATA_LIMIT_CONFIG)
        configured = int(value) if value not in (None, "") else METADATA_MAX_BYTES
    # Kafka 4.3 accepts metadata strictly shorter than the setting (a 100-byte string is
    # refused under offset.metadata.max.bytes=100, 99 bytes are accepted: checked by running).
    return configured - 1


def _check_group_idle(info: GroupInfo, plan: Plan) -> None:
    if info.group_type == "other":
        raise GroupInUseError(
            f"refusing to commit plan {plan.plan_id} for feed '{plan.feed}': group '{plan.group}' is not a consumer "
            "group but a share group (KIP-932) or a streams group (KIP-1071), which keep their progress per record, "
            "not as committed offsets. Give the feed a group id of its own (the feed file's 'group'), used by no "
            "share consumer or Kafka Streams application; the group's state is untouched"
        )
    if not info.members and info.state in _IDLE_STATES:
        return
    members = "; ".join(
        f"{m.client_id}@{m.host} (member {m.member_id}, assigned "
        f"{', '.join(_fmt(tp) for tp in m.assignment) or 'nothing'})"
        for m in info.members
    )
    raise GroupInUseError(
        f"refusing to commit plan {plan.plan_id} for group '{plan.group}': the group is {info.state} with "
        f"{len(info.members)} active member(s){': ' + members if members else ''}. A live consumer uses this "
        "group id; stop it (or give the feed its own group) and rerun; the published plan is committed then."
    )


def _verify(plan: Plan, readback: Mapping[TP, Committed], metadata: Mapping[TP, str]) -> None:
    wrong = []
    for p in plan.partitions:
        got = readback.get(p.key)
        if got is None or got.offset != p.end:
            wrong.append(f"{_fmt(p.key)} expected {p.end}, read back {None if got is None else got.offset}")
        elif got.metadata != metadata[p.key]:
            wrong.append(f"{_fmt(p.key)} offset {p.end} carries foreign metadata {got.metadata[:80]!r}")
    if wrong:
        raise CommitError(
            f"committed offsets of group '{plan.group}' do not match plan {plan.plan_id} after the commit: "
            + "; ".join(wrong)
            + ". Another client may have committed at the same time; the checkpoint was not updated. Run the feed "
            "again: it commits this plan again, or refuses it if another writer moved the group."
        )


def commit_plan(
    plan: Plan,
    connection: KafkaConnection | None,
    checkpoints: CheckpointStore,
    *,
    run_id: str,
    timeout_s: float = DEFAULT_COMMIT_TIMEOUT_S,
    adapter: KafkaAdapter | None = None,
) -> CommitResult:
    """Commit ``plan``'s end offsets for its group as run ``run_id``; see the module docstring."""
    started = _now()
    if not plan.commit:
        raise CommitError(
            f"plan {plan.plan_id} ({plan.mode} of feed '{plan.feed}') was made without commit; "
            f"its offsets are not committed for group '{plan.group}'"
        )
    if not plan.partitions:
        raise CommitError(f"plan {plan.plan_id} has no partitions; nothing to commit for group '{plan.group}'")
    if adapter is None and connection is None:
        raise CommitError(f"plan {plan.plan_id}: no Kafka connection to commit group '{plan.group}' with")
    kafka = adapter or KafkaAdapter(connection, timeout_s=timeout_s)  # type: ignore[arg-type]
    tps = [p.key for p in plan.partitions]
    ends = plan.ends()
    metadata = partition_metadata(plan, run_id, metadata_limit(kafka, plan))
    topic_ids = plan_topic_ids(plan)

    def result(status: CommitStatus, vanished: tuple[TP, ...] = (), notes: tuple[str, ...] = ()) -> CommitResult:
        return CommitResult(plan.plan_id, run_id, plan.group, status, ends, started, _now(), vanished, notes)

    current = kafka.committed(plan.group, tps)
    ours = all(current[tp].offset == ends[tp] and metadata_run_id(current[tp].metadata) == run_id for tp in tps)
    recorded = checkpoints.run_committed(plan.group, run_id)
    if ours and not recorded:
        # The Kafka commit went through but the run died before the checkpoint.
        checkpoints.put(plan.group, plan.plan_id, ends, run_id, topic_ids)
        return result("already_committed", notes=("group offsets were already at the plan's ends; recorded the "
                                                   "missing checkpoint",))  # fmt: skip
    if recorded:
        since = ", ".join(f"{_fmt(tp)}={current[tp].offset}" for tp in tps if current[tp].offset != ends[tp])
        moved_on = (f"the group's offsets changed after this run committed ({since}); left as they are",)
        return result("already_committed", notes=moved_on if since else ())

    _check_group_idle(kafka.describe_group(plan.group), plan)
    recreated = recreated_since_planning(plan, kafka)
    if recreated:
        raise OffsetsMovedError(
            f"refusing to commit plan {plan.plan_id} (run {run_id}) for group '{plan.group}': topics were deleted and "
            f"recreated after planning ({'; '.join(recreated)}); the plan's offsets belong to the old topics. The "
            "group's offsets are untouched; plan again"
        )
    moved, vanished = moved_since_planning(plan, run_id, current)
    if moved:
        raise OffsetsMovedError(
            f"refusing to commit plan {plan.plan_id} (run {run_id}): the committed offsets of group "
            f"'{plan.group}' were changed by another writer after planning ({'; '.join(moved)}). Plan again from "
            "the new offsets (the group's offsets are untouched)."
        )

    errors = kafka.alter_committed(plan.group, {p.key: (p.end, metadata[p.key]) for p in plan.partitions})
    failed = {tp: err for tp, err in errors.items() if err is not None}
    if failed:
        detail = "; ".join(f"{_fmt(tp)} offset {ends[tp]}: {err}" for tp, err in sorted(failed.items()))
        if set(failed.values()) & _MEMBER_ERRORS:
            raise GroupInUseError(
                f"committing plan {plan.plan_id} for group '{plan.group}' was rejected because the group gained "
                f"members while committing ({detail}); stop the live consumer and rerun"
            )
        raise CommitError(f"committing plan {plan.plan_id} for group '{plan.group}' failed: {detail}")

    fault_point("commit.after_kafka")
    _verify(plan, kafka.committed(plan.group, tps), metadata)
    checkpoints.put(plan.group, plan.plan_id, ends, run_id, topic_ids)
    notes = tuple(
        f"{_fmt(tp)}: the group's offset vanished after planning (expired or deleted); committed back at {ends[tp]}"
        for tp in vanished
    )
    return result("committed", tuple(vanished), notes)
