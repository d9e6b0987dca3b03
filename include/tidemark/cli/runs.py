"""``tidemark runs FEED``, ``tidemark report RUN`` and ``tidemark abandon FEED RUN``: the runs from the command line.

``runs`` lists a feed's recent runs, newest first, one line each (status, plan, counts,
commit, Data Docs); ``report`` prints one run's report as JSON. Both read the state dir
only (no Kafka, no Spark), so they work while the cluster is down.
"""

from __future__ import annotations

import argparse

from tidemark.cli.output import print_json, table
from tidemark.runs.pipeline import abandon_run
from tidemark.runs.report import RunReport, list_runs, load_report


def _counts(report: RunReport) -> str:
    c = report.counts
    parts = [f"{c['planned']} planned"] if "planned" in c else []
    parts += [f"{c[k]} {k}" for k in ("rows", "good", "quarantined") if k in c]
    return ", ".join(parts) or "-"


def _commit(report: RunReport) -> str:
    if report.commit is None:
        return "-"
    return str(report.commit.get("status", "-"))


def _runs(args: argparse.Namespace) -> int:
    reports = list_runs(args.feed, limit=args.limit)
    if args.json:
        print_json([r.model_dump(mode="json") for r in reports], sort_keys=True)
        return 0
    if not reports:
        print(f"no runs of feed '{args.feed}' yet")
        return 0
    rows = [
        (
            r.run_id,
            r.status,
            r.mode or "-",
            r.plan_id or "-",
            _counts(r),
            _commit(r),
            r.finished_at or r.started_at or "-",
            (r.error or "")[:60],
        )
        for r in reports
    ]
    print(table(["run", "status", "mode", "plan", "records", "commit", "finished", "error"], rows))
    return 0


def _report(args: argparse.Namespace) -> int:
    report = load_report(args.run, feed=args.feed)
    print_json(report.model_dump(mode="json"), sort_keys=True)
    return 0 if report.status != "failed" else 1


def _abandon(args: argparse.Namespace) -> int:
    settled = abandon_run(args.feed, args.run, args.reason)
    print(settled.events[0].message)
    return 0


def add_runs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    runs = sub.add_parser("runs", help="list a feed's recent runs (newest first)")
    runs.add_argument("feed", metavar="FEED")
    runs.add_argument("--limit", type=int, default=20, help="how many runs to show (default 20)")
    runs.add_argument("--json", action="store_true", help="print the reports as a JSON list")
    runs.set_defaults(func=_runs)
    report = sub.add_parser("report", help="print one run's report as JSON")
    report.add_argument("run", metavar="RUN", help="a run id (from 'tidemark runs FEED') or a report.json path")
    report.add_argument("--feed", help="the feed, when the run id exists for several feeds")
    report.set_defaults(func=_report)
    abandon = sub.add_parser(
        "abandon", help="give up a run that cannot be finished (its staged publication is discarded, never shown)"
    )
    abandon.add_argument("feed", metavar="FEED")
    abandon.add_argument("run", metavar="RUN", help="the run id an error named (see 'tidemark runs FEED')")
    abandon.add_argument("--reason", default="given up", help="why, for the run's record")
    abandon.set_defaults(func=_abandon)
