"""Masking decoded records (:mod:`tidemark.spark.masking`): each treatment on nested paths, arrays of records,
the key and headers, checked against an independent HKDF (``cryptography``'s) and Python's own HMAC; keys per feed
and field, weak keys refused; raw bytes nulled or kept for ``keep_raw``."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from tests.support.eventlog import event_log_conf
from tidemark.config.masking import MASKED, MASKING_KEY_ENV, Masking, Truncate, field_key
from tidemark.config.models import Deserialization
from tidemark.errors import ConfigError
from tidemark.spark.decode import annotate
from tidemark.spark.masking import mask_records, masking_key, raw_columns, split_raw, with_raw
from tidemark.staged import OUTCOME_COLUMN, RAW_HEADERS_COLUMN, RAW_KEY_COLUMN, RAW_VALUE_COLUMN

pytestmark = pytest.mark.spark

TS = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
KEY = secrets.token_hex(32).encode()  # 256 random bits, as 64 hex digits
DDL = ("id long, customer struct<email: string, name: string, age: int>, "
       "items array<struct<sku: string, note: string>>")  # fmt: skip
DESER = Deserialization(format="json", schema_ddl=DDL)


def mac(value: str | bytes, field: str, key: bytes = KEY, feed: str = "orders") -> str:
    """The hash of ``value`` in ``field`` of ``feed``, computed apart from Tidemark: HKDF-SHA256 (RFC 5869, no salt,
    info ``tidemark masking v1``, the feed and the field, NUL-separated) of the masking key, then HMAC-SHA256."""
    info = b"\0".join((b"tidemark masking v1", feed.encode(), field.encode()))
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(key)
    data = value.encode() if isinstance(value, str) else value
    return hmac.new(derived, data, hashlib.sha256).hexdigest()


def _records(spark: Any, values: list[dict[str, Any] | None], headers: list[tuple[str, bytes]] | None = None) -> Any:
    from tidemark.spark.source import SCHEMA

    rows = [("t", 0, i, TS, 0, f"key-{i}".encode(), None if v is None else json.dumps(v).encode(),
             headers or [], "plan") for i, v in enumerate(values)]  # fmt: skip
    return annotate(spark.createDataFrame(rows, SCHEMA), DESER)


RECORD = {"id": 1, "customer": {"email": "ann@example.com", "name": "Annabel", "age": 41},
          "items": [{"sku": "s1", "note": "call ann"}, {"sku": "s2", "note": None}]}  # fmt: skip


def masked(spark: Any, masking: Masking, key: bytes | None = KEY, feed: str = "orders", **kw: Any) -> Any:
    return mask_records(_records(spark, [RECORD, None], **kw), masking, key, feed).orderBy("offset").collect()


def test_hash_is_keyed_hmac_sha256_and_stable(spark: Any) -> None:
    masking = Masking(fields={"customer.email": "hash", "customer.age": "hash"}, key="hash")
    first, second = masked(spark, masking), masked(spark, masking)
    email = mac("ann@example.com", "customer.email")
    assert first[0].customer.email == email == second[0].customer.email  # stable across runs
    assert first[0].key == mac("key-0", "key")
    assert first[0].customer.age == mac("41", "customer.age")  # a number: its text's hash, the field now a string
    assert first[0].customer.name == "Annabel"  # the rest untouched
    another = secrets.token_hex(32).encode()
    other = masked(spark, masking, key=another)
    assert other[0].customer.email == mac("ann@example.com", "customer.email", another) != email
    assert first[1].customer is None  # a null record stays null


def test_two_feeds_and_two_fields_hash_one_value_to_unrelated_digests(spark: Any) -> None:
    """A team hashing guesses through its own feed learns nothing of another feed's (or field's) hashed values."""
    masking = Masking(fields={"customer.email": "hash", "customer.name": "hash"}, key="hash")
    orders = masked(spark, masking, feed="orders")[0]
    billing = masked(spark, masking, feed="billing")[0]
    assert billing.customer.email == mac("ann@example.com", "customer.email", feed="billing")
    assert orders.customer.email == mac("ann@example.com", "customer.email", feed="orders") != billing.customer.email
    assert orders.key != billing.key and orders.key == mac("key-0", "key")
    named = mask_records(
        _records(spark, [{**RECORD, "customer": {"email": "Annabel", "name": "Annabel", "age": 1}}]), masking, KEY,
        "orders",
    ).first()  # fmt: skip
    assert named.customer.email == mac("Annabel", "customer.email") != named.customer.name
    assert named.customer.name == mac("Annabel", "customer.name")
    # The plain HMAC under the shared key (what every feed and field gave before) is none of them.
    assert hmac.new(KEY, b"ann@example.com", hashlib.sha256).hexdigest() not in (orders.customer.email,
                                                                                 billing.customer.email)  # fmt: skip


def test_redact_truncate_and_drop_on_nested_paths(spark: Any) -> None:
    masking = Masking(fields={"customer.email": "redact", "customer.name": Truncate(truncate=3),
                              "customer.age": "drop"})  # fmt: skip
    (row, _) = masked(spark, masking)
    assert row.customer.email == MASKED and row.customer.name == "Ann"
    assert "age" not in row.customer.asDict()


def test_arrays_of_records_are_masked_item_by_item_and_top_level_fields_dropped(spark: Any) -> None:
    (row, _) = masked(spark, Masking(fields={"items.note": "hash", "id": "drop"}))
    assert [(i.sku, i.note) for i in row["items"]] == [("s1", mac("call ann", "items.note")), ("s2", None)]
    assert "id" not in row.asDict()


def test_headers_by_name_and_the_key(spark: Any) -> None:
    headers = [("x-email", b"ann@example.com"), ("trace", b"t-1"), ("x-drop", b"gone")]
    masking = Masking(headers={"x-email": "hash", "trace": Truncate(truncate=1), "x-drop": "drop"}, key="drop")
    (row, _) = masked(spark, masking, headers=headers)
    assert [(h.key, bytes(h.value)) for h in row.headers] == [
        ("x-email", mac("ann@example.com", "headers.x-email").encode()), ("trace", b"t")]  # fmt: skip
    assert row.key is None


def test_header_names_are_matched_whatever_their_case(spark: Any) -> None:
    """A producer writing ``X-Email`` (or ``X-EMAIL``) for the header the feed masks as ``x-email`` is masked too."""
    headers = [("X-Email", b"ann@example.com"), ("X-EMAIL", b"bob@example.com"), ("TRACE", b"t-1"),
               ("X-Drop", b"gone"), ("x-emails", b"kept")]  # fmt: skip
    masking = Masking(headers={"x-email": "hash", "Trace": "redact", "x-drop": "drop"})
    (row, _) = masked(spark, masking, headers=headers)
    assert [(h.key, bytes(h.value)) for h in row.headers] == [
        ("X-Email", mac("ann@example.com", "headers.x-email").encode()),
        ("X-EMAIL", mac("bob@example.com", "headers.x-email").encode()),
        ("TRACE", MASKED.encode()), ("x-emails", b"kept"),  # a name that merely starts alike is not the header
    ]  # fmt: skip
    with pytest.raises(ValueError, match="'x-email' and 'X-Email' name the same header"):
        Masking(headers={"x-email": "hash", "X-Email": "redact"})


def test_a_path_the_decoded_schema_lacks_or_a_missing_key_is_refused(spark: Any) -> None:
    records = _records(spark, [RECORD])
    with pytest.raises(ConfigError, match=r"feed 'orders': masking.fields.customer.phone: no field 'phone'"):
        mask_records(records, Masking(fields={"customer.phone": "redact"}), KEY, "orders")
    with pytest.raises(
        ConfigError, match=r"masking.fields.address: .* no field 'address' \(its fields: id, customer, items\)"
    ):
        mask_records(records, Masking(fields={"address": "redact"}), KEY, "orders")
    with pytest.raises(ConfigError, match=f"{MASKING_KEY_ENV}, and it is unset"):
        masking_key(Masking(key="hash"), "orders", {})
    assert masking_key(Masking(key="redact"), "orders", {}) is None
    assert masking_key(Masking(key="hash"), "orders", {MASKING_KEY_ENV: KEY.decode()}) == KEY


STRONG = secrets.token_hex(32)


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("short-but-random-" + secrets.token_hex(8), "too short"),
        (STRONG[:63], "too short: 63 characters carry at most 252 bits"),  # one hex digit short of 256 bits
        (secrets.token_urlsafe(32)[:42], "too short: 42 characters carry at most 252 bits"),
        ("a" * 100, "one text of 1 characters repeated"),
        ("0123456789abcdef" * 4, "one text of 16 characters repeated"),
        (STRONG[:32] * 2, "one text of 32 characters repeated"),
        ("correct horse battery staple is my masking key", "low entropy"),
        ("Password123!" * 4 + "x", "low entropy"),
    ],
    # Ids of their own: the keys are drawn anew in each process, and xdist's workers must collect the same tests.
    ids=["short", "hex-63", "urlsafe-42", "one-char", "16-repeated", "32-repeated", "phrase", "password"],
)  # fmt: skip
def test_a_weak_masking_key_is_refused_naming_why_and_how_to_make_one(key: str, why: str) -> None:
    with pytest.raises(ConfigError) as refused:
        masking_key(Masking(fields={"customer.email": "hash"}), "orders", {MASKING_KEY_ENV: key})
    message = str(refused.value)
    assert "feed 'orders'" in message and MASKING_KEY_ENV in message and why in message and "256" in message
    assert "secrets.token_hex(32)" in message and key not in message


@pytest.mark.parametrize(
    "key", [STRONG, secrets.token_hex(48), secrets.token_urlsafe(32), secrets.token_urlsafe(32)[:43],
            "0" + STRONG[1:]],
    ids=["hex-64", "hex-96", "urlsafe", "urlsafe-43", "hex-leading-zero"],  # drawn anew in each xdist worker
)  # fmt: skip
def test_a_key_of_256_random_bits_is_accepted(key: str) -> None:
    assert masking_key(Masking(key="hash"), "orders", {MASKING_KEY_ENV: key}) == key.encode()


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
    key = secrets.token_hex(32)
    conf_dir, events = event_log_conf(tmp_path)
    env = {**os.environ, "SPARK_CONF_DIR": str(conf_dir), "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", LEAK_SCRIPT, key], env=env, capture_output=True, text=True,
                          check=False, cwd=Path(__file__).parents[3])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    root = key.encode()
    assert (out["email"], out["id"], out["key"]) == (mac("ann@example.com", "customer.email", root),
                                                      mac("1", "id", root), mac("key-0", "key", root))  # fmt: skip
    assert out["notes"] == [mac("call ann", "items.note", root), None]
    assert out["header"] == mac("ann@example.com", "headers.x-email", root)
    derived = [
        field_key(root, "orders", f).hex() for f in ("customer.email", "id", "key", "items.note", "headers.x-email")
    ]
    # as text, or as a binary literal's hex; nor any key derived from it
    forms = {key, key.encode().hex(), key.encode().hex().upper(), *derived, *(d.upper() for d in derived)}
    assert "Project" in out["plans"][0] and not [f for f in forms for p in out["plans"] if f in p]
    logs = [p for p in events.rglob("*") if p.is_file()]
    assert logs and any(b"SparkListenerSQLExecutionStart" in p.read_bytes() for p in logs)
    assert [p.name for p in logs for f in forms if f.encode() in p.read_bytes()] == []
    assert key not in proc.stdout + proc.stderr
