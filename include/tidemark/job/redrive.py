"""Re-drive, dry run only: which of a feed's dead letters its current schema and rules would now let pass.

Each dead letter's raw record (topic, partition, offset, timestamp, key, value, headers)
goes back through the job's own decoding (:func:`tidemark.spark.decode.annotate`) and the
feed's row rules (:class:`tidemark.validation.rules.OutcomeCodes`), in a Spark session
of the caller's, exactly as a run codes a record's outcome; the verdict is the record's
new outcome: ``ok`` (it would pass) or its new reason codes. Nothing is written and
nothing is published: publishing those that pass exactly once, tracked so that a second
re-drive publishes nothing, is not built yet. Registry formats (Avro, JSON Schema,
Protobuf) need the run's registry schemas and are refused here; expectations that are
not row rules (a table's row count, say) are not re-checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from typing import TYPE_CHECKING

from tidemark.config.models import REGISTRY_FORMATS, Feed, load_feed
from tidemark.errors import ConfigError
from tidemark.output.deadletters import DeadLetter, dead_letters
from tidemark.spark.decode import annotate
from tidemark.spark.source import SCHEMA
from tidemark.staged import OK_OUTCOME, UNPUBLISHED_COLUMNS
from tidemark.validation.rules import OutcomeCodes, column_paths

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class Verdict:
    """A dead letter and what the feed's current schema and rules say of it now."""

    letter: DeadLetter
    passes: bool
    reason_codes: tuple[str, ...]  # the new reasons; empty when it passes


def redrive_dry_run(
    spark: SparkSession, feed: Feed | str, since: datetime | date | None = None, reason: str | None = None
) -> list[Verdict]:
    """Every dead letter of ``feed`` (filtered as :func:`dead_letters` filters) with its verdict now."""
    chosen = feed if isinstance(feed, Feed) else load_feed(feed)
    parts = chosen.deserialization.registry_parts
    if parts:
        raise ConfigError(
            f"feed '{chosen.name}': a re-drive dry run decodes without a schema registry, and the feed's "
            f"{', '.join(parts)} use {'/'.join(sorted(REGISTRY_FORMATS))}; not supported yet"
        )
    letters = dead_letters(chosen, since=since, reason=reason)
    if not letters:
        return []
    rows = [(d.topic, d.partition, d.offset, d.timestamp, 0, d.key, d.value,
             [{"key": k, "value": v} for k, v in d.headers], d.plan_id) for d in letters]  # fmt: skip
    decoded = annotate(spark.createDataFrame(rows, schema=SCHEMA), chosen.deserialization)
    record_columns = [c for c in column_paths(decoded.schema) if c not in (*UNPUBLISHED_COLUMNS, "plan_id")]
    codes = OutcomeCodes.of(record_columns, chosen)
    outcomes = {
        (r["topic"], r["partition"], r["offset"]): r["outcome"]
        for r in decoded.select("topic", "partition", "offset", codes.column().alias("outcome")).collect()
    }
    verdicts = []
    for d in letters:
        outcome = outcomes[(d.topic, d.partition, d.offset)]
        now = () if outcome == OK_OUTCOME else codes.labels(outcome)
        verdicts.append(Verdict(d, outcome == OK_OUTCOME, now))
    return verdicts
