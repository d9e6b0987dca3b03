"""Tidemark's own share of emitting metrics and lineage: ``python -m tests.bench.emit RUN_DIR [--repeat N]``.

Times, in-process, what Tidemark's tasks do for one run when metrics and lineage are on:
the plan task's metrics and lineage description, the Spark task's START and COMPLETE
facets, the commit task's metrics (Airflow's StatsD client sending to a UDP socket
opened here). ``RUN_DIR`` is a finished run's folder (``plan.json``, ``job.json``,
``report.json``). What ``make bench-observe`` measures beyond this is Airflow's own
machinery (its StatsD client and the OpenLineage provider's listener).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    os.environ.update({
        "AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(listener.getsockname()[1]),
        "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True",
    })  # fmt: skip
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    from tidemark.config.models import Feed
    from tidemark.orchestration import lineage, metrics
    from tidemark.planning.plan import Plan

    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
    plan = Plan.from_json((args.run_dir / "plan.json").read_text())
    feed = Feed(name=plan.feed, topics=tuple(sorted({p.topic for p in plan.partitions})), group=plan.group)
    samples = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        metrics.planned(plan)
        doc = lineage.describe(feed, plan, "127.0.0.1:9092")
        lineage.operator_lineage(doc)  # START
        lineage.operator_lineage(doc)  # COMPLETE
        metrics.finished(plan.feed, str(args.run_dir), str(args.run_dir / "report.json"), committed=True)
        samples.append(time.perf_counter() - started)
    listener.close()
    print(f"{len(plan.partitions)} partitions, {args.repeat} runs: Tidemark's metrics and lineage work "
          f"median {statistics.median(samples) * 1000:.2f} ms per run (first {samples[0] * 1000:.1f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
