"""The pure planner: every branch of the resolution table, caps, chunking and the plan document."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tidemark.errors import DataLossError, OffsetAheadError, PlanningError
from tidemark.planning.plan import PartitionPlan, Plan, PlanStore
from tidemark.planning.resolve import (
    PartitionSnapshot,
    Policy,
    RetentionInfo,
    Window,
    _cap_run,
    build_plan,
    chunk_ranges,
    mark_new_partitions,
    retention_warnings,
)

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
DAY_MS = 86_400_000


def snap(**kw: Any) -> PartitionSnapshot:
    base: dict[str, Any] = {
        "topic": "t",
        "partition": 0,
        "leader": 1,
        "committed": None,
        "checkpoint": None,
        "log_start": 100,
        "high_watermark": 200,
        "last_stable": 200,
    }
    return PartitionSnapshot(**{**base, **kw})


def plan_one(s: PartitionSnapshot, isolation: str = "read_committed", **kw: Any) -> Plan:
    policy = kw.pop("policy", Policy())
    return build_plan("f", "g", [s], policy=policy, created_at=NOW, isolation=isolation, **kw)  # type: ignore[arg-type]


def kinds(plan: Plan) -> list[str]:
    return [e.kind for e in plan.events]


# -- the resolution table (scheduled runs) -----------------------------------------------

RESOLUTION = [
    # id, snapshot fields, policy fields, (start, end, reason), event kinds
    ("committed", {"committed": 150}, {}, (150, 200, "committed"), []),
    ("committed-at-log-start", {"committed": 100}, {}, (100, 200, "committed"), []),
    ("committed-at-end", {"committed": 200}, {}, (200, 200, "committed"), []),
    ("committed-wins-over-checkpoint", {"committed": 150, "checkpoint": 120}, {}, (150, 200, "committed"), []),
    ("checkpoint-when-offsets-expired", {"checkpoint": 120}, {}, (120, 200, "checkpoint"), ["group_offsets_expired"]),
    # Neither offsets nor checkpoint: the output table's history (an Iceberg feed), before the reset policy.
    ("table-when-both-are-gone", {"table": 170}, {}, (170, 200, "table"), ["position_from_table"]),
    (
        "checkpoint-wins-over-table",
        {"checkpoint": 120, "table": 170},
        {},
        (120, 200, "checkpoint"),
        ["group_offsets_expired"],
    ),
    (
        "table-beats-on-missing-fail",
        {"table": 170},
        {"on_missing": "fail"},
        (170, 200, "table"),
        ["position_from_table"],
    ),
    (
        "table-below-log-start-skip",
        {"table": 40},
        {"on_data_loss": "skip"},
        (100, 200, "log_start"),
        ["position_from_table", "data_loss"],
    ),
    ("missing-earliest", {}, {"on_missing": "earliest"}, (100, 200, "earliest"), ["reset"]),
    ("missing-latest", {}, {"on_missing": "latest"}, (200, 200, "latest"), ["reset"]),
    ("missing-timestamp", {"ts_start_offset": 160}, {"on_missing": "timestamp"}, (160, 200, "timestamp"), ["reset"]),
    (
        "missing-timestamp-past-end",
        {"ts_start_offset": None},
        {"on_missing": "timestamp"},
        (200, 200, "timestamp"),
        ["timestamp_past_end", "reset"],
    ),
    (
        "new-partition-earliest",
        {"is_new": True},
        {"on_new_partition": "earliest"},
        (100, 200, "earliest"),
        ["new_partition"],
    ),
    ("new-partition-latest", {"is_new": True}, {"on_new_partition": "latest"}, (200, 200, "latest"), ["new_partition"]),
    (
        "new-partition-beats-on-missing-fail",
        {"is_new": True},
        {"on_missing": "fail"},
        (100, 200, "earliest"),
        ["new_partition"],
    ),
    ("below-log-start-skip", {"committed": 40}, {"on_data_loss": "skip"}, (100, 200, "log_start"), ["data_loss"]),
    (
        "checkpoint-below-log-start-skip",
        {"checkpoint": 40},
        {"on_data_loss": "skip"},
        (100, 200, "log_start"),
        ["group_offsets_expired", "data_loss"],
    ),
    ("ahead-earliest", {"committed": 250}, {"on_ahead": "earliest"}, (100, 200, "ahead_reset"), ["offset_ahead"]),
    ("ahead-latest", {"committed": 250}, {"on_ahead": "latest"}, (200, 200, "ahead_reset"), ["offset_ahead"]),
    (
        "checkpoint-ahead-latest",
        {"checkpoint": 250},
        {"on_ahead": "latest"},
        (200, 200, "ahead_reset"),
        ["group_offsets_expired", "offset_ahead"],
    ),
    # read_committed: the end is the last stable offset, frozen now.
    ("end-is-lso", {"committed": 150, "last_stable": 180}, {}, (150, 180, "committed"), []),
    # committed between LSO and HW is not "ahead": nothing to read yet, never a negative range.
    ("committed-between-lso-and-hw", {"committed": 190, "last_stable": 180}, {}, (190, 190, "committed"), []),
    ("cap-per-partition", {"committed": 100}, {"max_records_per_partition": 30}, (100, 130, "committed"), ["capped"]),
    ("cap-not-reached", {"committed": 180}, {"max_records_per_partition": 30}, (180, 200, "committed"), []),
    ("empty-log", {"log_start": 0, "high_watermark": 0, "last_stable": 0}, {}, (0, 0, "earliest"), ["reset"]),
    (
        "retention-emptied-log",
        {"committed": 7, "log_start": 7, "high_watermark": 7, "last_stable": 7},
        {},
        (7, 7, "committed"),
        [],
    ),
]


@pytest.mark.parametrize(
    ("fields", "policy", "expected", "events"),
    [pytest.param(f, p, e, ev, id=i) for i, f, p, e, ev in RESOLUTION],
)
def test_resolution_table(
    fields: dict[str, Any], policy: dict[str, Any], expected: tuple[int, int, str], events: list[str]
) -> None:
    plan = plan_one(snap(**fields), policy=Policy(**policy))
    (p,) = plan.partitions
    assert (p.start, p.end, p.reason) == expected
    assert kinds(plan) == events
    assert all(e.topic == "t" and e.partition == 0 for e in plan.events)
    assert p.start >= 0 and p.end >= p.start  # never -1, never a negative range


@pytest.mark.parametrize(("isolation", "end"), [("read_committed", 180), ("read_uncommitted", 200)])
def test_isolation_picks_the_end(isolation: str, end: int) -> None:
    plan = plan_one(snap(committed=150, last_stable=180), isolation=isolation)
    assert plan.partitions[0].end == plan.partitions[0].end_available == end
    assert plan.partitions[0].high_watermark == 200


@pytest.mark.parametrize(
    ("fields", "policy", "error", "needles"),
    [
        pytest.param(
            {"committed": 40},
            {"on_data_loss": "fail"},
            DataLossError,
            ["t[0]", "committed offset 40", "log start 100", "[40, 100)", "60 records", "retention.ms=86400000"],
            id="data-loss-fail",
        ),
        pytest.param(
            {"checkpoint": 40},
            {"on_data_loss": "fail"},
            DataLossError,
            ["t[0]", "checkpoint offset 40", "[40, 100)"],
            id="checkpoint-data-loss-fail",
        ),
        pytest.param(
            {"committed": 250},
            {"on_ahead": "fail"},
            OffsetAheadError,
            ["t[0]", "committed offset 250", "high watermark 200", "recreated"],
            id="ahead-fail",
        ),
        pytest.param(
            {}, {"on_missing": "fail"}, PlanningError, ["t[0]", "on_missing is fail", "group 'g'"], id="missing-fail"
        ),
    ],
)
def test_refusals_name_topic_partition_and_offsets(
    fields: dict[str, Any], policy: dict[str, Any], error: type[Exception], needles: list[str]
) -> None:
    retention = RetentionInfo(topic_retention_ms={"t": DAY_MS})
    with pytest.raises(error) as info:
        plan_one(snap(**fields), policy=Policy(**policy), retention=retention)
    assert type(info.value) is error
    for needle in needles:
        assert needle in str(info.value)


def test_refusal_names_every_offending_partition() -> None:
    snaps = [snap(partition=0, committed=10), snap(partition=1, committed=150), snap(partition=2, committed=20)]
    with pytest.raises(DataLossError) as info:
        build_plan("f", "g", snaps, policy=Policy(), created_at=NOW)
    assert "t[0]" in str(info.value) and "t[2]" in str(info.value) and "t[1]" not in str(info.value)


def test_unlimited_retention_is_named_in_data_loss() -> None:
    with pytest.raises(DataLossError, match=r"retention\.ms=-1 \(unlimited\)"):
        plan_one(snap(committed=1), retention=RetentionInfo(topic_retention_ms={"t": -1}))


def test_data_loss_skip_event_carries_lost_range() -> None:
    plan = plan_one(
        snap(committed=40), policy=Policy(on_data_loss="skip"), retention=RetentionInfo(None, None, {"t": 5})
    )
    (event,) = plan.events
    assert event.details["lost_start"] == 40 and event.details["lost_end"] == 100
    assert event.details["lost_records"] == 60 and event.details["retention_ms"] == 5


# -- backfill windows --------------------------------------------------------------------

WINDOW = Window(NOW - timedelta(hours=2), NOW - timedelta(hours=1))


@pytest.mark.parametrize(
    ("fields", "window", "expected", "events"),
    [
        pytest.param({"ts_start_offset": 120, "ts_end_offset": 180}, WINDOW, (120, 180), [], id="inside"),
        pytest.param(
            {"ts_start_offset": 120, "ts_end_offset": None}, WINDOW, (120, 200), ["timestamp_past_end"], id="end-past"
        ),
        pytest.param(
            {"ts_start_offset": None, "ts_end_offset": None}, WINDOW, (200, 200), ["timestamp_past_end"], id="all-past"
        ),
        pytest.param({"ts_start_offset": 120}, Window(WINDOW.start), (120, 200), [], id="open-end"),
        pytest.param(
            {"ts_start_offset": 120, "ts_end_offset": 195, "last_stable": 190},
            WINDOW,
            (120, 190),
            [],
            id="end-clamped-to-lso",
        ),
        # a committed offset plays no part in a backfill
        pytest.param(
            {"ts_start_offset": 110, "ts_end_offset": 130, "committed": 150},
            WINDOW,
            (110, 130),
            [],
            id="ignores-committed",
        ),
    ],
)
def test_backfill_window(fields: dict[str, Any], window: Window, expected: tuple[int, int], events: list[str]) -> None:
    plan = plan_one(snap(**fields), mode="backfill", window=window, policy=Policy(max_records_per_partition=1))
    (p,) = plan.partitions
    assert (p.start, p.end, p.reason) == (*expected, "timestamp")
    assert kinds(plan) == events
    assert plan.commit is False
    assert plan.window["start"] == window.start.isoformat()
    assert -1 not in (p.start, p.end)


def test_backfill_commit_can_be_asked_for() -> None:
    plan = plan_one(snap(ts_start_offset=120), mode="backfill", window=WINDOW, commit=True)
    assert plan.commit is True and plan.mode == "backfill"


@pytest.mark.parametrize(
    "window",
    [
        pytest.param(None, id="no-window"),
    ],
)
def test_backfill_needs_a_window(window: Window | None) -> None:
    with pytest.raises(PlanningError, match="window"):
        plan_one(snap(), mode="backfill", window=window)


@pytest.mark.parametrize(
    ("start", "end"),
    [
        pytest.param(datetime(2026, 1, 1), None, id="naive"),
        pytest.param(NOW, NOW - timedelta(seconds=1), id="reversed"),
    ],
)
def test_bad_windows_are_refused(start: datetime, end: datetime | None) -> None:
    with pytest.raises(PlanningError):
        Window(start, end)


def test_replay_hook_requested_offsets_still_obey_policies() -> None:
    snaps = [snap(partition=0), snap(partition=1), snap(partition=2)]
    plan = build_plan(
        "f",
        "g",
        snaps,
        policy=Policy(on_data_loss="skip"),
        created_at=NOW,
        mode="replay",
        start_overrides={("t", 0): 150, ("t", 1): 10, ("t", 2): 120},
        end_overrides={("t", 0): 160, ("t", 2): 999},
    )
    got = {p.partition: (p.start, p.end, p.reason) for p in plan.partitions}
    assert got == {0: (150, 160, "requested"), 1: (100, 200, "log_start"), 2: (120, 200, "requested")}
    assert kinds(plan) == ["data_loss"]
    assert plan.commit is False


def test_a_partition_twice_is_refused() -> None:
    with pytest.raises(PlanningError, match="twice"):
        build_plan("f", "g", [snap(), snap()], policy=Policy(), created_at=NOW)


# -- new partitions ----------------------------------------------------------------------


def test_mark_new_partitions_only_where_siblings_have_offsets() -> None:
    snaps = [
        snap(topic="a", partition=0, committed=5),
        snap(topic="a", partition=1),
        snap(topic="b", partition=0),
        snap(topic="b", partition=1),
        snap(topic="c", partition=0, checkpoint=3),
        snap(topic="c", partition=1),
    ]
    flags = {(s.topic, s.partition): s.is_new for s in mark_new_partitions(snaps)}
    assert flags == {
        ("a", 0): False,
        ("a", 1): True,
        ("b", 0): False,
        ("b", 1): False,
        ("c", 0): False,
        ("c", 1): True,
    }


# -- caps --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backlogs", "limit", "expected"),
    [
        pytest.param({"a": 10, "b": 100, "c": 100}, 110, {"a": 10, "b": 50, "c": 50}, id="small-first"),
        pytest.param({"a": 100, "b": 100, "c": 100}, 5, {"a": 2, "b": 2, "c": 1}, id="fewer-than-partitions"),
        pytest.param({"a": 0, "b": 7}, 5, {"a": 0, "b": 5}, id="empty-partition"),
        pytest.param({"a": 3, "b": 4}, 100, {"a": 3, "b": 4}, id="limit-not-reached"),
    ],
)
def test_run_cap_shares_fairly(backlogs: dict[str, int], limit: int, expected: dict[str, int]) -> None:
    grant = _cap_run({(k, 0): v for k, v in backlogs.items()}, limit)
    assert {k: grant[(k, 0)] for k in backlogs} == expected
    assert sum(grant.values()) == min(limit, sum(backlogs.values()))


def test_run_cap_in_a_plan_events_and_totals() -> None:
    snaps = [snap(partition=i, committed=100) for i in range(4)]
    plan = build_plan(
        "f", "g", snaps, policy=Policy(max_records_per_run=150, max_records_per_partition=60), created_at=NOW
    )
    assert plan.total_records == 150
    assert all(p.records <= 60 for p in plan.partitions)
    assert {e.details["limit"] for e in plan.events if e.kind == "capped"} == {
        "max_records_per_partition",
        "max_records_per_run",
    }


def test_caps_over_runs_cover_the_backlog_exactly_once() -> None:
    committed = {i: 100 for i in range(3)}
    read: dict[int, list[tuple[int, int]]] = {i: [] for i in range(3)}
    policy = Policy(max_records_per_run=70, max_records_per_partition=40)
    for _ in range(10):
        snaps = [snap(partition=i, committed=committed[i]) for i in range(3)]
        plan = build_plan("f", "g", snaps, policy=policy, created_at=NOW)
        if plan.total_records == 0:
            break
        assert plan.total_records <= 70
        for p in plan.partitions:
            read[p.partition].append((p.start, p.end))
            committed[p.partition] = p.end
    for ranges in read.values():
        assert ranges[0][0] == 100 and ranges[-1][1] == 200
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


# -- chunking and tasks ------------------------------------------------------------------


def pp(partition: int, start: int, end: int, leader: int = 1, topic: str = "t") -> PartitionPlan:
    return PartitionPlan(topic, partition, leader, None, None, 0, end, end, start, end, "earliest")


@pytest.mark.parametrize(
    ("parts", "rpt", "n_tasks"),
    [
        pytest.param([pp(0, 0, 2500)], 1000, 3, id="split-large"),
        pytest.param([pp(i, 0, 100) for i in range(10)], 1000, 1, id="pack-small-same-leader"),
        pytest.param([pp(i, 0, 100, leader=1 + i % 3) for i in range(9)], 1000, 3, id="one-task-per-leader"),
        pytest.param([pp(0, 0, 600), pp(1, 0, 600), pp(2, 0, 400)], 1000, 2, id="first-fit-decreasing"),
        pytest.param([pp(0, 5, 5), pp(1, 0, 0)], 10, 0, id="nothing-to-read"),
    ],
)
def test_chunking(parts: list[PartitionPlan], rpt: int, n_tasks: int) -> None:
    tasks = chunk_ranges(parts, rpt)
    assert len(tasks) == n_tasks
    assert [t.index for t in tasks] == list(range(len(tasks)))
    leaders = {(p.topic, p.partition): p.leader for p in parts}
    covered: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for t in tasks:
        assert t.records <= rpt
        assert {leaders[(c.topic, c.partition)] for c in t.chunks} == {t.leader}
        for c in t.chunks:
            assert 0 < c.end - c.start <= rpt
            covered.setdefault((c.topic, c.partition), []).append((c.start, c.end))
    for p in parts:
        spans = sorted(covered.get(p.key, []))
        assert sum(e - s for s, e in spans) == p.records
        if spans:
            assert spans[0][0] == p.start and spans[-1][1] == p.end
            assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


def test_every_partition_is_in_the_plan_even_with_nothing_to_read() -> None:
    snaps = [
        snap(partition=0, committed=200),
        snap(partition=1, committed=150, leader=2),
        snap(partition=2, committed=200),
    ]
    plan = build_plan("f", "g", snaps, policy=Policy(records_per_task=20), created_at=NOW)
    assert [p.partition for p in plan.partitions] == [0, 1, 2]
    assert [p.records for p in plan.partitions] == [0, 50, 0]
    assert {c.partition for t in plan.tasks for c in t.chunks} == {1}
    assert {t.leader for t in plan.tasks} == {2}
    assert [t.records for t in plan.tasks] == [20, 20, 10]


# -- the plan document -------------------------------------------------------------------


def test_plan_id_depends_on_ranges_not_on_time_or_events(tmp_path: Path) -> None:
    snaps = [snap(partition=i, committed=120 + i) for i in range(3)]
    a = build_plan("f", "g", snaps, policy=Policy(), created_at=NOW)
    b = build_plan("f", "g", list(reversed(snaps)), policy=Policy(), created_at=NOW + timedelta(hours=1))
    c = build_plan("f", "g", [replace(snaps[0], committed=121), *snaps[1:]], policy=Policy(), created_at=NOW)
    assert a.plan_id == b.plan_id != c.plan_id
    store = PlanStore(tmp_path)
    store.save(a)
    first, second = store.load("f", a.plan_id), store.load("f", a.plan_id)
    assert list(first.ranges()) == list(second.ranges()) == list(a.ranges())
    assert first.tasks == a.tasks and first.events == a.events
    assert a.created_at == "2026-11-21T12:00:00+00:00"


def test_scheduled_plans_commit_by_default() -> None:
    assert plan_one(snap(committed=150)).commit is True
    assert plan_one(snap(committed=150), commit=False).commit is False


# -- retention warnings ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("interval", "offsets_ms", "topic_ms", "expected"),
    [
        pytest.param(timedelta(days=8), 7 * DAY_MS, {}, [None], id="interval-longer-than-offsets-retention"),
        pytest.param(timedelta(days=7), 7 * DAY_MS, {}, [], id="equal-is-fine"),
        pytest.param(timedelta(days=1), 7 * DAY_MS, {"t": 3_600_000, "u": DAY_MS * 2}, ["t"], id="topic-retention"),
        pytest.param(timedelta(days=30), 7 * DAY_MS, {"t": -1}, [None], id="unlimited-topic-retention"),
        pytest.param(None, 1, {"t": 1}, [], id="no-schedule"),
        pytest.param(timedelta(days=2), None, {"t": None}, [], id="unknown"),
    ],
)
def test_retention_warnings(
    interval: timedelta | None, offsets_ms: int | None, topic_ms: dict[str, int | None], expected: list[str | None]
) -> None:
    events = retention_warnings(RetentionInfo(interval, offsets_ms, topic_ms))
    assert [e.topic for e in events] == expected
    assert all(e.kind == "retention_warning" for e in events)


def test_retention_warning_is_in_scheduled_plans_only() -> None:
    retention = RetentionInfo(timedelta(days=8), 7 * DAY_MS, {"t": DAY_MS})
    scheduled = plan_one(snap(committed=150), retention=retention)
    assert kinds(scheduled) == ["retention_warning", "retention_warning"]
    assert "offsets.retention.minutes" in scheduled.events[0].message
    assert "retention.ms" in scheduled.events[1].message and "'t'" in scheduled.events[1].message
    backfill = plan_one(snap(ts_start_offset=150), retention=retention, mode="backfill", window=WINDOW)
    assert "retention_warning" not in kinds(backfill)


# -- replays -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "fields", "expected", "events"),
    [
        pytest.param({}, {"committed": 150}, (150, 200, "committed"), [], id="committed"),
        pytest.param(
            {}, {"checkpoint": 130}, (130, 200, "checkpoint"), ["group_offsets_expired"], id="committed-expired"
        ),
        pytest.param({"start_from": "earliest"}, {"committed": 150}, (100, 200, "requested"), [], id="earliest"),
        pytest.param({"start_from": "latest"}, {"last_stable": 190}, (190, 190, "requested"), [], id="latest-is-lso"),
        pytest.param(
            {"start_from": "timestamp", "start_timestamp": NOW},
            {"ts_start_offset": 170},
            (170, 200, "requested"),
            [],
            id="timestamp",
        ),
        pytest.param(
            {"start_from": "by_duration", "duration": timedelta(hours=1)},
            {"ts_start_offset": None},
            (200, 200, "requested"),
            ["timestamp_past_end"],
            id="by-duration-past-end",
        ),
        pytest.param({"start_from": "offset", "start_offset": 120}, {}, (120, 200, "requested"), [], id="offset"),
        pytest.param(
            {"start_from": "shift_by", "shift_by": -30},
            {"committed": 150},
            (120, 200, "requested"),
            [],
            id="shift-back",
        ),
        pytest.param(
            {"start_from": "shift_by", "shift_by": -80},
            {"committed": 150},
            (100, 200, "requested"),
            ["reset"],
            id="shift-clamped",
        ),
        pytest.param(
            {"start_from": "shift_by", "shift_by": 10},
            {"checkpoint": 150},
            (160, 200, "requested"),
            [],
            id="shift-checkpoint",
        ),
        pytest.param(
            {"start_from": "earliest", "end_at": "offset", "end_offset": 150},
            {},
            (100, 150, "requested"),
            [],
            id="end-offset",
        ),
        pytest.param(
            {"start_from": "earliest", "end_at": "timestamp", "end_timestamp": NOW},
            {"ts_end_offset": None},
            (100, 200, "requested"),
            ["timestamp_past_end"],
            id="end-timestamp-past-end",
        ),
        pytest.param(
            {"start_from": "offset", "start_offset": 50},
            {},
            (100, 200, "log_start"),
            ["data_loss"],
            id="offset-below-log",
        ),
    ],
)
def test_replay_resolution(
    spec: dict[str, Any], fields: dict[str, Any], expected: tuple[int, int, str], events: list[str]
) -> None:
    from tidemark.planning.requests import ReplaySpec

    replay = ReplaySpec(**spec)
    plan = plan_one(
        snap(**fields), mode="replay", replay=replay, policy=Policy(on_data_loss="skip", max_records_per_partition=1)
    )
    (p,) = plan.partitions
    assert (p.start, p.end, p.reason) == expected
    assert kinds(plan) == events
    assert plan.mode == "replay" and plan.commit is False
    assert plan.window["start_from"] == replay.start_from


def test_replay_commit_follows_the_spec() -> None:
    from tidemark.planning.requests import ReplaySpec

    plan = plan_one(snap(committed=150), mode="replay", replay=ReplaySpec(start_from="earliest", commit=True))
    assert plan.commit is True


def test_replay_shift_without_position_is_refused() -> None:
    from tidemark.planning.requests import ReplaySpec

    with pytest.raises(PlanningError, match=r"t\[0\]"):
        plan_one(snap(), mode="replay", replay=ReplaySpec(start_from="shift_by", shift_by=-5))


def test_replay_needs_a_spec() -> None:
    with pytest.raises(PlanningError, match="replay spec"):
        plan_one(snap(committed=150), mode="replay")


# -- topic identity ------------------------------------------------------------------------

OLD_ID, NEW_ID = "old-topic-id", "new-topic-id"


def tagged(topic_id: str) -> str:
    return f'{{"tidemark_plan":"p","tidemark_run":"r","topic_id":"{topic_id}"}}'


@pytest.mark.parametrize(
    ("fields", "recreated"),
    [
        ({"checkpoint": 150, "checkpoint_topic_id": OLD_ID}, True),  # offsets deleted with the old topic
        ({"committed": 150, "committed_metadata": tagged(OLD_ID)}, True),
        ({"checkpoint": 150, "checkpoint_topic_id": NEW_ID}, False),
        (
            {"committed": 150, "committed_metadata": tagged(NEW_ID), "checkpoint": 150, "checkpoint_topic_id": OLD_ID},
            False,
        ),  # the committed offset decides when there is one
        ({"committed": 150, "committed_metadata": "", "checkpoint": 150, "checkpoint_topic_id": OLD_ID}, False),
        ({"checkpoint": 150}, False),  # a checkpoint recorded before topic ids: nothing to compare
    ],
)
def test_a_changed_topic_id_is_a_new_topic(fields: dict[str, Any], recreated: bool) -> None:
    plans = [plan_one(snap(partition=p, topic_id=NEW_ID, **fields)) for p in (0,)]
    p = plans[0].partitions[0]
    if recreated:
        assert (p.start, p.reason) == (100, "earliest")  # on_missing: earliest, from the log start
        event = next(e for e in plans[0].events if e.kind == "topic_recreated")
        assert event.topic == "t" and event.details["old_topic_id"] == OLD_ID
        assert event.details["new_topic_id"] == NEW_ID
    else:
        assert p.start == 150 and "topic_recreated" not in kinds(plans[0])
    assert p.topic_id == NEW_ID


def test_recreated_topic_follows_on_missing() -> None:
    s = snap(checkpoint=150, checkpoint_topic_id=OLD_ID, topic_id=NEW_ID)
    latest = plan_one(s, policy=Policy(on_missing="latest"))
    assert (latest.partitions[0].start, latest.partitions[0].reason) == (200, "latest")
    assert plan_one(replace(s, ts_start_offset=170), policy=Policy(on_missing="timestamp")).partitions[0].start == 170
    with pytest.raises(PlanningError, match=f"deleted and recreated.*{OLD_ID}.*{NEW_ID}.*on_missing is fail"):
        plan_one(s, policy=Policy(on_missing="fail"))


def test_every_partition_of_a_recreated_topic_resets_and_the_plan_id_covers_the_topic_id() -> None:
    old = [snap(partition=i, checkpoint=150, topic_id=OLD_ID, checkpoint_topic_id=OLD_ID) for i in range(2)]
    # Partition 1 of the new topic has no checkpoint of its own: not "a new partition" of a known topic.
    new = [replace(old[0], topic_id=NEW_ID), replace(old[1], checkpoint=None, topic_id=NEW_ID)]
    plan = build_plan("f", "g", new, policy=Policy(on_new_partition="latest"), created_at=NOW)
    assert [(p.start, p.reason) for p in plan.partitions] == [(100, "earliest"), (100, "earliest")]
    assert "new_partition" not in kinds(plan)
    same_ranges = build_plan("f", "g", [replace(s, checkpoint=100) for s in old], policy=Policy(), created_at=NOW)
    assert list(same_ranges.ranges()) == list(plan.ranges()) and same_ranges.plan_id != plan.plan_id
