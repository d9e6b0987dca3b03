"""A keyed table's merge, side by side: ``python -m tests.bench.changes [--out FILE]`` (``make bench-changes``).

A plan of N changes (updates of existing keys and inserts of new ones, some keys changed
several times in the plan) merged into a table of M keys, two ways, each on its own fresh
copy of the same table (SQLite catalog, local files), every round:

- ``tidemark``: :func:`tidemark.output.changes.apply_changes`, what a keyed feed's commit does:
  the plan's staged records read as changes, checked for staleness against the ledger and
  the keys' rows, folded per key, then one transaction of a copy-on-write ``delete`` of the
  changed keys, an ``append`` of their new rows and the ledger property;
- ``pyiceberg``: pyiceberg's own ``Table.upsert`` (join on the key) of the same plan folded
  beforehand (it refuses a key twice in its input), no staleness check, no ledger, and no
  deletes (it has none).

Both tables are compared after each round (they must hold the same rows). Printed: the
median seconds of each and their ratio. N and M are small by default (a quick check);
``TIDEMARK_BENCH_CHANGES_N``, ``TIDEMARK_BENCH_CHANGES_M`` and ``TIDEMARK_BENCH_CHANGES_ROUNDS``
set them (the issue's figure is N=100,000 over M=10,000,000).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from tidemark.output.changes import ChangeSpec, apply_changes
from tidemark.output.iceberg import FEED_KEY, GROUP_KEY, PLAN_KEY, RANGES_KEY, RECORDS_KEY

SPEC = ChangeSpec("bench", ("id",), "state", ())
T0 = datetime(2026, 1, 1, tzinfo=UTC)
ROW = pa.schema([
    ("id", pa.int64()), ("name", pa.string()), ("qty", pa.int64()), ("_kafka_topic", pa.string()),
    ("_kafka_partition", pa.int32()), ("_kafka_offset", pa.int64()), ("_kafka_timestamp", pa.timestamp("us", tz="UTC")),
])  # fmt: skip
RECORDS = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")), ("key", pa.binary()), ("id", pa.int64()), ("name", pa.string()),
    ("qty", pa.int64()),
])  # fmt: skip


def initial(m: int) -> pa.Table:
    """M keys, each written by offset ``id`` of partition 0 (built in Arrow: ten million Python objects per column
    would take longer than the merge)."""
    import pyarrow.compute as pc

    ids = pa.array(range(m), pa.int64())
    t0 = int(T0.timestamp()) * 1_000_000
    return pa.table({
        "id": ids, "name": pc.binary_join_element_wise("n", ids.cast(pa.string()), ""), "qty": ids,
        "_kafka_topic": pa.repeat("t", m), "_kafka_partition": pa.repeat(pa.scalar(0, pa.int32()), m),
        "_kafka_offset": ids,
        "_kafka_timestamp": pc.add(ids, t0).cast(pa.timestamp("us", tz="UTC")),
    }, schema=ROW)  # fmt: skip


def plan_records(n: int, m: int, seed: int) -> pa.Table:
    """N changes at offsets M.. of partition 0: 90% updates of random existing keys (some twice), 10% new keys."""
    rng = random.Random(seed)
    rows = []
    for j in range(n):
        key = rng.randrange(m) if rng.random() < 0.9 else m + j
        offset = m + j
        rows.append({"topic": "t", "partition": 0, "offset": offset, "timestamp": T0 + timedelta(microseconds=offset),
                     "key": None, "id": key, "name": f"v{j}", "qty": j})  # fmt: skip
    return pa.Table.from_pylist(rows, schema=RECORDS)


def folded(records: pa.Table) -> pa.Table:
    """The plan's last change per key as table rows (what pyiceberg's upsert is given)."""
    last: dict[int, dict[str, Any]] = {}
    for r in records.to_pylist():
        last[r["id"]] = {"id": r["id"], "name": r["name"], "qty": r["qty"], "_kafka_topic": r["topic"],
                         "_kafka_partition": r["partition"], "_kafka_offset": r["offset"],
                         "_kafka_timestamp": r["timestamp"]}  # fmt: skip
    return pa.Table.from_pylist(list(last.values()), schema=ROW)


def fresh_table(root: Path, name: str, rows: pa.Table) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(name, uri=f"sqlite:///{root / f'{name}.db'}", warehouse=f"file://{root / name}")
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", schema=ROW, properties={"commit.retry.num-retries": "0"})
    table.append(rows)
    return table


def contents(table: Any) -> list[tuple[Any, ...]]:
    got = table.refresh().scan(selected_fields=("id", "name", "qty", "_kafka_offset")).to_arrow().to_pylist()
    return sorted((r["id"], r["name"], r["qty"], r["_kafka_offset"]) for r in got)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    n = int(os.environ.get("TIDEMARK_BENCH_CHANGES_N", "2000"))
    m = int(os.environ.get("TIDEMARK_BENCH_CHANGES_M", "20000"))
    rounds = int(os.environ.get("TIDEMARK_BENCH_CHANGES_ROUNDS", "3"))
    base = initial(m)
    times: dict[str, list[float]] = {"tidemark": [], "pyiceberg": []}
    for round_no in range(rounds):
        records = plan_records(n, m, seed=round_no)
        with tempfile.TemporaryDirectory(prefix="tidemark-bench-changes-") as tmp:
            root = Path(tmp)
            ours, theirs = fresh_table(root, "ours", base), fresh_table(root, "theirs", base)
            props = {PLAN_KEY: f"bench-{round_no}", FEED_KEY: "bench", GROUP_KEY: "g", RECORDS_KEY: str(n),
                     RANGES_KEY: json.dumps([{"topic": "t", "partition": 0, "start": m, "end": m + n}])}  # fmt: skip
            start = time.perf_counter()
            apply_changes(ours, SPEC, records, props, "ns.t", None)
            times["tidemark"].append(time.perf_counter() - start)
            start = time.perf_counter()
            theirs.upsert(folded(records), join_cols=["id"])
            times["pyiceberg"].append(time.perf_counter() - start)
            assert contents(ours) == contents(theirs), "the two merges left different tables"
        print(
            f"round {round_no}: tidemark {times['tidemark'][-1]:.2f} s, pyiceberg upsert {times['pyiceberg'][-1]:.2f} s"
        )
    ours_s, theirs_s = statistics.median(times["tidemark"]), statistics.median(times["pyiceberg"])
    print(f"N={n:,} changes over M={m:,} keys, median of {rounds}: tidemark {ours_s:.2f} s, pyiceberg Table.upsert "
          f"{theirs_s:.2f} s, ratio tidemark/pyiceberg {ours_s / theirs_s:.2f}")  # fmt: skip
    if args.out is not None:
        args.out.write_text(json.dumps({"n": n, "m": m, "rounds": rounds, "seconds": times,
                                        "median": {"tidemark": ours_s, "pyiceberg": theirs_s},
                                        "ratio": ours_s / theirs_s}, indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
