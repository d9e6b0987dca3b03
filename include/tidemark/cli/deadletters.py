"""``tidemark deadletters FEED`` and ``tidemark redrive FEED [--dry-run]``: a feed's dead letters.

``deadletters`` lists them by reason and day, with counts and examples, from the feed's
output only (its shown plans' quarantines, :mod:`tidemark.output.deadletters`): no Kafka,
no Spark. ``redrive`` publishes those the feed's current schema and rules let pass into
its output, exactly once, recorded as a run (:mod:`tidemark.runs.redrive`): its Spark work
goes to ``spark-submit`` with ``--master`` or ``TIDEMARK_SPARK_MASTER`` when one is set, as
``tidemark run``'s job does, else into a local session of this process; ``--dry-run`` only
says which would pass. ``--json`` prints documents instead of tables.
"""

from __future__ import annotations

import argparse
import os
from datetime import UTC, datetime
from typing import Any

from tidemark.cli.output import error, print_json, progress, table
from tidemark.config.models import load_feed
from tidemark.output.deadletters import dead_letters, summarize
from tidemark.runs.run import silent


def _since(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO date or time (2026-11-20, 2026-11-20T08:00)") from exc
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _deadletters(args: argparse.Namespace) -> int:
    letters = dead_letters(args.feed, since=args.since, reason=args.reason)
    groups = summarize(letters)
    if args.json:
        print_json({"feed": args.feed, "records": len(letters), "groups": [g.to_dict() for g in groups],
                    "dead_letters": [d.to_dict() for d in letters]})  # fmt: skip
        return 0
    if not letters:
        print(f"no dead letters in feed '{args.feed}'" + (" matching the filters" if args.since or args.reason else ""))
        return 0
    rows = [
        (g.reason, g.day or "-", g.count, ", ".join(f"{e.topic}[{e.partition}]@{e.offset}" for e in g.examples))
        for g in groups
    ]
    print(table(["reason", "day", "records", "examples (topic[partition]@offset)"], rows))
    print(f"{len(letters)} dead letters")
    return 0


def _redrive(args: argparse.Namespace) -> int:
    # Heavy (pyspark, through the decoder): only this command needs it, not the CLI's start.
    from tidemark.job.redrive_job import RedriveJob
    from tidemark.runs.redrive import redrive_feed
    from tidemark.runs.submit import decodes_avro, redrive_submitter
    from tidemark.spark.session import local_session

    master = args.master or os.environ.get("TIDEMARK_SPARK_MASTER")
    say = silent if args.json else progress
    if master:  # the feed's Spark, as `tidemark run` submits its job
        spark: Any = RedriveJob(redrive_submitter(load_feed(args.feed), master=master, progress=say), master)
    else:
        spark = local_session("tidemark-redrive", "local[1]", avro=decodes_avro(args.feed))  # from_avro for Avro
    outcome = redrive_feed(spark, args.feed, since=args.since, reason=args.reason, dry_run=args.dry_run,
                           progress=say)  # fmt: skip
    verdicts = outcome.verdicts
    if args.json:
        print_json({"feed": args.feed, "dry_run": args.dry_run, "run_id": outcome.run_id,
                    "redrive_id": outcome.redrive_id, "state": outcome.state, "published": outcome.published,
                    "settled_first": list(outcome.settled_first), "report": outcome.report_path,
                    "dead_letters": len(verdicts), "would_pass": outcome.passing,
                    "records": [{**v.letter.to_dict(), "passes": v.passes, "reason_codes_now": list(v.reason_codes),
                                 "reason_now": v.reason}
                                for v in verdicts]})  # fmt: skip
        return 1 if outcome.error else 0
    rows = [(f"{v.letter.topic}[{v.letter.partition}]@{v.letter.offset}", "; ".join(v.letter.reason_codes),
             "passes" if v.passes else "; ".join(v.reason_codes)) for v in verdicts]  # fmt: skip
    if rows:
        print(table(["record", "reason then", "now"], rows))
    if args.dry_run:
        print(f"{outcome.passing} of {len(verdicts)} dead letters would now pass (dry run: nothing was published)")
        return 0
    if outcome.error:
        error(outcome.error)
        return 1
    print(
        f"re-drive {outcome.run_id}: {outcome.published} of {len(verdicts)} dead letters published into the "
        f"feed's output ({outcome.passing} pass now); report {outcome.report_path}"
    )
    return 0


def _filters(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("feed", metavar="FEED")
    cmd.add_argument("--since", type=_since, help="only records stamped at or after this ISO date or time (UTC)")
    cmd.add_argument(
        "--reason",
        help="only this reason code (decode_error, or a rule such as "
        "expect_column_values_to_match_regex(value); a rule's name takes every column)",
    )
    cmd.add_argument("--json", action="store_true", help="print JSON instead of a table")


def add_deadletters(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = sub.add_parser("deadletters", help="list a feed's dead letters (quarantined records) by reason and day")
    _filters(cmd)
    cmd.set_defaults(func=_deadletters)
    redrive = sub.add_parser(
        "redrive", help="publish the dead letters the feed's current schema and rules let pass, exactly once, as a run"
    )
    _filters(redrive)
    redrive.add_argument("--dry-run", action="store_true", help="list them with their verdicts, publish nothing")
    redrive.add_argument("--master", help="submit the Spark work to this master (default: TIDEMARK_SPARK_MASTER; "
                         "neither: a local session in this process)")  # fmt: skip
    redrive.set_defaults(func=_redrive)
