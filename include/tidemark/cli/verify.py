"""``tidemark verify FEED [--plan PLAN_ID] [--json]``: audit a feed's output against Kafka and the run ledger.

Calls :func:`tidemark.runs.verify.verify_feed` and prints its findings (``docs/verify.md``):
one line per finding naming its kind, the topic, partition and offsets or the file. With
``--plan``, only that plan's ranges are audited (what the feed DAG's ``verify`` task does). Exit 0
when the feed is clean, 1 when anything was found (2, as every command, when Tidemark
refuses: a feed file that does not load, Kafka unreachable).
"""

from __future__ import annotations

import argparse

from tidemark.cli.output import print_json, progress, table
from tidemark.runs.run import silent
from tidemark.runs.verify import show_spans, verify_feed


def _verify(args: argparse.Namespace) -> int:
    report = verify_feed(args.feed, batch=args.batch, progress=silent if args.json else progress, plan=args.plan)
    if args.json:
        print_json(report.to_dict())
        return 0 if report.clean else 1
    rows = [(p["topic"], p["partition"], p["log_start"], p["group"], p["end"], p["kafka_records"], p["output_records"])
            for p in report.partitions]  # fmt: skip
    if rows:
        print(table(["topic", "partition", "log start", "group at", "end", "in Kafka", "in the output"], rows))
    for note in report.notes:
        print(f"note: {note}")
    for f in report.findings:
        where = f.path if f.path else f"{f.topic}[{f.partition}] offsets {show_spans(f.offsets)}"
        print(f"{f.kind}: {where}: {f.message}")
    verdict = "clean" if report.clean else f"{len(report.findings)} findings"
    scope = f" (plan {report.plan})" if report.plan else ""
    print(f"feed '{report.feed}'{scope}: {verdict} ({report.kafka_records} records read from Kafka, "
          f"{report.output_records} in the output, {report.seconds:.1f} s)")  # fmt: skip
    return 0 if report.clean else 1


def add_verify(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    verify = sub.add_parser("verify", help="audit a feed's output against Kafka and the run ledger (exit 1: findings)")
    verify.add_argument("feed", metavar="FEED")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.add_argument("--plan", metavar="PLAN_ID", help="audit only this plan's ranges (default: the whole feed)")
    verify.add_argument("--batch", type=int, default=10_000, help="records per Kafka consume() call")
    verify.set_defaults(func=_verify)
