"""Feed configs and Tidemark's settings.

A feed is one YAML file in the feeds folder (``include/feeds/`` unless
``TIDEMARK_FEEDS_DIR`` says otherwise); the file's stem is the feed's name. Files are
validated by Pydantic models that forbid unknown keys, bound every number and check
cross-field rules, and a bad file is reported with its path and the failing field.
Connection settings (brokers, credentials) are never part of a feed: see
:mod:`tidemark.kafka.connection`.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tidemark._types import Isolation
from tidemark.config.declared import DeclaredField, FieldKind, ddl_fields, field_kind
from tidemark.config.durations import parse_skew, schedule_interval
from tidemark.config.masking import Masking, Treatment, path_problem, treatment_name
from tidemark.config.ownership import SIBLINGS, Claim, Clash, clashes, own_clashes, state_clashes
from tidemark.errors import ConfigError
from tidemark.storage import Location

OnMissing = Literal["earliest", "latest", "timestamp", "fail"]
OnNewPartition = Literal["earliest", "latest"]
OnDataLoss = Literal["fail", "skip"]
# A group moved by another writer (a stray consumer, an operator) past or behind what the output shows.
OnGroupMoved = Literal["follow", "fail"]
AlertPolicy = Literal["fail", "warn"]
OnAhead = Literal["fail", "earliest", "latest"]
ValueFormat = Literal["bytes", "string", "json", "avro", "json_schema", "protobuf"]
KeyFormat = Literal["bytes", "string", "avro", "json_schema", "protobuf"]
RecordPart = Literal["key", "value"]
# Values in the Schema Registry wire format: their schema comes from the registry, by id.
REGISTRY_FORMATS = frozenset({"avro", "json_schema", "protobuf"})
OnBadRecords = Literal["fail", "quarantine"]
FieldType = Literal["string", "integer", "number", "boolean"]
OutputFormat = Literal["parquet", "iceberg"]
# What a run does when its records would change a Parquet output's schema (tidemark.output.output_schema):
# evolve (columns added, types widened; anything else refused), fail, or quarantine (docs/schemas.md).
SchemaChange = Literal["evolve", "fail", "quarantine"]

FEED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
# A team's name as auth managers spell one (a FAB role, an Airflow team): letters, digits, '_', '.', '-'.
TEAM_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def package_root() -> Path:
    """The ``include/`` folder holding the package and the default feeds."""
    return Path(__file__).resolve().parents[2]


def feeds_dir() -> Path:
    return Path(os.environ.get("TIDEMARK_FEEDS_DIR", package_root() / "feeds"))


def state_location() -> Location:
    """Where plans, run reports and the default outputs live: a local folder or ``s3://bucket/prefix``.

    ``TIDEMARK_STATE_DIR`` (default ``~/.local/state/tidemark``). On an object store the
    steps of a run (possibly on different machines) exchange only this location's URLs.
    """
    return Location.of(os.environ.get("TIDEMARK_STATE_DIR") or Path.home() / ".local" / "state" / "tidemark")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JsonField(_Model):
    """One top-level field of a JSON value."""

    name: str = Field(min_length=1)
    type: FieldType
    required: bool = True


class Deserialization(_Model):
    """How record keys and values are decoded.

    ``avro`` values are in the Schema Registry wire format (magic byte 0, a 4-byte schema
    id, the Avro body). Every writer schema is resolved to one reader schema: version
    ``schema_version`` of ``subject`` (default ``<topic>-value``, the registry's topic-name
    strategy), or the subject's latest version when no version is pinned. The registry
    itself (URL, credentials) is a connection, never part of the feed. ``json_schema`` and
    ``protobuf`` values are framed the same way (a Protobuf body after its message
    indexes) and read with the same subject's reader schema.

    Keys are UTF-8 strings unless ``key_format`` says otherwise: ``bytes``, or ``avro``,
    ``json_schema`` or ``protobuf`` in the same wire format, read with their own reader
    schema: version ``key_schema_version`` of ``key_subject`` (default ``<topic>-key``),
    else that subject's latest, through the same registry connection.
    """

    format: ValueFormat = "bytes"
    key_format: KeyFormat = "string"
    fields: tuple[JsonField, ...] = ()
    # A JSON value's schema in Spark's DDL, nested and logical types included
    # ("id long NOT NULL, customer struct<id: long, name: string>, placed_at timestamp"):
    # the alternative to ``fields``; a top-level NOT NULL field is required.
    schema_ddl: str | None = Field(default=None, min_length=1)
    subject: str | None = Field(default=None, min_length=1)
    schema_version: PositiveInt | None = None
    key_subject: str | None = Field(default=None, min_length=1)
    key_schema_version: PositiveInt | None = None

    @model_validator(mode="after")
    def _fields_only_for_json(self) -> Deserialization:
        if (self.fields or self.schema_ddl) and self.format != "json":
            raise ValueError("'fields' and 'schema_ddl' declare a JSON schema and need format: json")
        if self.format == "json" and not self.fields and not self.schema_ddl:
            raise ValueError(
                "format: json needs the declared schema: 'fields' (top-level scalars) or 'schema_ddl' "
                "(Spark DDL with nested and logical types)"
            )
        if self.fields and self.schema_ddl:
            raise ValueError("declare the JSON schema once: 'fields' or 'schema_ddl', not both")
        if self.format not in REGISTRY_FORMATS and (self.subject is not None or self.schema_version is not None):
            raise ValueError(
                "'subject' and 'schema_version' name a registry schema and need format: avro, json_schema or protobuf"
            )
        if self.key_format not in REGISTRY_FORMATS and (
            self.key_subject is not None or self.key_schema_version is not None
        ):
            raise ValueError(
                "'key_subject' and 'key_schema_version' name a registry schema and need key_format: avro, "
                "json_schema or protobuf"
            )
        return self

    def reader_subject(self, topics: tuple[str, ...], part: RecordPart = "value") -> str:
        """The subject whose version is the reader schema of ``part``: ``subject`` (``key_subject``), else
        ``<topic>-value`` (``<topic>-key``), the serializers' default subject."""
        chosen = self.subject if part == "value" else self.key_subject
        if chosen is not None:
            return chosen
        if len(topics) != 1:
            option = "subject" if part == "value" else "key_subject"
            raise ConfigError(f"deserialization.{option}: a feed of several topics names the reader schema's subject")
        return f"{topics[0]}-{part}"

    def part_format(self, part: RecordPart) -> str:
        """``format`` for values, ``key_format`` for keys."""
        return self.format if part == "value" else self.key_format

    @property
    def decodes_avro(self) -> bool:
        """Whether keys or values decode with Spark's ``from_avro`` (the ``spark-avro`` package)."""
        return "avro" in (self.format, self.key_format)

    @property
    def registry_parts(self) -> tuple[RecordPart, ...]:
        """The parts of a record (``key``, ``value``) in a Schema Registry format."""
        parts: tuple[RecordPart, ...] = ("key", "value")
        return tuple(p for p in parts if self.part_format(p) in REGISTRY_FORMATS)

    def reader_version(self, part: RecordPart) -> int | None:
        """The pinned reader version of ``part`` (``schema_version`` / ``key_schema_version``); None: the latest."""
        return self.schema_version if part == "value" else self.key_schema_version


class Expectation(_Model):
    """A Great Expectations expectation by its snake_case name, with its arguments."""

    type: str = Field(pattern=r"^expect_[a-z0-9_]+$")
    kwargs: dict[str, Any] = Field(default_factory=dict)


class Validation(_Model):
    on_bad_records: OnBadRecords = "fail"
    quarantine_max_ratio: float = Field(default=0.05, ge=0.0, le=1.0)
    expect_records: bool = False
    expectations: tuple[Expectation, ...] = ()


WindowMode = Literal["exact", "offset_cut"]


def _duration_field(value: str, name: str) -> str:
    """``value`` as a duration field keeps it: checked by :func:`parse_skew`, its refusal naming ``name``."""
    try:
        parse_skew(value, name)
    except ConfigError as exc:
        raise ValueError(str(exc)) from exc
    return value


class TimeWindows(_Model):
    """How backfills and replays bounded by timestamps decide which records belong to a window.

    ``exact`` (default): the range is widened past the window's end by ``max_skew`` (how
    far a record's CreateTime may lag behind an earlier record's), and the job keeps exactly
    the records stamped in ``[start, end)``. ``offset_cut``: Kafka's offsets-for-times
    cut, as Spark's batch source does: from the first offset at/after start to the first
    offset at/after end, whatever the records' own timestamps.
    """

    mode: WindowMode = "exact"
    max_skew: str = "10m"

    @field_validator("max_skew")
    @classmethod
    def _skew_ok(cls, v: str) -> str:
        return _duration_field(v, "time_windows.max_skew")

    @property
    def max_skew_ms(self) -> int:
        return int(parse_skew(self.max_skew).total_seconds() * 1000)


class Alerts(_Model):
    """When a feed DAG's ``check`` task (after the commit) fails, so Airflow's failure callbacks and notifiers fire.

    ``max_lag``: the oldest record the group has not read may be at most this old after a run
    (``30s``, ``30m``, ``2h`` or ISO 8601). ``on_data_loss`` / ``on_expired_offsets``: a run
    whose plan or commit has a ``data_loss`` / ``group_offsets_expired`` event fails the
    check (``fail``) or only logs it (``warn``). ``stale_after``: the ``tidemark_watchdog`` DAG
    fails naming the feed when its last committed run is older than this (its DAG paused,
    its runs failing or not scheduled).
    """

    max_lag: str | None = None
    on_data_loss: AlertPolicy = "warn"
    on_expired_offsets: AlertPolicy = "warn"
    stale_after: str | None = None

    @field_validator("max_lag", "stale_after")
    @classmethod
    def _duration_ok(cls, v: str | None, info: ValidationInfo) -> str | None:
        return None if v is None else _duration_field(v, f"alerts.{info.field_name}")

    @property
    def max_lag_ms(self) -> int | None:
        return None if self.max_lag is None else int(parse_skew(self.max_lag, "alerts.max_lag").total_seconds() * 1000)


class Trigger(_Model):
    """When a feed runs because data arrived (``trigger:``), besides or instead of its ``schedule``.

    ``lag_records``: the feed runs once the group is at least this many records behind, summed
    over every partition of its topics (committed offset to the end its isolation sees).
    ``oldest_unread_age``: ... or once the oldest record it has not read is older than this
    (``30s``, ``10m``, ``2h`` or ISO 8601). Either or both; with the feed's ``schedule`` (a
    cron as today) the feed also runs on that. ``min_interval``: at least this long between two
    runs the trigger starts (default ``1m``). ``check_every``: how often the lag is looked up
    (default ``30s``): a run starts within about this long (plus the scheduler's loop) once a
    threshold is passed. See docs/orchestration.md.
    """

    lag_records: PositiveInt | None = None
    oldest_unread_age: str | None = None
    min_interval: str = "1m"
    check_every: str = "30s"

    @field_validator("oldest_unread_age", "min_interval", "check_every")
    @classmethod
    def _duration_ok(cls, v: str | None, info: ValidationInfo) -> str | None:
        return None if v is None else _duration_field(v, f"trigger.{info.field_name}")

    @model_validator(mode="after")
    def _a_threshold(self) -> Trigger:
        if self.lag_records is None and self.oldest_unread_age is None:
            raise ValueError(
                "a trigger needs a threshold: lag_records (records behind) and/or oldest_unread_age (e.g. 10m); "
                "for a cron alone use the feed's 'schedule' and drop 'trigger'"
            )
        if parse_skew(self.check_every, "trigger.check_every") < timedelta(seconds=1):
            raise ValueError("trigger.check_every: at least 1s (each check is two offset look-ups per broker)")
        return self

    @property
    def oldest_unread_age_ms(self) -> int | None:
        if self.oldest_unread_age is None:
            return None
        return int(parse_skew(self.oldest_unread_age, "trigger.oldest_unread_age").total_seconds() * 1000)

    @property
    def min_interval_s(self) -> float:
        return parse_skew(self.min_interval, "trigger.min_interval").total_seconds()

    @property
    def check_every_s(self) -> float:
        return parse_skew(self.check_every, "trigger.check_every").total_seconds()


class TopicPattern(_Model):
    """The topics of a feed chosen by a regular expression (``topics: {pattern: ..., exclude: [...]}``).

    ``pattern`` is a Python regular expression that must match a topic's *whole* name
    (``re.fullmatch``: ``orders\\..*`` takes ``orders.eu`` but not ``old.orders.eu``). Each
    ``exclude`` entry is a regular expression matched the same way, so a plain topic name
    excludes that topic (its dots match any character too: ``orders\\.dlq`` to be exact).
    The pattern is resolved against the cluster's topics each time a run is planned
    (:func:`tidemark.planning.topics.matching_topics`), internal topics never included.
    """

    pattern: str = Field(min_length=1)
    exclude: tuple[str, ...] = ()

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is one of the feed's: the pattern matches its whole name and no exclusion does."""
        return re.fullmatch(self.pattern, topic) is not None and not any(re.fullmatch(x, topic) for x in self.exclude)

    @property
    def label(self) -> str:
        """As messages and pages show it: ``pattern 'orders\\..*' (excluding 'orders\\.dlq')``."""
        quoted = ", ".join(f"'{x}'" for x in self.exclude)
        excluded = f" (excluding {quoted})" if self.exclude else ""
        return f"pattern '{self.pattern}'{excluded}"


def _regex_refusal(feed: str, field_name: str, value: str) -> str | None:
    """Why ``value`` is not a regular expression, naming the feed, the field and the pattern; None: it is one."""
    try:
        re.compile(value)
    except re.error as exc:
        return (
            f"feed '{feed}': {field_name} '{value}' is not a regular expression ({exc}); in YAML, single-quote it "
            "('orders\\..*') or double its backslashes"
        )
    return None


ICEBERG_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}\.[A-Za-z_][A-Za-z0-9_]{0,99}$")


# A partitioning by the record's Kafka timestamp (or none): ``date`` is the layout every output had before the choice.
KafkaPartitioning = Literal["date", "hour", "day", "month", "none"]
IcebergPartitioning = KafkaPartitioning  # the name the Iceberg output's code knew it by
KAFKA_PARTITIONINGS: tuple[str, ...] = ("date", "hour", "day", "month", "none")
Granularity = Literal["hour", "day", "month", "year"]
# What a value field's type lets it be partitioned by, from its kind (:func:`partition_refusal`).


class FieldPartitioning(_Model):
    """A partitioning by a top-level field of the decoded value (``partition_by: {field: ..., ...}``).

    ``granularity`` (``hour``, ``day``, ``month``, ``year``): by the record's event time in
    that field, in UTC: a timestamp or date field, or an integer field of epoch milliseconds.
    ``truncate``: by the field's first ``truncate`` characters (a string), or its value rounded
    down to a multiple of ``truncate`` (an integer or decimal). Neither: by the field's value.
    A record whose field is null goes to the null partition.
    """

    field: str = Field(min_length=1)
    granularity: Granularity | None = None
    truncate: PositiveInt | None = None

    @model_validator(mode="after")
    def _one_transform(self) -> FieldPartitioning:
        if self.granularity is not None and self.truncate is not None:
            raise ValueError("partition by the field's granularity or truncate, not both")
        return self

    @property
    def transform(self) -> str:
        """Iceberg's transform of the field: ``identity``, ``day``, ``truncate[3]``, ..."""
        if self.granularity is not None:
            return self.granularity
        return "identity" if self.truncate is None else f"truncate[{self.truncate}]"


PartitionChoice = KafkaPartitioning | FieldPartitioning
_CHOICES_TEXT = (
    "one of date, hour, day, month (of the Kafka timestamp), none, or a value field: {field: NAME} (its value), "
    "{field: NAME, granularity: hour|day|month|year} (its event time), {field: NAME, truncate: WIDTH}"
)
# Epoch milliseconds have no Iceberg time transform; truncate[ms] of the long is one for a fixed-length period.
EPOCH_MS_TRUNCATE = {"hour": 3_600_000, "day": 86_400_000}


def partition_choice(value: Any, option: str) -> Any:
    """``value`` of ``option`` (``iceberg.partition_by``) as a :data:`PartitionChoice`, refused with what is allowed."""
    if isinstance(value, str):
        if value not in KAFKA_PARTITIONINGS:
            raise ValueError(f"{option}: {value!r} is not a partitioning; use {_CHOICES_TEXT}")
        return value
    if isinstance(value, dict):
        try:
            return FieldPartitioning.model_validate(value)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join([option, *map(str, e['loc'])])}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"{problems} ({option} is {_CHOICES_TEXT})") from None
    return value


def partition_refusal(
    choice: FieldPartitioning, kind: FieldKind, type_label: str, output_format: str, option: str
) -> str | None:
    """Why ``choice`` cannot partition by its field of ``kind`` (``type_label`` as declared) for ``output_format``,
    naming ``option``, the field, its type and what is allowed; ``None``: it can."""
    name = f"{option}: field {choice.field!r} is {type_label}"
    if kind == "nested":
        return f"{name}; partition by a scalar field (a string, number, boolean, date or timestamp)"
    if choice.granularity is not None:
        if kind not in ("timestamp", "date", "integer"):
            return (
                f"{name}, and granularity {choice.granularity} needs a timestamp, date or an integer of epoch "
                "milliseconds; partition by its value ({field: NAME}) instead"
            )
        if kind == "date" and choice.granularity == "hour":
            return f"{name}, which has no hour: use granularity day, month or year"
        if kind == "integer" and output_format == "iceberg" and choice.granularity not in EPOCH_MS_TRUNCATE:
            return (
                f"{name}, read as epoch milliseconds, which an Iceberg table partitions by hour or day only "
                "(Iceberg's time transforms take timestamps; a fixed period is a truncate of the milliseconds); "
                "declare the field as a timestamp (schema_ddl) for month or year"
            )
    if choice.truncate is not None and kind not in ("string", "integer", "decimal"):
        return f"{name}; truncate takes a string, integer or decimal field"
    return None


def _output_option(value: Any, info: ValidationInfo, section: str) -> Any:
    return partition_choice(value, f"{section}.{info.field_name}")


IcebergMode = Literal["append", "upsert"]
ChangeFormat = Literal["debezium", "state"]
# Change metadata a keyed table may keep beside the row (``iceberg.change_columns``), each as ``_<name>``.
ChangeColumn = Literal["op", "source_ts_ms", "ts_ms"]
KAFKA_KEY = "key"  # in ``iceberg.key``: the record's Kafka key (a declared field may never take this name)


class IcebergOutput(_Model):
    """Where an Iceberg feed publishes: ``table`` (``namespace.name``) in Tidemark's catalog.

    The catalog itself (its URL and credentials) is never part of a feed: see
    :mod:`tidemark.output.iceberg`. ``quarantine`` is where records kept aside go (default
    ``<output>.quarantine``, a Parquet folder beside the table's location). ``dead_letters``
    (``namespace.name``) is the feed's dead-letter table in the same catalog (default
    ``<table's name>_dead_letters`` in the table's namespace: :mod:`tidemark.output.dead_letter_table`).
    ``partition_by``: ``date`` (default: the ``date`` column, the record timestamp's UTC
    date, then ``topic``), ``hour`` / ``day`` / ``month`` (Iceberg's transform of the
    record's Kafka ``timestamp``, then ``topic``), ``none``, or a value field
    (:class:`FieldPartitioning`: ``{field: order_ts, granularity: day}``, ``{field: country}``).
    A change evolves the table's spec with the next commit; files already written keep theirs.

    ``mode``: ``append`` (default: every record a new row) or ``upsert`` (a change stream into a
    table holding the current row per ``key``: :mod:`tidemark.output.changes`). ``key`` names
    one or more value columns (for ``debezium``, columns of the envelope's ``after``), or
    ``key`` for the record's Kafka key. ``change_format``: ``debezium`` (the envelope
    ``before``/``after``/``op``/``source``/``ts_ms``; ``op`` ``d`` deletes) or ``state`` (a
    compacted topic's latest-state records; a null value, a tombstone, deletes the key).
    ``change_columns``: change metadata kept in the table as ``_op``, ``_source_ts_ms``, ``_ts_ms``.
    """

    table: str | None = None
    quarantine: str | None = None
    dead_letters: str | None = None
    partition_by: PartitionChoice = "date"
    mode: IcebergMode = "append"
    key: tuple[str, ...] = ()
    change_format: ChangeFormat | None = None
    change_columns: tuple[ChangeColumn, ...] = ()

    @field_validator("table", "dead_letters")
    @classmethod
    def _table_ok(cls, v: str | None) -> str | None:
        if v is not None and not ICEBERG_TABLE.match(v):
            raise ValueError(f"{v!r} is not namespace.name (letters, digits and '_', one dot)")
        return v

    @field_validator("partition_by", mode="before")
    @classmethod
    def _choice(cls, v: Any, info: ValidationInfo) -> Any:
        return _output_option(v, info, "iceberg")

    @field_validator("key", mode="before")
    @classmethod
    def _key_list(cls, v: Any) -> Any:
        return (v,) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _upsert_fields(self) -> IcebergOutput:
        if self.mode != "upsert":
            given = [n for n in ("key", "change_format", "change_columns") if getattr(self, n)]
            if given:
                raise ValueError(f"'{given[0]}' is for a keyed table: it needs mode: upsert")
            return self
        if not self.key:
            raise ValueError("mode: upsert needs 'key': one or more value columns, or 'key' for the Kafka key")
        if self.change_format is None:
            raise ValueError("mode: upsert needs 'change_format': debezium or state")
        for name in self.key:
            if not name or "." in name or name.startswith("_"):
                raise ValueError(
                    f"key {name!r}: a key is a top-level column name (for debezium, a column of 'after'), not a "
                    "nested path and not a name starting with '_' (the table's change columns)"
                )
        if len(set(self.key)) != len(self.key):
            raise ValueError(f"key {list(self.key)} names a column twice")
        if "source_ts_ms" in self.change_columns and self.change_format != "debezium":
            raise ValueError("change_columns: source_ts_ms is the Debezium envelope's source.ts_ms (change_format: "
                             "debezium)")  # fmt: skip
        if self.partition_by != "date" and self.partition_by != "none":
            raise ValueError(
                f"partition_by: {self.partition_by} is not built for mode: upsert (a keyed table is unpartitioned: "
                "its merge deletes by key across the whole table); leave it out or say none"
            )
        return self


class ParquetOutput(_Model):
    """How a Parquet feed lays out a plan's folder (``parquet:``).

    ``partition_by``: ``date`` (default: ``topic=<t>/date=<d>/`` folders, the record
    timestamp's UTC date), ``hour`` / ``day`` / ``month`` (``timestamp_hour=...`` of the Kafka
    timestamp, then ``topic=``), ``none`` (the plan's files side by side), or a value field
    (:class:`FieldPartitioning`): Hive-style ``<field>_value=<value>/`` folders for its value,
    ``<field>_<granularity>=<time>/`` / ``<field>_trunc=<value>/`` for a transform, each beside
    the column, which the files keep (``docs/read-publish.md``).
    """

    partition_by: PartitionChoice = "date"

    @field_validator("partition_by", mode="before")
    @classmethod
    def _choice(cls, v: Any, info: ValidationInfo) -> Any:
        return _output_option(v, info, "parquet")


class Maintenance(_Model):
    """Table maintenance of an Iceberg feed (``maintenance:``): what ``tidemark maintain`` and the feed's
    ``tidemark_maintain_<feed>`` DAG do (:mod:`tidemark.output.maintenance`).

    ``schedule``: when the maintenance DAG runs (a cron or preset; default ``@daily``).
    Compaction: a table partition with at least ``min_input_files`` data files smaller than
    three quarters of ``target_file_mb`` has them rewritten into files near ``target_file_mb``
    (Iceberg's defaults: 5 files; 512 MB, here 128 MB for feeds of small runs).
    Snapshot expiry: snapshots older than ``snapshot_max_age`` are expired, except the newest
    ``keep_snapshots`` of the main branch and every branch's or tag's head. Orphan removal:
    files under the table's location that no snapshot, metadata file or pending run names,
    older than ``orphan_min_age`` (at least 1h: a job uploads files before its run commits
    them). Durations as ``30m``, ``72h`` or ISO 8601.
    """

    schedule: str = "@daily"
    target_file_mb: PositiveInt = 128
    min_input_files: int = Field(default=5, ge=2)
    keep_snapshots: PositiveInt = 10
    snapshot_max_age: str = "120h"
    orphan_min_age: str = "72h"

    @field_validator("schedule")
    @classmethod
    def _schedule_known(cls, v: str) -> str:
        schedule_interval(v)
        return v

    @field_validator("snapshot_max_age", "orphan_min_age")
    @classmethod
    def _duration_ok(cls, v: str, info: ValidationInfo) -> str:
        _duration_field(v, f"maintenance.{info.field_name}")
        if info.field_name == "orphan_min_age" and parse_skew(v) < timedelta(hours=1):
            raise ValueError(
                "maintenance.orphan_min_age: at least 1h (a run's job uploads its files before the run commits them)"
            )
        return v

    @property
    def target_file_bytes(self) -> int:
        return self.target_file_mb * 1024 * 1024

    @property
    def snapshot_max_age_td(self) -> timedelta:
        return parse_skew(self.snapshot_max_age, "maintenance.snapshot_max_age")

    @property
    def orphan_min_age_td(self) -> timedelta:
        return parse_skew(self.orphan_min_age, "maintenance.orphan_min_age")


class Feed(_Model):
    """One feed: what to read, from where it resumes, and how it is checked and written."""

    name: str
    # ``topics: {pattern: ...}`` in the file: the topics are the cluster's matches when a run is planned.
    # Declared before ``topics``, whose check needs it.
    topic_pattern: TopicPattern | None = None
    # The topics by name; empty for a pattern feed until a run resolves its pattern (:meth:`with_topics`).
    topics: tuple[str, ...]
    group: str = Field(min_length=1, max_length=249)
    schedule: str | None = None
    on_missing: OnMissing = "earliest"
    reset_timestamp: datetime | None = None
    on_new_partition: OnNewPartition = "earliest"
    on_data_loss: OnDataLoss = "fail"
    on_ahead: OnAhead = "fail"
    on_group_moved: OnGroupMoved = "follow"
    max_records_per_partition: PositiveInt | None = None
    max_records_per_run: PositiveInt | None = None
    records_per_task: PositiveInt = 1_000_000
    # Plans of at most this many records are read by the Spark driver itself, without
    # Python workers (tidemark.spark.source.read_plan_in_driver), unless their records hold more
    # than tidemark.spark.source.DRIVER_READ_MAX_BYTES; 0 always uses the data source.
    driver_read_max_records: NonNegativeInt = 250_000
    isolation: Isolation = "read_committed"
    deserialization: Deserialization = Deserialization()
    output: str | None = None
    output_format: OutputFormat = "parquet"
    iceberg: IcebergOutput | None = None
    parquet: ParquetOutput | None = None
    # A Parquet output keeps one schema across its plans: what a change of it does (SchemaChange).
    schema_change: SchemaChange = "fail"
    validation: Validation = Validation()
    time_windows: TimeWindows = TimeWindows()
    alerts: Alerts | None = None
    # Whether the feed's DAG ends with `tidemark verify` (docs/verify.md); TIDEMARK_DAG_VERIFY=0: no DAG does.
    verify: bool = True
    trigger: Trigger | None = None
    maintenance: Maintenance | None = None
    # Sensitive fields, masked in the job right after decoding (tidemark.config.masking, tidemark.spark.masking).
    masking: Masking | None = None
    # The team owning the feed (docs/deploy.md, "Team-per-feed deployment"): besides the rights on the feed's DAG,
    # a user reaches the feed only as a member of this team (tidemark.orchestration.access.in_team).
    team: str | None = Field(default=None, pattern=TEAM_NAME)

    @model_validator(mode="before")
    @classmethod
    def _pattern_form(cls, data: Any) -> Any:
        """``topics: {pattern: ..., exclude: [...]}`` is read into ``topic_pattern``; a list stays ``topics``."""
        if not isinstance(data, dict):
            return data
        if "topic_pattern" in data:
            raise ValueError("write a topic pattern as topics: {pattern: ..., exclude: [...]}, not topic_pattern")
        topics = data.get("topics")
        return {**data, "topics": (), "topic_pattern": topics} if isinstance(topics, dict) else data

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not FEED_NAME.match(v):
            raise ValueError("feed names use letters, digits, '.', '_' and '-' (the file's stem)")
        return v

    @field_validator("topics")
    @classmethod
    def _topics_unique(cls, v: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        # A pattern that failed its own check is absent from info.data: that error is enough.
        if not v and "topic_pattern" in info.data and info.data["topic_pattern"] is None:
            raise ValueError(
                "list at least 1 topic (topics: [orders.v1]) or give a pattern (topics: {pattern: 'orders\\..*'})"
            )
        if len(set(v)) != len(v):
            raise ValueError("a topic is listed twice")
        for topic in v:
            # Kafka's own rule; checked here so a typo fails with the file's name, not a broker error.
            if not TOPIC_NAME.match(topic) or topic in (".", ".."):
                raise ValueError(f"{topic!r} is not a Kafka topic name (letters, digits, '.', '_', '-'; 1-249)")
        return v

    @field_validator("topic_pattern")
    @classmethod
    def _pattern_ok(cls, v: TopicPattern | None, info: ValidationInfo) -> TopicPattern | None:
        if v is None:
            return v
        feed = info.data.get("name", "?")
        refusals = [_regex_refusal(feed, "topics.pattern", v.pattern)]
        refusals += [_regex_refusal(feed, f"topics.exclude[{i}]", x) for i, x in enumerate(v.exclude)]
        if found := [r for r in refusals if r is not None]:
            raise ValueError("; ".join(found))
        return v

    @field_validator("reset_timestamp")
    @classmethod
    def _aware(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is None:
            raise ValueError("give a timezone, e.g. 2026-01-31T00:00:00Z")
        return v

    @field_validator("schedule")
    @classmethod
    def _schedule_known(cls, v: str | None) -> str | None:
        if v is not None:
            schedule_interval(v)
        return v

    @model_validator(mode="after")
    def _cross_field(self) -> Feed:
        if self.on_missing == "timestamp" and self.reset_timestamp is None:
            raise ValueError("on_missing: timestamp needs reset_timestamp")
        if self.on_missing != "timestamp" and self.reset_timestamp is not None:
            raise ValueError("reset_timestamp is used only with on_missing: timestamp")
        if (
            self.max_records_per_partition
            and self.max_records_per_run
            and self.max_records_per_partition > self.max_records_per_run
        ):
            raise ValueError("max_records_per_partition is larger than max_records_per_run")
        if self.iceberg is not None and self.output_format != "iceberg":
            if self.iceberg.mode == "upsert":
                raise ValueError(
                    "iceberg.mode: upsert needs output_format: iceberg (a Parquet folder is append-only: it cannot "
                    "replace or delete a key's row)"
                )
            raise ValueError("'iceberg' settings need output_format: iceberg")
        if self.output_format == "iceberg" and self.iceberg_dead_letters == self.iceberg_table:
            raise ValueError(
                f"iceberg.dead_letters names the feed's own table {self.iceberg_table}; the dead letters go to a "
                "table of their own (leave it out for <table>_dead_letters)"
            )
        if self.parquet is not None and self.output_format != "parquet":
            raise ValueError(
                "'parquet' settings need output_format: parquet (an Iceberg feed sets iceberg.partition_by)"
            )
        refusal = self._partition_refusal()
        if refusal is not None:
            raise ValueError(refusal)
        if self.iceberg is not None and self.iceberg.mode == "upsert":
            _check_change_feed(self.iceberg, self.deserialization)
            if self.maintenance is not None:
                raise ValueError(
                    "'maintenance' is not built for iceberg.mode: upsert (its compaction sorts an append table's rows "
                    "by offset); leave it out of a keyed table's feed"
                )
        if self.maintenance is not None and self.output_format != "iceberg":
            raise ValueError(
                "'maintenance' is for Iceberg tables (output_format: iceberg); a Parquet folder's plans are kept as "
                "published (see docs/ARCHITECTURE.md, 'Table maintenance')"
            )
        deser = self.deserialization
        # A pattern may match several topics (and more later): its reader schemas are named, never <topic>-value.
        several = len(self.topics) > 1 or self.topic_pattern is not None
        if deser.format in REGISTRY_FORMATS and deser.subject is None and several:
            raise ValueError(
                "deserialization.subject: a feed of several topics names the subject of its reader schema "
                "(a topic pattern too: it may match several)"
            )
        if deser.key_format in REGISTRY_FORMATS and deser.key_subject is None and several:
            raise ValueError(
                "deserialization.key_subject: a feed of several topics names the subject of its key's reader schema "
                "(a topic pattern too: it may match several)"
            )
        if self.masking is not None:
            self._check_masking(self.masking)
        own = own_clashes(self.claims())
        if own:
            raise ValueError(own[0].describe())
        return self

    def claims(self) -> list[Claim]:
        """Everything this feed owns (:mod:`tidemark.config.ownership`): its paths, its tables and its group."""
        out = self.output_location().url
        label = "output" if self.output else "output (default)"
        found = [Claim(self.name, label, "path", out, explicit=False)]
        found += [Claim(self.name, f"the {label}'s sibling", "path", out + s, explicit=False) for s in SIBLINGS]
        if self.iceberg is not None and self.iceberg.quarantine:
            found.append(Claim(self.name, "iceberg.quarantine", "path", Location.of(self.iceberg.quarantine).url))
        if self.masking is not None and self.masking.keep_raw is not None:
            found.append(Claim(self.name, "masking.keep_raw", "path", Location.of(self.masking.keep_raw).url))
        if self.output_format == "iceberg":
            table, dead = (self.iceberg.table, self.iceberg.dead_letters) if self.iceberg else (None, None)
            found.append(Claim(self.name, "iceberg.table" + ("" if table else " (default)"), "table",
                               self.iceberg_table))  # fmt: skip
            found.append(Claim(self.name, "iceberg.dead_letters" + ("" if dead else " (default)"), "table",
                               self.iceberg_dead_letters))  # fmt: skip
        found.append(Claim(self.name, "group", "group", self.group))
        return found

    def _partition_refusal(self) -> str | None:
        """Why the feed's value-field partitioning does not fit the value's declared fields (``None``: it does).

        A JSON value's fields are declared in the file and checked here; a registry format's
        come from its reader schema, checked when a run reads it (:mod:`tidemark.output.partitioning`).
        """
        choice = self.partitioning
        if not isinstance(choice, FieldPartitioning):
            return None
        option = f"{self.output_format}.partition_by"
        deser = self.deserialization
        if deser.format in REGISTRY_FORMATS:
            return None
        if deser.format != "json":
            return (
                f"{option}: field {choice.field!r}: a value of format: {deser.format} has no fields; partition by "
                "the Kafka timestamp (date, hour, day, month) or decode the value (format: json, avro, ...)"
            )
        declared = self._declared_fields()
        if declared is None:  # a DDL this check cannot read: the run checks the decoded schema
            return None
        if choice.field not in declared:
            return (
                f"{option}: {choice.field!r} is not a declared field of the value (declared: "
                f"{', '.join(declared) or 'none'}); name a top-level field of deserialization's schema"
            )
        type_name = declared[choice.field].type
        return partition_refusal(choice, field_kind(type_name), type_name, self.output_format, option)

    @property
    def tombstones_are_changes(self) -> bool:
        """Whether a null value (a tombstone) is a change, the delete of its key (``iceberg.mode: upsert``): decoded
        as a record whose value columns are null, not quarantined as a bad record."""
        return self.iceberg is not None and self.iceberg.mode == "upsert"

    @property
    def partitioning(self) -> PartitionChoice:
        """How the output is partitioned: ``iceberg.partition_by`` or ``parquet.partition_by`` (default ``date``)."""
        section = self.iceberg if self.output_format == "iceberg" else self.parquet
        return section.partition_by if section is not None else "date"

    @model_validator(mode="before")
    @classmethod
    def _change_rules(cls, data: Any) -> Any:
        """A change stream's records that cannot be applied are quarantined as any bad record is (or fail the run,
        as the feed's ``validation`` says): the rules are added to the feed's expectations, once."""
        if not isinstance(data, dict) or not isinstance(data.get("iceberg"), dict):
            return data
        iceberg = data["iceberg"]
        if iceberg.get("mode") != "upsert":
            return data
        keys = iceberg.get("key") or ()
        keys = (keys,) if isinstance(keys, str) else tuple(keys)
        rules: list[dict[str, Any]] = []
        if iceberg.get("change_format") == "debezium":
            rules.append({"type": "expect_column_values_to_be_in_set",
                          "kwargs": {"column": "op", "value_set": list(DEBEZIUM_OPS)}})  # fmt: skip
            if KAFKA_KEY in keys:
                rules.append({"type": "expect_column_values_to_not_be_null", "kwargs": {"column": KAFKA_KEY}})
        elif iceberg.get("change_format") == "state":
            rules += [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": k}} for k in keys]
        validation = dict(data.get("validation") or {})
        have = list(validation.get("expectations") or ())
        validation["expectations"] = [*have, *(r for r in rules if r not in have)]
        return {**data, "validation": validation}

    def _check_masking(self, masking: Masking) -> None:
        """Masked paths exist in the declared schema (a registry schema's: checked by the job), no expectation
        names a dropped field, and raw bytes are kept outside the output."""
        self._check_masked_columns(masking)
        deser = self.deserialization
        if masking.fields and deser.format in ("bytes", "string"):
            raise ValueError(
                f"masking.fields: a value of format {deser.format} has no fields to mask; declare its schema "
                "(format: json, avro, json_schema or protobuf) or mask the key and headers only"
            )
        declared = self._declared_fields()
        for path, treatment in masking.fields.items() if declared is not None else ():
            problem = path_problem(path, treatment, declared or {})
            if problem is not None:
                raise ValueError(f"masking.fields.{path}: {problem}")
        for expectation in self.validation.expectations:
            column = str(expectation.kwargs.get("column", ""))
            hit = [p for p in masking.dropped if column == p or column.startswith(p + ".")]
            if hit:
                raise ValueError(
                    f"validation.expectations: {expectation.type} names column '{column}', which masking.fields "
                    f"drops ('{hit[0]}: drop'); expectations see the masked record: drop the expectation or mask "
                    "the field another way (hash, redact, truncate)"
                )
        if masking.keep_raw is not None:
            kept, out = Location.of(masking.keep_raw).url, self.output_location().url
            inside = [o for o in (out, f"{out}.quarantine", f"{out}.backfills", f"{out}.replays")
                      if kept == o or kept.startswith(o + "/")]  # fmt: skip
            if inside:
                raise ValueError(
                    f"masking.keep_raw: {masking.keep_raw} lies inside the feed's output ({inside[0]}), which its "
                    "readers see; keep raw bytes in a separately secured location"
                )

    @staticmethod
    def _check_masked_key(masking: Masking, iceberg: IcebergOutput) -> None:
        """A keyed table's key is masked one-to-one or not at all: ``redact`` gives every key the same marker and
        ``truncate`` gives keys sharing a prefix the same value, so distinct keys would fold into one row. ``hash``
        (HMAC-SHA256, 256 bits) keeps them apart but for a collision, whose chance among n keys is below
        n²/2²⁵⁷ (10¹² keys: under 10⁻⁵²)."""
        images = ("after", "before") if iceberg.change_format == "debezium" else ("",)
        masked: list[tuple[str, str, Treatment]] = []  # (the masking option, the key column, its treatment)
        for name in iceberg.key:
            if name == KAFKA_KEY:
                masked += [("masking.key", name, masking.key)] if masking.key is not None else []
                continue
            paths = [f"{image}.{name}" if image else name for image in images]
            masked += [(f"masking.fields.{p}", name, t) for p, t in masking.fields.items()
                       if any(path == p or path.startswith(p + ".") for path in paths)]  # fmt: skip
        for where, name, treatment in masked:
            kind = treatment_name(treatment)
            if kind in ("redact", "truncate"):
                how = "every key becomes one marker" if kind == "redact" else "keys sharing a prefix become one"
                raise ValueError(
                    f"{where}: {kind} masks the keyed table's key '{name}' (iceberg.key) many-to-one ({how}), so "
                    "distinct keys would fold into one row; hash it (HMAC-SHA256: distinct keys stay apart and "
                    "masked keys still match) or key the table by another column"
                )

    def _check_masked_columns(self, masking: Masking) -> None:
        """A column the output is built on (a keyed table's key, the partitioning's field) is not dropped."""
        iceberg = self.iceberg
        if iceberg is not None and iceberg.mode == "upsert":
            in_value = "after." if iceberg.change_format == "debezium" else ""
            for name in iceberg.key:
                if (masking.key == "drop") if name == KAFKA_KEY else f"{in_value}{name}" in masking.dropped:
                    raise ValueError(
                        f"masking drops '{name}', the keyed table's key (iceberg.key): its changes would have no key "
                        "to apply by; hash it instead (masked keys still match) or key the table by another column"
                    )
            self._check_masked_key(masking, iceberg)
        choice = self.partitioning
        if isinstance(choice, FieldPartitioning) and choice.field in masking.dropped:
            raise ValueError(
                f"masking drops '{choice.field}', the field {self.output_format}.partition_by partitions by; "
                "partition by another field, or mask it another way (hash, redact, truncate)"
            )

    def _declared_fields(self) -> dict[str, DeclaredField] | None:
        """The declared JSON schema's fields, or None when only the job knows them (a registry format, or DDL
        this check cannot read: Spark's parser then has the last word)."""
        deser = self.deserialization
        if deser.format != "json":
            return None
        if deser.schema_ddl is None:
            return {f.name: DeclaredField(f.type) for f in deser.fields}
        try:
            return ddl_fields(deser.schema_ddl)
        except ValueError:
            return None

    def with_topics(self, topics: tuple[str, ...]) -> Feed:
        """This feed reading ``topics``: a pattern feed as one run resolved it (the pattern is kept)."""
        return self.model_copy(update={"topics": tuple(topics)})

    @property
    def topics_label(self) -> str:
        """The feed's topics as pages and descriptions show them: the names, or the pattern."""
        return self.topic_pattern.label if self.topic_pattern is not None else ", ".join(self.topics)

    @property
    def iceberg_table(self) -> str:
        """The Iceberg table of an ``output_format: iceberg`` feed (default ``tidemark.<feed name>``)."""
        chosen = self.iceberg.table if self.iceberg is not None else None
        return chosen or "tidemark." + re.sub(r"[^A-Za-z0-9_]", "_", self.name)

    @property
    def iceberg_dead_letters(self) -> str:
        """An Iceberg feed's dead-letter table: ``iceberg.dead_letters``, else ``<table>_dead_letters`` beside it."""
        chosen = self.iceberg.dead_letters if self.iceberg is not None else None
        return chosen or f"{self.iceberg_table}_dead_letters"

    @property
    def reset_timestamp_ms(self) -> int | None:
        return None if self.reset_timestamp is None else int(self.reset_timestamp.timestamp() * 1000)

    @property
    def interval(self) -> timedelta | None:
        return None if self.schedule is None else schedule_interval(self.schedule)

    def output_location(self) -> Location:
        """Where scheduled runs publish: ``output`` (a local path or ``s3://...``), else ``<state>/output/<feed>``."""
        return Location.of(self.output) if self.output else state_location() / "output" / self.name

    def output_dir(self) -> Path:
        """The output as a local folder (refused for an object-store output)."""
        return self.output_location().local_path()

    def output_for(self, mode: str) -> Location:
        """Where a run of ``mode`` publishes by default: backfills and replays beside the feed's own output.

        They go beside it (``<output>.backfills``, ``<output>.replays``), so a reader of the
        feed's output never sees a replayed record twice. Committing ones are the feed's
        next run and publish into its output (:func:`tidemark.planning.committing.committing_request`).
        """
        base = self.output_location()
        return base if mode == "scheduled" else base.with_name(f"{base.name}.{mode}s")


DEBEZIUM_OPS = ("c", "u", "r", "d")  # create, update, read (a snapshot's row), delete; a tombstone has none
# The reasons a keyed table's change cannot be applied, beside the feed's own expectations: Tidemark's rules
# (``validation.rules.change_rules``), the job's check of the staged changes and the merge's own
# (``output.changes.change_problem``) say them alike.
CHANGE_KEY_LABEL = "change_without_key"  # + "(<key columns>)": the image lacks a key column's value
CHANGE_OP_LABEL = "change_without_op"  # a Debezium record with an image but a null op (a tombstone has neither)
CHANGE_IMAGE_LABEL = "change_without_image"  # c/u/r without 'after' when the Kafka key is the only key


def _check_change_feed(iceberg: IcebergOutput, deser: Deserialization) -> None:
    """What a keyed table needs of the feed's decoding, checked where the file says it (a registry schema's or a
    DDL's columns are checked when the run decodes, :mod:`tidemark.output.changes`)."""
    if deser.format in ("bytes", "string"):
        raise ValueError(
            f"iceberg.mode: upsert needs decoded values (deserialization.format json, avro, json_schema or protobuf), "
            f"not format: {deser.format}: the key and the change are columns of the value"
        )
    if iceberg.change_format == "debezium" and deser.fields:
        raise ValueError(
            "iceberg.change_format: debezium: the envelope's 'before' and 'after' are structs; declare them in "
            "deserialization.schema_ddl ('before struct<...>, after struct<...>, op string, source struct<...>, "
            "ts_ms long'), not in 'fields'"
        )
    if deser.fields:
        names = {f.name for f in deser.fields}
        missing = [k for k in iceberg.key if k != KAFKA_KEY and k not in names]
        if missing:
            raise ValueError(
                f"iceberg.key: {missing[0]!r} is not a declared field of the value (fields: {sorted(names)}); "
                f"say '{KAFKA_KEY}' for the record's Kafka key"
            )
        required = [f.name for f in deser.fields if f.required]
        if required:
            raise ValueError(
                f"iceberg.mode: upsert: field '{required[0]}' is required, so a tombstone (a null value, which "
                "deletes its key) would be quarantined instead; declare the value's fields with required: false"
            )


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        # ``topics: {pattern: ...}`` is validated as ``topic_pattern``: named as the file names it.
        loc = ".".join("topics" if p == "topic_pattern" else str(p) for p in err["loc"]) or "(file)"
        parts.append(f"field '{loc}': {err['msg']}")
    return "; ".join(parts)


def parse_feed(name: str, doc: Any, source: str) -> Feed:
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: a feed file must be a YAML mapping, got {type(doc).__name__}")
    if "name" in doc:
        raise ConfigError(f"{source}: field 'name': not allowed, the feed's name is the file's stem ('{name}')")
    try:
        return Feed(name=name, **doc)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from exc


def load_feed_file(path: Path) -> Feed:
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read feed file: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return parse_feed(path.stem, doc, str(path))


def load_feed(name_or_path: str, directory: Path | None = None) -> Feed:
    """A feed by name (looked up in the feeds folder) or by path to its YAML file; refused when it claims what
    another feed file of its folder claims (:func:`ownership_problems`)."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") and candidate.exists():
        return _owning(load_feed_file(candidate), candidate)
    folder = directory or feeds_dir()
    for suffix in (".yaml", ".yml"):
        path = folder / f"{name_or_path}{suffix}"
        if path.exists():
            return _owning(load_feed_file(path), path)
    known = ", ".join(sorted(f.stem for f in folder.glob("*.y*ml"))) or "none"
    raise ConfigError(f"no feed named '{name_or_path}' in {folder} (known feeds: {known})")


def _owning(feed: Feed, path: Path) -> Feed:
    """``feed`` (from ``path``), unless it clashes with another loadable feed file of its folder."""
    loaded = {feed.name: (feed, path)}
    for other in _feed_files(path.parent):
        if other.stem not in loaded:
            with contextlib.suppress(ConfigError):  # a file that does not load is reported on its own
                loaded[other.stem] = (load_feed_file(other), other)
    problem = ownership_problems(loaded).get(feed.name)
    if problem is not None:
        raise ConfigError(problem.error)
    return feed


def _feed_files(folder: Path) -> list[Path]:
    return sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")])


def ownership_problems(loaded: dict[str, tuple[Feed, Path]]) -> dict[str, FeedProblem]:
    """The feeds of ``loaded`` (name: feed and its file) whose claims clash (:mod:`tidemark.config.ownership`):
    with another feed's (both are refused, naming both files) or with the state dir."""
    files = {name: f"feed file {path}" for name, (_, path) in loaded.items()}
    claims = [c for feed, _ in loaded.values() for c in feed.claims()]
    errors: dict[str, list[str]] = {}
    involved: dict[str, list[str]] = {}
    found: list[Clash] = clashes(claims)
    for c in found:
        text = c.describe(files)
        for name, other in ((c.first.feed, c.second.feed), (c.second.feed, c.first.feed)):
            errors.setdefault(name, []).append(text)
            involved.setdefault(name, [str(loaded[name][1])]).append(str(loaded[other][1]))
    state = state_location().url
    for name, (feed, path) in loaded.items():
        for text in state_clashes(feed.claims(), state):
            errors.setdefault(name, []).append(
                f"{files[name]}: {text}, which Tidemark alone writes; choose a place outside it"
            )
            involved.setdefault(name, [str(path)])
    return {
        name: FeedProblem(name, tuple(dict.fromkeys(involved[name])), "; ".join(dict.fromkeys(texts)))
        for name, texts in errors.items()
    }


# Tidemark's own DAGs, tidemark_<name>: no feed may take their ids.
BUILTIN_DAGS = ("backfill", "replay", "redrive", "watchdog")


def dag_id(name: str) -> str:
    """The Airflow DAG id of feed ``name`` (or of a built-in DAG): ``tidemark_<name>``, dots as ``_``."""
    return f"tidemark_{name.replace('.', '_')}"


@dataclass(frozen=True)
class FeedProblem:
    """A feed file that gets no DAG: its feed name (the stem), the files involved and what is wrong with them."""

    name: str
    files: tuple[str, ...]
    error: str

    @property
    def dag_id(self) -> str:
        return dag_id(self.name)

    @property
    def message(self) -> str:
        """The error with what it costs and the remedy, as Airflow and the view show it."""
        return (
            f"{self.error}. Feed '{self.name}' has no DAG ('{self.dag_id}') and does not run until "
            f"{' and '.join(self.files)} {'is' if len(self.files) == 1 else 'are'} fixed; every other feed loads"
        )


@dataclass(frozen=True)
class FeedScan:
    """The feeds folder read file by file: the feeds that load, by name, and the files that do not."""

    feeds: dict[str, Feed]
    problems: tuple[FeedProblem, ...]


def scan_feeds(directory: Path | None = None) -> FeedScan:
    """Every feed in the folder, each file on its own: one bad file never hides another feed.

    A file that is not valid YAML or not a valid feed, two files that map to one DAG id
    (``orders.v1`` and ``orders_v1``, or ``orders.yaml`` beside ``orders.yml``: neither is
    loaded, as nothing says which one is meant), or a feed named after a built-in DAG
    (``replay``, ``backfill``) is a :class:`FeedProblem` naming the file(s) and the field. So are
    two feeds that claim one path, table or group (:func:`ownership_problems`): both files are
    named and neither feed loads, as nothing says which one owns it.
    """
    folder = directory or feeds_dir()
    paths = _feed_files(folder)
    by_dag: dict[str, list[Path]] = {}
    for path in paths:
        by_dag.setdefault(dag_id(path.stem), []).append(path)
    feeds: dict[str, Feed] = {}
    source: dict[str, Path] = {}
    problems: list[FeedProblem] = []
    for dag, files in by_dag.items():
        builtin = [b for b in BUILTIN_DAGS if dag_id(b) == dag]
        if len(files) > 1:
            error = (
                f"feed files {' and '.join(str(f) for f in files)} all map to the DAG id '{dag}'; "
                "rename all but one (a feed's name is its file's stem)"
            )
            problems += [FeedProblem(f.stem, tuple(str(f) for f in files), error) for f in files]
        elif builtin:
            error = (
                f"feed file {files[0]} would take the DAG id '{dag}' of Tidemark's built-in {builtin[0]} DAG; "
                "rename the file"
            )
            problems.append(FeedProblem(files[0].stem, (str(files[0]),), error))
        else:
            try:
                feeds[files[0].stem] = load_feed_file(files[0])
                source[files[0].stem] = files[0]
            except ConfigError as exc:
                problems.append(FeedProblem(files[0].stem, (str(files[0]),), str(exc)))
    owned = ownership_problems({name: (feed, source[name]) for name, feed in feeds.items()})
    problems += owned.values()
    feeds = {name: feed for name, feed in feeds.items() if name not in owned}
    return FeedScan(dict(sorted(feeds.items())), tuple(problems))


def load_feeds(directory: Path | None = None) -> dict[str, Feed]:
    """Every feed in the folder, by name; refuses the lot if any file is bad (see :func:`scan_feeds`).

    For callers that must know every feed, such as the check that a replay's output is no
    other feed's output: a feed whose file does not load could own that output.
    """
    scan = scan_feeds(directory)
    if scan.problems:
        raise ConfigError("; ".join(dict.fromkeys(p.error for p in scan.problems)))
    return scan.feeds
