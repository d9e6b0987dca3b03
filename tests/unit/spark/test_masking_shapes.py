"""Every masking treatment at every place a value can sit: a top-level field, a field of a nested record, a field of
each record in an array, a map-typed field, the record's key and a header, in one record; and a null at each place.

Each treatment is checked against what it must give computed apart from Tidemark (HMAC-SHA256 under the field's
HKDF-derived key, :func:`tests.support.masking.hashed`; the marker, a prefix, nothing), so a treatment applied at
one place and forgotten at another shows.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from tests.support.masking import hashed, strong_key
from tidemark.config.masking import MASKED, Masking, Treatment, Truncate
from tidemark.config.models import Deserialization
from tidemark.errors import ConfigError
from tidemark.spark.decode import annotate
from tidemark.spark.masking import mask_records

pytestmark = pytest.mark.spark

TS = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
KEY = strong_key().encode()
DDL = (
    "id long, email string, customer struct<email: string, name: string>, "
    "items array<struct<sku: string, note: string>>, attrs map<string, string>, tags array<string>"
)
RECORD = {
    "id": 1,
    "email": "ann@example.com",
    "customer": {"email": "bob@example.com", "name": "Bob"},
    "items": [{"sku": "s1", "note": "call ann"}, {"sku": "s2", "note": None}, {"sku": "s3", "note": "ring"}],
    "attrs": {"a": "x", "b": "y"},
    "tags": ["vip", None],
}
NULLS = {"id": 2, "email": None, "customer": None, "items": None, "attrs": None, "tags": None}
HEADERS = [("trace", b"t-1"), ("pii", b"secret"), ("pii2", b"other")]
PATHS = ("email", "customer.email", "items.note", "attrs", "tags")


def mac(value: str | bytes, field: str) -> str:
    """``value`` hashed in ``field`` (``customer.email``, ``key``, ``headers.pii``) of feed ``orders``."""
    return hashed(value, field, KEY, "orders")


def _masked(spark: Any, masking: Masking) -> list[Any]:
    from tidemark.spark.source import SCHEMA

    rows = [("t", 0, 0, TS, 0, b"key-0", json.dumps(RECORD).encode(), HEADERS, "plan"),
            ("t", 0, 1, TS, 0, None, json.dumps(NULLS).encode(), [("pii", None)], "plan"),
            ("t", 0, 2, TS, 0, b"key-2", None, [], "plan")]  # fmt: skip
    frame = annotate(spark.createDataFrame(rows, SCHEMA), Deserialization(format="json", schema_ddl=DDL))
    return mask_records(frame, masking, KEY, "orders").orderBy("offset").collect()


def _everywhere(treatment: Treatment, paths: tuple[str, ...] = PATHS) -> Masking:
    return Masking(fields=dict.fromkeys(paths, treatment), key=treatment, headers={"pii": treatment, "pii2": treatment})


def _headers(row: Any) -> list[tuple[str, bytes | None]]:
    return [(h.key, None if h.value is None else bytes(h.value)) for h in row.headers]


def _check_nulls(nulls: Any, empty: Any, gone: set[str]) -> None:
    """A null stays null wherever it is, and a record without a value (a tombstone) stays without one."""
    for name in {"email", "customer", "items", "attrs", "tags"} - gone:
        assert nulls[name] is None, name
    assert nulls.key is None
    assert empty.customer is None and empty["items"] is None


def test_hash_at_every_place(spark: Any) -> None:
    row, nulls, empty = _masked(spark, _everywhere("hash"))
    assert row.email == mac("ann@example.com", "email")
    assert (row.customer.email, row.customer.name) == (mac("bob@example.com", "customer.email"), "Bob")
    assert [(i.sku, i.note) for i in row["items"]] == [
        ("s1", mac("call ann", "items.note")),
        ("s2", None),
        ("s3", mac("ring", "items.note")),
    ]
    assert row.attrs == mac('{"a":"x","b":"y"}', "attrs")  # a map: its JSON text's hash
    assert row.tags == mac('["vip",null]', "tags")  # an array named whole: its JSON text's hash
    assert row.key == mac("key-0", "key")  # the decoded key (a string)
    assert _headers(row) == [
        ("trace", b"t-1"),
        ("pii", mac("secret", "headers.pii").encode()),
        ("pii2", mac("other", "headers.pii2").encode()),
    ]
    assert _headers(nulls) == [("pii", None)]
    _check_nulls(nulls, empty, set())
    assert row.id == 1


def test_redact_at_every_place(spark: Any) -> None:
    row, nulls, empty = _masked(spark, _everywhere("redact"))
    assert row.email == MASKED
    assert (row.customer.email, row.customer.name) == (MASKED, "Bob")
    assert [(i.sku, i.note) for i in row["items"]] == [("s1", MASKED), ("s2", None), ("s3", MASKED)]
    assert row.attrs == MASKED
    assert row.tags == MASKED  # an array named whole
    assert row.key == MASKED
    assert _headers(row) == [("trace", b"t-1"), ("pii", MASKED.encode()), ("pii2", MASKED.encode())]
    assert _headers(nulls) == [("pii", None)]
    _check_nulls(nulls, empty, set())


def test_truncate_at_every_place_that_holds_text(spark: Any) -> None:
    row, nulls, empty = _masked(spark, _everywhere(Truncate(truncate=3), ("email", "customer.email", "items.note")))
    assert row.email == "ann"
    assert (row.customer.email, row.customer.name) == ("bob", "Bob")
    assert [(i.sku, i.note) for i in row["items"]] == [("s1", "cal"), ("s2", None), ("s3", "rin")]
    assert row.attrs == {"a": "x", "b": "y"} and row.tags == ["vip", None]  # not named: untouched
    assert row.key == "key"
    assert _headers(row) == [("trace", b"t-1"), ("pii", b"sec"), ("pii2", b"oth")]
    assert _headers(nulls) == [("pii", None)]
    _check_nulls(nulls, empty, set())


@pytest.mark.parametrize("length", [1, 15, 16])
def test_truncate_at_its_length_boundaries(spark: Any, length: int) -> None:
    """One character; one short of the text (15 of "ann@example.com"'s 15: whole); as long as it, and longer."""
    (row, _, _) = _masked(spark, Masking(fields={"email": Truncate(truncate=length)}))
    assert row.email == "ann@example.com"[:length]


def test_truncate_of_a_map_or_a_number_is_refused_naming_the_path(spark: Any) -> None:
    for path, kind in (("attrs", "map<string,string>"), ("id", "bigint")):
        with pytest.raises(ConfigError, match=rf"feed 'orders': masking.{path}: truncate needs a string or binary "
                           rf"field, not {kind}"):  # fmt: skip
            _masked(spark, Masking(fields={path: Truncate(truncate=2)}))


def test_drop_at_every_place(spark: Any) -> None:
    row, nulls, empty = _masked(spark, _everywhere("drop"))
    assert "email" not in row.asDict() and "attrs" not in row.asDict() and "tags" not in row.asDict()
    assert row.customer.asDict() == {"name": "Bob"}
    assert [i.asDict() for i in row["items"]] == [{"sku": "s1"}, {"sku": "s2"}, {"sku": "s3"}]
    assert row.key is None
    assert _headers(row) == [("trace", b"t-1")]
    assert _headers(nulls) == []
    _check_nulls(nulls, empty, {"email", "attrs", "tags"})


def test_each_place_alone_leaves_the_others_untouched(spark: Any) -> None:
    """One treatment at one place: a treatment applied to every place, or to the wrong one, shows."""
    (row, _, _) = _masked(spark, Masking(fields={"items.note": "redact"}))
    assert [i.note for i in row["items"]] == [MASKED, None, MASKED]
    assert row.email == "ann@example.com" and row.customer.email == "bob@example.com" and row.key == "key-0"
    assert _headers(row) == HEADERS
    (row, _, _) = _masked(spark, Masking(headers={"pii2": "redact"}))
    assert _headers(row) == [("trace", b"t-1"), ("pii", b"secret"), ("pii2", MASKED.encode())]
    (row, _, _) = _masked(spark, Masking(headers={"pii": "hash"}, key="redact"))
    assert _headers(row) == [("trace", b"t-1"), ("pii", mac("secret", "headers.pii").encode()), ("pii2", b"other")]
    assert row.key == MASKED
    (row, _, _) = _masked(spark, Masking(headers={"pii2": "drop", "trace": "hash"}))
    assert _headers(row) == [("trace", mac("t-1", "headers.trace").encode()), ("pii", b"secret")]


def test_hashing_without_a_key_is_refused(spark: Any) -> None:
    from tidemark.spark.source import SCHEMA

    frame = spark.createDataFrame([], SCHEMA)
    for masking in (Masking(key="hash"), Masking(headers={"pii": "hash"}), Masking(fields={"value": "hash"})):
        with pytest.raises(ConfigError, match="feed 'orders': masking hashes, and no masking key was given"):
            mask_records(frame, masking, None, "orders")
    assert mask_records(frame, Masking(key="redact"), None, "orders").columns == frame.columns
