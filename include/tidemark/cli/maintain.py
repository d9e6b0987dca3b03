"""``tidemark maintain FEED [--dry-run]``: compact, expire and clean an Iceberg feed's table once.

The same job as the feed's ``tidemark_maintain_<feed>`` DAG (:func:`tidemark.output.maintenance.maintain`),
with the feed's ``maintenance:`` settings (defaults when it has none). ``--dry-run`` says what it
would do and changes nothing (and records nothing). Prints one line per figure, or the report as JSON.
"""

from __future__ import annotations

import argparse

from tidemark.cli.output import print_json, table
from tidemark.config.models import load_feed
from tidemark.output.maintenance import maintain


def _maintain(args: argparse.Namespace) -> int:
    report = maintain(load_feed(args.feed), dry_run=args.dry_run)
    if args.json:
        print_json(report.to_dict(), sort_keys=True)
        return 0
    print(f"{'dry run: ' if report.dry_run else ''}table {report.table} of feed '{report.feed}'")
    rows = [
        ("data files", report.files_before, report.files_after),
        ("bytes", report.bytes_before, report.bytes_after),
    ]
    print(table(["", "before", "after"], rows))
    print(report.summary())
    for note in report.notes:
        print(f"note: {note}")
    return 0


def add_maintain(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    maintain_ = sub.add_parser("maintain", help="compact an Iceberg feed's table, expire snapshots, remove orphans")
    maintain_.add_argument("feed", metavar="FEED")
    maintain_.add_argument("--dry-run", action="store_true", help="say what would be done; change nothing")
    maintain_.add_argument("--json", action="store_true", help="print the maintenance report as JSON")
    maintain_.set_defaults(func=_maintain)
