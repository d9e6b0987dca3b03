"""A committing backfill or replay: it moves the feed's group, so it is checked as the feed's next run.

Pure, like the planner: a plan made for a backfill or replay that commits, the request
it was made for and where the feed's output ends go in; the plan comes back to publish
into the feed's own output, with an event for each range the group is moved past on
purpose, or one error naming every partition it would rewind or skip.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from tidemark._types import TopicPartition as TP
from tidemark.config.models import Feed
from tidemark.errors import DataLossError, PlanningError
from tidemark.planning.plan import Event, EventKind, PartitionPlan, Plan
from tidemark.planning.requests import RunRequest


def committing_request(feed: Feed, plan: Plan, request: RunRequest, shown: Mapping[TP, int] | None = None) -> Plan:
    """A committing backfill or replay, checked: it moves the feed's group, so it is the feed's next run.

    The rule (``docs/ARCHITECTURE.md``, "The feed's output"): it publishes to the feed's own
    output (never only to ``.backfills``/``.replays``: the group must not move over records
    that reached no output; ``runs.start.publish_target`` refuses any other), and it starts
    where the group is: the committed offset, else
    the checkpoint, else where the feed's output ends (``shown``: the run ledger, or an
    Iceberg table's recorded position); on a topic recreated since (a ``topic_recreated``
    plan event) the old topic's position means nothing and the new topic's log start is
    where it is. A start past that would skip ``[base, start)``: refused unless
    ``allow_gap`` is true, and then each skipped range is an ``offsets_skipped`` event;
    ``[base, log start)`` that retention deleted is the feed's ``on_data_loss`` to decide
    (``fail`` refuses, ``skip`` names it as a ``data_loss`` event), as for scheduled runs. A
    start before the base (a rewind) would publish offsets the output already holds, or
    move the group back so that the feed publishes them again: always refused.
    """
    rewinds, gaps, lost = _against_group(plan, shown or {})
    who = f"a committing {plan.mode} of feed '{feed.name}' (group '{plan.group}')"
    if lost and feed.on_data_loss == "fail":
        deleted = "; ".join(f"{p.topic}[{p.partition}] [{base}, {p.log_start})" for p, base in lost)
        raise DataLossError(
            f"{who} would commit past records retention deleted unread: {deleted}, and on_data_loss is fail. Set "
            "on_data_loss: skip to go on from the log start (each lost range is then a data_loss event), or run it "
            "without commit"
        )
    if rewinds:
        raise PlanningError(
            f"{who} would move the group back: {'; '.join(rewinds)}. Those offsets are already in the feed's output "
            "and would be published twice. Run it without commit (it publishes beside the feed's output), or start "
            "it at the committed offsets"
        )
    if gaps and not request.allow_gap:
        skipped = "; ".join(f"{p.topic}[{p.partition}] [{base}, {p.start})" for p, base in gaps)
        raise PlanningError(
            f"{who} would skip offsets that reach no output: {skipped}. Start it at the committed offsets, run it "
            "without commit, or set allow_gap (--allow-gap) to skip them on purpose (each skipped range is then an "
            "event in the report)"
        )
    events = tuple(
        _passed_over("data_loss", p, base, p.log_start, "were deleted by retention before they were read; the "
                     f"committing {plan.mode} goes on from the log start (on_data_loss: skip)")
        for p, base in lost
    ) + tuple(
        _passed_over("offsets_skipped", p, base, p.start, f"are skipped on request (allow_gap): the {plan.mode} "
                     "commits past them and they are in no output")
        for p, base in gaps
    )  # fmt: skip
    return replace(plan, events=plan.events + events, output=None)


def _against_group(
    plan: Plan, shown: Mapping[TP, int]
) -> tuple[list[str], list[tuple[PartitionPlan, int]], list[tuple[PartitionPlan, int]]]:
    """Each range against where the group is: the rewinds, the gaps and the ranges retention deleted unread."""
    recreated = {e.topic for e in plan.events if e.kind == "topic_recreated"}
    rewinds: list[str] = []
    gaps: list[tuple[PartitionPlan, int]] = []
    lost: list[tuple[PartitionPlan, int]] = []
    for p in plan.partitions:
        if p.topic in recreated:
            base: int | None = p.log_start  # the old topic's offsets say nothing about the new one
        else:
            base = p.committed if p.committed is not None else p.checkpoint
            if base is None:
                base = shown.get(p.key)
        if base is None:
            continue  # the group has no position yet and the output holds nothing: the feed's reset policy
        if p.start < base:
            rewinds.append(f"{p.topic}[{p.partition}] starts at {p.start}, the group is at {base}")
            continue
        named = any(e.kind == "data_loss" and (e.topic, e.partition) == p.key for e in plan.events)
        if base < p.log_start and p.start >= p.log_start and not named:  # retention deleted [base, log start)
            lost.append((p, base))
        if p.start > max(base, p.log_start):
            gaps.append((p, max(base, p.log_start)))
    return rewinds, gaps, lost


def _passed_over(kind: EventKind, p: PartitionPlan, start: int, end: int, why: str) -> Event:
    """An event naming ``[start, end)`` of ``p``, which the committing run moves the group past."""
    where = f"{p.topic}[{p.partition}]: offsets [{start}, {end}) ({end - start} records)"
    return Event(kind=kind, message=f"{where} {why}", topic=p.topic, partition=p.partition,
                 details={"start": start, "end": end, "records": end - start})  # fmt: skip
