"""What a committing backfill or replay may do to the group: start where it is, skip only on request, never rewind."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tidemark.config.models import parse_feed
from tidemark.errors import ConfigError, DataLossError, PlanningError
from tidemark.planning.committing import committing_request
from tidemark.planning.requests import ReplaySpec, RunRequest, run_request
from tidemark.planning.resolve import Observed, PartitionSnapshot, PlanRequest, Policy, build_plan
from tidemark.runs.pipeline import publish_target

FEED = parse_feed("f", {"topics": ["t"], "group": "g", "output": "/tmp/tidemark-unit-out"}, "f.yaml")
SKIPPING = parse_feed("f", {"topics": ["t"], "group": "g", "output": "/tmp/tidemark-unit-out", "on_data_loss": "skip"},
                      "f.yaml")  # fmt: skip


def plan(committed: int | None, spec: ReplaySpec, **snapshot: Any) -> Any:
    fields: dict[str, Any] = {"topic": "t", "partition": 0, "leader": 1, "committed": committed, "checkpoint": None,
                              "log_start": 100, "high_watermark": 200, "last_stable": 200, **snapshot}  # fmt: skip
    policy = Policy(on_data_loss="skip")
    request = PlanRequest("f", "g", policy, datetime.now(UTC), mode="replay", replay=spec)
    return build_plan(request, Observed((PartitionSnapshot(**fields),)))


def asked(**params: Any) -> RunRequest:
    """A committing replay's trigger parameters, parsed as every entry point parses them."""
    return run_request("replay", {"commit": True, **params})


def test_from_the_committed_offset_publishes_into_the_feed_output() -> None:
    checked = committing_request(FEED, plan(150, ReplaySpec(commit=True)), asked())
    assert checked.output is None and checked.partitions[0].start == 150
    assert [e.kind for e in checked.events if e.kind == "offsets_skipped"] == []


def test_a_gap_is_refused_unless_allowed_and_then_an_event() -> None:
    gap = plan(150, ReplaySpec(start_from="offset", start_offset=160, commit=True))
    with pytest.raises(PlanningError, match=r"t\[0\] \[150, 160\).*allow_gap"):
        committing_request(FEED, gap, asked())
    checked = committing_request(FEED, gap, asked(allow_gap=True))
    [event] = [e for e in checked.events if e.kind == "offsets_skipped"]
    assert (event.topic, event.partition, dict(event.details)) == ("t", 0, {"start": 150, "end": 160, "records": 10})


@pytest.mark.parametrize(
    "spec",
    [ReplaySpec(start_from="earliest", commit=True), ReplaySpec(start_from="shift_by", shift_by=-20, commit=True)],
)
def test_a_rewind_is_refused(spec: ReplaySpec) -> None:
    with pytest.raises(PlanningError, match=r"t\[0\] starts at 1[03]0, the group is at 150.*without commit"):
        committing_request(FEED, plan(150, spec), asked(allow_gap=True))


def test_retention_past_the_committed_offset_is_a_data_loss_event_not_a_gap() -> None:
    lost = plan(50, ReplaySpec(commit=True))  # the log starts at 100: retention took [50, 100)
    checked = committing_request(SKIPPING, lost, asked())
    assert checked.partitions[0].start == 100 and [e.kind for e in checked.events].count("data_loss") == 1


def test_a_replay_from_earliest_past_deleted_records_follows_on_data_loss() -> None:
    """Item 5: group at 50, retention deleted to 100: ``--start-from earliest --commit`` used to pass silently."""
    earliest = plan(50, ReplaySpec(start_from="earliest", commit=True))
    with pytest.raises(DataLossError, match=r"t\[0\] \[50, 100\).*on_data_loss is fail"):
        committing_request(FEED, earliest, asked())
    checked = committing_request(SKIPPING, earliest, asked())
    [event] = [e for e in checked.events if e.kind == "data_loss"]
    assert dict(event.details) == {"start": 50, "end": 100, "records": 50}


def test_a_recreated_topic_starts_where_the_new_topic_starts() -> None:
    """Item 5: the old topic's committed 150 is no base on the new topic (ids differ): earliest is no rewind,
    and a start past the new topic's log start skips records, refused without allow_gap."""
    ids = {"topic_id": "new-id", "committed_metadata": '{"tidemark_run": "r", "topic_id": "old-id"}', "log_start": 0}
    earliest = plan(150, ReplaySpec(start_from="earliest", commit=True), **ids)
    assert committing_request(FEED, earliest, asked()).partitions[0].start == 0
    later = plan(150, ReplaySpec(start_from="offset", start_offset=100, commit=True), **ids)
    with pytest.raises(PlanningError, match=r"t\[0\] \[0, 100\).*allow_gap"):
        committing_request(FEED, later, asked())


def test_without_offsets_or_checkpoints_the_output_s_end_is_the_base() -> None:
    """Item 5: no committed offset, no checkpoint, but the output ends at 150 (ledger or Iceberg table)."""
    with pytest.raises(PlanningError, match=r"t\[0\] starts at 100, the group is at 150"):
        committing_request(FEED, plan(None, ReplaySpec(start_from="earliest", commit=True)), asked(), {("t", 0): 150})
    with pytest.raises(PlanningError, match=r"t\[0\] \[150, 180\).*allow_gap"):
        committing_request(FEED, plan(None, ReplaySpec(start_from="offset", start_offset=180, commit=True)), asked(),
                           {("t", 0): 150})  # fmt: skip


def test_an_output_elsewhere_and_a_non_boolean_allow_gap_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"parameter 'output'.*feed's own output"):
        publish_target(FEED, asked(output="/elsewhere"))  # where a run publishes is decided before it plans
    with pytest.raises(ConfigError, match="parameter 'allow_gap'"):
        committing_request(FEED, plan(150, ReplaySpec(commit=True)), asked(allow_gap="yes"))


def test_after_the_group_s_offsets_expired_the_checkpoint_is_the_base() -> None:
    """The group's offsets expired (none committed), Tidemark's checkpoint says 150: a rewind and a gap are still
    measured from it, not waved through as a group with no position."""
    with pytest.raises(PlanningError, match=r"t\[0\] starts at 100, the group is at 150"):
        committing_request(FEED, plan(None, ReplaySpec(start_from="earliest", commit=True), checkpoint=150), asked())
    with pytest.raises(PlanningError, match=r"t\[0\] \[150, 170\).*allow_gap"):
        committing_request(
            FEED, plan(None, ReplaySpec(start_from="offset", start_offset=170, commit=True), checkpoint=150), asked()
        )
