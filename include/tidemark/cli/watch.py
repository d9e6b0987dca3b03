"""``tidemark watch FEED``: run a feed whenever its lag passes its ``trigger:`` thresholds, without Airflow.

The same rule as the Airflow trigger (:func:`tidemark.orchestration.lag.decide`) over the
same offset look-ups (:class:`tidemark.orchestration.lag.LagProbe`): every ``check_every``
it reads the group's lag, and when the rule fires it runs the feed as ``tidemark run`` does
(plan, Spark job, commit), one run at a time in this process, writing why the run started
beside it (``trigger.json``). A failed run is printed and the watch goes on: the rule starts
it again once its grace has passed. Connection settings come from the environment.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

from tidemark.config.models import load_feed
from tidemark.errors import ConfigError, TidemarkError


def _say(message: str) -> None:
    print(f"[{datetime.now(UTC).strftime('%H:%M:%S')}] {message}", flush=True)


def _watch(args: argparse.Namespace) -> int:
    # confluent-kafka and Spark's launcher: loaded by this command only, not by every CLI start.
    from tidemark.devtools.kafka.cluster import connection_from_env
    from tidemark.orchestration.lag import Fired, LagProbe, Thresholds, decide, record_cause
    from tidemark.runs.pipeline import run_feed

    feed = load_feed(args.feed)
    if feed.trigger is None:
        raise ConfigError(
            f"feed '{feed.name}' has no 'trigger:' section: give lag_records and/or oldest_unread_age to watch it"
        )
    rule = Thresholds.of(feed)
    every_s = args.check_every if args.check_every is not None else feed.trigger.check_every_s
    connection = connection_from_env()
    probe = LagProbe.for_feed(feed, connection)
    last: Fired | None = None  # in memory: runs here are one at a time, and a restart starts afresh
    runs = checks = 0
    _say(f"watching feed '{feed.name}' (group {feed.group}) every {every_s:g}s")
    try:
        while True:
            checks += 1
            try:
                reading = probe.read(rule.oldest_unread_age_ms)
            except TidemarkError as exc:
                _say(f"check failed, trying again: {exc}")
            else:
                decision = decide(rule, reading, last, active_runs=0)
                if decision.fire:
                    last = Fired(reading.at_ms, reading.positions)
                    _say(f"running: {decision.reason}")
                    runs += 1
                    try:
                        handle, _job, outcome = run_feed(feed.name, connection, master=args.master, progress=_say)
                    except TidemarkError as exc:
                        _say(f"run failed (started again after the rule's grace): {exc}")
                    else:
                        event = {"feed": feed.name, "reason": decision.reason, **reading.to_json()}
                        record_cause(handle.run_dir, "lag", [event], "watch")
                        _say(f"run {handle.plan_id}: {'committed' if outcome.committed else 'not committed'}")
                elif args.verbose:
                    _say(f"waiting: {decision.reason}")
            if (args.max_runs is not None and runs >= args.max_runs) or (
                args.max_checks is not None and checks >= args.max_checks
            ):
                return 0
            time.sleep(every_s)
    finally:
        probe.close()


def add_watch(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    watch = sub.add_parser("watch", help="run a feed whenever its lag passes its trigger: thresholds")
    watch.add_argument("feed", help="feed name (a file in the feeds folder) or path to a feed YAML")
    watch.add_argument("--master", help="Spark master (default: TIDEMARK_SPARK_MASTER or local[*])")
    watch.add_argument("--check-every", dest="check_every", type=float, help="seconds (default: the feed's)")
    watch.add_argument("--max-runs", dest="max_runs", type=int, help="stop after this many runs")
    watch.add_argument("--max-checks", dest="max_checks", type=int, help="stop after this many checks")
    watch.add_argument("--verbose", action="store_true", help="print every check's reason for waiting")
    watch.set_defaults(func=_watch)
