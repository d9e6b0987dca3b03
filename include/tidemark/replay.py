"""Replay and backfill requests: trigger parameters in, a validated request out.

The replay DAG's trigger form (and ``tidemark replay`` / ``tidemark backfill``) hand over
loosely typed values; this module turns them into a frozen :class:`ReplaySpec` or
refuses with a message naming the parameter and what to put there. It is pure: the
planner resolves a spec against the partitions' offsets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, get_args

from tidemark.errors import ConfigError

StartFrom = Literal["committed", "earliest", "latest", "timestamp", "offset", "shift_by", "by_duration"]
EndAt = Literal["latest", "timestamp", "offset"]

START_CHOICES: tuple[str, ...] = get_args(StartFrom)
END_CHOICES: tuple[str, ...] = get_args(EndAt)

_DURATION = re.compile(r"^P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+)S)?)?$")


@dataclass(frozen=True)
class ReplaySpec:
    """Where a replay starts and ends, per partition of the feed's topics."""

    start_from: StartFrom = "committed"
    start_timestamp: datetime | None = None
    start_offset: int | None = None
    shift_by: int | None = None
    duration: timedelta | None = None
    end_at: EndAt = "latest"
    end_timestamp: datetime | None = None
    end_offset: int | None = None
    commit: bool = False


def parse_duration(text: str) -> timedelta:
    """An ISO 8601 duration such as ``PT6H`` or ``P1DT30M``."""
    match = _DURATION.match(text.strip().upper())
    if not match or text.strip().upper() in ("P", "PT"):
        raise ConfigError(f"parameter 'duration': {text!r} is not an ISO 8601 duration like PT6H or P1DT30M")
    parts = {k: int(v) if v else 0 for k, v in match.groupdict().items()}
    return timedelta(days=parts["d"], hours=parts["h"], minutes=parts["m"], seconds=parts["s"])


def parse_timestamp(name: str, value: Any) -> datetime | None:
    if value in (None, ""):
        return None
    if isinstance(value, datetime):
        parsed = value
    else:
        try:
            parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError as exc:
            raise ConfigError(f"parameter '{name}': {value!r} is not an ISO 8601 date-time") from exc
    if parsed.tzinfo is None:
        raise ConfigError(f"parameter '{name}': {value!r} has no timezone; add one, e.g. 2026-01-31T00:00:00Z")
    return parsed


def _int(name: str, value: Any, minimum: int | None = None) -> int | None:
    if value in (None, ""):
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"parameter '{name}': expected a whole number, got {value!r}")
    try:
        number = int(value)
    except ValueError as exc:
        raise ConfigError(f"parameter '{name}': expected a whole number, got {value!r}") from exc
    if minimum is not None and number < minimum:
        raise ConfigError(f"parameter '{name}': must be at least {minimum}, got {number}")
    return number


def parse_replay_params(params: Mapping[str, Any]) -> ReplaySpec:
    """Validate trigger parameters; every refusal names the parameter at fault."""
    start_from: StartFrom = params.get("start_from") or "committed"
    if start_from not in START_CHOICES:
        raise ConfigError(f"parameter 'start_from': {start_from!r} is not one of {', '.join(START_CHOICES)}")
    end_at: EndAt = params.get("end_at") or "latest"
    if end_at not in END_CHOICES:
        raise ConfigError(f"parameter 'end_at': {end_at!r} is not one of {', '.join(END_CHOICES)}")
    duration_text = params.get("duration")
    spec = ReplaySpec(
        start_from=start_from,
        start_timestamp=parse_timestamp("start_timestamp", params.get("start_timestamp")),
        start_offset=_int("start_offset", params.get("start_offset"), minimum=0),
        shift_by=_int("shift_by", params.get("shift_by")),
        duration=parse_duration(duration_text) if duration_text else None,
        end_at=end_at,
        end_timestamp=parse_timestamp("end_timestamp", params.get("end_timestamp")),
        end_offset=_int("end_offset", params.get("end_offset"), minimum=0),
        commit=bool(params.get("commit", False)),
    )
    needs = {
        "timestamp": ("start_timestamp", spec.start_timestamp),
        "offset": ("start_offset", spec.start_offset),
        "shift_by": ("shift_by", spec.shift_by),
        "by_duration": ("duration", spec.duration),
    }
    if start_from in needs and needs[start_from][1] is None:
        raise ConfigError(f"start_from={start_from} needs parameter '{needs[start_from][0]}'")
    end_needs = {"timestamp": ("end_timestamp", spec.end_timestamp), "offset": ("end_offset", spec.end_offset)}
    if end_at in end_needs and end_needs[end_at][1] is None:
        raise ConfigError(f"end_at={end_at} needs parameter '{end_needs[end_at][0]}'")
    if spec.start_timestamp and spec.end_timestamp and spec.end_timestamp <= spec.start_timestamp:
        raise ConfigError(
            f"parameter 'end_timestamp' ({spec.end_timestamp.isoformat()}) must be after "
            f"'start_timestamp' ({spec.start_timestamp.isoformat()})"
        )
    if spec.start_offset is not None and spec.end_offset is not None and spec.end_offset < spec.start_offset:
        raise ConfigError(f"parameter 'end_offset' ({spec.end_offset}) is below 'start_offset' ({spec.start_offset})")
    return spec
