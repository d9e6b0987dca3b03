"""The offsets/lag page behind the Airflow plugin (a small FastAPI app).

``create_app()`` builds the app; the plugin in ``plugins/`` mounts it under
``/tidemark`` and adds a navigation entry. Pages: ``/`` lists feeds with their lag and
last run, ``/feeds/{feed}`` shows per-partition offsets, recent runs with their events,
and a link to replay; ``/api/feeds/{feed}`` returns the same as JSON. Handlers are thin:
the data comes from :mod:`tidemark.status` and :mod:`tidemark.report`. A feed whose
brokers do not answer shows its error instead of failing the page. No connection
setting is ever rendered. Airflow mounts plugin apps without auth; the plugin passes
Airflow's own security dependencies (:func:`tidemark.orchestration.airflow_auth`) so
that every route needs an authenticated Airflow user.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse

from tidemark.checkpoints import CheckpointStore, default_store
from tidemark.config import Feed, load_feeds
from tidemark.connection import KafkaConnection, from_env
from tidemark.errors import TidemarkError
from tidemark.kafka_io import KafkaAdapter
from tidemark.report import RunReport, list_runs
from tidemark.status import FeedStatus, feed_status

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #1f2933; }
table { border-collapse: collapse; margin: .5rem 0 1.5rem; }
th, td { border-bottom: 1px solid #d9e2ec; padding: .3rem .8rem; text-align: left; }
th { background: #f0f4f8; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.err { color: #b42318; } .ok { color: #067647; } .muted { color: #627d98; }
"""


def _page(title: str, body: str) -> HTMLResponse:
    return HTMLResponse(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>"
    )


class Html(str):
    """Markup built here from escaped parts; table cells of this type are not escaped again."""


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return value if isinstance(value, Html) else html.escape(str(value))


def _table(headers: list[str], rows: list[list[Any]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=num' if i in numeric else ''}>{_cell(c)}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def create_app(
    *,
    feeds: Callable[[], Mapping[str, Feed]] = load_feeds,
    connection: Callable[[], KafkaConnection] = from_env,
    checkpoints: Callable[[], CheckpointStore] = default_store,
    runs: Callable[[str], list[RunReport]] = list_runs,
    timeout_s: float = 5.0,
    dependencies: Sequence[Any] = (),
) -> FastAPI:
    """The app; ``dependencies`` guard every route (the plugin passes Airflow's own auth)."""
    app = FastAPI(title="Tidemark", docs_url=None, redoc_url=None, dependencies=list(dependencies))

    def status_of(feed: Feed) -> FeedStatus:
        return feed_status(feed, KafkaAdapter(connection(), timeout_s=timeout_s), checkpoints())

    def feed_or_404(name: str) -> Feed:
        known = feeds()
        if name not in known:
            raise HTTPException(404, f"no feed named '{name}' (known: {', '.join(sorted(known)) or 'none'})")
        return known[name]

    @app.get("/", response_class=HTMLResponse)
    def index() -> HTMLResponse:
        rows = []
        for name, feed in sorted(feeds().items()):
            try:
                lag: Any = status_of(feed).total_lag
            except TidemarkError as exc:
                lag = f"unavailable: {exc}"
            recent = runs(name)[:1]
            last = f"{recent[0].run_id} ({recent[0].status})" if recent else "never"
            link = Html(f"<a href='feeds/{html.escape(name)}'>{html.escape(name)}</a>")
            rows.append([link, feed.group, ", ".join(feed.topics), feed.schedule, lag, last])
        return _page("Tidemark feeds", _table(["feed", "group", "topics", "schedule", "lag", "last run"], rows))

    @app.get("/api/feeds/{name}")
    def feed_json(name: str) -> dict[str, Any]:
        feed = feed_or_404(name)
        try:
            status: dict[str, Any] = status_of(feed).to_dict()
        except TidemarkError as exc:
            status = {"error": str(exc)}
        return {"status": status, "runs": [r.model_dump() for r in runs(name)[:20]]}

    @app.get("/feeds/{name}", response_class=HTMLResponse)
    def feed_page(name: str) -> HTMLResponse:
        feed = feed_or_404(name)
        parts = [
            f"<p>group <b>{html.escape(feed.group)}</b> · topics {html.escape(', '.join(feed.topics))} · "
            f"{html.escape(feed.isolation)} · <a href='../'>all feeds</a></p>"
        ]
        try:
            status = status_of(feed)
            rows = [
                [p.label, p.leader, p.committed, p.checkpoint, p.log_start, p.end, p.lag] for p in status.partitions
            ]
            parts.append(
                _table(
                    ["partition", "leader", "committed", "checkpoint", "log start", "end", "lag"],
                    rows,
                    numeric={1, 2, 3, 4, 5, 6},
                )
            )
            parts.append(f"<p>total lag <b>{status.total_lag}</b></p>")
        except TidemarkError as exc:
            parts.append(f"<p class=err>offsets unavailable: {html.escape(str(exc))}</p>")
        recent = runs(name)[:20]
        run_rows = []
        for report in recent:
            events = "; ".join(f"{e.get('kind')}: {e.get('message')}" for e in report.events)
            records = report.counts.get("records", report.counts.get("read"))
            run_rows.append([report.run_id, report.plan_id, report.status, records, events])
        parts.append("<h2>Recent runs</h2>")
        parts.append(_table(["run", "plan", "state", "records", "events"], run_rows) if run_rows else "<p>none</p>")
        parts.append(
            "<h2>Replay</h2><p>Trigger the <a href='/dags/tidemark_replay' target='_top'>tidemark_replay</a> DAG "
            f"with feed <code>{html.escape(name)}</code>: choose where to start and end, and whether to commit.</p>"
        )
        return _page(f"Tidemark · {name}", "".join(parts))

    return app
