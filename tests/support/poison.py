"""A topic of good and poison records for the dead-letter and re-drive tests: records numbered on, where every
fifth does not decode, every seventh breaks the feed's rule (``x-<i>``), every eleventh is a tombstone and the rest
are good (``v-<i>``); and an Iceberg feed's dead-letter table as pyiceberg's own catalog reads it (:func:`table_rows`),
not through Tidemark's reader.

:func:`produce_with_poison` writes string values (a value that does not decode is not UTF-8; null passes every
rule); :func:`produce_json_with_poison` writes JSON records of :data:`JSON_DDL` whose sensitive fields, key and
``x-user`` header carry a marker (a value that does not decode is the record cut short after the marker; a
tombstone lacks the required ``id``, so it does not decode either), the rule's field being ``tier``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from tests.faults.harness import FaultEnv, Row, digest
from tidemark.kafka.admin import Record

UNDECODABLE = b"\xff\xfe-not-utf8"
JSON_DDL = "id long NOT NULL, customer struct<email: string, name: string>, tier string"


def kind_of(i: int) -> str:
    """What record ``i`` is: ``undecodable``, ``refused`` (breaks the rule), ``tombstone`` or ``good``."""
    if i % 5 == 1:
        return "undecodable"
    if i % 7 == 2:
        return "refused"
    if i % 11 == 3:
        return "tombstone"
    return "good"


def produce_with_poison(env: FaultEnv, count: int) -> None:
    """``count`` records numbered on from the last, each with an ``origin`` header (module docstring)."""
    records = []
    for i in range(env.sent, env.sent + count):
        kind = kind_of(i)
        value: bytes | None = f"v-{i}".encode()
        if kind == "undecodable":
            value = UNDECODABLE + str(i).encode()
        elif kind == "refused":
            value = f"x-{i}".encode()
        elif kind == "tombstone":
            value = None
        records.append(Record(value=value, key=f"k{i}".encode(), partition=i % env.partitions,
                              headers=(("origin", f"h{i}".encode()),)))  # fmt: skip
    env.sent += count
    env.kafka.produce(env.topic, records)


def produce_json_with_poison(env: FaultEnv, count: int, marker: str) -> None:
    """``count`` JSON records numbered on from the last, ``marker`` in ``customer.email``, ``customer.name``, the
    key and the ``x-user`` header (module docstring)."""
    records = []
    for i in range(env.sent, env.sent + count):
        kind = kind_of(i)
        doc = {"id": i, "customer": {"email": f"{marker}.{i}@example.com", "name": f"{marker}-n{i}"},
               "tier": f"x-{i}" if kind == "refused" else f"v-{i}"}  # fmt: skip
        whole = json.dumps(doc).encode()
        value: bytes | None = whole
        if kind == "undecodable":
            value = whole[: whole.index(b"@")]  # the marker, then no end
        elif kind == "tombstone":
            value = None
        headers = (("x-user", f"{marker}-h{i}".encode()), ("origin", f"h{i}".encode()))
        records.append(Record(value=value, key=f"{marker}-key-{i}".encode(), partition=i % env.partitions,
                              headers=headers))  # fmt: skip
    env.sent += count
    env.kafka.produce(env.topic, records)


def table_rows(env: FaultEnv) -> Counter[Row]:
    """The feed's dead-letter table read by other tools than Tidemark's: each row's record and value digest.

    An Iceberg feed's: its table (default name ``<table>_dead_letters``) as pyiceberg's own catalog reads it, every
    row naming its plan, run and reasons. A Parquet feed's (local output): the quarantine files each published
    plan's ``_manifest.json`` lists, read with pyarrow, the raw value where decoding kept it aside (``_raw_value``),
    else the value column; every row with its reason."""
    if env.iceberg is None:
        return _parquet_rows(Path(env.output))
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError

    uri = os.environ.get("TIDEMARK_ICEBERG_CATALOG_URI") or f"sqlite:///{env.root / 'iceberg_catalog.sqlite'}"
    catalog = load_catalog("tidemark", uri=uri, **{"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"})
    try:
        table = catalog.load_table(f"{env.iceberg}_dead_letters")
    except NoSuchTableError:
        return Counter()
    rows = table.scan().to_arrow().to_pylist()
    assert all(r["feed"] == env.feed and r["plan_id"] and r["run_id"] and r["reason_codes"] and r["reason"]
               for r in rows)  # fmt: skip
    return Counter((r["topic"], r["partition"], r["offset"], digest(r["value"])) for r in rows)


def _parquet_rows(output: Path) -> Counter[Row]:
    rows: Counter[Row] = Counter()
    for manifest in output.glob("plan_id=*/_manifest.json"):
        for entry in json.loads(manifest.read_text())["files"]:
            if not entry["path"].startswith("_quarantine/"):
                continue
            table = pq.read_table(manifest.parent / entry["path"])
            # As bytes: a value kept as the string column may hold what does not decode as UTF-8.
            values = table.column("value").cast(pa.binary()).to_pylist()
            kept = "_raw_value" in table.column_names
            raws = table.column("_raw_value").to_pylist() if kept else [None] * len(values)
            # The topic is a Hive folder (``_quarantine/topic=<t>/date=<d>/``), not a column of the file.
            topic = unquote(next(p for p in entry["path"].split("/") if p.startswith("topic="))[len("topic=") :])
            where = table.select(["partition", "offset", "_reason"]).to_pylist()
            for r, value, raw in zip(where, values, raws, strict=True):
                assert r["_reason"], r
                rows[(topic, r["partition"], r["offset"], digest(raw if raw is not None else value))] += 1
    return rows
