"""The benchmark charts, drawn with matplotlib (a dev dependency: benchmarks are not runtime code).

Each chart names what it measured and when (the run's date and time, UTC) in its title, titles both axes with
their units, labels every bar on its axis and its value on the bar, and says in a legend what the colours mean, so a
reader needs neither the JSON nor this file to read it. The figure builders return the figure (tests read its
labels); ``save`` writes it and frees it. ``python -m tests.bench.charts FILE.json...`` redraws the PNG beside each
benchmark result (the read, Avro and small-run ones) from the JSON alone.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Figures built without pyplot: no GUI backend, no global figure registry to leak into.
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import StrMethodFormatter

TIDEMARK = "#2f5bb7"
SPARK = "#8c8c8c"
FLOOR = "#d0d0d0"

# The read and Avro benchmarks' runners by what they stand for (tests/bench/read.py's, avro.py's docstrings).
TIDEMARK_RUNNERS = {"R3", "R6", "A3b", "A3", "A6"}
SPARK_RUNNERS = {"R4", "R4w", "A4w"}
KINDS = (
    (TIDEMARK, "Tidemark"),
    (SPARK, "Spark's own Kafka source"),
    (FLOOR, "floors: Kafka's Java consumer, one confluent-kafka process, Spark's Python data source without Kafka"),
)


def measured(doc: dict[str, Any]) -> str:
    """When the benchmark ran, as a title says it: ``measured 2026-11-24 01:05 UTC`` ('' when the JSON lacks it)."""
    when = doc.get("when")
    if not when:
        return ""
    return f"measured {datetime.fromisoformat(str(when)).astimezone(UTC):%Y-%m-%d %H:%M} UTC"


def _colour(name: str) -> str:
    return TIDEMARK if name in TIDEMARK_RUNNERS else SPARK if name in SPARK_RUNNERS else FLOOR


def read_figure(doc: dict[str, Any]) -> Figure:
    """Median records/s per runner of ``make bench``, one horizontal bar each, in run order."""
    runners = [r for r in doc["runners"].values() if not r["error"]]
    fig = Figure(figsize=(11, 0.55 * len(runners) + 3.2), layout="constrained")
    ax = fig.subplots()
    values = [r["median_records_per_s"] for r in runners]
    bars = ax.barh([f"{r['name']}  {r['label']}" for r in runners], values, color=[_colour(r["name"]) for r in runners])
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], padding=4, fontsize=9)
    ax.invert_yaxis()  # top to bottom in the order the runners ran
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.set_xlabel("records per second, median of the measured runs (higher is better)")
    ax.set_ylabel("runner (in the order they ran)")
    what = doc.get("what", f"Reading {doc['records']:,} records of {doc['value_bytes']} B")
    ax.set_title(
        f"{what} from {doc['partitions']} partitions\n"
        f"{doc['runs']} measured runs per runner, {doc['cpus']} CPUs, Spark {doc['spark_version']} "
        f"{doc['spark_master']}" + (f", {measured(doc)}" if measured(doc) else ""),
        fontsize=10,
    )
    shown = {_colour(r["name"]) for r in runners}
    kinds = [Patch(color=c, label=label) for c, label in KINDS if c in shown]
    fig.legend(handles=kinds, loc="outside lower center", fontsize=8)
    ax.margins(x=0.18)
    return fig


def small_runs_figure(doc: dict[str, Any]) -> Figure:
    """Seconds per small run of ``make bench-small``: Tidemark beside Spark's Kafka source, per size."""
    rows = doc["table"]
    fig = Figure(figsize=(2.4 * len(rows) + 3.5, 4.8), layout="constrained")
    ax = fig.subplots()
    width = 0.38
    sides = (
        (-width / 2, "tidemark_s", "tidemark run: plan, read, validate, publish, commit", TIDEMARK),
        (width / 2, "spark_s", "Spark's Kafka source: the same offsets to Parquet, no validation or commit", SPARK),
    )
    for offset, key, label, colour in sides:
        bars = ax.bar([i + offset for i in range(len(rows))], [r[key] for r in rows], width, label=label, color=colour)
        ax.bar_label(bars, fmt="%.1f s", padding=3, fontsize=9)
    ax.set_xticks(range(len(rows)), [f"{r['records']:,} records" for r in rows])
    ax.set_ylabel("seconds per run, median (lower is better)")
    ax.set_xlabel("records in the run")
    ax.set_title(
        f"Small runs, each in a fresh process with its JVM start: medians of {doc['runs']} interleaved rounds\n"
        f"({doc['warmups']} warm-up dropped), {doc['cores']} cores" + (f", {measured(doc)}" if measured(doc) else ""),
        fontsize=10,
    )
    ax.legend(loc="upper left", fontsize=8)
    ax.margins(y=0.2)
    return fig


def save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=110)


def redraw(path: Path) -> Path:
    """The PNG beside a benchmark's JSON, drawn again from it: a small-run table or a read/Avro runner set."""
    doc = json.loads(path.read_text())
    fig = small_runs_figure(doc) if "table" in doc and "runners" not in doc else read_figure(doc)
    out = path.with_suffix(".png")
    save(fig, out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    for name in argv if argv is not None else sys.argv[1:]:
        print(redraw(Path(name)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
