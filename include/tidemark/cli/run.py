"""``tidemark run``, ``tidemark backfill`` and ``tidemark replay``: one whole run from the CLI.

Each plans, submits the Spark job with ``spark-submit`` (``local[*]`` unless
``--master`` or ``TIDEMARK_SPARK_MASTER`` says otherwise), commits where the run
commits, and prints progress lines and a summary: ranges, records, validation, output
and committed offsets. Connection settings come from the environment.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tidemark.cli.output import progress as _progress
from tidemark.cli.output import table
from tidemark.devtools.kafka.cluster import connection_from_env
from tidemark.planning.requests import COMMIT_PARAMS, END_CHOICES, SPEC_PARAMS, START_CHOICES
from tidemark.runs.pipeline import run_feed


def summarize(handle: Any, job: dict[str, Any], outcome: Any) -> str:
    """The per-run summary the CLI and the demo print."""
    plan = handle.plan()
    stats = {(s["topic"], s["partition"]): s for s in job.get("ranges", [])}
    rows = []
    for p in plan.partitions:
        s = stats.get((p.topic, p.partition), {})
        rows.append(
            (
                f"{p.topic}[{p.partition}]",
                p.start,
                p.end,
                p.reason,
                s.get("records", 0),
                s.get("gaps", 0),
                outcome.offsets.get(f"{p.topic}[{p.partition}]", "-"),
            )
        )
    validation = job.get("validation") or {}
    lines = [
        table(["partition", "start", "end", "start reason", "records", "gaps", "committed"], rows),
        f"plan      {plan.plan_id} ({handle.mode}), {plan.total_records} records planned",
        f"validated {'passed' if validation.get('success', True) else 'FAILED'}: "
        f"{validation.get('good_records', job.get('records', 0))} good, "
        f"{validation.get('quarantined_records', 0)} quarantined",
        f"output    {(job.get('manifest') or {}).get('location', '-')}",
        f"commit    {'committed' if outcome.committed else 'not committed: ' + str(outcome.skipped_reason)}",
        f"report    {outcome.report_path}",
    ]
    if plan.events:
        lines.append("events:")
        lines.extend(f"  - {e.kind}: {e.message}" for e in plan.events)
    return "\n".join(lines)


def _execute(args: argparse.Namespace, mode: str, params: dict[str, Any]) -> int:
    handle, job, outcome = run_feed(
        args.feed, connection_from_env(), mode=mode, params=params, master=args.master, progress=_progress
    )
    if args.json:
        print(json.dumps({"run": handle.to_xcom(), "job": job, "commit": outcome.to_xcom()}, indent=2, default=str))
    else:
        print(summarize(handle, job, outcome))
    return 0


def _run(args: argparse.Namespace) -> int:
    return _execute(args, "scheduled", {})


def _window_params(args: argparse.Namespace) -> dict[str, Any]:
    pairs = (("window_mode", args.window_mode), ("max_skew", args.max_skew), ("output", args.output),
             ("topics", args.topics), ("partitions", args.partitions))  # fmt: skip
    return {k: v for k, v in pairs if v is not None} | {"dry_run": args.dry_run}


def _backfill(args: argparse.Namespace) -> int:
    params = {"start_timestamp": args.start, "end_timestamp": args.end, "commit": args.commit,
              "allow_gap": args.allow_gap}  # fmt: skip
    return _execute(args, "backfill", {**params, **_window_params(args)})


def _replay(args: argparse.Namespace) -> int:
    params = {k: v for k, v in vars(args).items() if k in _REPLAY_KEYS and v is not None}
    return _execute(args, "replay", {**params, **_window_params(args)})


_REPLAY_KEYS = SPEC_PARAMS + COMMIT_PARAMS  # the window and selection flags: _window_params


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("feed", help="feed name (a file in the feeds folder) or path to a feed YAML")
    parser.add_argument("--master", help="Spark master (default: TIDEMARK_SPARK_MASTER or local[*])")
    parser.add_argument("--json", action="store_true", help="print the run's documents as JSON")


def _commit_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--commit", action="store_true",
        help="commit the group's offsets afterwards: publishes to the feed's output and must start at the committed "
        "offsets",
    )  # fmt: skip
    parser.add_argument(
        "--allow-gap", dest="allow_gap", action="store_true",
        help="with --commit: allow a start past the committed offsets (the skipped records are in no output; each "
        "skipped range is an event)",
    )  # fmt: skip


def _window_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--window-mode", dest="window_mode", choices=("exact", "offset_cut"),
        help="timestamp bounds: exact keeps exactly the records stamped in the window (default: the feed's "
        "time_windows.mode, exact unless set); offset_cut reads from the first offset at/after start to the first "
        "at/after end",
    )  # fmt: skip
    parser.add_argument(
        "--max-skew", dest="max_skew",
        help="exact windows: how far a record's timestamp may lag behind an earlier one's (30s, 10m, PT10M; "
        "default: the feed's time_windows.max_skew, 10m unless set)",
    )  # fmt: skip
    parser.add_argument("--output", help="where to publish (default: the feed's output with .backfills/.replays)")
    parser.add_argument("--topics", help="comma-separated topics of the feed (default: all)")
    parser.add_argument("--partitions", help="comma-separated partition numbers (default: all)")
    parser.add_argument("--dry-run", dest="dry_run", action="store_true", help="plan only: read nothing")


def add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="plan, read, validate, publish and commit one run of a feed")
    _common(run)
    run.set_defaults(func=_run)

    backfill = sub.add_parser("backfill", help="read the records of a timestamp window [start, end)")
    _common(backfill)
    backfill.add_argument("--start", required=True, help="window start, ISO 8601 with timezone (inclusive)")
    backfill.add_argument("--end", required=True, help="window end, ISO 8601 with timezone (exclusive)")
    _commit_flags(backfill)
    _window_flags(backfill)
    backfill.set_defaults(func=_backfill)

    replay = sub.add_parser("replay", help="re-read a feed from any start to any end")
    _common(replay)
    replay.add_argument("--start-from", dest="start_from", choices=START_CHOICES, default="committed")
    replay.add_argument("--start-timestamp", dest="start_timestamp")
    replay.add_argument("--start-offset", dest="start_offset", type=int)
    replay.add_argument(
        "--shift-by", dest="shift_by", type=int, help="records to move from committed (negative rewinds)"
    )
    replay.add_argument("--duration", help="ISO 8601 duration for --start-from by_duration, e.g. PT6H")
    replay.add_argument("--end-at", dest="end_at", choices=END_CHOICES, default="latest")
    replay.add_argument("--end-timestamp", dest="end_timestamp")
    replay.add_argument("--end-offset", dest="end_offset", type=int)
    _commit_flags(replay)
    _window_flags(replay)
    replay.set_defaults(func=_replay)
