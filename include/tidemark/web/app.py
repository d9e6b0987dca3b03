"""The Tidemark view behind the Airflow plugin (a small FastAPI app rendering Jinja2 templates).

``create_app()`` builds the app; the plugin in ``plugins/`` mounts it under ``/tidemark``
and adds a navigation entry. Pages (templates in ``tidemark/web/templates/``): ``/`` lists
feeds with their lag, last run and trouble; ``/feeds/{feed}`` shows per partition the
committed offset, checkpoint, log start, end and lag in records and in time, the recent
runs as charts (inline SVG drawn here: records and lag in records; lag in time at each
run's planning, the number ``tidemark.lag_seconds_at_plan`` sends) and a table with the
metrics' per-run numbers and links to their Airflow run and Data Docs, the runs' events
with times, and a replay form; ``/runs/{feed}/{run_id}/docs`` and
``/runs/{feed}/{run_id}/files/{path}`` serve a run's files (its Data Docs);
``/feeds/{feed}/deadletters`` lists the feed's dead letters by reason and day with counts
and a few examples each (rendered by :func:`example`, the one place a dead letter's values
reach a page), and a re-drive form. JSON:
``/api/feeds``, ``/api/feeds/{feed}``, ``/api/feeds/{feed}/deadletters``,
``POST /api/feeds/{feed}/replay/preview`` (plans exactly as a dry run would, reads nothing),
``POST /api/feeds/{feed}/replay`` (triggers ``tidemark_replay`` through Airflow's REST API
with the caller's own credentials) and ``POST /api/feeds/{feed}/redrive`` (triggers
``tidemark_redrive`` the same way).

Routes are thin: the work is in :class:`ViewDeps`, over :mod:`tidemark.runs.status`,
:mod:`tidemark.runs.report` and :func:`tidemark.runs.start.plan_request`. A feed whose
brokers do not answer shows its error instead of failing the page. No connection setting
is ever rendered: error texts and the runs' stored errors and events pass
:meth:`ViewDeps.unclipped`, which hides secret values (:func:`tidemark.redaction.redact`)
and names the broker addresses "the feed's brokers". Airflow mounts plugin apps without
auth; the plugin passes Airflow's own security dependencies: ``dependencies`` guard every
route (an authenticated user), ``trigger_dependencies`` the trigger (a user who may run the
replay DAG).

Authorization is per feed (``access``, a :class:`FeedAccess`; the plugin's asks Airflow's auth
manager about the feed's own DAG): reading a feed's page, JSON, runs' files or a preview needs
``read`` (``runs`` for run files and dead letters, which hold record values), a replay
``replay`` and a committing replay also ``commit``; a re-drive (it publishes into the feed's
output, as the feed's own runs do) needs ``commit`` and passes ``redrive_dependencies`` (the
plugin's: the user may run ``tidemark_redrive``).
A feed file that does not load (:func:`tidemark.config.models.scan_feeds`) is listed with
its error, never hiding the other feeds, and its pages answer 409 with that error.
Lists show only the feeds the user may read; any other feed, known or not, answers 403 with
Airflow's own bare ``Forbidden``, so a refusal tells nothing about which feeds exist. Previews
(Kafka calls on the api-server) are limited per user (``preview_rate``).

The view runs on Airflow's origin, where the login cookie lives, so it keeps other
content from acting there. Run files (Data Docs, written from record data) are served
with a sandboxing Content-Security-Policy: no script runs and nothing loads from the
internet. The POST endpoints take only a JSON body (``application/json``, which a form
on another site cannot send) and refuse requests whose ``Origin`` or ``Sec-Fetch-Site``
is not this origin. Pages may be framed by Airflow itself only, and no OpenAPI document
is served. The preview and the trigger share one validation, the planner's: whatever
the preview accepts is what the trigger starts.
"""

from __future__ import annotations

import json
import math
import mimetypes
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import quote, urlsplit

from fastapi import Body, Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from tidemark.checkpoints.store import CheckpointStore, default_store
from tidemark.config.models import Feed, FeedProblem, scan_feeds
from tidemark.errors import ConfigError, PlanningError, TidemarkError, shown
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.connection import KafkaConnection, from_env
from tidemark.output.deadletters import (
    DeadLetter,
    LetterCounts,
    Position,
    count_dead_letters,
    counts_of,
    fetch_dead_letters,
    letters_signature,
)
from tidemark.output.maintenance import MaintenanceReport, last_record
from tidemark.planning.requests import END_CHOICES, REPLAY_PARAMS, START_CHOICES, flag, run_request
from tidemark.redaction import redact, replace_everywhere
from tidemark.runs.pipeline import plan_request
from tidemark.runs.report import RunReport, list_runs, secret_values
from tidemark.runs.run import run_dir_for
from tidemark.runs.status import FeedStatus, feed_status, shared_adapter
from tidemark.storage import Location
from tidemark.web.charts import Tick, count_axis, duration_axis, parse_time, time_axis

REPLAY_DAG = "tidemark_replay"
REDRIVE_DAG = "tidemark_redrive"
REDRIVE_KEYS = frozenset({"since", "reason", "dry_run"})  # what the re-drive form may send
AIRFLOW_FILE = "airflow.json"  # the Airflow DAG run that made a Tidemark run (written by the plan task)
CAUSE_FILE = "trigger.json"  # why a feed run started (tidemark.orchestration.lag.record_cause)
CHART_RUNS = 30
# The replay DAG's Params a trigger from the view may carry: all but allow_gap (the view's
# form has no such field; skipping offsets is left to the DAG's own form and the CLI).
REPLAY_KEYS = frozenset(REPLAY_PARAMS) - {"allow_gap"}

Trigger = Callable[[Request, dict[str, Any]], dict[str, Any]]
# What a user asks of a feed: its pages, JSON and previews; its runs' files; a replay; a committing replay.
Action = Literal["read", "runs", "replay", "commit"]
FORBIDDEN = "Forbidden"  # Airflow's own answer: names no feed and no reason a caller could probe with
PREVIEW_RATE = (12, 60.0)  # previews per user per that many seconds: each one is several Kafka calls
PREVIEW_RATE_ENV = "TIDEMARK_VIEW_PREVIEW_RATE"  # "COUNT/SECONDS", e.g. 12/60


def preview_rate(environ: Mapping[str, str] | None = None) -> tuple[int, float]:
    """Previews allowed per user: ``TIDEMARK_VIEW_PREVIEW_RATE`` ("COUNT/SECONDS"), else :data:`PREVIEW_RATE`."""
    return _rate(PREVIEW_RATE_ENV, PREVIEW_RATE, environ)


def dead_letter_rate(environ: Mapping[str, str] | None = None) -> tuple[int, float]:
    """Dead-letter pages allowed per user: ``TIDEMARK_VIEW_DEAD_LETTER_RATE`` ("COUNT/SECONDS"), else
    :data:`DEAD_LETTER_RATE`."""
    return _rate(DEAD_LETTER_RATE_ENV, DEAD_LETTER_RATE, environ)


def _rate(name: str, default: tuple[int, float], environ: Mapping[str, str] | None) -> tuple[int, float]:
    text = (os.environ if environ is None else environ).get(name, "").strip()
    if not text:
        return default
    count, _, seconds = text.partition("/")
    try:
        rate = (int(count), float(seconds))
    except ValueError:
        rate = (0, 0.0)
    if rate[0] < 1 or rate[1] <= 0:
        raise ConfigError(f"{name}={shown(text)}: expected COUNT/SECONDS with both above 0, e.g. 12/60")
    return rate


class FeedAccess(Protocol):
    """Which of ``feeds`` the request's user may do ``action`` on, and who that user is (for rate limits)."""

    def allowed(self, request: Request, action: Action, feeds: Collection[str]) -> set[str]: ...

    def who(self, request: Request) -> str: ...


class OpenAccess:
    """Everyone may do everything: the view without Airflow (tests of the pages themselves, ``make bench-view``)."""

    def allowed(self, request: Request, action: Action, feeds: Collection[str]) -> set[str]:
        return set(feeds)

    def who(self, request: Request) -> str:
        return request.client.host if request.client else "-"


class LetterReader(Protocol):
    """How the view reads a feed's dead letters: counted by reason and day, then a page's examples by position,
    each as :func:`example` shows it."""

    def counts(self, feed: Feed) -> LetterCounts: ...

    def examples(self, feed: Feed, counts: LetterCounts, positions: Sequence[Position]) -> dict[Position, Any]: ...


@dataclass
class StoredLetters:
    """The feed's dead letters where its runs put them (:func:`count_dead_letters`, :func:`fetch_dead_letters`):
    memory bounded by a batch, whatever their number. Each feed's counts are kept until what they depend on
    changes (:func:`letters_signature`: a new shown plan, a table append, a re-drive), and so are the examples
    shown for them (clipped): a feed's dead letters are read once per change, not once per request."""

    store: Callable[[], CheckpointStore]
    _kept: dict[str, tuple[tuple[Any, ...], LetterCounts, dict[Position, Any]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def counts(self, feed: Feed) -> LetterCounts:
        store = self.store()
        signature = letters_signature(feed, store)
        with self._lock:
            kept = self._kept.get(feed.name)
        if kept is not None and kept[0] == signature:
            return kept[1]
        counts = count_dead_letters(feed, store=store)
        with self._lock:
            self._kept[feed.name] = (signature, counts, {})
        return counts

    def examples(self, feed: Feed, counts: LetterCounts, positions: Sequence[Position]) -> dict[Position, Any]:
        with self._lock:
            kept = self._kept.get(feed.name)
        held = kept[2] if kept is not None and kept[1] is counts else {}
        missing = [p for p in positions if p not in held]
        if missing:
            fetched = {d.key_of: d for d in fetch_dead_letters(feed, counts, missing, store=self.store())}
            held.update((p, example(fetched[p.key])) for p in missing if p.key in fetched)
        return {p: held[p] for p in positions if p in held}


@dataclass(frozen=True)
class ListedLetters:
    """Dead letters a function gives whole (tests of the pages): counted in memory, positions index the list."""

    letters: Callable[[Feed], list[DeadLetter]]

    def counts(self, feed: Feed) -> LetterCounts:
        return counts_of(self.letters(feed))

    def examples(self, feed: Feed, counts: LetterCounts, positions: Sequence[Position]) -> dict[Position, Any]:
        held = self.letters(feed)
        return {p: example(held[p.row]) for p in positions if p.row < len(held)}


@dataclass
class RateLimit:
    """At most ``count`` calls per ``per_s`` seconds for each key (a sliding window, kept in memory per process)."""

    count: int
    per_s: float
    _calls: dict[str, deque[float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_s(self, key: str, now: float | None = None) -> float:
        """0 when ``key`` may call now (the call is counted); else how long until it may."""
        now = time.monotonic() if now is None else now
        with self._lock:
            calls = self._calls.setdefault(key, deque())
            while calls and calls[0] <= now - self.per_s:
                calls.popleft()
            if len(calls) >= self.count:
                return calls[0] + self.per_s - now
            calls.append(now)
            return 0.0


# Run files hold record data (GX writes rejected values into its pages unescaped): sandboxed,
# they run no script and load nothing from elsewhere, yet show their server-rendered HTML.
FILES_CSP = (
    "sandbox; default-src 'none'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self' data:; frame-ancestors 'self'; base-uri 'none'; form-action 'none'"
)
# The view's own pages: inline script and style of its templates; framed by Airflow (same origin) only.
PAGE_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'self'"
)
DETAIL_CHARS = 600  # an error text longer than this is cut (inputs are quoted only in part anyway)
HEADERS_SHOWN = 16  # a dead letter's headers shown, at most (the JSON says how many it has)
HEADER_CHARS = 200  # a header's name or value longer than this is cut
DEAD_LETTER_GROUPS = 25  # (reason, day) groups per page of a feed's dead letters
DEAD_LETTER_RATE = (30, 60.0)  # dead-letter pages (or JSON) per user per that many seconds: each reads the store
DEAD_LETTER_RATE_ENV = "TIDEMARK_VIEW_DEAD_LETTER_RATE"  # "COUNT/SECONDS", e.g. 30/60

# A run id or one name of a path below it: no separators, no control characters, not "." or "..".
_SAFE_NAME = re.compile(r"^(?!\.\.?$)[^/\\\x00-\x1f\x7f]{1,255}$")

_templates = Environment(
    loader=PackageLoader("tidemark.web", "templates"), autoescape=select_autoescape(["html"]), auto_reload=False
)


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _duration(ms: int | None) -> str:
    """A lag in time as people read it: 0s, 42s, 7m 5s, 3h 10m, 2d 4h."""
    if ms is None:
        return "-"
    seconds = ms // 1000
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if seconds >= size:
            rest = (seconds % size) // sub_size
            return f"{seconds // size}{unit} {rest}{sub}" if rest else f"{seconds // size}{unit}"
    return f"{seconds}s"


def _when(text: str | None) -> str:
    """A report's ISO timestamp, to the second, in UTC."""
    if not text:
        return "-"
    try:
        return datetime.fromisoformat(text).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    except ValueError:
        return text


def _iso(ms: int | None) -> str:
    return "" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


_templates.globals.update(dash=_dash, duration=_duration, iso=_iso, when=_when)


@dataclass(frozen=True)
class RunRow:
    """One run as the page shows it."""

    run_id: str
    mode: str | None
    status: str
    plan_id: str | None
    records: int
    lag_before: int | None  # records the group had not read when the run was planned (its ranges' partitions)
    lag_time_before_ms: int | None  # age of the oldest unread record then (scheduled and committing runs)
    published: int | None
    quarantined: int | None
    job_seconds: float | None  # the Spark job's steps, summed
    started_at: str | None
    error: str | None
    airflow_url: str | None
    docs_url: str | None
    started_by: str | None = None  # lag | schedule | manual (trigger.json)
    started_reason: str | None = None  # the lag rule's reason when a lag trigger started it


def _dry_run(report: RunReport) -> bool:
    return "dry run" in str((report.commit or {}).get("reason", ""))


def _records(report: RunReport) -> int:
    """Records the run read (a dry run reads none; its plan's count is in the report)."""
    c = report.counts
    return 0 if _dry_run(report) else int(c.get("rows", c.get("read", c.get("planned", 0))))


def _lag_before(report: RunReport) -> int | None:
    lags = []
    for r in report.ranges:
        position = r.get("committed_before")
        if position is None:
            position = r.get("checkpoint_before")
        if position is None:  # the group had no position: the run started by policy
            position = r.get("start")
        end = r.get("high_watermark")
        if position is not None and end is not None:
            lags.append(max(int(end) - int(position), 0))
    return sum(lags) if lags else None


def _run_row(report: RunReport, root: str, runs_root: Path | None, scrub: Callable[[str], str]) -> RunRow:
    """``report`` as a row; its stored error (written by the job or the commit, from any exception) scrubbed."""
    run_dir = run_dir_for(report.feed, report.run_id, runs_root)
    airflow_url = None
    airflow_doc = run_dir / AIRFLOW_FILE
    if airflow_doc.exists():
        doc = json.loads(airflow_doc.read_text())
        airflow_url = f"/dags/{doc['dag_id']}/runs/{quote(str(doc['dag_run_id']), safe='')}"
    docs_url = f"{root}/runs/{report.feed}/{report.run_id}/docs" if report.data_docs else None
    cause: dict[str, Any] = {}
    if (run_dir / CAUSE_FILE).exists():
        cause = json.loads((run_dir / CAUSE_FILE).read_text())
    fired = cause.get("lag_events") or [{}]
    mode = f"{report.mode} (dry run)" if _dry_run(report) else report.mode
    lags = report.lag_ms_at_plan() if report.commit_requested else {}
    return RunRow(
        report.run_id, mode, report.status, report.plan_id, _records(report), _lag_before(report),
        max(lags.values()) if lags else None, report.counts.get("published"), report.counts.get("quarantined"),
        round(sum(report.timings_s.values()), 1) if report.timings_s else None,
        report.started_at, scrub(report.error) if report.error else None, airflow_url, docs_url,
        cause.get("cause"), fired[-1].get("reason"),
    )  # fmt: skip


def _x_positions(runs: Sequence[RunRow], left: float, right: float) -> tuple[list[float], list[Tick], str]:
    """Where each run sits along x, the x ticks and the axis title: by start time (UTC) when every run has one,
    else by position, oldest first."""
    times = [parse_time(r.started_at) for r in runs]
    if runs and all(t is not None for t in times):
        axis = time_axis([t for t in times if t is not None], left, right)
        return [axis.x(t) for t in times if t is not None], list(axis.ticks), "run started (UTC)"
    step = (right - left) / max(len(runs), 1)
    xs = [round(left + i * step + step / 2, 1) for i in range(len(runs))]
    every = max(math.ceil(len(runs) / 10), 1)
    return xs, [Tick(x, str(i + 1)) for i, x in enumerate(xs) if i % every == 0], "run (oldest first)"


def _line(
    runs: Sequence[RunRow], xs: Sequence[float], value: Callable[[RunRow], int | None],
    label: Callable[[RunRow, int], str], ceiling: float, top: float, bottom: float,
) -> list[dict[str, Any]]:  # fmt: skip
    """A line's points, one per run that has a value, scaled to the axis's top value ``ceiling``."""
    points = []
    for r, x in zip(runs, xs, strict=True):
        v = value(r)
        if v is None:
            continue
        y = bottom - (0.0 if not ceiling else (bottom - top) * v / ceiling)
        points.append({"x": x, "y": round(y, 1), "value": v, "label": label(r, v)})
    return points


def _run_label(r: RunRow) -> str:
    return f"{r.run_id} ({_when(r.started_at)})" if r.started_at else r.run_id


def _ticks(ticks: Sequence[Tick]) -> list[dict[str, Any]]:
    return [{"at": t.at, "label": t.label} for t in ticks]


def _lag_time_chart(rows: Sequence[RunRow], width: int = 640, height: int = 170) -> dict[str, Any]:
    """Line geometry of the lag in time at each run's planning, oldest run first (what ``lag_seconds_at_plan`` sent):
    x the run's start time, y the lag in a unit chosen by the largest (s, min, h, d)."""
    left, right, top, bottom = 56, 56, 24, height - 40  # the runs chart's margins: one time axis under the other
    runs = list(reversed(rows[:CHART_RUNS]))
    xs, x_ticks, x_title = _x_positions(runs, left, width - right)
    highest = max((r.lag_time_before_ms or 0 for r in runs), default=0)
    ceiling, unit, y_ticks = duration_axis(highest, top, bottom)
    points = _line(runs, xs, lambda r: r.lag_time_before_ms,
                   lambda r, ms: f"{_run_label(r)}: oldest unread record {_duration(ms)} old",
                   ceiling, top, bottom)  # fmt: skip
    return {
        "width": width, "height": height, "left": left, "right": right, "top": top, "bottom": bottom,
        "points": points, "line": " ".join(f"{p['x']},{p['y']}" for p in points),
        "max": _duration(highest) if points else "-", "x_ticks": _ticks(x_ticks), "x_title": x_title,
        "y_ticks": _ticks(y_ticks), "y_title": f"lag ({unit})",
    }  # fmt: skip


def _chart(rows: Sequence[RunRow], width: int = 640, height: int = 210) -> dict[str, Any]:
    """Bar and line geometry for the recent runs, oldest first (the template only draws it): x the run's start
    time, the left axis records read (bars), the right axis the lag in records before the run (line)."""
    left, right, top, bottom = 56, 56, 24, height - 40
    runs = list(reversed(rows[:CHART_RUNS]))
    xs, x_ticks, x_title = _x_positions(runs, left, width - right)
    max_records = max((r.records for r in runs), default=0)
    records_top, y_ticks = count_axis(max_records, top, bottom)
    w = round(min((width - left - right) * 0.7 / max(len(runs), 1), 36.0), 1)
    bars = []
    for r, x in zip(runs, xs, strict=True):
        h = (bottom - top) * r.records / records_top
        bars.append({"x": round(x - w / 2, 1), "y": round(bottom - h, 1), "w": w, "h": round(h, 1),
                     "label": f"{_run_label(r)}: {r.records} records"})  # fmt: skip
    max_lag = max((r.lag_before or 0 for r in runs), default=0)
    lag_top, y2_ticks = count_axis(max_lag, top, bottom)
    points = _line(runs, xs, lambda r: r.lag_before, lambda r, lag: f"{r.run_id}: lag {lag} records",
                   lag_top, top, bottom)  # fmt: skip
    return {
        "width": width, "height": height, "left": left, "right": right, "top": top, "bottom": bottom, "bars": bars,
        "points": points, "line": " ".join(f"{p['x']},{p['y']}" for p in points),
        "max_records": max_records, "max_lag": max_lag, "x_ticks": _ticks(x_ticks), "x_title": x_title,
        "y_ticks": _ticks(y_ticks), "y2_ticks": _ticks(y2_ticks),
    }  # fmt: skip


_NOTABLE = (
    "reset", "group_offsets_expired", "data_loss", "offset_ahead", "new_partition", "retention_warning",
    "schema_changed", "table_schema_evolved", "topic_added", "topic_removed",
)  # fmt: skip


def _events(reports: Sequence[RunReport]) -> list[dict[str, Any]]:
    """Resets, expired offsets, lost ranges and quarantined records of the recent runs, newest first."""
    out = []
    for report in reports:
        when = report.started_at
        for e in report.events:
            if e.get("kind") not in _NOTABLE:
                continue
            where = (
                f"{e['topic']}[{e['partition']}]"
                if e.get("topic") is not None and e.get("partition") is not None
                else ""
            )
            out.append({"time": when, "run_id": report.run_id, "kind": e.get("kind"), "where": where,
                        "message": e.get("message", "")})  # fmt: skip
        quarantined = report.counts.get("quarantined", 0)
        if quarantined:
            out.append({"time": report.finished_at or when, "run_id": report.run_id, "kind": "quarantined",
                        "where": "", "message": f"{quarantined} bad records kept in the run's quarantine"})  # fmt: skip
    return out


def replay_conf(feed: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """The replay DAG's conf from a form's parameters: known keys only, a dry run unless said otherwise."""
    unknown = sorted(set(body) - REPLAY_KEYS)
    if unknown:
        named = ", ".join(k if len(k) <= 40 else shown(k) for k in unknown[:5]) + (", …" if len(unknown) > 5 else "")
        raise ConfigError(f"unknown replay parameters: {named} (known: {', '.join(sorted(REPLAY_KEYS))})")
    conf = {k: v for k, v in body.items() if v is not None and v != ""}
    conf["dry_run"] = flag(body, "dry_run", default=True)
    return {"feed": feed, **conf}


def _clip(text: str) -> str:
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS] + "…"


def _origin(url: str) -> str:
    """``scheme://host:port`` of a URL, with the scheme's default port spelled out."""
    try:
        parts = urlsplit(url.strip().lower())
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return ""
    return f"{parts.scheme}://{parts.hostname}:{port}" if parts.scheme and parts.hostname else ""


def same_origin_json(request: Request, api_base: str | None = None) -> None:
    """Refuse what a page on another origin could send: a non-JSON body, or a foreign Origin / Sec-Fetch-Site.

    A form or a no-CORS fetch from another site (or another port of this host, which
    browsers count as the same site and send the login cookie to) can only send
    form-encoded or text bodies; ``application/json`` needs a CORS preflight this app
    never grants. Browsers also name the page's origin on every cross-origin POST.
    Callers that are not browsers (the API with a bearer token) send neither header.
    """
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise HTTPException(415, "send the parameters as a JSON object with Content-Type: application/json")
    site = request.headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        raise HTTPException(403, f"cross-site request refused (Sec-Fetch-Site: {shown(site)})")
    origin = request.headers.get("origin")
    if origin is not None:
        allowed = {_origin(str(request.base_url))} | ({_origin(api_base)} if api_base else set())
        if _origin(origin) not in allowed - {""}:
            raise HTTPException(403, f"cross-origin request refused (Origin: {shown(origin)})")


def redrive_conf(feed: str, body: Any) -> dict[str, Any]:
    """The re-drive DAG's conf from the form's JSON body: a dry run unless said; unknown keys and bad values refused."""
    if not isinstance(body, Mapping):
        raise HTTPException(422, "send the re-drive's parameters as a JSON object")
    unknown = sorted(str(k) for k in body if k not in REDRIVE_KEYS)
    if unknown:
        raise HTTPException(422, f"unknown re-drive parameters: {', '.join(shown(k) for k in unknown)}")
    conf: dict[str, Any] = {"feed": feed, "dry_run": body.get("dry_run", True) is not False}
    since = body.get("since")
    if since not in (None, ""):
        try:
            moment = datetime.fromisoformat(str(since))
            conf["since"] = (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).isoformat()
        except ValueError:
            raise HTTPException(422, f"since: {shown(str(since))} is not an ISO date or time") from None
    reason = body.get("reason")
    if reason not in (None, ""):
        if not isinstance(reason, str) or len(reason) > 300:
            raise HTTPException(422, "reason: a reason code (decode_error, or a rule's label), at most 300 characters")
        conf["reason"] = reason
    return conf


def example(letter: DeadLetter) -> dict[str, Any]:
    """One dead letter as a page or the JSON shows it: the one place its values (key, value, headers) are rendered.

    Record data is shown as the record holds it, clipped (:data:`DETAIL_CHARS`; at most :data:`HEADERS_SHOWN`
    headers, each name and value :data:`HEADER_CHARS`), never passed through the connection's redaction:
    a record carrying a guessed password in a header would otherwise learn from a ``***`` that the guess is
    right. Whoever may see a feed's dead letters may read its records. A masked feed's dead letters hold
    masked values only: the job masks before it quarantines (:mod:`tidemark.spark.masking`).
    """
    doc: dict[str, Any] = letter.to_dict()
    for name in ("key", "value", "reason"):  # a record's value may be megabytes: a page shows its start
        if isinstance(doc.get(name), str):
            doc[name] = _clip(doc[name])
    headers = doc.get("headers") or []
    doc["headers_total"] = len(headers)
    doc["headers"] = [[_cut(str(k), HEADER_CHARS), None if v is None else _cut(str(v), HEADER_CHARS)]
                      for k, v in headers[:HEADERS_SHOWN]]  # fmt: skip
    return doc


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def airflow_trigger(
    request: Request, conf: dict[str, Any], api_base: str | None = None, dag_id: str = REPLAY_DAG
) -> dict[str, Any]:
    """Trigger the replay DAG (or ``dag_id``) through Airflow's REST API as the caller (their bearer token or UI
    cookie).

    Going through the public API (not Airflow's internals) keeps Airflow's own checks:
    the conf is validated against the DAG's Params and the run records who triggered it.
    ``api_base`` is Airflow's configured ``[api] base_url``. Without one there is no trigger:
    the request's ``Host`` header is the caller's to choose, and the caller's token would go
    wherever it names.
    """
    if not api_base:
        raise HTTPException(
            503,
            "replays cannot be started from this view: Airflow's [api] base_url is not set; set it to the address "
            "Airflow's REST API is reached at (e.g. https://airflow.example.com), then restart the api-server",
        )
    headers = {"Content-Type": "application/json"}
    if auth := request.headers.get("authorization"):
        headers["Authorization"] = auth
    elif token := request.cookies.get("_token"):
        headers["Cookie"] = f"_token={token}"
    base = api_base.rstrip("/")
    url = f"{base}/api/v2/dags/{dag_id}/dagRuns"
    data = json.dumps({"logical_date": None, "conf": conf}).encode()
    req = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            doc: dict[str, Any] = json.loads(resp.read())
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")
        try:
            detail = json.loads(detail).get("detail", detail)
        except (ValueError, AttributeError):
            pass
        raise HTTPException(err.code, detail) from err
    return {"dag_id": dag_id, "dag_run_id": doc["dag_run_id"], "state": doc.get("state"), "conf": conf}


@dataclass(frozen=True)
class ViewDeps:
    """What the view reads, each asked for per request: feeds, Kafka, the checkpoint store, run reports."""

    feeds: Callable[[], Mapping[str, Feed]]
    connection: Callable[[], KafkaConnection]
    checkpoints: Callable[[], CheckpointStore]
    runs: Callable[[str], list[RunReport]]
    runs_root: Path | None
    timeout_s: float
    access: FeedAccess = field(default_factory=OpenAccess)
    preview_limit: RateLimit = field(default_factory=lambda: RateLimit(*PREVIEW_RATE))
    problems: Callable[[], Sequence[FeedProblem]] = lambda: ()
    letters: LetterReader = field(default_factory=lambda: StoredLetters(default_store))
    dead_letter_limit: RateLimit = field(default_factory=lambda: RateLimit(*DEAD_LETTER_RATE))

    def unclipped(self, value: Any) -> Any:
        """``value`` (a text, or JSON-like data holding texts) without secret values or broker addresses."""
        conn = self.connection()
        # Broker addresses are connection settings too: a viewer learns that Kafka did not answer, not where it is.
        servers = {conn.bootstrap_servers} | {s.strip() for s in conn.bootstrap_servers.split(",") if s.strip()}
        servers |= {s.rsplit(":", 1)[0] for s in servers if ":" in s}
        hidden = redact(value, secret_values(conn))
        return replace_everywhere(hidden, dict.fromkeys(servers - {""}, "the feed's brokers"))

    def scrub(self, text: str) -> str:
        return _clip(str(self.unclipped(text)))

    def visible(self, request: Request) -> list[Feed]:
        """The feeds the user may read, by name."""
        known = self.feeds()
        allowed = self.access.allowed(request, "read", list(known))
        return [known[name] for name in sorted(allowed & known.keys())]

    def broken(self, request: Request, root: str) -> list[dict[str, Any]]:
        """Rows of the feeds page for the feed files that do not load and that the user may read, with the error."""
        rows = []
        for problem in self.problems():
            # One name at a time: two colliding files (orders.v1, orders_v1) share a DAG id but not a row.
            if problem.name not in self.access.allowed(request, "read", [problem.name]):
                continue
            recent = self.runs(problem.name)[:1]  # a feed that ran before its file broke keeps its history
            last = _run_row(recent[0], root, self.runs_root, self.scrub).__dict__ if recent else None
            rows.append({"name": problem.name, "group": None, "topics": [], "schedule": None, "broken": True,
                         "error": self.scrub(problem.message), "trouble": ["feed file does not load"],
                         "last": last})  # fmt: skip
        return rows

    def rows(self, request: Request, root: str) -> list[dict[str, Any]]:
        """The feeds page: every feed the user may read, those whose file does not load among them, by name."""
        found = [self.summary(f, root) for f in self.visible(request)] + self.broken(request, root)
        return sorted(found, key=lambda row: str(row["name"]))

    def feed_for(self, request: Request, name: str, action: Action = "read") -> Feed:
        """Feed ``name`` if the user may do ``action`` on it: 403 otherwise, whether it exists or not.

        A feed whose file does not load answers 409 with the file's error (to a user allowed ``action`` on it).
        """
        if name not in self.access.allowed(request, action, [name]):
            raise HTTPException(403, FORBIDDEN)
        known = self.feeds()
        if name not in known:
            problem = next((p for p in self.problems() if p.name == name), None)
            if problem is not None:
                raise HTTPException(409, self.scrub(problem.message))
            readable = self.access.allowed(request, "read", list(known))
            raise HTTPException(404, f"no feed named {shown(name)} (known: {', '.join(sorted(readable)) or 'none'})")
        return known[name]

    def adapter(self) -> KafkaAdapter:
        # One client per connection and process, not one per request (each request re-reads the connection).
        return shared_adapter(self.connection(), timeout_s=self.timeout_s)

    def status_of(self, feed: Feed) -> FeedStatus:
        return feed_status(feed, self.adapter(), self.checkpoints(), lag_times=True)

    def summary(self, feed: Feed, root: str) -> dict[str, Any]:
        """One row of the feeds page: lag, trouble and the last run (or the error that hid them)."""
        topics = [feed.topics_label] if feed.topic_pattern else list(feed.topics)  # a pattern: as the file says it
        row: dict[str, Any] = {"name": feed.name, "group": feed.group, "topics": topics,
                               "schedule": feed.schedule, "error": None, "trouble": []}  # fmt: skip
        try:
            status = self.status_of(feed)
            row.update(lag=status.total_lag, lag_ms=status.max_lag_ms, lag_time=_duration(status.max_lag_ms),
                       unpositioned=status.unpositioned,
                       trouble=list(status.trouble))  # fmt: skip
        except TidemarkError as exc:
            row["error"] = self.scrub(str(exc))
        recent = self.runs(feed.name)[:1]
        row["last"] = _run_row(recent[0], root, self.runs_root, self.scrub).__dict__ if recent else None
        return row

    def feed_view(self, feed: Feed, root: str) -> dict[str, Any]:
        """A feed's status (or the error), its recent reports and their rows."""
        status: FeedStatus | None = None
        error = None
        try:
            status = self.status_of(feed)
        except TidemarkError as exc:
            error = self.scrub(str(exc))
        reports = self.runs(feed.name)[:CHART_RUNS]
        rows = [_run_row(r, root, self.runs_root, self.scrub) for r in reports]
        return {"status": status, "error": error, "reports": reports, "rows": rows,
                "maintenance": self.maintenance(feed)}  # fmt: skip

    def dead_letters(self, feed: Feed, page: int = 1) -> dict[str, Any]:
        """One page of the feed's dead letters by reason and day: counts (aggregated from their reason and time
        columns only), :data:`DEAD_LETTER_GROUPS` groups a page, a few examples each (:func:`example`), fetched
        by position for this page's groups only."""
        counts = self.letters.counts(feed)
        pages = max(1, -(-len(counts.groups) // DEAD_LETTER_GROUPS))
        if not 1 <= page <= pages:
            raise HTTPException(404, f"page {page}: the dead letters of feed '{feed.name}' have {pages} page(s)")
        chosen = counts.groups[(page - 1) * DEAD_LETTER_GROUPS : page * DEAD_LETTER_GROUPS]
        shown = self.letters.examples(feed, counts, [p for g in chosen for p in g.examples])
        groups = [{"reason": g.reason, "day": None if g.day is None else g.day.isoformat(), "count": g.count,
                   "examples": [shown[p] for p in g.examples if p in shown]}
                  for g in chosen]  # fmt: skip
        return {"feed": feed.name, "records": counts.records, "groups": groups, "page": page, "pages": pages,
                "groups_total": len(counts.groups)}  # fmt: skip

    def dead_letters_for(self, request: Request, name: str, page: int) -> tuple[Feed, dict[str, Any]]:
        """The feed (with the ``runs`` right) and its dead letters' ``page``, within the user's rate."""
        feed = self.feed_for(request, name, "runs")
        wait = self.dead_letter_limit.wait_s(self.access.who(request))
        if wait:
            count, per_s = self.dead_letter_limit.count, self.dead_letter_limit.per_s
            raise HTTPException(
                429, f"too many dead-letter pages: at most {count} every {per_s:.0f}s per user; try again in "
                f"{wait:.0f}s", headers={"Retry-After": str(max(1, round(wait)))},
            )  # fmt: skip
        return feed, self.dead_letters(feed, page)

    def maintenance(self, feed: Feed) -> MaintenanceReport | None:
        """The table's last maintenance (Iceberg feeds), from the records beside the run history."""
        if feed.output_format != "iceberg":
            return None
        return last_record(feed.name, self.runs_root)  # the state dir the run history is under

    def plan_of(self, feed: Feed, body: Any) -> tuple[dict[str, Any], Any, Any, bool, KafkaAdapter]:
        """The preview's and the trigger's one validation: the plan a dry run of ``body`` would make."""
        name = feed.name
        if not isinstance(body, dict):
            raise HTTPException(400, f"send the replay parameters as a JSON object, got {shown(body)}")
        try:
            conf = replay_conf(name, body)
            kafka = self.adapter()
            request = run_request("replay", conf)
            plan = plan_request(feed, kafka, self.checkpoints(), request)
        except (ConfigError, PlanningError) as exc:  # bad parameters, or the plan itself refused (data loss, ...)
            raise HTTPException(400, self.scrub(str(exc))) from exc
        except TidemarkError as exc:
            raise HTTPException(502, self.scrub(str(exc))) from exc
        return conf, plan, plan.output, request.dry_run, kafka

    def preview(self, feed: Feed, body: Any) -> dict[str, Any]:
        """What a replay of ``body`` would read: ranges with their first and last record times, and its effect."""
        conf, plan, output, dry_run, kafka = self.plan_of(feed, body)
        try:
            firsts = kafka.timestamps_at({p.key: p.start for p in plan.partitions if p.records}, feed.isolation)
            lasts = kafka.timestamps_at({p.key: p.end - 1 for p in plan.partitions if p.records}, feed.isolation)
        except TidemarkError as exc:
            raise HTTPException(502, self.scrub(str(exc))) from exc
        if plan.commit and not dry_run:
            effect = f"group '{plan.group}' is committed at each range's end after the replay publishes"
        else:
            effect = f"group '{plan.group}' keeps its offsets (nothing is committed)"
        return {
            "plan_id": plan.plan_id,
            "records": plan.total_records,
            "dry_run": dry_run,
            "commit": plan.commit,
            "output": str(output),
            "group_effect": effect,
            "ranges": [
                {
                    "topic": p.topic,
                    "partition": p.partition,
                    "start": p.start,
                    "end": p.end,
                    "records": p.records,
                    "committed": p.committed,
                    "reason": p.reason,
                    "first_record_at": _iso(firsts.get(p.key)) or None,
                    "last_record_at": _iso(lasts.get(p.key)) or None,
                }
                for p in plan.partitions
            ],
            "events": [{"kind": e.kind, "message": e.message} for e in plan.events],
            "conf": conf,
        }

    def data_docs_path(self, feed: str, run_id: str) -> str:
        """The run's Data Docs index, relative to its run folder (``feed``: one the user may read runs of)."""
        report = next((r for r in self.runs(feed) if r.run_id == run_id), None)
        if report is None or not report.data_docs:
            raise HTTPException(404, f"run {run_id} of feed '{feed}' has no Data Docs")
        run_dir = run_dir_for(feed, run_id, self.runs_root).url
        index = Location.of(report.data_docs).url
        if not index.startswith(run_dir + "/"):
            raise HTTPException(404, "Data Docs outside the run's folder")
        return index[len(run_dir) + 1 :]

    def run_file(self, feed: str, run_id: str, path: str) -> Response:
        """Data Docs pages and their assets; only under the run's ``gx/`` folder (local or object store).

        Served sandboxed (``FILES_CSP``): they are written from record data. ``feed``: one the user
        may read runs of.
        """
        parts = path.split("/")
        missing = HTTPException(404, f"no file {shown(path)} in the Data Docs of run {shown(run_id)}")
        if not _SAFE_NAME.match(run_id) or parts[0] != "gx" or not all(_SAFE_NAME.match(p) for p in parts):
            raise missing
        target = run_dir_for(feed, run_id, self.runs_root)
        for part in parts:
            target = target / part
        if not target.is_file():
            raise missing
        headers = {"Content-Security-Policy": FILES_CSP, "Cross-Origin-Resource-Policy": "same-origin"}
        if target.is_local:
            return FileResponse(target.local_path(), headers=headers)
        media = mimetypes.guess_type(path)[0] or "application/octet-stream"
        return Response(target.read_bytes(), media_type=media, headers=headers)


# A range's figures computed from its records' content: a masked feed's view shows none (runs before its
# checksums were of masked records published digests of raw bytes, which a guess of a hashed value can be tested on).
CONTENT_FIGURES = ("checksum", "bytes")
# What a validation summary holds of record values (GX's observed values and exception texts, bad records' samples):
# shown only to users who may read the feed's runs (``runs``), as its dead letters and Data Docs are.
VALUE_FIELDS = ("observed_value", "exception")


def _shown_run(report: RunReport, *, masked: bool, values: bool) -> dict[str, Any]:
    """A run report as the feed's JSON shows it: without the connection; for a masked feed without
    :data:`CONTENT_FIGURES` per range; without ``values`` (a user without ``runs``), the validation summary
    without record values (:data:`VALUE_FIELDS` of each expectation, the bad records' samples)."""
    doc: dict[str, Any] = report.model_dump(exclude={"connection"})
    if masked:
        doc["ranges"] = [{k: v for k, v in r.items() if k not in CONTENT_FIGURES} for r in doc.get("ranges") or []]
    validation = doc.get("validation")
    if not values and isinstance(validation, dict):
        kept = {k: v for k, v in validation.items() if k != "sample_bad_records"}
        kept["expectations"] = [{k: v for k, v in e.items() if k not in VALUE_FIELDS} if isinstance(e, dict) else e
                                for e in validation.get("expectations") or []]  # fmt: skip
        doc["validation"] = kept
    return doc


def _root_of(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


async def _security_headers(request: Request, call_next: Callable[[Request], Any]) -> Response:
    response: Response = await call_next(request)
    response.headers.setdefault("Content-Security-Policy", PAGE_CSP)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "SAMEORIGIN"
    return response


async def _unreadable_body(request: Request, exc: Exception) -> JSONResponse:
    # FastAPI's default answer quotes the whole input back; name the problem only.
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    problems = "; ".join(
        _clip(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg', 'invalid')}") for e in errors[:5]
    )
    return JSONResponse({"detail": _clip(f"unreadable request: {problems}")}, status_code=422)


def create_app(
    *,
    feeds: Callable[[], Mapping[str, Feed]] | None = None,
    problems: Callable[[], Sequence[FeedProblem]] | None = None,
    connection: Callable[[], KafkaConnection] = from_env,
    checkpoints: Callable[[], CheckpointStore] = default_store,
    runs: Callable[[str], list[RunReport]] = list_runs,
    runs_root: Path | None = None,
    timeout_s: float = 5.0,
    dependencies: Sequence[Any] = (),
    trigger_dependencies: Sequence[Any] = (),
    trigger: Trigger | None = None,
    api_base: Callable[[], str | None] = lambda: None,
    access: FeedAccess | None = None,
    preview_rate: tuple[int, float] = PREVIEW_RATE,
    letters: Callable[[Feed], list[DeadLetter]] | None = None,
    redrive: Trigger | None = None,
    dead_letter_rate: tuple[int, float] = DEAD_LETTER_RATE,
    redrive_dependencies: Sequence[Any] = (),
) -> FastAPI:
    """The app; ``dependencies`` guard every route, ``trigger_dependencies`` also the replay trigger and
    ``redrive_dependencies`` the re-drive trigger.

    ``access`` says which feeds the user may read, replay and commit (default: every feed,
    for a view without Airflow); ``preview_rate`` caps each user's previews (count, seconds).
    ``feeds`` and ``problems`` default to the feeds folder read file by file (a file that does not
    load is listed with its error, never hiding the others). ``trigger`` starts a replay run
    (default: :func:`airflow_trigger` at ``api_base()``), ``redrive`` a re-drive run (default: the
    same, of ``tidemark_redrive``); ``letters`` reads a feed's dead letters (default: with the run ledger of
    ``checkpoints``, the view's store). The routes are thin:
    the work is in :class:`ViewDeps` and the pure helpers above.
    """
    known = feeds or (lambda: scan_feeds().feeds)
    # Given feeds (tests, benchmarks) come without problems unless these are given too.
    broken = problems or ((lambda: scan_feeds().problems) if feeds is None else (lambda: ()))
    deps = ViewDeps(known, connection, checkpoints, runs, runs_root, timeout_s, access or OpenAccess(),
                    RateLimit(*preview_rate), broken,
                    ListedLetters(letters) if letters else StoredLetters(checkpoints),
                    RateLimit(*dead_letter_rate))  # fmt: skip
    start_run: Trigger = trigger or (lambda request, conf: airflow_trigger(request, conf, api_base()))
    start_redrive: Trigger = redrive or (
        lambda request, conf: airflow_trigger(request, conf, api_base(), dag_id=REDRIVE_DAG)
    )
    app = FastAPI(title="Tidemark", docs_url=None, redoc_url=None, openapi_url=None, dependencies=list(dependencies))
    app.middleware("http")(_security_headers)
    app.add_exception_handler(RequestValidationError, _unreadable_body)

    def csrf(request: Request) -> None:
        same_origin_json(request, api_base())

    @app.get("/", response_class=HTMLResponse)
    def index(request: Request) -> HTMLResponse:
        rows = deps.rows(request, _root_of(request))
        return HTMLResponse(_templates.get_template("index.html").render(title="Tidemark feeds", feeds=rows))

    @app.get("/api/feeds")
    def feeds_json(request: Request) -> list[dict[str, Any]]:
        return deps.rows(request, _root_of(request))

    @app.get("/api/feeds/{name}")
    def feed_json(name: str, request: Request) -> dict[str, Any]:
        feed = deps.feed_for(request, name)
        values = name in deps.access.allowed(request, "runs", [name])  # record values: as for its runs' files
        view = deps.feed_view(feed, _root_of(request))
        status_doc = view["status"].to_dict() if view["status"] is not None else {"error": view["error"]}
        history = {
            "runs": [_shown_run(r, masked=feed.masking is not None, values=values) for r in view["reports"][:20]],
            "run_rows": [r.__dict__ for r in view["rows"]],
            "events": _events(view["reports"]),
        }
        return {"status": status_doc, **deps.unclipped(history)}  # stored errors and events: scrubbed as shown

    @app.get("/feeds/{name}", response_class=HTMLResponse)
    def feed_page(name: str, request: Request) -> HTMLResponse:
        feed = deps.feed_for(request, name)
        root = _root_of(request)
        view = deps.feed_view(feed, root)
        status: FeedStatus | None = view["status"]
        rows: list[RunRow] = view["rows"]
        html = _templates.get_template("feed.html").render(
            title=f"Tidemark · {name}", feed=feed, root=root, status=status, error=view["error"],
            trouble=status.trouble if status else (), runs=rows, last=rows[0] if rows else None,
            maintenance=view["maintenance"], chart_data=_chart(rows), lag_chart_data=_lag_time_chart(rows),
            events=deps.unclipped(_events(view["reports"])), start_choices=START_CHOICES, end_choices=END_CHOICES,
        )  # fmt: skip
        return HTMLResponse(html)

    @app.post("/api/feeds/{name}/replay/preview", dependencies=[Depends(csrf)])
    def replay_preview(name: str, request: Request, body: Any = Body(...)) -> dict[str, Any]:  # noqa: B008
        feed = deps.feed_for(request, name)
        wait = deps.preview_limit.wait_s(deps.access.who(request))
        if wait:
            count, per_s = preview_rate
            raise HTTPException(
                429, f"too many previews: at most {count} every {per_s:.0f}s per user; try again in {wait:.0f}s",
                headers={"Retry-After": str(max(1, round(wait)))},
            )  # fmt: skip
        return deps.preview(feed, body)

    @app.post("/api/feeds/{name}/replay", dependencies=[Depends(csrf), *trigger_dependencies])
    def replay_trigger(name: str, request: Request, body: Any = Body(...)) -> dict[str, Any]:  # noqa: B008
        feed = deps.feed_for(request, name, "replay")
        if isinstance(body, dict) and body.get("commit") not in (None, False, ""):
            # A committing replay moves the group as the feed's own runs do: it needs the right to run that DAG.
            deps.feed_for(request, name, "commit")
        # Planned first, as the preview plans: a run is started only for what would run.
        conf, _plan, _output, _dry_run, _kafka = deps.plan_of(feed, body)
        return start_run(request, conf)

    @app.get("/api/feeds/{name}/deadletters")
    def dead_letters_json(name: str, request: Request, page: int = 1) -> dict[str, Any]:
        return deps.dead_letters_for(request, name, page)[1]

    @app.get("/feeds/{name}/deadletters", response_class=HTMLResponse)
    def dead_letters_page(name: str, request: Request, page: int = 1) -> HTMLResponse:
        feed, view = deps.dead_letters_for(request, name, page)
        html = _templates.get_template("deadletters.html").render(
            title=f"Tidemark · {name} · dead letters", feed=feed, root=_root_of(request), view=view
        )
        return HTMLResponse(html)

    @app.post("/api/feeds/{name}/redrive", dependencies=[Depends(csrf), *redrive_dependencies])
    def redrive_trigger(name: str, request: Request, body: Any = Body(...)) -> dict[str, Any]:  # noqa: B008
        feed = deps.feed_for(request, name, "commit")  # it publishes into the feed's output
        return start_redrive(request, redrive_conf(feed.name, body))

    @app.get("/runs/{feed}/{run_id}/docs")
    def data_docs(feed: str, run_id: str, request: Request) -> RedirectResponse:
        index = deps.data_docs_path(deps.feed_for(request, feed, "runs").name, run_id)
        return RedirectResponse(f"{_root_of(request)}/runs/{feed}/{run_id}/files/{index}")

    @app.get("/runs/{feed}/{run_id}/files/{path:path}")
    def run_file(feed: str, run_id: str, path: str, request: Request) -> Response:
        return deps.run_file(deps.feed_for(request, feed, "runs").name, run_id, path)

    return app
