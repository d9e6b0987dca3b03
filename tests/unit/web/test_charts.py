"""The view's chart axes: nice value ticks, units chosen by the largest value, time ticks with dates."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tidemark.web.charts import (
    count_axis,
    count_label,
    duration_axis,
    duration_unit,
    nice_step,
    parse_time,
    time_axis,
)


@pytest.mark.parametrize(
    ("highest", "step"),
    [(0, 1.0), (5, 1.0), (5.01, 2.0), (10, 2.0), (10.01, 5.0), (25, 5.0), (25.01, 10.0), (40_000, 10_000.0)],
)
def test_value_steps_are_one_two_or_five_times_a_power_of_ten(highest: float, step: float) -> None:
    assert nice_step(highest) == pytest.approx(step)


@pytest.mark.parametrize(
    ("value", "label"),
    [(0, "0"), (999, "999"), (1000, "1k"), (1500, "1.5k"), (999_999, "999.999k"), (1_000_000, "1M"), (2e9, "2G")],
)
def test_counts_read_as_people_write_them(value: float, label: str) -> None:
    assert count_label(value) == label


@pytest.mark.parametrize(
    ("ms", "unit"),
    [(0, "s"), (119_999, "s"), (120_000, "min"), (7_199_999, "min"), (7_200_000, "h"), (172_800_000, "d")],
)
def test_a_lag_axis_counts_in_the_unit_its_largest_value_reads_in(ms: int, unit: str) -> None:
    assert duration_unit(ms)[0] == unit


def test_axes_start_at_zero_and_reach_a_whole_step_at_the_top() -> None:
    top, ticks = count_axis(45, top=20, bottom=120)
    assert top == 50 and [t.label for t in ticks] == ["0", "10", "20", "30", "40", "50"]
    assert ticks[0].at == 120 and ticks[-1].at == 20
    ceiling_ms, unit, lag_ticks = duration_axis(90 * 60_000, top=20, bottom=120)
    assert unit == "min" and ceiling_ms == 100 * 60_000 and lag_ticks[-1].label == "100"
    assert count_axis(0, top=20, bottom=120)[0] == 1  # an empty chart still has an axis


def test_time_ticks_fall_on_whole_hours_and_say_the_date_where_it_changes() -> None:
    start = datetime(2026, 12, 7, 21, 10, tzinfo=UTC)
    times = [start + timedelta(hours=h) for h in range(5)]
    axis = time_axis(times, left=50, right=550)
    labels = [t.label for t in axis.ticks]
    assert labels[0].startswith("Dec 07 ")
    assert "Dec 08 00:00" in labels
    assert all(label.endswith(":00") for label in labels)
    assert 50 <= axis.x(times[0]) < axis.x(times[-1]) <= 550
    assert [t.at for t in axis.ticks] == sorted(t.at for t in axis.ticks)


def test_runs_days_apart_are_labelled_by_date_alone() -> None:
    times = [datetime(2026, 11, d, 12, tzinfo=UTC) for d in (1, 5, 9, 13)]
    labels = [t.label for t in time_axis(times, 0, 600).ticks]
    assert labels and all(len(label) == 6 and label.startswith("Nov ") for label in labels)


def test_one_run_still_gets_a_labelled_axis() -> None:
    axis = time_axis([datetime(2026, 12, 7, 20, 0, tzinfo=UTC)], 0, 600)
    assert axis.ticks and axis.x(datetime(2026, 12, 7, 20, 0, tzinfo=UTC)) == 300


def test_report_timestamps_parse_to_utc() -> None:
    assert parse_time("2026-12-07T21:00:00+01:00") == datetime(2026, 12, 7, 20, 0, tzinfo=UTC)
    assert parse_time("2026-12-07T20:00:00Z") == datetime(2026, 12, 7, 20, 0, tzinfo=UTC)
    assert parse_time(None) is None and parse_time("yesterday") is None
