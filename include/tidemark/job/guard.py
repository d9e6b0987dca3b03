"""The job's guard before publishing: a plan whose topic was recreated, or a committing plan whose group another
writer moved, is refused.

The commit applies the same check (:func:`moved_since_planning`) as its compare-and-set,
so the job and the commit agree on what "moved" means.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidemark._types import TopicPartition as TP
from tidemark.errors import OffsetsMovedError
from tidemark.kafka.adapter import Committed, KafkaAdapter
from tidemark.kafka.connection import KafkaConnection
from tidemark.planning.metadata import metadata_run_id, writer
from tidemark.planning.plan import Plan


def _fmt(tp: TP) -> str:
    return f"{tp[0]}[{tp[1]}]"


def moved_since_planning(plan: Plan, run_id: str, current: Mapping[TP, Committed]) -> tuple[list[str], list[TP]]:
    """Partitions another writer moved since planning, and partitions whose offset vanished.

    A vanished position (the plan saw an offset, the group has none now) was expired by
    the broker or deleted: nobody else wrote it, so committing there is safe. A partition
    already at its end with this run's metadata is not "moved" either: an earlier
    attempt of this same commit got that far before failing on other partitions.
    """
    moved: list[str] = []
    vanished: list[TP] = []
    for p in plan.partitions:
        now = current[p.key]
        if now.offset == p.committed:
            continue
        if now.offset == p.end and metadata_run_id(now.metadata) == run_id:
            continue
        if now.offset is None:
            vanished.append(p.key)
            continue
        saw = "none" if p.committed is None else str(p.committed)
        moved.append(f"{_fmt(p.key)} plan saw {saw}, group now at {now.offset} (written by {writer(now.metadata)})")
    return moved, vanished


def recreated_since_planning(plan: Plan, kafka: KafkaAdapter) -> list[str]:
    """Topics of ``plan`` whose id is not the one the plan was made on: deleted and recreated since.

    The plan's offsets belong to the old topic; read or committed on the new one, they would
    be other records under the old topic's plan id.
    """
    planned = {p.topic: p.topic_id for p in plan.partitions if p.topic_id}
    if not planned:
        return []
    now = {i.topic: i.topic_id for i in kafka.partitions(sorted(planned))}
    return [f"'{t}' was {planned[t]} at planning, now {now.get(t) or 'gone'}" for t in sorted(planned)
            if now.get(t) != planned[t]]  # fmt: skip


def refuse_if_moved(plan: Plan, connection: KafkaConnection, run_id: str | None) -> None:
    """Before publishing: refuse a committing plan whose group another writer moved since planning.

    Such a plan can never commit (the commit's compare-and-set would refuse it), and its
    publication would overlap whatever the group's new position leads the next run to
    publish. A cleared old Airflow run re-running its job is the usual case. The check
    narrows the window; the commit's compare-and-set refuses what still slips through, and its staged
    publication is discarded, never having been visible.
    """
    kafka = KafkaAdapter(connection)
    recreated = recreated_since_planning(plan, kafka)
    if recreated:
        raise OffsetsMovedError(
            f"refusing to read plan {plan.plan_id}{f' (run {run_id})' if run_id else ''}: topics were deleted and "
            f"recreated after planning ({'; '.join(recreated)}), so its offsets name other records now. Nothing was "
            "read or published; plan again (run the feed again)"
        )
    if not plan.commit or not plan.partitions:
        return
    moved, _ = moved_since_planning(plan, run_id or "", kafka.committed(plan.group, [p.key for p in plan.partitions]))
    if moved:
        raise OffsetsMovedError(
            f"refusing to publish plan {plan.plan_id}{f' (run {run_id})' if run_id else ''}: the committed offsets of "
            f"group '{plan.group}' were changed by another writer after planning ({'; '.join(moved)}), so this plan "
            "can never commit. Nothing was published; Plan again from the new offsets (run the feed again)."
        )
