"""Dead-letter page benchmark: 1,000,000 dead letters render in under a second, memory flat in their number.

Writes ``N`` dead letters as one shown Parquet publication's quarantine (pyarrow, as the job
lays it out: ``<output>/plan_id=<id>/_quarantine/topic=<t>/date=<d>/part-*.parquet`` listed by
the plan's manifest; 12 reason codes over 30 days; each record a 200-byte value, a key and two
headers), then, for each ``N`` of ``--sizes``, in a fresh Python process (so each size's
memory is its own), requests the feed's dead-letter page through the view's app as the
api-server serves it (in-process, without Airflow's auth layer) ``--samples`` times and
reports the first render (cold: the counts read from the files), the median and slowest of
the others (warm: the view keeps a feed's counts and shown examples until its dead letters
change), the process's peak resident memory after the renders less its resident memory
before the first (``VmHWM`` after a reset, less ``VmRSS``; the process warmed up first on a feed
of ten dead letters), Python's own peak allocations during a render
(``tracemalloc``) and pyarrow's pool peak. The target: the largest size's renders under 1 s,
and memory that does not grow with ``N``. The first render's CPU time (all threads) is reported too: on a
shared machine its wall time is mostly waiting for a core. No Kafka, no Spark. Writes the JSON to
``--out`` (``make bench-deadletters`` writes ``docs/benchmarks/bench-deadletters-view.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

TARGET_S = 1.0
FEED = "bench_dead"
TOPIC = "bench-dead"
PLAN = "bench-plan"
FILE_ROWS = 250_000  # rows per quarantine file
REASONS = [f"expect_rule_{i}(value)" for i in range(11)] + ["decode_error"]


def write_letters(root: Path, count: int) -> Path:
    """``count`` dead letters under ``root / "out"`` as one shown publication's quarantine; the output folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tidemark.output.base import FileEntry, Manifest

    output = root / "out"
    plan = output / f"plan_id={PLAN}"
    files: list[FileEntry] = []
    start = datetime(2026, 11, 1, tzinfo=UTC)
    header_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    for first in range(0, count, FILE_ROWS):
        rows = min(FILE_ROWS, count - first)
        offsets = pa.array(range(first, first + rows), pa.int64())
        stamps = pa.array([start + timedelta(seconds=(first + i) * 30 * 86400 // max(count, 1)) for i in range(rows)],
                          pa.timestamp("us", tz="UTC"))  # fmt: skip
        reasons = [REASONS[(first + i) % len(REASONS)] for i in range(rows)]
        table = pa.table({
            "partition": pa.array([(first + i) % 12 for i in range(rows)], pa.int32()),
            "offset": offsets,
            "timestamp": stamps,
            "timestamp_type": pa.array([0] * rows, pa.int32()),
            "key": pa.array([f"key-{first + i}".encode() for i in range(rows)], pa.binary()),
            "value": pa.array([(f"value-{first + i}-" + "x" * 200).encode() for i in range(rows)], pa.binary()),
            "headers": pa.array([[{"key": "trace", "value": b"t"}, {"key": "origin", "value": b"bench"}]] * rows,
                                header_type),
            "_reason": pa.array(reasons, pa.string()),
            "_reason_codes": pa.array([[r] for r in reasons], pa.list_(pa.string())),
        })  # fmt: skip
        name = f"_quarantine/topic={TOPIC}/date=2026-11-01/part-{first // FILE_ROWS:05d}.parquet"
        (plan / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, plan / name)
        files.append(FileEntry(path=name, bytes=(plan / name).stat().st_size, rows=rows, sha256=""))
    manifest = Manifest(plan_id=PLAN, feed=FEED, group="g-bench", location=str(output),
                        published_at=start.isoformat(), records=0, quarantined=count, ranges=(), files=tuple(files),
                        extra={"run_id": "bench-run"})  # fmt: skip
    (plan / "_manifest.json").write_text(json.dumps(manifest.to_dict()))
    return output


def measure(output: Path, samples: int) -> dict[str, Any]:
    """Renders of the dead-letter page of the feed publishing to ``output`` (in this process)."""
    import pyarrow as pa
    from fastapi.testclient import TestClient

    from tidemark.checkpoints.store import SqliteCheckpointStore
    from tidemark.config.models import Feed
    from tidemark.kafka.connection import KafkaConnection
    from tidemark.web.app import create_app

    feed = Feed(name=FEED, topics=(TOPIC,), group="g-bench", output=str(output))
    few = write_letters(output.parent / "few", 10)  # the warm-up's feed: ten dead letters
    empty = Feed(name="bench_few", topics=(TOPIC,), group="g-bench-few", output=str(few))
    store = SqliteCheckpointStore(output.parent / "cp.sqlite")
    app = create_app(feeds=lambda: {FEED: feed, empty.name: empty}, connection=lambda: KafkaConnection("127.0.0.1:9"),
                     checkpoints=lambda: store, dead_letter_rate=(10_000, 1.0))  # fmt: skip
    client = TestClient(app)
    # The process warmed up first (imports, the first request, a template, the readers' first use on ten letters):
    # what follows is the letters' own cost.
    assert client.get(f"/feeds/{empty.name}/deadletters").status_code == 200
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident memory starts again from here (Linux)
    rss_before = _status_kb("VmRSS")
    times, cpu, peaks = [], [], []
    for _ in range(samples):
        tracemalloc.start()
        began, began_cpu = time.perf_counter(), time.process_time()
        response = client.get(f"/feeds/{FEED}/deadletters")
        times.append(time.perf_counter() - began)
        cpu.append(time.process_time() - began_cpu)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert response.status_code == 200, response.text[:500]
    body = client.get(f"/api/feeds/{FEED}/deadletters").json()
    rss_after = _status_kb("VmHWM")
    return {
        "letters": body["records"],
        "groups": body["groups_total"],
        "cold_s": round(times[0], 4),
        "cold_cpu_s": round(cpu[0], 4),
        "warm_median_s": round(statistics.median(times[1:]), 4),
        "warm_slowest_s": round(max(times[1:]), 4),
        "rss_before_mb": round(rss_before / 1024, 1),
        "rss_peak_growth_mb": round((rss_after - rss_before) / 1024, 1),
        "python_peak_mb": round(max(peaks) / 2**20, 2),
        "arrow_pool_peak_mb": round(pa.default_memory_pool().max_memory() / 2**20, 2),
    }


def _status_kb(name: str) -> int:
    """A figure of ``/proc/self/status`` in kB (``VmRSS``: resident now, ``VmHWM``: its peak)."""
    line = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith(f"{name}:"))
    return int(line.split()[1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.deadletters_view", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000", help="dead-letter counts, comma-separated")
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    parser.add_argument("--one", type=Path, default=None, help=argparse.SUPPRESS)  # a child: measure this output
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure(args.one, args.samples)))
        return 0
    results = []
    with tempfile.TemporaryDirectory(prefix="tm-bench-dead-") as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            root = Path(tmp) / f"n{size}"
            began = time.perf_counter()
            output = write_letters(root, size)
            written = time.perf_counter() - began
            child = subprocess.run(
                [sys.executable, "-m", "tests.bench.deadletters_view", "--one", str(output), "--samples",
                 str(args.samples)], capture_output=True, text=True, check=False, env={**os.environ},
            )  # fmt: skip
            if child.returncode != 0:
                print(child.stderr[-3000:], file=sys.stderr)
                return 1
            figures = {**json.loads(child.stdout.strip().splitlines()[-1]), "written_s": round(written, 1)}
            results.append(figures)
            print(json.dumps(figures))
    largest = results[-1]
    doc = {"target_s": TARGET_S, "samples": args.samples, "results": results,
           "met": max(largest["cold_s"], largest["warm_median_s"]) < TARGET_S}  # fmt: skip
    if args.out is not None:
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{largest['letters']:,} dead letters: first render {largest['cold_s']} s, then median "
          f"{largest['warm_median_s']} s (target < {TARGET_S} s)")  # fmt: skip
    return 0 if doc["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
