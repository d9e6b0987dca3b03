"""The lag rule (pure): when a lag-triggered feed runs, and why it waits otherwise."""

from __future__ import annotations

import pytest

from tidemark.orchestration.lag import RUN_START_GRACE_S, Fired, LagReading, Thresholds, decide, reading_of

AT = 1_800_000_000_000
P0, P1 = ("orders", 0), ("orders", 1)


def reading(records: int, *, at_ms: int = AT, overdue: tuple[str, ...] = (), positions: dict[str, int] | None = None):
    return LagReading(at_ms, records, overdue, positions if positions is not None else {"orders[0]": 10})


RULE = Thresholds(lag_records=100, oldest_unread_age_ms=None, min_interval_s=60.0)


@pytest.mark.parametrize(
    ("records", "fires"),
    [(0, False), (99, False), (100, True), (5000, True)],
)
def test_fires_at_the_record_threshold_and_not_below(records: int, fires: bool) -> None:
    decision = decide(RULE, reading(records), None, active_runs=0)
    assert decision.fire is fires
    assert ("lag_records 100" in decision.reason) is fires


def test_an_overdue_partition_fires_an_age_rule_whatever_the_record_count() -> None:
    rule = Thresholds(lag_records=None, oldest_unread_age_ms=600_000, min_interval_s=0)
    assert not decide(rule, reading(1), None, active_runs=0).fire
    fired = decide(rule, reading(1, overdue=("orders[1]",)), None, active_runs=0)
    assert fired.fire and "orders[1]" in fired.reason and "600s" in fired.reason


def test_a_queued_or_running_run_always_waits() -> None:
    decision = decide(RULE, reading(10_000), None, active_runs=1)
    assert not decision.fire and "queued or running" in decision.reason


def test_after_firing_it_waits_until_the_offsets_move() -> None:
    last = Fired(AT, {"orders[0]": 10})
    # The run has not committed yet, even past min_interval: no second firing (no duplicate run).
    same = decide(RULE, reading(10_000, at_ms=AT + 120_000), last, active_runs=0)
    assert not same.fire and "have not moved" in same.reason
    # The run committed (offsets moved) and lag is back over the threshold: fires again.
    moved = decide(RULE, reading(10_000, at_ms=AT + 120_000, positions={"orders[0]": 900}), last, active_runs=0)
    assert moved.fire


def test_a_run_that_never_committed_is_started_again_after_the_grace() -> None:
    last = Fired(AT, {"orders[0]": 10})
    late = AT + int(RUN_START_GRACE_S * 1000)
    assert not decide(RULE, reading(10_000, at_ms=late - 1000), last, active_runs=0).fire
    assert decide(RULE, reading(10_000, at_ms=late), last, active_runs=0).fire


def test_min_interval_holds_even_when_the_offsets_moved() -> None:
    rule = Thresholds(lag_records=100, oldest_unread_age_ms=None, min_interval_s=900.0)
    last = Fired(AT, {"orders[0]": 10})
    moved = {"orders[0]": 500}
    early = decide(rule, reading(10_000, at_ms=AT + 600_000, positions=moved), last, active_runs=0)
    assert not early.fire and "min_interval is 900s" in early.reason
    assert decide(rule, reading(10_000, at_ms=AT + 900_000, positions=moved), last, active_runs=0).fire


def test_a_long_min_interval_also_stretches_the_wait_for_a_run() -> None:
    rule = Thresholds(lag_records=100, oldest_unread_age_ms=None, min_interval_s=RUN_START_GRACE_S * 2)
    last = Fired(AT, {"orders[0]": 10})
    at = AT + int(RUN_START_GRACE_S * 1000) + 1000
    assert not decide(rule, reading(10_000, at_ms=at), last, active_runs=0).fire


def test_reading_sums_lag_and_marks_overdue_partitions() -> None:
    got = reading_of(
        AT,
        committed={P0: 10, P1: None},
        ends={P0: 60, P1: 30},
        fallback={P1: 5},  # no committed offset: the run would start at the log start
        first_young={P0: 40, P1: 5},
    )
    assert got.records == 50 + 25
    # P0: position 10 < first young offset 40 -> an unread record older than the age; P1: position 5 is young.
    assert got.overdue == ("orders[0]",)
    assert dict(got.positions) == {"orders[0]": 10, "orders[1]": -1}


def test_reading_with_every_unread_record_old_or_nothing_unread() -> None:
    got = reading_of(
        AT, committed={P0: 10, P1: 30}, ends={P0: 20, P1: 30}, fallback={}, first_young={P0: None, P1: None}
    )
    assert got.records == 10 and got.overdue == ("orders[0]",)  # P1 has nothing unread: never overdue


def test_a_position_past_the_end_counts_no_lag() -> None:
    assert reading_of(AT, committed={P0: 90}, ends={P0: 50}, fallback={}).records == 0


def test_fired_round_trips_and_ignores_unknown_shapes() -> None:
    fired = Fired(AT, {"orders[0]": 3})
    assert Fired.from_json(fired.to_json()) == fired
    assert Fired.from_json(None) is None and Fired.from_json({"at_ms": "x"}) is None
