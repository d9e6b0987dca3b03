"""A run's request: trigger parameters in, one validated :class:`RunRequest` out.

The DAGs' trigger forms (and ``tidemark run`` / ``replay`` / ``backfill``) hand over
loosely typed values; :func:`run_request` turns them, once, into a frozen
:class:`RunRequest` (the mode, a backfill's :class:`Window` or a replay's
:class:`ReplaySpec`, the commit choice, the selection, where it publishes, dry run) or
refuses with a message naming the parameter and what to put there. That value travels
down to the planner unchanged. It is pure: the rules that need the feed (where a replay
may publish, a committing run's start) are checked where the feed is known
(:mod:`tidemark.runs.start`), and the planner resolves the request against the
partitions' offsets.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, get_args

from tidemark.config.durations import parse_duration, parse_skew, parse_timestamp
from tidemark.config.models import WindowMode
from tidemark.errors import ConfigError, PlanningError, shown
from tidemark.planning.plan import Mode, RequestMode
from tidemark.storage import Location, is_url

StartFrom = Literal["committed", "earliest", "latest", "timestamp", "offset", "shift_by", "by_duration"]
EndAt = Literal["latest", "timestamp", "offset"]

START_CHOICES: tuple[str, ...] = get_args(StartFrom)
END_CHOICES: tuple[str, ...] = get_args(EndAt)

# Kafka offsets are signed 64-bit; a larger number would only fail later, in the task supervisor.
MAX_OFFSET = 2**63 - 1
MAX_PARTITION = 2**31 - 1
OUTPUT_ROOTS_ENV = "TIDEMARK_REPLAY_OUTPUT_ROOTS"

# The trigger parameters of a replay, declared once: the replay DAG's Params, the view's
# trigger endpoint and the CLI's flags are built from (or checked against) these names.
SPEC_PARAMS: tuple[str, ...] = (
    "start_from", "start_timestamp", "start_offset", "shift_by", "duration", "end_at", "end_timestamp", "end_offset",
)  # fmt: skip
COMMIT_PARAMS: tuple[str, ...] = ("commit", "allow_gap")
WINDOW_PARAMS: tuple[str, ...] = ("window_mode", "max_skew")
SELECTION_PARAMS: tuple[str, ...] = ("topics", "partitions", "output", "dry_run")
REPLAY_PARAMS: tuple[str, ...] = SPEC_PARAMS + COMMIT_PARAMS + WINDOW_PARAMS + SELECTION_PARAMS


MODES: tuple[str, ...] = get_args(RequestMode)  # a re-drive is no trigger's mode


@dataclass(frozen=True)
class Window:
    """A backfill's time window; the end is optional (then: the end of the log now)."""

    start: datetime
    end: datetime | None = None

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or (self.end is not None and self.end.tzinfo is None):
            raise PlanningError("a backfill window needs timezone-aware times, e.g. 2026-01-31T00:00:00Z")
        if self.end is not None and self.end < self.start:
            raise PlanningError(f"the backfill window ends ({self.end.isoformat()}) before it starts")

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start.isoformat(), "end": None if self.end is None else self.end.isoformat()}


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


@dataclass(frozen=True)
class RunRequest:
    """What one run is asked to do, from the trigger to the planner: built once by :func:`run_request`.

    ``window`` is a backfill's, ``replay`` a replay's (the planner refuses a mode without
    its bounds); ``commit=None`` commits scheduled runs only; ``topics``/``partitions``
    narrow a backfill or replay (empty: all); ``output`` is where a backfill or replay asked
    to publish (``None``: beside the feed's output), checked against the feed's outputs
    where the feed is known.
    """

    mode: Mode = "scheduled"
    window: Window | None = None
    replay: ReplaySpec | None = None
    commit: bool | None = None
    allow_gap: bool = False  # a committing run may skip offsets on purpose (each skip is an event)
    window_mode: WindowMode | None = None  # None: the feed's time_windows
    max_skew: timedelta | None = None
    topics: tuple[str, ...] = ()
    partitions: tuple[int, ...] = ()
    output: Location | None = None
    dry_run: bool = False


def _int(name: str, value: Any, minimum: int = -MAX_OFFSET, maximum: int = MAX_OFFSET) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool) or not isinstance(value, int | str) or (isinstance(value, str) and len(value) > 40):
        raise ConfigError(f"parameter '{name}': expected a whole number, got {shown(value)}")
    try:
        number = int(value)
    except ValueError as exc:
        raise ConfigError(f"parameter '{name}': expected a whole number, got {shown(value)}") from exc
    if not minimum <= number <= maximum:
        raise ConfigError(f"parameter '{name}': must be from {minimum} to {maximum}, got {shown(number)}")
    return number


def flag(params: Mapping[str, Any], name: str, default: bool = False) -> bool:
    """A true/false parameter, strictly: the string "false" must never mean true."""
    value = params.get(name, default)
    if not isinstance(value, bool):
        raise ConfigError(f"parameter '{name}': expected true or false, got {shown(value)}")
    return value


def parse_replay_params(params: Mapping[str, Any]) -> ReplaySpec:
    """Validate trigger parameters; every refusal names the parameter at fault."""
    start_from: StartFrom = params.get("start_from") or "committed"
    if not isinstance(start_from, str) or start_from not in START_CHOICES:
        raise ConfigError(f"parameter 'start_from': {shown(start_from)} is not one of {', '.join(START_CHOICES)}")
    end_at: EndAt = params.get("end_at") or "latest"
    if not isinstance(end_at, str) or end_at not in END_CHOICES:
        raise ConfigError(f"parameter 'end_at': {shown(end_at)} is not one of {', '.join(END_CHOICES)}")
    duration_text = params.get("duration")
    if duration_text is not None and not isinstance(duration_text, str):
        raise ConfigError(f"parameter 'duration': {shown(duration_text)} is not an ISO 8601 duration like PT6H")
    commit = flag(params, "commit")
    spec = ReplaySpec(
        start_from=start_from,
        start_timestamp=parse_timestamp("start_timestamp", params.get("start_timestamp")),
        start_offset=_int("start_offset", params.get("start_offset"), minimum=0),
        shift_by=_int("shift_by", params.get("shift_by")),
        duration=parse_duration(duration_text) if duration_text else None,
        end_at=end_at,
        end_timestamp=parse_timestamp("end_timestamp", params.get("end_timestamp")),
        end_offset=_int("end_offset", params.get("end_offset"), minimum=0),
        commit=commit,
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


def run_request(mode: str, params: Mapping[str, Any] | None = None) -> RunRequest:
    """A run of ``mode`` from its trigger parameters (:data:`REPLAY_PARAMS`, a backfill's window), checked once.

    A scheduled run takes only ``dry_run`` (its other parameters are checked, then not used).
    """
    if mode not in MODES:
        raise ConfigError(f"mode must be scheduled, backfill or replay, got {mode!r}")
    params = params or {}
    topics, partitions, dry_run = _topics(params), _partitions(params), flag(params, "dry_run")
    if mode == "scheduled":
        return RunRequest(dry_run=dry_run)
    output = params.get("output")
    asked: dict[str, Any] = {
        "topics": topics, "partitions": partitions, "dry_run": dry_run, "allow_gap": flag(params, "allow_gap"),
        "output": output_location(output) if output not in (None, "") else None, **_window_options(params),
    }  # fmt: skip
    if mode == "backfill":
        start = parse_timestamp("start_timestamp", params.get("start_timestamp"))
        end = parse_timestamp("end_timestamp", params.get("end_timestamp"))
        if start is None or end is None:
            raise ConfigError("a backfill needs parameters 'start_timestamp' and 'end_timestamp'")
        if end <= start:
            raise ConfigError(f"parameter 'end_timestamp' ({end.isoformat()}) must be after 'start_timestamp'")
        return RunRequest("backfill", window=Window(start, end), commit=flag(params, "commit"), **asked)
    spec = parse_replay_params(params)
    return RunRequest("replay", replay=spec, commit=spec.commit, **asked)


def _topics(params: Mapping[str, Any]) -> tuple[str, ...]:
    topics = params.get("topics")
    if topics in (None, "", []):
        return ()
    if isinstance(topics, str):
        topics = [t.strip() for t in topics.split(",") if t.strip()]
    if not isinstance(topics, list | tuple) or not all(isinstance(t, str) for t in topics):
        raise ConfigError(f"parameter 'topics': expected a list of topic names, got {shown(topics)}")
    return tuple(topics)


def _partitions(params: Mapping[str, Any]) -> tuple[int, ...]:
    partitions = params.get("partitions")
    if partitions in (None, "", []):
        return ()
    if isinstance(partitions, str):
        partitions = [p.strip() for p in partitions.split(",") if p.strip()]
    try:
        numbers = [int(p) for p in partitions]
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"parameter 'partitions': expected partition numbers, got {shown(partitions)}") from exc
    if any(n < 0 for n in numbers) or any(isinstance(p, bool) for p in partitions):
        raise ConfigError(f"parameter 'partitions': partition numbers are 0 or more, got {shown(partitions)}")
    return tuple(numbers)


def _window_options(params: Mapping[str, Any]) -> dict[str, Any]:
    """``window_mode`` and ``max_skew``, checked; absent ones keep the feed's settings."""
    options: dict[str, Any] = {}
    mode = params.get("window_mode")
    if mode not in (None, ""):
        if mode not in ("exact", "offset_cut"):
            raise ConfigError(f"parameter 'window_mode': {mode!r} is not one of exact, offset_cut")
        options["window_mode"] = mode
    skew = params.get("max_skew")
    if skew not in (None, ""):
        options["max_skew"] = parse_skew(str(skew), "max_skew")
    return options


def _lexical(text: str) -> str | None:
    """A location normalised by its text alone (``..`` and ``.`` folded), or ``None`` if it is not absolute.

    Nothing on the server is consulted: no home folder for ``~``, no symlink, no
    ``/proc/self/cwd``; what the caller typed is what gets compared.
    """
    if "\x00" in text or any(ord(c) < 32 for c in text):
        return None
    if is_url(text):
        scheme, _, rest = text.partition("://")
        rest = posixpath.normpath("/" + rest).lstrip("/")
        if scheme != "s3" or not rest or rest == ".":
            return None
        return f"s3://{rest}"
    if not text.startswith("/"):
        return None
    return "/" + posixpath.normpath(text).lstrip("/")


def output_roots(defaults: Sequence[Location], environ: Mapping[str, str] | None = None) -> list[str]:
    """Where replays and backfills may write: ``defaults`` and the roots in ``TIDEMARK_REPLAY_OUTPUT_ROOTS``."""
    env = os.environ if environ is None else environ
    configured = [r.strip() for r in env.get(OUTPUT_ROOTS_ENV, "").split(",") if r.strip()]
    roots: list[str] = []
    for root in [str(d) for d in defaults] + configured:
        normal = _lexical(root)
        if normal is None:
            raise ConfigError(f"{OUTPUT_ROOTS_ENV}: {shown(root)} is not an absolute local path or s3://bucket/prefix")
        if normal not in roots:
            roots.append(normal)
    return roots


def output_location(value: Any) -> Location:
    """The ``output`` parameter as a location, normalised lexically (never resolved on the server)."""
    normal = _lexical(value.strip()) if isinstance(value, str) else None
    if normal is None:
        raise ConfigError(f"parameter 'output': {shown(value)} is not an absolute local path or s3://bucket/prefix")
    return Location(normal)


def confine_output(target: Location, roots: Sequence[str]) -> None:
    """Refuse ``target`` unless it lies under one of ``roots`` (:func:`output_roots`; compared lexically, as text)."""
    normal = _lexical(target.url) or target.url
    if not any(normal == root or normal.startswith(root.rstrip("/") + "/") for root in roots):
        raise ConfigError(
            f"parameter 'output': {shown(target.url)} is outside the places replays and backfills may write: "
            f"{', '.join(roots)}; to allow another place, add it to {OUTPUT_ROOTS_ENV} "
            "(comma-separated local paths and s3://bucket/prefix) where the view and the workers run"
        )
