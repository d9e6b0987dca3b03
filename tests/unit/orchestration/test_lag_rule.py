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


# Boundaries and every branch: waiting decisions say fire=False (not a falsy other value), equal times, one record.


def test_every_waiting_decision_is_a_plain_no() -> None:
    last = Fired(AT, {"orders[0]": 10})
    waits = [
        decide(RULE, reading(500), None, active_runs=1),
        decide(RULE, reading(500, at_ms=AT + 1000), last, active_runs=0),  # offsets not moved since the firing
        decide(RULE, reading(500, at_ms=AT + 1000, positions={"orders[0]": 20}), last, active_runs=0),  # min_interval
        decide(RULE, reading(5), None, active_runs=0),
    ]
    assert [d.fire for d in waits] == [False, False, False, False]
    assert all(d.fire is False for d in waits)
    assert waits[0].reason == "1 run(s) of the feed queued or running"
    assert waits[2].reason == "fired 1s ago; min_interval is 60s"
    assert waits[3].reason == "below the thresholds (lag 5 records, no partition overdue)"


def test_the_grace_and_min_interval_end_exactly_at_their_length() -> None:
    last = Fired(AT, {"orders[0]": 10})
    grace_ms = int(RUN_START_GRACE_S * 1000)
    assert not decide(RULE, reading(500, at_ms=AT + grace_ms - 1), last, 0).fire
    assert decide(RULE, reading(500, at_ms=AT + grace_ms), last, 0).fire  # equal: the wait is over
    moved = {"orders[0]": 11}
    assert not decide(RULE, reading(500, at_ms=AT + 59_999, positions=moved), last, 0).fire
    assert decide(RULE, reading(500, at_ms=AT + 60_000, positions=moved), last, 0).fire


def test_both_reasons_are_given_and_every_overdue_partition_named() -> None:
    rule = Thresholds(lag_records=10, oldest_unread_age_ms=600_000, min_interval_s=0)
    decision = decide(rule, reading(20, overdue=("orders[0]", "orders[1]")), None, 0)
    assert decision.fire is True
    assert decision.reason == (
        "lag 20 records >= lag_records 10; unread records older than 600s in orders[0], orders[1]"
    )


def test_a_single_old_unread_record_is_overdue_and_a_partition_without_start_or_fallback_has_no_lag() -> None:
    # P0: one record behind, older than the age (the first young record is past it): overdue.
    # P1: no committed offset and no fallback (on_missing latest): it starts at its end, nothing behind.
    got = reading_of(AT, {P0: 9}, {P0: 10, P1: 7}, fallback={}, first_young={P0: 10, P1: None})
    assert (got.at_ms, got.records, got.overdue) == (AT, 1, ("orders[0]",))
    assert dict(got.positions) == {"orders[0]": 9, "orders[1]": -1}
    # The same record young enough: not overdue.
    assert reading_of(AT, {P0: 9}, {P0: 10}, fallback={}, first_young={P0: 9}).overdue == ()


def test_a_reading_as_the_trigger_event_carries_it() -> None:
    assert reading(7, overdue=("orders[1]",)).to_json() == {
        "at_ms": AT, "lag_records": 7, "overdue_partitions": ["orders[1]"],
    }  # fmt: skip


def test_thresholds_of_a_feed() -> None:
    from tidemark.config.models import Feed

    feed = Feed(name="o", group="g", topics=["t"], trigger={"lag_records": 5, "oldest_unread_age": "1m",
                                                            "min_interval": "30s"})  # fmt: skip
    assert Thresholds.of(feed) == Thresholds(5, 60_000, 30.0)
    with pytest.raises(ValueError, match=r"^feed 'p' has no trigger$"):
        Thresholds.of(Feed(name="p", group="g", topics=["t"]))


def test_the_cause_of_a_run_is_written_beside_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from tidemark.orchestration.lag import CAUSE_FILE, record_cause

    record_cause(str(tmp_path), "lag", [{"at_ms": AT, "lag_records": 7}], run_type="asset_triggered")
    assert json.loads((tmp_path / CAUSE_FILE).read_text()) == {
        "cause": "lag", "run_type": "asset_triggered", "lag_events": [{"at_ms": AT, "lag_records": 7}],
    }  # fmt: skip
    record_cause(str(tmp_path), "manual")
    assert json.loads((tmp_path / "trigger.json").read_text()) == {"cause": "manual", "run_type": "", "lag_events": []}


def test_the_probe_lists_partitions_again_exactly_when_the_refresh_time_passed(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The partition listing is kept for PARTITIONS_REFRESH_S: asked again at exactly that age, not a moment before
    (the adapter is a recorder: this is the probe's own timing rule)."""
    from tidemark.kafka.adapter import PartitionInfo
    from tidemark.kafka.connection import KafkaConnection
    from tidemark.orchestration import lag

    class Listing:
        calls = 0

        def partitions(self, topics: tuple[str, ...]) -> list[PartitionInfo]:
            Listing.calls += 1
            return [PartitionInfo(t, 0, 1, (1,), "id") for t in topics]

    now = [1000.0]
    monkeypatch.setattr(lag.time, "monotonic", lambda: now[0])
    probe = lag.LagProbe(KafkaConnection(bootstrap_servers="127.0.0.1:1"), ["a"], "g")
    probe._adapter = Listing()  # type: ignore[assignment]
    assert probe._tps() == [("a", 0)] and Listing.calls == 1
    now[0] += lag.PARTITIONS_REFRESH_S - 0.001
    probe._tps()
    assert Listing.calls == 1
    now[0] = 1000.0 + lag.PARTITIONS_REFRESH_S
    probe._tps()
    assert Listing.calls == 2
