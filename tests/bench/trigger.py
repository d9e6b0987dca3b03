"""What an idle lag-triggered feed costs, against an idle cron feed at ``*/15``.

Starts a local Airflow (:class:`tidemark.devtools.airflow.LocalAirflow`: api-server, scheduler,
dag-processor, triggerer) on the running cluster, then, on the same Airflow:

1. **baseline**: one manual feed, no trigger: the triggerer's CPU rate with nothing to run, and
   the whole Airflow's (every process tree in its ``pids.json``), over ``--minutes``;
2. **cron**: ``--cron-runs`` runs of that idle feed (one every 15 minutes is what ``*/15``
   does: the plan task, a skipped Spark task, the commit task), each measured as the whole
   Airflow's CPU during the run less the baseline rate over the same time; times 4 per hour;
3. **lag**: ``--feeds`` feed files with ``trigger: {lag_records: 1000000}`` (never reached:
   idle) and the default ``check_every`` (30 s), each on a topic of its own; once the
   triggerer runs every trigger, its CPU rate over ``--minutes`` less the baseline, per feed.

CPU is user + system time from ``/proc/<pid>/stat`` (children included), so other load on the
machine does not count, only what these processes used. Prints a table and writes JSON
(``--json``). Not a test: ``make bench-trigger``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.support.cputime import tree_cpu_seconds
from tests.support.kafka import KafkaTestAdmin
from tidemark.devtools.airflow import LocalAirflow, project_root
from tidemark.devtools.kafka.cluster import connection_from_env

IDLE_FEED = "idle_cron"


def _get(airflow: LocalAirflow, token: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        airflow.url + path, data=data, method="POST" if data else "GET",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def _wait(what: str, check: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(1)
    raise SystemExit(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _cpu(airflow: LocalAirflow, names: tuple[str, ...] | None = None) -> float:
    pids = json.loads(airflow.pids_file.read_text())
    return sum(tree_cpu_seconds(pid) for name, pid in pids.items() if names is None or name in names)


def _rate(airflow: LocalAirflow, seconds: float, names: tuple[str, ...] | None) -> float:
    """CPU seconds per second of ``names`` (``None``: every process) over ``seconds`` of wall time."""
    before, start = _cpu(airflow, names), time.monotonic()
    time.sleep(seconds)
    return (_cpu(airflow, names) - before) / (time.monotonic() - start)


def _dag_parsed(airflow: LocalAirflow, token: str, dag_id: str) -> bool:
    try:
        _get(airflow, token, f"/api/v2/dags/{dag_id}")
    except urllib.error.HTTPError:
        return False
    return True


def _ended(airflow: LocalAirflow, token: str, path: str) -> str | None:
    state = str(_get(airflow, token, path)["state"])
    return state if state in ("success", "failed") else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--feeds", type=int, default=20, help="idle lag-triggered feeds")
    parser.add_argument("--minutes", type=float, default=3.0, help="each measuring window")
    parser.add_argument("--cron-runs", dest="cron_runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)

    connection = connection_from_env()
    adapter = KafkaTestAdmin(connection)
    base = Path(tempfile.mkdtemp(prefix="tidemark-bench-trigger-"))
    feeds, dags = base / "feeds", base / "dags"
    feeds.mkdir()
    dags.mkdir()
    (dags / "tidemark_dags.py").write_text((project_root() / "dags" / "tidemark_dags.py").read_text())
    topics = [f"bench-trigger-{uuid.uuid4().hex[:8]}" for _ in range(args.feeds + 1)]
    for topic in topics:
        adapter.create_topic(topic, 3, 1)
    idle = {"topics": [topics[0]], "group": f"g-{topics[0]}", "output": str(base / "out" / IDLE_FEED)}
    (feeds / f"{IDLE_FEED}.yaml").write_text(yaml.safe_dump(idle))
    airflow = LocalAirflow(
        home=base / "home", port=0, bootstrap_servers=connection.bootstrap_servers,
        extra_env={"AIRFLOW__CORE__DAGS_FOLDER": str(dags), "TIDEMARK_FEEDS_DIR": str(feeds),
                   "TIDEMARK_STATE_DIR": str(base / "state"),
                   "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
                   "PYTHONPATH": os.pathsep.join(p for p in (str(project_root()), os.environ.get("PYTHONPATH")) if p)},
    )  # fmt: skip
    window_s = args.minutes * 60
    out: dict[str, Any] = {"feeds": args.feeds, "window_s": window_s}
    try:
        print(f"starting Airflow under {base} ...", flush=True)
        airflow.up()
        token = airflow.token("admin")
        _wait("the idle feed's DAG", lambda: _dag_parsed(airflow, token, f"tidemark_{IDLE_FEED}"), 300)
        time.sleep(30)  # the first parse's and the start's own work done
        print(f"baseline: {args.minutes:g} min ...", flush=True)
        before_all, start = _cpu(airflow), time.monotonic()
        out["triggerer_base_rate"] = _rate(airflow, window_s, ("triggerer",))
        out["all_base_rate"] = (_cpu(airflow) - before_all) / (time.monotonic() - start)

        runs = []
        for i in range(args.cron_runs):
            before, start = _cpu(airflow), time.monotonic()
            run = _get(airflow, token, f"/api/v2/dags/tidemark_{IDLE_FEED}/dagRuns", {"logical_date": None})
            path = f"/api/v2/dags/tidemark_{IDLE_FEED}/dagRuns/{run['dag_run_id']}"
            state = _wait("the idle run", lambda: _ended(airflow, token, path), 600)  # noqa: B023 - waited for here
            took = time.monotonic() - start
            time.sleep(5)  # the executor's worker processes finish their bookkeeping
            spent = _cpu(airflow) - before - out["all_base_rate"] * (time.monotonic() - start)
            runs.append(spent)
            print(f"idle cron run {i + 1}: {state}, {took:.0f}s, {spent:.2f} CPU s above the baseline", flush=True)
        out["cron_run_cpu_s"] = runs
        out["cron_feed_cpu_s_per_hour"] = statistics.median(runs) * 4

        for i, topic in enumerate(topics[1:]):
            doc = {"topics": [topic], "group": f"g-{topic}", "output": str(base / "out" / f"lag{i}"),
                   "trigger": {"lag_records": 1_000_000}}  # fmt: skip
            (feeds / f"lag{i}.yaml").write_text(yaml.safe_dump(doc))
        log = airflow.home / "logs" / "triggerer.log"

        def all_running() -> bool:
            return bool(log.read_text(errors="replace").count("checks every") >= args.feeds)

        _wait(f"the triggerer to run {args.feeds} lag triggers", all_running, 900)
        time.sleep(60)  # each trigger's first checks (clients connecting) behind us
        print(f"{args.feeds} idle lag feeds: {args.minutes:g} min ...", flush=True)
        out["triggerer_lag_rate"] = _rate(airflow, window_s, ("triggerer",))
        per_feed_rate = max(out["triggerer_lag_rate"] - out["triggerer_base_rate"], 0.0) / args.feeds
        out["lag_feed_cpu_s_per_hour"] = per_feed_rate * 3600
        fired = log.read_text(errors="replace").count("fires:")
        out["lag_fired"] = fired
    finally:
        airflow.down(timeout_s=10)
        for topic in topics:
            adapter.delete_topic(topic)

    print()
    print(f"triggerer, idle (no trigger):      {out['triggerer_base_rate'] * 3600:8.1f} CPU s/hour")
    print(f"triggerer, {args.feeds} idle lag feeds:     {out['triggerer_lag_rate'] * 3600:8.1f} CPU s/hour")
    print(f"one idle lag feed (30s checks):    {out['lag_feed_cpu_s_per_hour']:8.1f} CPU s/hour (triggerer)")
    print(f"one idle cron feed at */15:        {out['cron_feed_cpu_s_per_hour']:8.1f} CPU s/hour (4 runs: scheduler, "
          "workers)")  # fmt: skip
    print(f"lag triggers fired while idle:     {out['lag_fired']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
