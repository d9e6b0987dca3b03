"""Masking decoded records (:mod:`tidemark.spark.masking`): each treatment on nested paths, arrays of records,
the key and headers, checked against Python's own HMAC; raw bytes nulled or kept for ``keep_raw``."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.eventlog import event_log_conf
from tidemark.config.masking import MASKED, MASKING_KEY_ENV, Masking, Truncate
from tidemark.config.models import Deserialization
from tidemark.errors import ConfigError
from tidemark.spark.decode import annotate
from tidemark.spark.masking import mask_records, masking_key, raw_columns, split_raw, with_raw
from tidemark.staged import OUTCOME_COLUMN, RAW_HEADERS_COLUMN, RAW_KEY_COLUMN, RAW_VALUE_COLUMN

pytestmark = pytest.mark.spark

TS = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
KEY = b"a-masking-key-of-some-length"
DDL = ("id long, customer struct<email: string, name: string, age: int>, "
       "items array<struct<sku: string, note: string>>")  # fmt: skip
DESER = Deserialization(format="json", schema_ddl=DDL)


def mac(value: str | bytes, key: bytes = KEY) -> str:
    data = value.encode() if isinstance(value, str) else value
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def _records(spark: Any, values: list[dict[str, Any] | None], headers: list[tuple[str, bytes]] | None = None) -> Any:
    from tidemark.spark.source import SCHEMA

    rows = [("t", 0, i, TS, 0, f"key-{i}".encode(), None if v is None else json.dumps(v).encode(),
             headers or [], "plan") for i, v in enumerate(values)]  # fmt: skip
    return annotate(spark.createDataFrame(rows, SCHEMA), DESER)


RECORD = {"id": 1, "customer": {"email": "ann@example.com", "name": "Annabel", "age": 41},
          "items": [{"sku": "s1", "note": "call ann"}, {"sku": "s2", "note": None}]}  # fmt: skip


def masked(spark: Any, masking: Masking, key: bytes | None = KEY, **kw: Any) -> Any:
    return mask_records(_records(spark, [RECORD, None], **kw), masking, key, "orders").orderBy("offset").collect()


def test_hash_is_keyed_hmac_sha256_and_stable(spark: Any) -> None:
    masking = Masking(fields={"customer.email": "hash", "customer.age": "hash"}, key="hash")
    first, second = masked(spark, masking), masked(spark, masking)
    assert first[0].customer.email == mac("ann@example.com") == second[0].customer.email  # stable across runs
    assert first[0].key == mac("key-0")
    assert first[0].customer.age == mac("41")  # a number inside a record: its text's hash, the field now a string
    assert first[0].customer.name == "Annabel"  # the rest untouched
    other = masked(spark, masking, key=b"another-key-of-some-length")
    assert other[0].customer.email == mac("ann@example.com", b"another-key-of-some-length") != first[0].customer.email
    assert first[1].customer is None  # a null record stays null


def test_redact_truncate_and_drop_on_nested_paths(spark: Any) -> None:
    masking = Masking(fields={"customer.email": "redact", "customer.name": Truncate(truncate=3),
                              "customer.age": "drop"})  # fmt: skip
    (row, _) = masked(spark, masking)
    assert row.customer.email == MASKED and row.customer.name == "Ann"
    assert "age" not in row.customer.asDict()


def test_arrays_of_records_are_masked_item_by_item_and_top_level_fields_dropped(spark: Any) -> None:
    (row, _) = masked(spark, Masking(fields={"items.note": "hash", "id": "drop"}))
    assert [(i.sku, i.note) for i in row["items"]] == [("s1", mac("call ann")), ("s2", None)]
    assert "id" not in row.asDict()


def test_headers_by_name_and_the_key(spark: Any) -> None:
    headers = [("x-email", b"ann@example.com"), ("trace", b"t-1"), ("x-drop", b"gone")]
    masking = Masking(headers={"x-email": "hash", "trace": Truncate(truncate=1), "x-drop": "drop"}, key="drop")
    (row, _) = masked(spark, masking, headers=headers)
    assert [(h.key, bytes(h.value)) for h in row.headers] == [("x-email", mac("ann@example.com").encode()),
                                                              ("trace", b"t")]  # fmt: skip
    assert row.key is None


def test_a_path_the_decoded_schema_lacks_or_a_missing_key_is_refused(spark: Any) -> None:
    records = _records(spark, [RECORD])
    with pytest.raises(ConfigError, match=r"feed 'orders': masking.fields.customer.phone: no field 'phone'"):
        mask_records(records, Masking(fields={"customer.phone": "redact"}), KEY, "orders")
    with pytest.raises(
        ConfigError, match=r"masking.fields.address: .* no field 'address' \(its fields: id, customer, items\)"
    ):
        mask_records(records, Masking(fields={"address": "redact"}), KEY, "orders")
    with pytest.raises(ConfigError, match=MASKING_KEY_ENV):
        masking_key(Masking(key="hash"), "orders", {})
    with pytest.raises(ConfigError, match="shorter than 16"):
        masking_key(Masking(key="hash"), "orders", {MASKING_KEY_ENV: "short"})
    assert masking_key(Masking(key="redact"), "orders", {}) is None
    assert masking_key(Masking(key="hash"), "orders", {MASKING_KEY_ENV: KEY.decode()}) == KEY


def test_raw_bytes_are_nulled_or_kept_for_bad_records_only(spark: Any) -> None:
    from pyspark.sql import functions as F

    records = _records(spark, [RECORD, RECORD], headers=[("x-email", b"ann@example.com")])
    outcome = F.when(F.col("offset") == 0, F.lit("ok")).otherwise(F.lit("rules-1")).alias(OUTCOME_COLUMN)
    plain = mask_records(records, Masking(fields={"customer.email": "redact"}), KEY).select("*", outcome)
    assert {r[RAW_VALUE_COLUMN] for r in raw_columns(plain, Masking(key="redact")).collect()} == {None}

    kept = Masking(fields={"customer.email": "redact"}, headers={"x-email": "redact"}, keep_raw="/secured")
    frame = mask_records(with_raw(records), kept, KEY).select("*", outcome)
    rows = raw_columns(frame, kept).orderBy("offset").collect()
    assert rows[0][RAW_VALUE_COLUMN] is None and rows[0][RAW_HEADERS_COLUMN] is None  # good: nothing kept
    assert b"ann@example.com" in bytes(rows[1][RAW_VALUE_COLUMN]) and bytes(rows[1][RAW_KEY_COLUMN]) == b"key-1"
    quarantined, raw = split_raw(raw_columns(frame, kept).where(F.col("offset") == 1))
    (q,) = quarantined.collect()
    assert q[RAW_VALUE_COLUMN] is None and q[RAW_KEY_COLUMN] is None and RAW_HEADERS_COLUMN not in q.asDict()
    assert q.customer.email == MASKED and bytes(q.headers[0].value) == MASKED.encode()
    (r,) = raw.collect()
    assert b"ann@example.com" in bytes(r.value) and bytes(r.headers[0].value) == b"ann@example.com"


# Run in its own Python: an event log is a setting of a new application, and the tests' shared session has none.
LEAK_SCRIPT = """
import json, sys
from pyspark.sql import functions as F
from tests.unit.spark.test_masking import RECORD, _records
from tidemark.config.masking import Masking
from tidemark.spark.masking import mask_records
from tidemark.spark.session import local_session

spark = local_session("tidemark-masking-key", "local[1]")
masking = Masking(fields={"customer.email": "hash", "items.note": "hash", "id": "hash"}, key="hash",
                  headers={"x-email": "hash"})
frame = mask_records(_records(spark, [RECORD, None], headers=[("x-email", b"ann@example.com")]), masking,
                     sys.argv[1].encode(), "orders")
frame = frame.where(F.col("offset") >= 0).orderBy("offset")
rows = frame.collect()
qe = frame._jdf.queryExecution()
plans = [qe.toString(), qe.logical().toString(), qe.analyzed().toString(), qe.optimizedPlan().toString(),
         qe.executedPlan().toString()]
row = rows[0]
print(json.dumps({"plans": plans, "email": row.customer.email, "id": row.id, "key": row.key,
                  "notes": [i.note for i in row["items"]], "header": bytes(row.headers[0].value).decode()}))
spark.stop()
"""


def test_the_masking_key_reaches_no_plan_and_no_event_log(tmp_path: Path) -> None:
    """The key hashes every kind of path (nested, in an array of records, the key, a header) without entering a
    query plan: Spark's own strings (explain, the UI's SQL tab) and an enabled event log never hold it."""
    key = f"masking-key-{uuid.uuid4().hex}"
    conf_dir, events = event_log_conf(tmp_path)
    env = {**os.environ, "SPARK_CONF_DIR": str(conf_dir), "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", LEAK_SCRIPT, key], env=env, capture_output=True, text=True,
                          check=False, cwd=Path(__file__).parents[3])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (out["email"], out["id"], out["key"]) == (mac("ann@example.com", key.encode()), mac("1", key.encode()),
                                                      mac("key-0", key.encode()))  # fmt: skip
    assert out["notes"] == [mac("call ann", key.encode()), None]
    assert out["header"] == mac("ann@example.com", key.encode())
    forms = {key, key.encode().hex(), key.encode().hex().upper()}  # as text, or as a binary literal's hex
    assert "Project" in out["plans"][0] and not [f for f in forms for p in out["plans"] if f in p]
    logs = [p for p in events.rglob("*") if p.is_file()]
    assert logs and any(b"SparkListenerSQLExecutionStart" in p.read_bytes() for p in logs)
    assert [p.name for p in logs for f in forms if f.encode() in p.read_bytes()] == []
    assert key not in proc.stdout + proc.stderr
