"""The staging vocabulary: the names the job's staged files use, in one leaf that imports nothing.

The job writes every record once into a staging folder and publishes from there
(:mod:`tidemark.job.steps`). The Spark decoder, the range statistics, the read tasks'
writer, validation, the publishers and the job all read or write those files, so the
names they share live here: the columns staged beside a record (its outcome, its decode
error, its raw bytes and their digest), the outcome codes, the folder of the single
write, the partition columns, and which writer staged a plan. It sits in the bottom
layer beside :mod:`tidemark._types` so that every layer from ``spark`` up can import it.
"""

from __future__ import annotations

from typing import Final, Literal

# -- a record's columns from its source (the value's column(s) sit between key and headers) -------

METADATA_COLUMNS: Final = ("topic", "partition", "offset", "timestamp", "timestamp_type", "key", "headers", "plan_id")

# -- columns beside a record's own: in staging only, except the quarantine's _reason and _reason_codes --

OUTCOME_COLUMN: Final = "_outcome"  # the staging partition: OK_OUTCOME or why a record is bad
ERROR_COLUMN: Final = "decode_error"  # why a record did not decode (the decoder's output)
REASON_COLUMN: Final = "_reason"  # a quarantined record's full reason, as data
REASON_CODES_COLUMN: Final = "_reason_codes"  # its reasons as codes: decode_error, or each broken rule's label
RAW_VALUE_COLUMN: Final = "_raw_value"  # a bad record's value bytes, for the quarantine
RAW_KEY_COLUMN: Final = "_raw_key"  # a registry-format key's bytes, for the range statistics and the quarantine
# A bad record's headers as Kafka held them, staged only for a masked feed's ``keep_raw`` location.
RAW_HEADERS_COLUMN: Final = "_raw_headers"
# The wire-format header (first five bytes) of an Avro key or value: the job checks the schema ids records
# carry on these instead of the raw bytes.
RAW_HEAD_COLUMNS: Final[dict[Literal["key", "value"], str]] = {"value": "_value_head", "key": "_key_head"}
# A record's share of its range's statistics (tidemark.spark.stats.row_digest), staged while its raw bytes
# were at hand, so the statistics need not keep a good record's raw bytes.
ROW_HASH_COLUMN: Final = "_row_hash"
ROW_BYTES_COLUMN: Final = "_row_bytes"
DIGEST_COLUMNS: Final = (ROW_HASH_COLUMN, ROW_BYTES_COLUMN)
# Everything above that a staged file may carry beside the record's own columns and publication drops.
UNPUBLISHED_COLUMNS: Final = (
    RAW_VALUE_COLUMN,
    RAW_KEY_COLUMN,
    RAW_HEADERS_COLUMN,
    *DIGEST_COLUMNS,
    *RAW_HEAD_COLUMNS.values(),
)

# -- partitions ---------------------------------------------------------------------------

TOPIC_COLUMN: Final = "topic"
DATE_COLUMN: Final = "date"  # the record timestamp's UTC date
# A publication's partitions, in folder order: <output>/plan_id=<id>/topic=<t>/date=<d>/.
PARTITION_COLUMNS: Final = (TOPIC_COLUMN, DATE_COLUMN)
# The single staged write's partitions: outcome first, so each outcome is one folder to rename or rewrite.
STAGED_PARTITION_COLUMNS: Final = (OUTCOME_COLUMN, *PARTITION_COLUMNS)
PASS_DIR: Final = "_pass"  # inside a staging folder: the job's single write
# Every staged and published file's timestamps: Spark's name for Parquet's INT64 TIMESTAMP(MICROS,
# isAdjustedToUTC=true), what the read tasks' pyarrow writes (Spark would write INT96; Iceberg reads no INT96).
PARQUET_TIMESTAMPS: Final = "TIMESTAMP_MICROS"

# Names a declared field (a feed's JSON fields, a registry reader's top-level fields) may not take: the
# record's columns and the job's own.
RESERVED_COLUMNS: Final = frozenset({
    *METADATA_COLUMNS, "value", ERROR_COLUMN, RAW_VALUE_COLUMN, RAW_KEY_COLUMN, RAW_HEADERS_COLUMN,
    *RAW_HEAD_COLUMNS.values(), *DIGEST_COLUMNS, OUTCOME_COLUMN, DATE_COLUMN,
})  # fmt: skip

DECODE_REASON: Final = "decode_error"  # the reason code of a record that did not decode


def reason_codes(reason: str) -> tuple[str, ...]:
    """A quarantined record's reason codes from its full ``_reason`` text (for quarantines written before
    ``_reason_codes`` was): ``decode_error`` for ``decode_error: <why>``, else each ``; ``-separated rule label."""
    if reason.startswith(f"{DECODE_REASON}:"):
        return (DECODE_REASON,)
    return tuple(part for part in reason.split("; ") if part)


# -- outcome codes (the values of OUTCOME_COLUMN) -------------------------------------------

OK_OUTCOME: Final = "ok"
DECODE_CODE: Final = "decode-"  # + the 1-based index of the record's reason in decode.decode_reasons
RULES_CODE: Final = "rules-"  # + the broken rules as a bitmask, hex (tidemark.validation.rules.OutcomeCodes)
OUTSIDE_WINDOW: Final = "outside_window"  # stamped outside an exact window: read, counted, left out

# -- who staged a plan (JobResult.staged_by) and who read it (JobResult.reader) --------------

StagedBy = Literal["spark", "read_tasks"]
STAGED_BY_SPARK: Final = "spark"  # Spark's Parquet writer, which codes every record's outcome
STAGED_BY_READ_TASKS: Final = "read_tasks"  # the read tasks themselves (tidemark.spark.arrow_avro)
Reader = Literal["driver", "data_source"]
READ_BY_DRIVER: Final = "driver"  # a small plan, read in the driver (no Python workers)
READ_BY_DATA_SOURCE: Final = "data_source"  # Spark's Python data source in the executors
