"""A topic of good and poison records for the dead-letter and re-drive tests: records numbered on, where every
fifth does not decode as text, every seventh breaks the feed's rule (``x-<i>``), every eleventh is a tombstone
(null passes every rule) and the rest are good (``v-<i>``); and an Iceberg feed's dead-letter table as pyiceberg's
own catalog reads it (:func:`table_rows`), not through Tidemark's reader."""

from __future__ import annotations

import os
from collections import Counter

from tests.faults.harness import FaultEnv, Row, digest
from tidemark.kafka.admin import Record

UNDECODABLE = b"\xff\xfe-not-utf8"


def produce_with_poison(env: FaultEnv, count: int) -> None:
    """``count`` records numbered on from the last, each with an ``origin`` header (module docstring)."""
    records = []
    for i in range(env.sent, env.sent + count):
        value: bytes | None = f"v-{i}".encode()
        if i % 5 == 1:
            value = UNDECODABLE + str(i).encode()
        elif i % 7 == 2:
            value = f"x-{i}".encode()
        elif i % 11 == 3:
            value = None
        records.append(Record(value=value, key=f"k{i}".encode(), partition=i % env.partitions,
                              headers=(("origin", f"h{i}".encode()),)))  # fmt: skip
    env.sent += count
    env.kafka.produce(env.topic, records)


def table_rows(env: FaultEnv) -> Counter[Row]:
    """The Iceberg feed's dead-letter table (its default name, ``<table>_dead_letters``) as pyiceberg's own catalog
    reads it: each row's record and value digest; every row names its plan, run and reasons."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError

    assert env.iceberg is not None
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
