"""The columns of a staged record that are Tidemark's own, named once for decoding, the formats and the job.

A decoded record has the source's :data:`METADATA_COLUMNS`, with the value's column(s)
between ``key`` and ``headers``. Beside them the job stages what it must not lose or must
count: :data:`ERROR_COLUMN` (why a record did not decode), the raw value and key of formats
whose decoded columns cannot hold them (:data:`RAW_VALUE_COLUMN`, :data:`RAW_KEY_COLUMN`),
an Avro part's wire-format header (:data:`RAW_HEAD_COLUMNS`), each row's digest
(:data:`tidemark.spark.stats.DIGEST_COLUMNS`) and its outcome (:data:`OUTCOME_COLUMN`). A
feed's declared JSON fields and a registry reader's top-level fields become columns too, so
none may take one of :data:`RESERVED_COLUMNS`. Of ``spark/`` the module imports
only :mod:`tidemark.spark.stats`, so :mod:`tidemark.spark.decode` and the
registry formats' :mod:`tidemark.spark.wire` both read it without importing each other.
"""

from __future__ import annotations

from tidemark.config.models import RecordPart
from tidemark.spark.stats import DIGEST_COLUMNS

ERROR_COLUMN = "decode_error"
METADATA_COLUMNS = ("topic", "partition", "offset", "timestamp", "timestamp_type", "key", "headers", "plan_id")
RAW_VALUE_COLUMN = "_raw_value"
RAW_KEY_COLUMN = "_raw_key"  # a registry-format key's bytes, staged for the range statistics and the quarantine
# The wire-format header (first five bytes) of an Avro key or value, staged beside the decoded record: the
# job checks the schema ids records carry on these instead of the raw bytes (see tidemark.job.steps).
RAW_HEAD_COLUMNS: dict[RecordPart, str] = {"value": "_value_head", "key": "_key_head"}
OUTCOME_COLUMN = "_outcome"  # the job's staging partition: "ok" or why a record is bad
# Names a declared field may not take: record columns, and the job's own (``date`` partitions the output).
RESERVED_COLUMNS = frozenset({
    *METADATA_COLUMNS, "value", ERROR_COLUMN, RAW_VALUE_COLUMN, RAW_KEY_COLUMN, *RAW_HEAD_COLUMNS.values(),
    *DIGEST_COLUMNS, OUTCOME_COLUMN, "date",
})  # fmt: skip
