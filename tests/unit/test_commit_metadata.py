"""Offset metadata naming the plan and the run stays within Kafka's 4096-byte limit."""

from __future__ import annotations

import json

import pytest

from tidemark.planning.metadata import METADATA_MAX_BYTES, metadata_plan_id, metadata_run_id, plan_metadata
from tidemark.planning.plan import PartitionPlan, Plan, compute_plan_id

RUN = "20261122T152342123456Z-0123abcd"


def plan(feed: str = "orders") -> Plan:
    parts = (PartitionPlan("t", 0, 1, None, None, 0, 10, 10, 0, 10, "earliest"),)
    return Plan(
        compute_plan_id(feed, "g", "scheduled", "read_committed", parts),
        feed, "g", "scheduled", True, "read_committed", "2026-01-01T00:00:00+00:00", parts, (),
    )  # fmt: skip


def test_metadata_names_the_plan_run_feed_and_mode() -> None:
    p = plan()
    doc = json.loads(plan_metadata(p, RUN))
    assert doc == {"tidemark_plan": p.plan_id, "tidemark_run": RUN, "feed": "orders", "mode": "scheduled"}
    assert metadata_plan_id(plan_metadata(p, RUN)) == p.plan_id
    assert metadata_run_id(plan_metadata(p, RUN)) == RUN


@pytest.mark.parametrize("limit", [4096, 200, 120, 90])
def test_metadata_is_trimmed_to_the_limit_keeping_the_plan_and_run_ids(limit: int) -> None:
    p = plan(feed="é" * 99)  # multi-byte characters: the limit is in bytes
    text = plan_metadata(p, RUN, limit=limit)
    assert len(text.encode()) <= limit
    assert metadata_plan_id(text) == p.plan_id
    assert metadata_run_id(text) == RUN


def test_limit_too_small_for_the_ids_is_an_error() -> None:
    from tidemark.errors import CommitError

    with pytest.raises(CommitError, match="too small"):
        plan_metadata(plan(), RUN, limit=60)


@pytest.mark.parametrize("metadata", ["", "not json", "[1]", '{"tidemark_plan": 3}', '{"other": "x"}'])
def test_foreign_metadata_names_no_plan_or_run(metadata: str) -> None:
    assert metadata_plan_id(metadata) is None
    assert metadata_run_id(metadata) is None


def test_default_limit_is_kafkas() -> None:
    assert METADATA_MAX_BYTES == 4096


def test_metadata_names_the_topic_id_and_keeps_it_before_the_feed_name() -> None:
    from tidemark.planning.metadata import metadata_topic_id

    p = plan(feed="é" * 99)
    assert metadata_topic_id(plan_metadata(p, RUN, topic_id="AAAAAAAAAAAAAAAAAAAAAQ")) == "AAAAAAAAAAAAAAAAAAAAAQ"
    text = plan_metadata(p, RUN, limit=130, topic_id="AAAAAAAAAAAAAAAAAAAAAQ")
    assert len(text.encode()) <= 130 and metadata_topic_id(text) == "AAAAAAAAAAAAAAAAAAAAAQ"
    assert metadata_run_id(plan_metadata(p, RUN, limit=90, topic_id="AAAAAAAAAAAAAAAAAAAAAQ")) == RUN
