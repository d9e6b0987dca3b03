"""Durations and timestamps as feeds, trigger parameters and the CLI write them: one parser each.

``parse_skew`` reads a time-window skew (``30s``, ``10m``, ``1h``, ``PT10M``),
``schedule_interval`` the longest gap of a schedule (preset, ``6h`` or cron),
``parse_duration`` an ISO 8601 duration (``P1DT30M``) and ``parse_timestamp`` an ISO 8601
date-time that carries its timezone. Refusals are :class:`ConfigError` naming the field.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from tidemark.errors import ConfigError, shown

_SKEW = re.compile(r"^(\d+)\s*(s|m|min|h)$")
_ISO_SKEW = re.compile(r"^PT(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+)S)?$")


def parse_skew(text: str, name: str = "time_windows.max_skew") -> timedelta:
    """A skew bound: ``30s``, ``10m``, ``1h`` or ISO 8601 (``PT10M``); refusals name ``name``."""
    value = str(text).strip()
    short = _SKEW.match(value)
    if short:
        n, unit = int(short.group(1)), short.group(2)
        return {"s": timedelta(seconds=n), "m": timedelta(minutes=n), "min": timedelta(minutes=n),
                "h": timedelta(hours=n)}[unit]  # fmt: skip
    iso = _ISO_SKEW.match(value.upper())
    if iso and value.upper() != "PT":
        parts = {k: int(v) if v else 0 for k, v in iso.groupdict().items()}
        return timedelta(hours=parts["h"], minutes=parts["m"], seconds=parts["s"])
    raise ConfigError(f"'{name}': {text!r} is not a duration like 30s, 10m, 1h or PT10M")


_PRESETS = {
    "@hourly": timedelta(hours=1),
    "@daily": timedelta(days=1),
    "@weekly": timedelta(weeks=1),
    "@monthly": timedelta(days=31),
    "@yearly": timedelta(days=366),
    "@annually": timedelta(days=366),
}
_SCHEDULE_EVERY = re.compile(r"^(\d+)\s*(m|min|h|d|w)$")


def schedule_interval(schedule: str) -> timedelta:
    """The longest gap between runs of a schedule (preset, ``6h``-style, or cron)."""
    if schedule in _PRESETS:
        return _PRESETS[schedule]
    match = _SCHEDULE_EVERY.match(schedule.strip())
    if match:
        n, unit = int(match.group(1)), match.group(2)
        return {"m": timedelta(minutes=n), "min": timedelta(minutes=n), "h": timedelta(hours=n),
                "d": timedelta(days=n), "w": timedelta(weeks=n)}[unit]  # fmt: skip
    from croniter import croniter  # here, not at the top: a third of a second, and only cron schedules need it

    if not croniter.is_valid(schedule):
        raise ValueError(f"schedule {schedule!r} is neither a preset (@hourly ...), a duration (6h) nor a cron")
    # The longest gap over a year of fire times: a cron like "0 0 1 * *" has uneven gaps.
    it = croniter(schedule, datetime(2026, 1, 1, tzinfo=UTC))
    prev = it.get_next(datetime)
    longest = timedelta(0)
    for _ in range(400):
        nxt = it.get_next(datetime)
        longest = max(longest, nxt - prev)
        prev = nxt
    return longest


_ISO_DURATION = re.compile(r"^P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+)S)?)?$")


def parse_duration(text: str) -> timedelta:
    """An ISO 8601 duration such as ``PT6H`` or ``P1DT30M``."""
    match = _ISO_DURATION.match(text.strip().upper()) if len(text) <= 40 else None
    if not match or text.strip().upper() in ("P", "PT"):
        raise ConfigError(f"parameter 'duration': {shown(text)} is not an ISO 8601 duration like PT6H or P1DT30M")
    parts = {k: int(v) if v else 0 for k, v in match.groupdict().items()}
    try:
        return timedelta(days=parts["d"], hours=parts["h"], minutes=parts["m"], seconds=parts["s"])
    except OverflowError as exc:
        raise ConfigError(f"parameter 'duration': {shown(text)} is longer than any log") from exc


def parse_timestamp(name: str, value: Any) -> datetime | None:
    """An ISO 8601 date-time with a timezone (``2026-01-31T00:00:00Z``); empty is ``None``; refusals name ``name``."""
    if value in (None, ""):
        return None
    if isinstance(value, datetime):
        parsed = value
    else:
        try:
            parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError as exc:
            raise ConfigError(f"parameter '{name}': {shown(value)} is not an ISO 8601 date-time") from exc
    if parsed.tzinfo is None:
        raise ConfigError(f"parameter '{name}': {shown(value)} has no timezone; add one, e.g. 2026-01-31T00:00:00Z")
    return parsed
