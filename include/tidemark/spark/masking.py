"""Masking a feed's sensitive fields in Spark: the decoded records as everything after decoding sees them.

:func:`mask_records` takes the decoded records (:func:`tidemark.spark.decode.annotate`'s
columns) and applies the feed's ``masking:`` (:mod:`tidemark.config.masking`) with Spark's
own column functions: value fields by path (``withField`` / ``dropFields`` into structs,
``transform`` through arrays of structs), the ``key`` column and the ``headers`` entries by
name (whatever its case). ``hash`` is HMAC-SHA256 under the feed's and the field's own key, derived
(:func:`tidemark.config.masking.field_key`, HKDF-SHA256) from the key :func:`masking_key` reads from
``TIDEMARK_MASKING_KEY`` (in DAGs, the ``tidemark_masking`` Airflow connection's password; it
reaches the driver in the private secrets file, as the other connections do), shown as
lower-case hex; texts are hashed as their UTF-8 bytes, binary values as they are, other types
as their text (complex ones as JSON). Null stays null. Spark builds each message (the casts,
``to_json``); a vectorised (Arrow) Python UDF computes the HMAC, the key inside its pickled
closure, so the key is in no query plan: not in ``explain``, the UI's SQL tab or an event
log (Spark's own ``hmac`` would carry it there as a literal). Spark refuses a Python UDF
inside ``transform``'s lambda, so a field under arrays is hashed in three steps: its
messages, nested in the arrays only, into a transient column; the UDF hashes them there;
a ``transform`` with item indexes puts each hash in its field's place.

The job masks right after decoding (:mod:`tidemark.job.steps`), so the staged files,
validation's counts, samples and GX's unexpected-value lists and Data Docs, the
publication and the quarantine all hold masked values only. The raw bytes decoding keeps
aside (``_raw_value``, ``_raw_key``) would undo that: :func:`raw_columns` nulls them, or,
with ``keep_raw``, keeps a bad record's raw key, value and headers for
:func:`split_raw`, which writes them to the ``keep_raw`` location and nothing else.

Anyone publishing records of a masked feed outside the job (a re-drive) masks them with
:func:`mask_records` first.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from tidemark.config.masking import (
    KEY_BITS,
    MASKED,
    MASKING_KEY_ENV,
    Masking,
    Treatment,
    Truncate,
    field_key,
    key_problem,
)
from tidemark.errors import ConfigError
from tidemark.staged import (
    ERROR_COLUMN,
    METADATA_COLUMNS,
    OK_OUTCOME,
    OUTCOME_COLUMN,
    RAW_HEADERS_COLUMN,
    RAW_KEY_COLUMN,
    RAW_VALUE_COLUMN,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

_NOT_FIELDS = frozenset({*METADATA_COLUMNS, ERROR_COLUMN})  # the decoded record's columns that are not its value's
# Columns of a kept raw record, as the ``keep_raw`` location holds them.
KEPT_COLUMNS = ("topic", "partition", "offset", "timestamp", "key", "value", "headers")


def masking_key(masking: Masking, feed: str, environ: Mapping[str, str] | None = None) -> bytes | None:
    """The deployment's masking key, which every ``hash`` treatment's key derives from (:func:`field_key`); None
    when the feed hashes nothing. Refused, never quoted, when missing or weak (:func:`key_problem`)."""
    if not masking.hashes:
        return None
    value = (os.environ if environ is None else environ).get(MASKING_KEY_ENV, "")
    problem = key_problem(value)
    if problem is not None:
        raise ConfigError(
            f"feed '{feed}': masking hashes with keys derived from {MASKING_KEY_ENV}, and {problem}. Set it (in "
            f"Airflow: the password of the 'tidemark_masking' connection) to at least {KEY_BITS} random bits, e.g. "
            "the 64 hex digits python -c 'import secrets; print(secrets.token_hex(32))' prints, the same for "
            "every run of the feed (docs/deploy.md, 'Masking keys')"
        )
    return value.encode()


def mask_records(df: DataFrame, masking: Masking, key: bytes | None, feed: str = "?") -> DataFrame:
    """``df`` (decoded records: ``key``, value columns, ``headers``) with the feed's sensitive fields masked.

    ``key``: the deployment's masking key (:func:`masking_key`), needed when a treatment is ``hash``; each hashed
    field's HMAC key is derived from it for ``feed`` and the field (:func:`field_key`). A path
    that is not in ``df``'s schema (a registry reader that lacks it) is refused, naming the
    feed, the path and the fields there are. Raw columns are left to :func:`raw_columns`.
    """
    from pyspark.sql import functions as F

    if masking.hashes and key is None:
        raise ConfigError(f"feed '{feed}': masking hashes, and no masking key was given")
    for path, treatment in masking.fields.items():
        top, *rest = path.split(".")
        if top not in df.columns:
            raise ConfigError(
                f"feed '{feed}': masking.fields.{path}: the decoded value has no field '{top}' "
                f"(its fields: {', '.join(c for c in df.columns if c not in _NOT_FIELDS and not c.startswith('_'))})"
            )
        if not rest and treatment == "drop":
            df = df.drop(top)
            continue
        dtype = df.schema[top].dataType
        if treatment == "hash" and _arrays_on(dtype, rest, feed, path):
            assert key is not None
            # The hashes beside the records first: a lambda may read a column, never hold a Python UDF.
            df = df.withColumn(_HASHES, _hash_udf(field_key(key, feed, path), _arrays_on(dtype, rest, feed, path))(
                _messages(F.col(top), dtype, rest)))  # fmt: skip
            df = df.withColumn(top, _hashed(F.col(top), dtype, rest, F.col(_HASHES))).drop(_HASHES)
            continue
        df = df.withColumn(top, _masked(F.col(top), dtype, rest, treatment, key, f"{feed}", path))
    if masking.key is not None and "key" in df.columns:
        key_type = df.schema["key"].dataType
        dropped = F.lit(None).cast(key_type)
        masked = dropped if masking.key == "drop" else _leaf(F.col("key"), key_type, masking.key, key, feed, "key")
        df = df.withColumn("key", masked)
    if masking.headers and "headers" in df.columns:
        df = _headers(df, masking, key, feed)
    return df


_HASHES = "_masking_hashes"  # a transient column: the hashes of the messages under arrays, in their places


def _masked(col: Column, dtype: DataType, rest: list[str], treatment: Treatment, key: bytes | None, feed: str,
            path: str) -> Column:  # fmt: skip
    """``col`` (of ``dtype``) with the field at ``rest`` under it treated; arrays of structs are walked item by item
    (a hash under an array is :func:`_messages` and :func:`_hashed`'s)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StructType

    if not rest:
        return _leaf(col, dtype, treatment, key, feed, path)
    if isinstance(dtype, ArrayType):
        element = dtype.elementType
        return F.transform(col, lambda item: _masked(item, element, rest, treatment, key, feed, path))
    if not isinstance(dtype, StructType) or rest[0] not in dtype.names:
        fields = ", ".join(dtype.names) if isinstance(dtype, StructType) else f"none: it is a {dtype.simpleString()}"
        raise ConfigError(f"feed '{feed}': masking.fields.{path}: no field '{rest[0]}' there (its fields: {fields})")
    name = rest[0]
    if len(rest) == 1 and treatment == "drop":
        return col.dropFields(name)
    child = _masked(col.getField(name), dtype[name].dataType, rest[1:], treatment, key, feed, path)
    return F.when(col.isNotNull(), col.withField(name, child))  # null otherwise, of the changed struct's type


def _arrays_on(dtype: DataType, rest: Sequence[str], feed: str, path: str) -> int:
    """How many arrays the path ``rest`` under ``dtype`` goes through before its leaf (refused when it is not there)."""
    from pyspark.sql.types import ArrayType, StructType

    if not rest:
        return 0
    if isinstance(dtype, ArrayType):
        return 1 + _arrays_on(dtype.elementType, rest, feed, path)
    if not isinstance(dtype, StructType) or rest[0] not in dtype.names:
        fields = ", ".join(dtype.names) if isinstance(dtype, StructType) else f"none: it is a {dtype.simpleString()}"
        raise ConfigError(f"feed '{feed}': masking.fields.{path}: no field '{rest[0]}' there (its fields: {fields})")
    return _arrays_on(dtype[rest[0]].dataType, rest[1:], feed, path)


def _messages(col: Column, dtype: DataType, rest: Sequence[str]) -> Column:
    """The messages of the leaves at ``rest`` under ``col``, nested in its arrays only (structs are stepped through)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StructType

    if not rest:
        return _message(col, dtype)
    if isinstance(dtype, ArrayType):
        element = dtype.elementType
        return F.transform(col, lambda item: _messages(item, element, rest))
    assert isinstance(dtype, StructType)  # _arrays_on checked the path
    return _messages(col.getField(rest[0]), dtype[rest[0]].dataType, rest[1:])


def _hashed(col: Column, dtype: DataType, rest: Sequence[str], hashes: Column) -> Column:
    """``col`` with each leaf at ``rest`` replaced by its hash, the item of ``hashes`` (:func:`_messages`'s nesting)
    at the same array positions."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, BinaryType, StructType

    if not rest:
        return F.when(col.isNotNull(), hashes.cast("binary") if isinstance(dtype, BinaryType) else hashes)
    if isinstance(dtype, ArrayType):
        element = dtype.elementType
        return F.transform(col, lambda item, i: _hashed(item, element, rest, hashes[i]))
    assert isinstance(dtype, StructType)  # _arrays_on checked the path
    name = rest[0]
    child = _hashed(col.getField(name), dtype[name].dataType, rest[1:], hashes)
    return F.when(col.isNotNull(), col.withField(name, child))


def _message(col: Column, dtype: DataType) -> Column:
    """The bytes a value's hash is of: a binary value's own, a text's UTF-8, a number's (a date's...) text's, a
    complex value's JSON text's."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import AtomicType, BinaryType

    if isinstance(dtype, BinaryType):
        return col
    if isinstance(dtype, AtomicType):
        return col.cast("string").cast("binary")
    return F.to_json(col).cast("binary")


def _leaf(col: Column, dtype: DataType, treatment: Treatment, key: bytes | None, feed: str, path: str) -> Column:
    """One value treated: null stays null; a binary value stays binary, anything else becomes a string."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, StringType

    binary = isinstance(dtype, BinaryType)
    if isinstance(treatment, Truncate):
        if not (binary or isinstance(dtype, StringType)):
            raise ConfigError(
                f"feed '{feed}': masking.{path}: truncate needs a string or binary field, not {dtype.simpleString()}"
            )
        return F.substring(col, 1, treatment.truncate)
    if treatment == "drop":  # a leaf kept in place (the key): null
        return F.lit(None).cast(dtype)
    if treatment == "redact":
        marker = F.lit(MASKED)
        out = marker.cast("binary") if binary else marker
        return F.when(col.isNotNull(), out)
    assert key is not None  # mask_records refuses hashing without a key
    key = field_key(key, feed, path)  # this feed's and this field's own
    digest = _hash_udf(key)(_message(col, dtype))
    return F.when(col.isNotNull(), digest.cast("binary") if binary else digest)


def _hex_hmac(key: bytes) -> Callable[[bytes | None], str | None]:
    """HMAC-SHA256 of a message under ``key``, as lower-case hex (None for None), as ``hmac.new(...).hexdigest()``.

    The keyed state is made once per worker process, on first use (an HMAC object is not picklable; the key is).
    """
    keyed: list[hmac.HMAC] = []

    def digest(message: bytes | None) -> str | None:
        if message is None:
            return None
        if not keyed:
            keyed.append(hmac.new(key, digestmod=hashlib.sha256))
        h = keyed[0].copy()
        h.update(message)
        return h.hexdigest()

    return digest


def _hash_udf(key: bytes, arrays: int = 0) -> Callable[[Column], Column]:
    """A vectorised (Arrow) UDF: binary messages, nested in ``arrays`` arrays, to their keyed hashes (text) in the
    same places. The key travels in its closure only: pickled with the UDF, never rendered in a plan."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StringType

    digest = _hex_hmac(key)

    def hashed(messages: pa.Array) -> pa.Array:
        if isinstance(messages, pa.ListArray | pa.LargeListArray):  # the same offsets and nulls, the values hashed
            return type(messages).from_arrays(messages.offsets, hashed(messages.values), mask=messages.is_null())
        return pa.array([digest(m) for m in messages.to_pylist()], pa.string())

    def masking_hash(messages: pa.Array) -> pa.Array:
        return hashed(messages)

    masking_hash.__annotations__ = {"messages": pa.Array, "return": pa.Array}  # what arrow_udf reads its kind from
    out: DataType = StringType()
    for _ in range(arrays):
        out = ArrayType(out, True)
    udf: Callable[[Column], Column] = F.arrow_udf(masking_hash, out)
    return udf


def _headers(df: DataFrame, masking: Masking, key: bytes | None, feed: str) -> DataFrame:
    """``df`` with each named header's value treated (``drop``: the entry removed), names matched whatever their
    case; hashed ones by :func:`_hash_udf` under their header's own key (:func:`field_key`, ``headers.<name>`` in
    lower case) over the array of their messages, beside the records, then put in their places."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    def name_of(h: Column) -> Column:
        return F.lower(h.getField("key"))

    treatments = {name.lower(): t for name, t in masking.headers.items()}
    dropped = [name for name, t in treatments.items() if t == "drop"]
    kept = {name: t for name, t in treatments.items() if t not in ("drop", "hash")}
    hashed = sorted(name for name, t in treatments.items() if t == "hash")
    out = F.filter("headers", lambda h: ~name_of(h).isin(dropped)) if dropped else F.col("headers")

    def treat(h: Column) -> Column:
        value = h.getField("value")
        for name, t in kept.items():
            treated = _leaf(h.getField("value"), BinaryType(), t, key, feed, f"headers.{name}")
            value = F.when(name_of(h) == F.lit(name), treated).otherwise(value)
        return h.withField("value", value)

    df = df.withColumn("headers", F.transform(out, treat) if kept else out)
    if not hashed:
        return df
    assert key is not None  # mask_records refuses hashing without a key
    for name in hashed:  # one header name at a time: each has its own key
        df = _hash_header(df, name, field_key(key, feed, f"headers.{name}"))
    return df


def _hash_header(df: DataFrame, name: str, key: bytes) -> DataFrame:
    """``df`` with the values of every header named ``name`` (lower case; matched whatever their case) hashed
    under ``key``: their messages beside the records, hashed by one UDF, put back by item index."""
    from pyspark.sql import functions as F

    def mine(h: Column) -> Column:
        return F.lower(h.getField("key")) == F.lit(name)

    chosen = F.transform("headers", lambda h: F.when(mine(h), h.getField("value")))
    df = df.withColumn(_HASHES, _hash_udf(key, 1)(chosen))

    def put(h: Column, i: Column) -> Column:
        hashed = mine(h) & h.getField("value").isNotNull()
        return h.withField("value", F.when(hashed, F.col(_HASHES)[i].cast("binary")).otherwise(h.getField("value")))

    return df.withColumn("headers", F.transform("headers", put)).drop(_HASHES)


def raw_columns(frame: DataFrame, masking: Masking) -> DataFrame:
    """``frame`` (staged records with their outcome) without raw bytes that would bypass masking.

    Without ``keep_raw``: ``_raw_value`` and ``_raw_key`` are null on every row (their digests
    were taken before). With it: a bad record keeps them, and ``_raw_headers``, for
    :func:`split_raw`; a good one keeps none.
    """
    from pyspark.sql import functions as F

    bad = F.col(OUTCOME_COLUMN) != F.lit(OK_OUTCOME)
    kept = masking.keep_raw is not None
    present = [c for c in (RAW_VALUE_COLUMN, RAW_KEY_COLUMN, RAW_HEADERS_COLUMN) if c in frame.columns]
    blank: Callable[[str], Column] = lambda c: (F.when(bad, F.col(c)) if kept else F.lit(None)).cast(  # noqa: E731
        frame.schema[c].dataType
    )
    return frame.select(*[blank(c).alias(c) if c in present else F.col(c) for c in frame.columns])


def with_raw(decoded: DataFrame) -> DataFrame:
    """``decoded`` with every record's raw key, value and headers beside it (for ``keep_raw``), taken before
    masking: ``_raw_value`` / ``_raw_key`` as decoding kept them, else the ``value`` / ``key`` bytes."""
    from pyspark.sql import functions as F

    extra: list[Column] = []
    if RAW_VALUE_COLUMN not in decoded.columns:
        extra.append(F.col("value").cast("binary").alias(RAW_VALUE_COLUMN))
    if RAW_KEY_COLUMN not in decoded.columns:
        extra.append(F.col("key").cast("binary").alias(RAW_KEY_COLUMN))
    extra.append(F.col("headers").alias(RAW_HEADERS_COLUMN))
    return decoded.select("*", *extra)


def split_raw(bad: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Quarantined rows (with ``_raw_*`` columns) as (what the quarantine keeps: raw bytes null, no raw headers;
    the raw records for the ``keep_raw`` location: :data:`KEPT_COLUMNS` and the reason columns)."""
    from pyspark.sql import functions as F

    reasons = [c for c in bad.columns if c in ("_reason", "_reason_codes", "plan_id", "date")]
    raw = bad.select("topic", "partition", "offset", "timestamp", F.col(RAW_KEY_COLUMN).alias("key"),
                     F.col(RAW_VALUE_COLUMN).alias("value"), F.col(RAW_HEADERS_COLUMN).alias("headers"),
                     *reasons)  # fmt: skip
    masked = bad.drop(RAW_HEADERS_COLUMN)
    masked = masked.select(
        *[F.lit(None).cast(masked.schema[c].dataType).alias(c) if c in (RAW_VALUE_COLUMN, RAW_KEY_COLUMN)
          else F.col(c) for c in masked.columns]
    )  # fmt: skip
    return masked, raw
