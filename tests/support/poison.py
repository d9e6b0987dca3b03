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
