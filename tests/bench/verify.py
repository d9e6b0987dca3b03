"""``tidemark verify`` benchmark: ``python -m tests.bench.verify [--records N] [--plans P] [--out FILE]``.

How long the audit of a feed of ``N`` records (default 10 million) takes: every record read
back from Kafka (``read_committed``, in batches) and digested, the output's offsets and raw
bytes read with pyarrow, each range's digest and each record's bytes compared. The goal is
10 million records in at most 2 minutes on the 2-core test machine.

Set-up, outside the timing and without Spark: ``N`` string records (a key and a value of about
100 bytes, the fault suite's shape) are produced to a fresh topic of 3 partitions on the
cluster ``TIDEMARK_BOOTSTRAP_SERVERS`` names (else the embedded one); the same records,
whose offsets are known (a fresh topic, an idempotent producer, one partition at a time), are
written as a Parquet feed's output of ``P`` published plans (default 10), each plan folder
with its data files and a manifest carrying each range's digest (:mod:`tidemark.spark.rowhash`,
the figures the job records) and the files' sha256, exactly the layout a run publishes; the
group's offsets are committed at the ends. Then :func:`tidemark.runs.verify.verify_feed` runs
once (it must be clean) and its wall time, its records per second and the machine's load are
written as JSON (default ``docs/benchmarks/bench-verify.json``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tidemark.config.models import Feed
from tidemark.devtools.kafka.cluster import connection_from_env
from tidemark.kafka.admin import KafkaAdmin, Record, produce
from tidemark.kafka.connection import KafkaConnection, logged
from tidemark.spark.rowhash import range_digest

PARTITIONS = 3
GOAL_S = 120.0
GOAL_RECORDS = 10_000_000


def _value(i: int) -> bytes:
    return f'v-{i}-{{"order": {i}, "amount": {i * 7 % 1000}, "note": "{"x" * 60}"}}'.encode()


def _produce(connection: KafkaConnection, topic: str, records: int) -> None:
    for p in range(PARTITIONS):
        count = len(range(p, records, PARTITIONS))
        produce(connection, topic, (Record(value=_value(i), key=f"k{i}".encode(), partition=p)
                                    for i in range(p, records, PARTITIONS)),
                **{"batch.size": 1_000_000, "linger.ms": 50, "compression.type": "lz4"})  # fmt: skip
        print(f"  produced {count} records to partition {p}", flush=True)


def _publish(output: Path, topic: str, records: int, plans: int, group: str, feed: str) -> dict[tuple[str, int], int]:
    """The records as ``plans`` published plan folders (data files and manifests); the ends per partition."""
    per = [len(range(p, records, PARTITIONS)) for p in range(PARTITIONS)]
    ends: dict[tuple[str, int], int] = {}
    for k in range(plans):
        plan_id = f"bench{k:04d}{uuid.uuid4().hex[:12]}"
        folder = output / f"plan_id={plan_id}"
        ranges, files = [], []
        for p in range(PARTITIONS):
            start, end = per[p] * k // plans, per[p] * (k + 1) // plans
            offsets = np.arange(start, end, dtype=np.int64)
            ids = offsets * PARTITIONS + p
            keys = pa.array([f"k{i}".encode() for i in ids.tolist()], pa.binary())
            values = pa.array([_value(i) for i in ids.tolist()], pa.binary())
            digest = range_digest(topic, p, offsets, keys, values)
            ranges.append({"topic": topic, "partition": p, "start": start, "end": end, "records": digest.records,
                           "first_offset": start if end > start else None,
                           "last_offset": end - 1 if end > start else None, "gaps": 0, "min_timestamp_ms": None,
                           "max_timestamp_ms": None, "bytes": digest.bytes, "checksum": digest.checksum})  # fmt: skip
            relative = f"topic={topic}/date=2026-12-07/part-{p:05d}.parquet"
            path = folder / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            table = pa.table({"partition": pa.array(np.full(len(offsets), p), pa.int32()), "offset": offsets,
                              "key": keys.cast(pa.string()), "value": values.cast(pa.string())})  # fmt: skip
            pq.write_table(table, path)
            data = path.read_bytes()
            files.append({"path": relative, "bytes": len(data), "rows": table.num_rows,
                          "sha256": hashlib.sha256(data).hexdigest()})  # fmt: skip
            ends[(topic, p)] = end
        manifest = {"plan_id": plan_id, "feed": feed, "group": group, "location": str(folder),
                    "published_at": datetime.now(UTC).isoformat(), "records": sum(f["rows"] for f in files),
                    "quarantined": 0, "ranges": ranges, "files": files, "extra": {}, "version": 1}  # fmt: skip
        (folder / "_manifest.json").write_text(json.dumps(manifest))
    return ends


def _commit(connection: KafkaConnection, group: str, ends: dict[tuple[str, int], int]) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(logged(connection.client_config(**{"group.id": group, "enable.auto.commit": False})))
    try:
        consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in ends.items()], asynchronous=False)
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    from tidemark.runs import verify as _v

    verify_feed = _v.verify_feed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=GOAL_RECORDS)
    parser.add_argument("--plans", type=int, default=10)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/bench-verify.json"))
    args = parser.parse_args(argv)
    connection = connection_from_env()
    work = Path(tempfile.mkdtemp(prefix="bench-verify-"))
    os.environ["TIDEMARK_STATE_DIR"] = str(work / "state")
    topic, group, name = f"bench-verify-{uuid.uuid4().hex[:8]}", f"g-bench-verify-{uuid.uuid4().hex[:8]}", "bench"
    KafkaAdmin(connection).create_topic(topic, partitions=PARTITIONS)
    print(f"producing {args.records} records to {topic}", flush=True)
    began = time.perf_counter()
    _produce(connection, topic, args.records)
    produced_s = time.perf_counter() - began
    output = work / "out"
    ends = _publish(output, topic, args.records, args.plans, group, name)
    _commit(connection, group, ends)
    feed = Feed(name=name, topics=(topic,), group=group, output=str(output),
                deserialization={"format": "string"})  # type: ignore[arg-type]  # fmt: skip
    load = os.getloadavg()[0]
    cpu = time.process_time()
    report = verify_feed(feed, connection=connection, batch=args.batch, progress=print)
    cpu = time.process_time() - cpu
    assert report.clean, [f.message for f in report.findings[:5]]
    assert report.kafka_records == args.records == report.output_records, report.to_dict()
    result: dict[str, Any] = {
        "records": args.records, "plans": args.plans, "partitions": PARTITIONS, "batch": args.batch,
        "verify_s": round(report.seconds, 2), "verify_cpu_s": round(cpu, 2),
        "records_per_s": round(args.records / report.seconds), "load_average_1m_before": round(load, 2),
        "cores": os.cpu_count(), "produce_s": round(produced_s, 1),
        "extrapolated_10m_s": round(report.seconds * GOAL_RECORDS / args.records, 1), "goal_10m_s": GOAL_S,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }  # fmt: skip
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
