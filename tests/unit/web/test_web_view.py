"""The Tidemark view's pure helpers: lag durations, the replay conf, the chart's geometry."""

from __future__ import annotations

import pytest

from tidemark.errors import ConfigError
from tidemark.runs.report import RunReport
from tidemark.web.app import (
    PREVIEW_RATE,
    RateLimit,
    RunRow,
    _chart,
    _duration,
    _events,
    _lag_time_chart,
    preview_rate,
    replay_conf,
)


@pytest.mark.parametrize(
    ("ms", "text"),
    [(None, "-"), (0, "0s"), (42_000, "42s"), (425_000, "7m 5s"), (3_600_000, "1h"), (11_400_000, "3h 10m"),
     (187_200_000, "2d 4h")],
)  # fmt: skip
def test_lag_durations_read_like_people_say_them(ms: int | None, text: str) -> None:
    assert _duration(ms) == text


def test_replay_conf_is_a_dry_run_unless_said_and_refuses_unknown_keys() -> None:
    assert replay_conf("orders", {"start_from": "earliest", "start_offset": None}) == {
        "feed": "orders", "start_from": "earliest", "dry_run": True,
    }  # fmt: skip
    assert replay_conf("orders", {"dry_run": False})["dry_run"] is False
    with pytest.raises(ConfigError, match="unknown replay parameters: feed"):
        replay_conf("orders", {"feed": "other"})  # the feed comes from the page, not the body


def _row(run_id: str, records: int, lag: int | None, lag_ms: int | None = None) -> RunRow:
    return RunRow(run_id, "scheduled", "succeeded", "p", records, lag, lag_ms, None, None, None, None, None, None, None)


def test_chart_draws_runs_oldest_first_scaled_to_the_largest() -> None:
    rows = [_row(f"r{i}", records, lag) for i, (records, lag) in enumerate([(10, 40), (40, 80), (0, None)])]
    chart = _chart(rows)
    assert [b["label"] for b in chart["bars"]] == ["r2: 0 records", "r1: 40 records", "r0: 10 records"]
    assert chart["max_records"] == 40 and chart["max_lag"] == 80
    tallest = max(chart["bars"], key=lambda b: b["h"])
    assert tallest["label"].startswith("r1") and tallest["y"] == 24  # reaches the top of the plot area
    assert len(chart["points"]) == 2  # a run without a known lag has no point


def test_lag_time_chart_puts_each_runs_lag_oldest_first_and_skips_runs_without_one() -> None:
    rows = [_row("r2", 5, 5, 30_000), _row("r1", 5, 5, None), _row("r0", 5, 5, 120_000)]  # newest first, as listed
    chart = _lag_time_chart(rows)
    assert [(p["label"].split(":")[0], p["value"]) for p in chart["points"]] == [("r0", 120_000), ("r2", 30_000)]
    oldest, newest = chart["points"]
    assert oldest["y"] == 24 and newest["y"] == pytest.approx(24 + (chart["bottom"] - 24) * 3 / 4, abs=0.1)
    assert oldest["x"] < newest["x"] and chart["max"] == "2m"
    assert _lag_time_chart([_row("r0", 0, None)])["points"] == []


def test_the_events_table_lists_schema_changes_and_leaves_routine_events_out() -> None:
    events = [
        {"kind": "schema_changed", "topic": "orders", "partition": 2, "message": "id 7 -> 9"},
        {"kind": "table_schema_evolved", "message": "added channel"},
        {"kind": "gaps", "topic": "orders", "partition": 0, "message": "3 offsets"},
    ]
    report = RunReport(run_id="r1", feed="orders", status="succeeded", events=events)
    assert [(e["kind"], e["where"]) for e in _events([report])] == [
        ("schema_changed", "orders[2]"), ("table_schema_evolved", ""),
    ]  # fmt: skip


def test_the_preview_limit_is_a_sliding_window_per_user() -> None:
    limit = RateLimit(2, 60.0)
    assert [limit.wait_s("a", now=t) for t in (0.0, 10.0, 20.0)] == [0.0, 0.0, 40.0]
    assert limit.wait_s("b", now=20.0) == 0.0  # another user has a window of its own
    assert limit.wait_s("a", now=60.0) == 0.0  # the first call left the window
    assert limit.wait_s("a", now=61.0) == 9.0


def test_the_preview_rate_comes_from_the_environment_or_is_refused_by_name() -> None:
    assert preview_rate({}) == PREVIEW_RATE
    assert preview_rate({"TIDEMARK_VIEW_PREVIEW_RATE": "30/10"}) == (30, 10.0)
    for bad in ("0/60", "ten/60", "5", "5/-1"):
        with pytest.raises(ConfigError, match="TIDEMARK_VIEW_PREVIEW_RATE"):
            preview_rate({"TIDEMARK_VIEW_PREVIEW_RATE": bad})


def _timed(run_id: str, started_at: str, records: int, lag: int | None, lag_ms: int | None = None) -> RunRow:
    return RunRow(run_id, "scheduled", "succeeded", "p", records, lag, lag_ms, None, None, None, started_at, None, None,
                  None)  # fmt: skip


def test_runs_sit_on_a_time_axis_by_start_time_with_dates_where_the_day_changes() -> None:
    rows = [  # newest first, as listed; the gap before the last run is twice the one before
        _timed("r2", "2026-12-08T01:00:00+00:00", 30, 10, 90_000),
        _timed("r1", "2026-12-07T23:00:00+00:00", 20, 40, 30_000),
        _timed("r0", "2026-12-07T22:00:00+00:00", 10, 80, 600_000),
    ]
    chart = _chart(rows)
    xs = [p["x"] for p in chart["points"]]
    assert xs[0] < xs[1] < xs[2]
    assert xs[2] - xs[1] == pytest.approx(2 * (xs[1] - xs[0]), abs=0.2)  # by time, not by position
    labels = [t["label"] for t in chart["x_ticks"]]
    assert labels[0].startswith("Dec 07 ") and any(label.startswith("Dec 08 ") for label in labels[1:])
    assert chart["x_title"] == "run started (UTC)"
    assert [t["label"] for t in chart["y_ticks"]] == ["0", "10", "20", "30"]  # records read, left
    assert [t["label"] for t in chart["y2_ticks"]] == ["0", "20", "40", "60", "80"]  # lag in records, right
    lag = _lag_time_chart(rows)
    assert lag["y_title"] == "lag (min)" and [t["label"] for t in lag["y_ticks"]] == ["0", "2", "4", "6", "8", "10"]
    assert [p["x"] for p in lag["points"]] == xs  # the two charts share their time axis


def test_runs_without_a_start_time_fall_back_to_their_order() -> None:
    chart = _chart([_row("r1", 5, 5), _row("r0", 5, 5)])
    assert chart["x_title"] == "run (oldest first)"
    assert [t["label"] for t in chart["x_ticks"]] == ["1", "2"]
