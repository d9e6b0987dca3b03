"""The offset metadata a plan's commit writes beside each offset: which plan, run and topic wrote it.

Pure code over a :class:`~tidemark.planning.plan.Plan`: the planner reads a committed
offset's topic id back from it, the job's guard and the commit name the writer of an
offset from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from tidemark._types import TopicPartition as TP
from tidemark.errors import CommitError
from tidemark.planning.plan import Plan

METADATA_MAX_BYTES = 4096  # broker default offset.metadata.max.bytes


def plan_metadata(plan: Plan, run_id: str, limit: int = METADATA_MAX_BYTES - 1, topic_id: str | None = None) -> str:
    """The offset metadata naming the plan, the run and the topic's id: compact JSON of at most ``limit`` bytes.

    The plan and run ids always survive; the mode is dropped, then the feed name
    truncated, then the topic id dropped, only if they would not fit (the default limit
    leaves room for all of them many times over; the checkpoint keeps the topic id too).
    """
    ids = {"tidemark_plan": plan.plan_id, "tidemark_run": run_id}
    doc: dict[str, str] = {**ids, **({"topic_id": topic_id} if topic_id else {}), "feed": plan.feed,
                           "mode": plan.mode}  # fmt: skip

    def encode(d: Mapping[str, str]) -> str:
        return json.dumps(d, separators=(",", ":"), ensure_ascii=False)

    text = encode(doc)
    if len(text.encode()) <= limit:
        return text
    doc.pop("mode")
    text = encode(doc)
    while len(text.encode()) > limit and doc["feed"]:
        doc["feed"] = doc["feed"][: max(0, len(doc["feed"]) - max(1, len(text.encode()) - limit))]
        text = encode(doc)
    if len(text.encode()) > limit and topic_id:
        text = encode({**ids, "topic_id": topic_id})
    if len(text.encode()) > limit:
        text = encode(ids)
    if len(text.encode()) > limit:
        raise CommitError(
            f"offset metadata limit {limit} bytes is too small for plan id {plan.plan_id} and run id {run_id}"
        )
    return text


def _metadata_field(metadata: str, key: str) -> str | None:
    try:
        doc = json.loads(metadata)
    except ValueError:
        return None
    value = doc.get(key) if isinstance(doc, dict) else None
    return value if isinstance(value, str) else None


def metadata_plan_id(metadata: str) -> str | None:
    """The plan id in a committed offset's metadata, if Tidemark wrote it."""
    return _metadata_field(metadata, "tidemark_plan")


def metadata_run_id(metadata: str) -> str | None:
    """The run id in a committed offset's metadata, if Tidemark wrote it."""
    return _metadata_field(metadata, "tidemark_run")


def metadata_topic_id(metadata: str) -> str | None:
    """The id of the topic a committed offset was committed on, if Tidemark wrote it."""
    return _metadata_field(metadata, "topic_id")


def partition_metadata(plan: Plan, run_id: str, limit: int = METADATA_MAX_BYTES - 1) -> dict[TP, str]:
    """Each partition's offset metadata: :func:`plan_metadata` with the id of the partition's topic."""
    by_topic = {p.topic: p.topic_id for p in plan.partitions}
    texts = {topic: plan_metadata(plan, run_id, limit, topic_id) for topic, topic_id in by_topic.items()}
    return {p.key: texts[p.topic] for p in plan.partitions}


def plan_topic_ids(plan: Plan) -> dict[str, str]:
    """topic → id for the plan's topics whose id the planner saw."""
    return {p.topic: p.topic_id for p in plan.partitions if p.topic_id}


def writer(metadata: str) -> str:
    """Who wrote a committed offset, as far as its metadata tells."""
    run = metadata_run_id(metadata)
    if run is not None:
        return f"Tidemark run {run} (plan {metadata_plan_id(metadata)})"
    plan_id = metadata_plan_id(metadata)
    if plan_id is not None:
        return f"Tidemark plan {plan_id}"
    return "another client" if not metadata else f"another client (metadata {metadata[:60]!r})"
