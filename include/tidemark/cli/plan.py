"""The ``tidemark plan`` and ``tidemark status`` commands.

``plan FEED`` gathers the feed's offsets, plans one run, saves the plan under the state
dir (``plans/<feed>/<plan_id>.json``) and prints a per-partition table with totals, or
the plan document itself with ``--json``; ``--window-start``/``--window-end`` plan a
backfill instead. ``status FEED`` shows committed offset, checkpoint, log start, end and
lag per partition without planning anything. Both read the connection from the
environment, else from the embedded cluster
(:func:`tidemark.devtools.kafka.cluster.connection_from_env`).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from tidemark.checkpoints.store import default_store
from tidemark.cli.output import table
from tidemark.config.durations import parse_timestamp
from tidemark.config.models import load_feed, state_location
from tidemark.devtools.kafka.cluster import connection_from_env
from tidemark.errors import ConfigError
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.output import publisher_for
from tidemark.planning.plan import PlanStore
from tidemark.planning.requests import RunRequest, Window
from tidemark.runs.gather import plan_feed
from tidemark.runs.status import feed_status


def _plan(args: argparse.Namespace) -> int:
    feed = load_feed(args.feed)
    start = parse_timestamp("--window-start", args.window_start)
    end = parse_timestamp("--window-end", args.window_end)
    if end is not None and start is None:
        raise ConfigError("--window-end needs --window-start")
    request = RunRequest() if start is None else RunRequest("backfill", window=Window(start, end))
    adapter = KafkaAdapter(connection_from_env())
    plan = plan_feed(feed, adapter, default_store(), request, output=publisher_for(feed))  # as a run would plan
    path = PlanStore(state_location()).save(plan)
    if args.json:
        print(plan.to_json())
        return 0
    by_partition: dict[tuple[str, int], list[str]] = defaultdict(list)
    general = []
    for event in plan.events:
        if event.topic is not None and event.partition is not None:
            by_partition[(event.topic, event.partition)].append(event.kind)
        else:
            general.append(event)
    rows = [
        (
            f"{p.topic}[{p.partition}]",
            p.leader,
            p.committed,
            p.checkpoint,
            p.log_start,
            p.end_available,
            p.start,
            p.records,
            p.reason,
            ",".join(by_partition.get(p.key, [])),
        )
        for p in plan.partitions
    ]
    headers = ["partition", "leader", "committed", "checkpoint", "log start", "end", "start", "records", "reason"]
    print(table([*headers, "events"], rows))
    with_data = sum(1 for p in plan.partitions if p.records)
    leaders = len({t.leader for t in plan.tasks})
    print(
        f"\ntotal: {plan.total_records} records in {with_data} of {len(plan.partitions)} partitions; "
        f"{len(plan.tasks)} tasks over {leaders} leaders; {len(plan.events)} events; "
        f"{adapter.requests} admin requests"
    )
    for event in general:
        print(f"warning: {event.message}")
    print(f"plan {plan.plan_id} ({plan.mode}, {plan.isolation}, commit={plan.commit}) saved to {path}")
    return 0


def _status(args: argparse.Namespace) -> int:
    feed = load_feed(args.feed)
    status = feed_status(feed, KafkaAdapter(connection_from_env()), default_store())
    rows = [
        (p.label, p.leader, p.committed, p.checkpoint, p.log_start, p.end, "-" if p.lag is None else p.lag)
        for p in status.partitions
    ]
    print(table(["partition", "leader", "committed", "checkpoint", "log start", "end", "lag"], rows))
    print(f"\nfeed '{feed.name}', group '{feed.group}' ({feed.isolation}): total lag {status.total_lag}")
    if status.unpositioned:
        print(
            f"{status.unpositioned} partitions have no committed offset and no checkpoint: "
            "the next run starts them by policy"
        )
    return 0


def add_planning(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plan = sub.add_parser("plan", help="plan a feed's next run, save the plan and show it")
    plan.add_argument("feed", help="feed name (in the feeds folder) or path to its YAML file")
    plan.add_argument("--json", action="store_true", help="print the plan document instead of the table")
    plan.add_argument("--window-start", dest="window_start", help="plan a backfill from this time (ISO 8601)")
    plan.add_argument("--window-end", dest="window_end", help="backfill up to this time (default: the end now)")
    plan.set_defaults(func=_plan)
    status = sub.add_parser("status", help="show a feed's committed offsets, checkpoints and lag")
    status.add_argument("feed", help="feed name (in the feeds folder) or path to its YAML file")
    status.set_defaults(func=_status)
