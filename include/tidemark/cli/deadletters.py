"""``tidemark deadletters FEED``: a feed's dead letters by reason and day, with counts and examples.

Reads the feed's output only (its shown plans' quarantines, :mod:`tidemark.output.deadletters`):
no Kafka, no Spark. ``--json`` prints the summary and every matching record.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from tidemark.cli.output import print_json, table
from tidemark.output.deadletters import dead_letters, summarize


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


def add_deadletters(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = sub.add_parser("deadletters", help="list a feed's dead letters (quarantined records) by reason and day")
    cmd.add_argument("feed", metavar="FEED")
    cmd.add_argument("--since", type=_since, help="only records stamped at or after this ISO date or time (UTC)")
    cmd.add_argument(
        "--reason",
        help="only this reason code (decode_error, or a rule such as "
        "expect_column_values_to_match_regex(value); a rule's name takes every column)",
    )
    cmd.add_argument("--json", action="store_true", help="print the summary and the records as JSON")
    cmd.set_defaults(func=_deadletters)
