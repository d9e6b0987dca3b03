"""Axes for the view's run charts: time on x (when each run started, in UTC, with dates), values on y with units.

Pure functions over plain values; :mod:`tidemark.web.app` turns runs into points and the template draws what
these return. Ticks are "nice": values at 1, 2 or 5 times a power of ten (records) or of a duration unit (lag in
time), times at whole minutes, hours or days, so a reader can read a value off the axis. A tick label carries the
date where it changes (the first tick, and any tick on a new day); a span of days labels dates alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

# Time tick spacings, in seconds: the smallest giving at most MAX_TIME_TICKS ticks over the span is used.
TIME_STEPS_S = (
    60, 300, 600, 900, 1800, 3600, 2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600,
    86400, 2 * 86400, 7 * 86400, 14 * 86400, 28 * 86400,
)  # fmt: skip
MAX_TIME_TICKS = 6
VALUE_TICKS = 5
# Lag in time: the unit the axis counts in, by the largest value (seconds under 2 min, minutes under 2 h, ...).
DURATION_UNITS = (("s", 1, 120), ("min", 60, 7200), ("h", 3600, 172800), ("d", 86400, math.inf))


@dataclass(frozen=True)
class Tick:
    """One tick: where it sits along its axis (pixels) and its label."""

    at: float
    label: str


def parse_time(text: str | None) -> datetime | None:
    """A report's ISO timestamp as an aware UTC datetime (None for none or an unreadable one)."""
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def nice_step(highest: float, ticks: int = VALUE_TICKS) -> float:
    """The tick spacing (1, 2 or 5 times a power of ten) that covers ``highest`` in at most ``ticks`` steps."""
    if highest <= 0:
        return 1.0
    raw = highest / ticks
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def count_label(value: float) -> str:
    """A count as an axis shows it: 0, 750, 1.5k, 20k, 2M."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


def value_axis(highest: float, top: float, bottom: float) -> tuple[float, list[tuple[float, float]]]:
    """The axis's top value (``highest`` rounded up to a whole step) and its ticks from 0 up: (pixels, value)."""
    step = nice_step(highest)
    n = max(math.ceil(highest / step), 1)
    return step * n, [(round(bottom - (bottom - top) * i / n, 1), i * step) for i in range(n + 1)]


def count_axis(highest: float, top: float, bottom: float) -> tuple[float, list[Tick]]:
    """A count axis: its top value and ticks labelled 0, 5k, 10k, ..."""
    ceiling, ticks = value_axis(highest, top, bottom)
    return ceiling, [Tick(at, count_label(value)) for at, value in ticks]


def duration_unit(highest_ms: float) -> tuple[str, int]:
    """The unit (name, seconds) a lag-in-time axis counts in for values up to ``highest_ms``."""
    seconds = highest_ms / 1000
    return next((name, size) for name, size, below in DURATION_UNITS if seconds < below)


def duration_axis(highest_ms: float, top: float, bottom: float) -> tuple[float, str, list[Tick]]:
    """The axis's top value in ms, its unit's name, and its ticks labelled in that unit."""
    unit, size = duration_unit(highest_ms)
    ceiling, ticks = value_axis(highest_ms / 1000 / size, top, bottom)
    return ceiling * size * 1000, unit, [Tick(at, f"{value:g}") for at, value in ticks]


@dataclass(frozen=True)
class TimeAxis:
    """Where a time falls along the plot (pixels), and the ticks to label it with."""

    start: float  # epoch seconds at the left edge
    end: float  # ... and at the right edge
    left: float
    right: float
    ticks: tuple[Tick, ...]
    step_s: int

    def x(self, when: datetime) -> float:
        span = self.end - self.start
        return round(self.left + (self.right - self.left) * (when.timestamp() - self.start) / span, 1)


def _tick_label(when: datetime, previous: datetime | None, step_s: int) -> str:
    if step_s >= 86400:
        return when.strftime("%b %d")
    if previous is None or previous.date() != when.date():
        return when.strftime("%b %d %H:%M")
    return when.strftime("%H:%M")


def time_axis(times: Sequence[datetime], left: float, right: float) -> TimeAxis:
    """An axis over ``times`` (not empty), padded by half a slot each side so the first and last run show whole."""
    first, last = min(times).timestamp(), max(times).timestamp()
    pad = max((last - first) / (2 * max(len(times), 1)), 60.0)
    start, end = first - pad, last + pad
    step = next((s for s in TIME_STEPS_S if (end - start) / s <= MAX_TIME_TICKS), TIME_STEPS_S[-1])
    ticks: list[Tick] = []
    axis = TimeAxis(start, end, left, right, (), step)
    at = math.ceil(start / step) * step
    previous: datetime | None = None
    while at <= end:
        when = datetime.fromtimestamp(at, UTC)
        ticks.append(Tick(axis.x(when), _tick_label(when, previous, step)))
        previous = when
        at += step
    return TimeAxis(start, end, left, right, tuple(ticks), step)
