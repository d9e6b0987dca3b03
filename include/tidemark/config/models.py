"""Feed configs and Tidemark's settings.

A feed is one YAML file in the feeds folder (``include/feeds/`` unless
``TIDEMARK_FEEDS_DIR`` says otherwise); the file's stem is the feed's name. Files are
validated by Pydantic models that forbid unknown keys, bound every number and check
cross-field rules, and a bad file is reported with its path and the failing field.
Connection settings (brokers, credentials) are never part of a feed: see
:mod:`tidemark.kafka.connection`.
"""

from __future__ import annotations

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
from tidemark.config.durations import parse_skew, schedule_interval
from tidemark.config.masking import DeclaredField, Masking, ddl_fields, path_problem
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

FEED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
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


IcebergPartitioning = Literal["date", "hour", "day", "month", "none"]


class IcebergOutput(_Model):
    """Where an Iceberg feed publishes: ``table`` (``namespace.name``) in Tidemark's catalog.

    The catalog itself (its URL and credentials) is never part of a feed: see
    :mod:`tidemark.output.iceberg`. ``quarantine`` is where records kept aside go (default
    ``<output>.quarantine``, a Parquet folder beside the table's location).
    ``partition_by``: ``date`` (default: the ``date`` column, the record timestamp's UTC
    date, then ``topic``), ``hour`` / ``day`` / ``month`` (Iceberg's transform of the
    record's Kafka ``timestamp``, then ``topic``) or ``none``. A change evolves the table's
    spec with the next commit; files already written keep theirs.
    """

    table: str | None = None
    quarantine: str | None = None
    partition_by: IcebergPartitioning = "date"

    @field_validator("table")
    @classmethod
    def _table_ok(cls, v: str | None) -> str | None:
        if v is not None and not ICEBERG_TABLE.match(v):
            raise ValueError(f"{v!r} is not namespace.name (letters, digits and '_', one dot)")
        return v


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
    validation: Validation = Validation()
    time_windows: TimeWindows = TimeWindows()
    alerts: Alerts | None = None
    trigger: Trigger | None = None
    maintenance: Maintenance | None = None
    # Sensitive fields, masked in the job right after decoding (tidemark.config.masking, tidemark.spark.masking).
    masking: Masking | None = None

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
            raise ValueError("'iceberg' settings need output_format: iceberg")
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
        return self

    def _check_masking(self, masking: Masking) -> None:
        """Masked paths exist in the declared schema (a registry schema's: checked by the job), no expectation
        names a dropped field, and raw bytes are kept outside the output."""
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
    """A feed by name (looked up in the feeds folder) or by path to its YAML file."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") and candidate.exists():
        return load_feed_file(candidate)
    folder = directory or feeds_dir()
    for suffix in (".yaml", ".yml"):
        path = folder / f"{name_or_path}{suffix}"
        if path.exists():
            return load_feed_file(path)
    known = ", ".join(sorted(f.stem for f in folder.glob("*.y*ml"))) or "none"
    raise ConfigError(f"no feed named '{name_or_path}' in {folder} (known feeds: {known})")


BUILTIN_DAGS = ("backfill", "replay", "watchdog")  # Tidemark's own DAGs, tidemark_<name>: no feed may take their ids


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
    (``replay``, ``backfill``) is a :class:`FeedProblem` naming the file(s) and the field.
    """
    folder = directory or feeds_dir()
    paths = sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")])
    by_dag: dict[str, list[Path]] = {}
    for path in paths:
        by_dag.setdefault(dag_id(path.stem), []).append(path)
    feeds: dict[str, Feed] = {}
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
            except ConfigError as exc:
                problems.append(FeedProblem(files[0].stem, (str(files[0]),), str(exc)))
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
