"""Validation inside the Spark job: built-in range checks, the feed's GX suite, bad records.

:func:`validate` runs on the DataFrame the job read (persisted by the caller, so Kafka
is read once) and costs few Spark actions: one aggregation per (topic, partition) gives
the range statistics *and* the bad-record counts of every row rule, one small action
samples bad records, and Great Expectations runs its own metrics in a thread beside
them (its context, queries and Data Docs overlap the aggregation's scan).

Built-in checks (always on, :func:`check_ranges`): no record outside its planned range
or in an unplanned partition, no duplicate ``(topic, partition, offset)``, every range
read to its end (verified from the reader's positions when it reports them; the data
alone cannot tell a short read from trailing transaction markers, so the reader raises
on a short read itself), and gaps inside ranges counted, not failed. Manifest counts are
compared with :func:`check_written_counts` after publishing.

The feed's expectations run as a GX 1.x suite (ephemeral context, Spark datasource,
whole-dataframe batch, checkpoint) and produce a validation result plus a Data Docs site
under ``<run_dir>/gx``. ``expect_records`` adds ``expect_table_row_count_to_be_between``
(min 1), so an empty batch does not pass vacuously.

Bad records. Row-level expectations are translated into Spark SQL conditions (true where
a row violates them) so bad rows can be split off: ``not_be_null``, ``be_null``,
``be_between``, ``be_in_set``, ``not_be_in_set``, ``match_regex``, ``not_match_regex``,
``value_lengths_to_be_between`` and ``value_lengths_to_equal`` on an existing column,
without ``row_condition``. Like GX, they ignore nulls except the null checks. Rows with
a ``_decode_error`` are bad too, and so are a keyed table's Debezium changes without their
key's value (:func:`change_rules`: Tidemark's rule, not in the GX suite). Under
``on_bad_records: fail`` any failing expectation, rule or decode error fails the run.
Under ``quarantine`` bad rows go to the quarantine output with a ``_reason`` and the run
fails only if their share exceeds ``quarantine_max_ratio``; expectations that are not row-translatable (uniqueness,
aggregates, table-level, conditional) cannot be quarantined row by row, so when one of
them fails the run fails. ``mostly`` only changes GX's verdict; a row that violates a
translated rule is quarantined whatever ``mostly`` allows.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import reduce
from operator import add, or_
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidemark._types import TopicPartition as TP
from tidemark.config.models import (
    CHANGE_IMAGE_LABEL,
    CHANGE_KEY_LABEL,
    CHANGE_OP_LABEL,
    KAFKA_KEY,
    Expectation,
    Feed,
)
from tidemark.errors import ConfigError, ValidationFailedError
from tidemark.planning.plan import PartitionPlan, Plan
from tidemark.settings import cache_root
from tidemark.spark.decode import decode_reasons
from tidemark.spark.stats import RangeStats, range_stat_aggs, stats_from_rows
from tidemark.staged import DECODE_CODE, DIGEST_COLUMNS, ERROR_COLUMN, OK_OUTCOME, REASON_COLUMN, RULES_CODE

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# The decoder names it ERROR_COLUMN (``decode_error``); ``_decode_error`` is accepted as well.
DECODE_ERROR_COLUMNS = (ERROR_COLUMN, "_decode_error")
DECODE_ERROR_COLUMN = ERROR_COLUMN
SAMPLE_SIZE = 20
ROW_COUNT_EXPECTATION = "expect_table_row_count_to_be_between"

# -- row rules: expectations as Spark SQL conditions ---------------------------------


class Untranslatable(ValueError):
    """An expectation (or one of its arguments) has no row-level Spark condition."""


@dataclass(frozen=True)
class RowRule:
    """A row-level check as a Spark SQL condition that is TRUE where a row is bad."""

    label: str  # shown in ``_reason`` and the summary, e.g. "expect_column_values_to_not_be_null(order_id)"
    expectation: str
    sql: str
    index: int | None  # position in the feed's expectations; None for the decode-error rule


DECODE_LABEL = "decode_error"


def decode_rule(column: str = DECODE_ERROR_COLUMN) -> RowRule:
    """Rows whose ``column`` (the decoder's failure reason) is set are bad."""
    return RowRule(DECODE_LABEL, column, f"{quote_ident(column)} IS NOT NULL", None)


ROW_TRANSLATABLE = frozenset(
    {
        "expect_column_values_to_not_be_null",
        "expect_column_values_to_be_null",
        "expect_column_values_to_be_between",
        "expect_column_values_to_be_in_set",
        "expect_column_values_to_not_be_in_set",
        "expect_column_values_to_match_regex",
        "expect_column_values_to_not_match_regex",
        "expect_column_value_lengths_to_be_between",
        "expect_column_value_lengths_to_equal",
    }
)
# Arguments that change GX's verdict or its report but not which rows are bad.
_IGNORED_KWARGS = frozenset({"mostly", "result_format", "catch_exceptions", "meta", "include_config"})


def quote_ident(name: str) -> str:
    """A Spark SQL identifier: the whole name in backticks, so ``a.b`` is one column."""
    return "`" + name.replace("`", "``") + "`"


def column_paths(schema: Any) -> list[str]:
    """A Spark schema's column names and, below each struct, its fields' dotted paths (``customer.id``).

    Expectations may name a nested field by its path, as GX's Spark engine reads it.
    """
    from pyspark.sql.types import StructType

    def walk(struct: StructType, prefix: str) -> list[str]:
        out = []
        for f in struct.fields:
            out.append(prefix + f.name)
            if isinstance(f.dataType, StructType):
                out += walk(f.dataType, f"{prefix}{f.name}.")
        return out

    return walk(schema, "")


def sql_literal(value: Any) -> str:
    """A Spark SQL literal for a number or string (strings escaped for Spark's parser)."""
    if isinstance(value, bool) or value is None:
        raise Untranslatable(f"value {value!r} has no comparison literal")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Untranslatable(f"value {value!r} is not finite")
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    raise Untranslatable(f"value {value!r} of type {type(value).__name__} has no SQL literal")


def _bounds(expr: str, kwargs: Mapping[str, Any]) -> str:
    lo, hi = kwargs.get("min_value"), kwargs.get("max_value")
    if lo is None and hi is None:
        raise Untranslatable("neither min_value nor max_value is set")
    outside = []
    if lo is not None:
        outside.append(f"{expr} {'<=' if kwargs.get('strict_min') else '<'} {sql_literal(lo)}")
    if hi is not None:
        outside.append(f"{expr} {'>=' if kwargs.get('strict_max') else '>'} {sql_literal(hi)}")
    return " OR ".join(outside)


def _in_list(col: str, values: Any) -> str:
    if not isinstance(values, list | tuple | set | frozenset):
        raise Untranslatable("value_set is not a list")
    literals = [sql_literal(v) for v in values if v is not None]
    return f"{col} IN ({', '.join(literals)})" if literals else "FALSE"


def translate(expectation: Expectation, columns: Iterable[str] | None = None, index: int | None = None) -> RowRule:
    """The row rule for ``expectation``; raises :class:`Untranslatable` when there is none.

    ``columns`` (the DataFrame's) makes a rule on a missing column untranslatable: GX
    then reports the expectation as failed with its exception, which fails the run.
    """
    kind, kwargs = expectation.type, dict(expectation.kwargs)
    if kind not in ROW_TRANSLATABLE:
        raise Untranslatable(f"{kind} is not a per-row expectation Tidemark can filter on")
    if kwargs.get("row_condition"):
        raise Untranslatable("conditional expectations (row_condition) are not translated")
    column = kwargs.get("column")
    if not isinstance(column, str) or not column:
        raise Untranslatable("no 'column' argument")
    names = set(columns) if columns is not None else set()
    if columns is not None and column not in names:
        raise Untranslatable(f"column '{column}' is not in the data")
    unknown = set(kwargs) - _IGNORED_KWARGS - {"column"} - _KNOWN_ARGS[kind]
    if unknown:
        raise Untranslatable(f"arguments {sorted(unknown)} are not translated")
    # A path below a struct column (``customer.id``, see :func:`column_paths`) is quoted part by part.
    nested = "." in column and column.split(".", 1)[0] in names
    col = ".".join(map(quote_ident, column.split("."))) if nested else quote_ident(column)
    present = f"{col} IS NOT NULL"
    if kind == "expect_column_values_to_not_be_null":
        sql = f"{col} IS NULL"
    elif kind == "expect_column_values_to_be_null":
        sql = present
    elif kind == "expect_column_values_to_be_between":
        sql = f"{present} AND ({_bounds(col, kwargs)})"
    elif kind == "expect_column_values_to_be_in_set":
        sql = f"{present} AND NOT ({_in_list(col, kwargs.get('value_set'))})"
    elif kind == "expect_column_values_to_not_be_in_set":
        sql = f"{present} AND ({_in_list(col, kwargs.get('value_set'))})"
    elif kind in ("expect_column_values_to_match_regex", "expect_column_values_to_not_match_regex"):
        regex = kwargs.get("regex")
        if not isinstance(regex, str):
            raise Untranslatable("no 'regex' argument")
        negate = "NOT " if kind == "expect_column_values_to_match_regex" else ""
        sql = f"{present} AND {negate}({col} RLIKE {sql_literal(regex)})"
    elif kind == "expect_column_value_lengths_to_be_between":
        sql = f"{present} AND ({_bounds(f'length({col})', kwargs)})"
    else:  # expect_column_value_lengths_to_equal
        value = kwargs.get("value")
        if not isinstance(value, int) or isinstance(value, bool):
            raise Untranslatable("'value' is not an integer")
        sql = f"{present} AND length({col}) <> {value}"
    return RowRule(f"{kind}({column})", kind, sql, index)


_KNOWN_ARGS: dict[str, frozenset[str]] = {
    "expect_column_values_to_not_be_null": frozenset(),
    "expect_column_values_to_be_null": frozenset(),
    "expect_column_values_to_be_between": frozenset({"min_value", "max_value", "strict_min", "strict_max"}),
    "expect_column_values_to_be_in_set": frozenset({"value_set"}),
    "expect_column_values_to_not_be_in_set": frozenset({"value_set"}),
    "expect_column_values_to_match_regex": frozenset({"regex"}),
    "expect_column_values_to_not_match_regex": frozenset({"regex"}),
    "expect_column_value_lengths_to_be_between": frozenset({"min_value", "max_value", "strict_min", "strict_max"}),
    "expect_column_value_lengths_to_equal": frozenset({"value"}),
}


def split_rules(expectations: Sequence[Expectation], columns: Iterable[str]) -> tuple[list[RowRule], dict[int, str]]:
    """Row rules for the translatable expectations, and why each other one is not."""
    cols = list(columns)
    rules: list[RowRule] = []
    untranslatable: dict[int, str] = {}
    for i, exp in enumerate(expectations):
        try:
            rules.append(translate(exp, cols, i))
        except Untranslatable as exc:
            untranslatable[i] = str(exc)
    for name in DECODE_ERROR_COLUMNS:
        if name in cols:
            rules.insert(0, decode_rule(name))
            break
    return rules, untranslatable


def change_rules(feed: Feed, columns: Iterable[str]) -> list[RowRule]:
    """A keyed table's Debezium changes that cannot be applied, as row rules (none for a feed that is not one).

    - ``change_without_key(<key columns>)``: a ``c``/``u``/``r`` whose ``after`` (or a ``d`` whose ``before``) is null
      or lacks the value of a key column;
    - ``change_without_op``: a record whose ``op`` is null but which carries an image (``before`` or ``after``); a
      tombstone has neither and is a change (the delete of its Kafka key) or ignored. GX's ``be_in_set`` passes a
      null ``op``, so the feed's expectation alone lets it through;
    - ``change_without_image``: a ``c``/``u``/``r`` without ``after`` when the Kafka key is the only key.

    Each is quarantined as any broken rule is (or fails the run under ``on_bad_records: fail``), in the job, before
    the group's commit: the merge after the commit finds nothing it cannot apply
    (:func:`tidemark.output.changes.change_problem` says the same reasons, and the job checks the staged changes
    with it before the commit). No GX expectation says "not null when op is c, u or r" without a conditional
    expectation, whose string conditions GX deprecates, so these are Tidemark's own rules, beside the suite. A
    ``state`` feed's key columns have the feed's own not-null expectations
    (:meth:`tidemark.config.models.Feed._change_rules`), and so has the Kafka key when it is the key.
    """
    iceberg = feed.iceberg
    if iceberg is None or iceberg.mode != "upsert" or iceberg.change_format != "debezium":
        return []
    keys = [k for k in iceberg.key if k != KAFKA_KEY]
    names = set(columns)
    if "op" not in names:
        return []

    def missing(image: str) -> str:  # an image or key field the records lack is a value they lack
        if image not in names:
            return "TRUE"
        fields = [f"{quote_ident(image)}.{quote_ident(k)} IS NULL" if f"{image}.{k}" in names else "TRUE" for k in keys]
        return " OR ".join([f"{quote_ident(image)} IS NULL", *fields])

    op = quote_ident("op")
    rules = []
    if keys:
        sql = f"({op} IN ('c', 'u', 'r') AND ({missing('after')})) OR ({op} = 'd' AND ({missing('before')}))"
        rules.append(RowRule(f"{CHANGE_KEY_LABEL}({', '.join(keys)})", CHANGE_KEY_LABEL, sql, None))
    images = [f"{quote_ident(i)} IS NOT NULL" for i in ("before", "after") if i in names]
    if images:
        rules.append(RowRule(CHANGE_OP_LABEL, CHANGE_OP_LABEL, f"{op} IS NULL AND ({' OR '.join(images)})", None))
    if not keys:
        sql = f"{op} IN ('c', 'u', 'r') AND {missing('after')}"
        rules.append(RowRule(CHANGE_IMAGE_LABEL, CHANGE_IMAGE_LABEL, sql, None))
    return rules


def feed_rules(feed: Feed, columns: Iterable[str]) -> tuple[list[RowRule], dict[int, str]]:
    """:func:`split_rules` of the feed's expectations, then its :func:`change_rules`: every row rule of the feed."""
    cols = list(columns)
    rules, untranslatable = split_rules(feed.validation.expectations, cols)
    return rules + change_rules(feed, cols), untranslatable


def reason_sql(rules: Sequence[RowRule]) -> str:
    """A Spark SQL string expression naming every rule a row violates, ``; ``-separated."""
    parts = []
    for rule in rules:
        if rule.label == DECODE_LABEL:
            parts.append(f"CASE WHEN {rule.sql} THEN concat('decode_error: ', {quote_ident(rule.expectation)}) END")
        else:
            parts.append(f"CASE WHEN coalesce(({rule.sql}), FALSE) THEN {sql_literal(rule.label)} END")
    return f"concat_ws('; ', {', '.join(parts)})" if parts else "CAST(NULL AS STRING)"


RULE_BITS = 60  # rules per "-"-separated chunk of a RULES_CODE
DECODE_REASON_PREFIX = "decode_error: "


@dataclass(frozen=True)
class OutcomeCodes:
    """Each record's outcome as a short code (the job's staging partition), and the reason a code stands for.

    The staging folder of an outcome is named after its code: a name built from the
    reasons themselves outgrows what a file system allows once a record breaks a handful
    of rules (eight not-null rules on a record ``{}`` make 330 characters). The code says
    *which* rules (a bitmask over :attr:`rules`) or which decode failure (an index into
    :attr:`decode_reasons`), so it stays short, and :meth:`reason` gives the full text
    the quarantine output carries in its ``_reason`` column.
    """

    rules: tuple[RowRule, ...]  # the feed's translated row rules, in the feed's order
    decode_reasons: tuple[str, ...]

    @classmethod
    def of(cls, columns: Iterable[str], feed: Feed, schemas: Mapping[str, Any] | None = None) -> OutcomeCodes:
        """The codes of ``feed``'s records; ``columns`` are the decoded record's, ``schemas`` the run's registry
        schemas per part (``value``, ``key``), whose decode reasons may name their fields."""
        rules, _ = feed_rules(feed, [c for c in columns if c not in DECODE_ERROR_COLUMNS])
        found = schemas or {}
        return cls(tuple(rules), tuple(decode_reasons(feed.deserialization, found.get("value"), found.get("key"))))

    def column(self) -> Column:
        """The code of each row: ``decode-<n>`` when it did not decode (no other rule applies to
        its null fields), else ``rules-<mask>`` for the rules it breaks, else ``ok``.

        These are exactly the rows :func:`validate` counts bad.
        """
        from pyspark.sql import functions as F

        verdict: Column = F.lit(OK_OUTCOME)
        if self.rules:
            chunks = [
                reduce(add, [
                    F.when(F.coalesce(F.expr(rule.sql), F.lit(False)), F.lit(1 << bit).cast("bigint"))
                    .otherwise(F.lit(0).cast("bigint"))
                    for bit, rule in enumerate(self.rules[first : first + RULE_BITS])
                ])
                for first in range(0, len(self.rules), RULE_BITS)
            ]  # fmt: skip
            mask = F.concat_ws("-", *[F.lower(F.hex(chunk)) for chunk in chunks])
            verdict = F.when(
                reduce(or_, [chunk != 0 for chunk in chunks]), F.concat(F.lit(RULES_CODE), mask)
            ).otherwise(verdict)
        if not self.decode_reasons:
            return verdict
        error = F.col(DECODE_ERROR_COLUMN)
        index = F.array_position(F.array(*[F.lit(r) for r in self.decode_reasons]), error)
        return F.when(error.isNotNull(), F.concat(F.lit(DECODE_CODE), index.cast("string"))).otherwise(verdict)

    def decode_error(self, code: Column) -> Column:
        """The decode failure (``decode_error``'s text) of rows whose ``code`` is a decode code."""
        from pyspark.sql import functions as F

        if not self.decode_reasons:
            return F.lit(None).cast("string")
        index = F.substring(code, len(DECODE_CODE) + 1, 8).cast("int")
        return F.element_at(F.array(*[F.lit(r) for r in self.decode_reasons]), index)

    def reason(self, code: str) -> str:
        """The ``_reason`` of a bad record's code: ``decode_error: <why>``, or every broken rule, ``; ``-separated."""
        labels = self.labels(code)
        if labels == (DECODE_LABEL,):
            return DECODE_REASON_PREFIX + self.decode_reasons[int(code[len(DECODE_CODE) :]) - 1]
        return "; ".join(labels)

    def labels(self, code: str) -> tuple[str, ...]:
        """The reason codes of a bad record's code (its ``_reason_codes``): ``decode_error``, or the label of each
        broken rule (``expect_column_values_to_match_regex(value)``), in the feed's order."""
        if code.startswith(DECODE_CODE) and code[len(DECODE_CODE) :].isdigit():
            if 1 <= int(code[len(DECODE_CODE) :]) <= len(self.decode_reasons):
                return (DECODE_LABEL,)
        elif code.startswith(RULES_CODE):
            labels: list[str] = []
            for n, chunk in enumerate(code[len(RULES_CODE) :].split("-")):
                mask = int(chunk, 16)
                labels += [r.label for bit, r in enumerate(self.rules[n * RULE_BITS : (n + 1) * RULE_BITS])
                           if mask >> bit & 1]  # fmt: skip
            if labels:
                return tuple(labels)
        raise ValueError(f"outcome code {code!r} names no decode failure or rule of this feed")


# -- built-in range checks ------------------------------------------------------------


@dataclass(frozen=True)
class RangeCheck:
    stats: dict[TP, RangeStats]
    gaps: dict[TP, int]  # planned offsets with no record (compaction, markers, aborted): counted only

    def to_dict(self, plan: Plan) -> list[dict[str, Any]]:
        out = []
        for p in plan.partitions:
            s = self.stats.get(p.key)
            out.append(
                {
                    "topic": p.topic,
                    "partition": p.partition,
                    "start": p.start,
                    "end": p.end,
                    "rows": s.records if s else 0,
                    "gaps": self.gaps.get(p.key, 0),
                    "min_offset": s.first_offset if s else None,
                    "max_offset": s.last_offset if s else None,
                }
            )
        return out


def check_ranges(
    stats_or_df: DataFrame | Iterable[RangeStats], plan: Plan, *, positions: Mapping[TP, int] | None = None
) -> RangeCheck:
    """The built-in checks; raises :class:`ValidationFailedError` naming partitions and offsets.

    Pass the DataFrame (one aggregation, distinct offsets counted) or statistics already
    computed (validation's, or the reader's ``tidemark.spark.stats.range_stats``: without a
    distinct count, duplicates show as more records than offsets planned); ``positions``
    (the reader's next offset per partition) proves each range was read to its end.
    """
    if hasattr(stats_or_df, "groupBy"):
        df: Any = stats_or_df
        rows = df.groupBy("topic", "partition").agg(*range_stat_aggs(content=False, distinct=True)).collect()
        stats = stats_from_rows(rows, plan, positions, content=False, distinct=True)
    else:
        given: Iterable[RangeStats] = stats_or_df  # type: ignore[assignment]
        stats = list(given)
        if positions is not None:
            stats = [s if s.position is not None else replace(s, position=positions.get(s.key)) for s in stats]
    planned = {p.key: p for p in plan.partitions}
    by_tp = {s.key: s for s in stats}
    problems = [problem for s in stats for problem in _range_problems(s, planned.get(s.key))]
    for key, p in planned.items():
        position = (positions or {}).get(key)
        if position is None and key in by_tp:
            position = by_tp[key].position
        if position is not None and position < p.end and p.records:
            problems.append(
                f"{p.topic}[{p.partition}]: read stopped at offset {position}, before the planned end {p.end} "
                f"(range [{p.start}, {p.end}))"
            )
    if problems:
        raise ValidationFailedError(
            f"built-in checks failed for plan {plan.plan_id} of feed '{plan.feed}': " + "; ".join(problems)
        )
    gaps = {key: p.records - (by_tp[key].records if key in by_tp else 0) for key, p in planned.items()}
    return RangeCheck(by_tp, gaps)


def _range_problems(s: RangeStats, p: PartitionPlan | None) -> list[str]:
    """What is wrong with one range's statistics against its planned range ``p`` (``None``: not planned)."""
    if p is None:
        return [f"{s.topic}[{s.partition}]: {s.records} records from a partition the plan does not read"]
    problems = []
    if (
        s.records
        and s.first_offset is not None
        and s.last_offset is not None
        and (s.first_offset < p.start or s.last_offset >= p.end)
    ):
        problems.append(
            f"{s.topic}[{s.partition}]: offsets {s.first_offset}..{s.last_offset} outside the planned range "
            f"[{p.start}, {p.end})"
        )
    if s.distinct_offsets is not None and s.records != s.distinct_offsets:
        problems.append(
            f"{s.topic}[{s.partition}]: {s.records - s.distinct_offsets} duplicate offsets "
            f"({s.records} records, {s.distinct_offsets} distinct offsets in [{p.start}, {p.end}))"
        )
    elif s.records > p.records:
        problems.append(
            f"{s.topic}[{s.partition}]: {s.records} records, more than the {p.records} offsets planned in "
            f"[{p.start}, {p.end}) (duplicates)"
        )
    return problems


def check_written_counts(expected: Mapping[TP, int], written: Mapping[TP, int], what: str = "output") -> None:
    """Record counts in a manifest must equal what validation passed on, partition by partition."""
    wrong = [
        f"{t}[{p}]: expected {expected.get((t, p), 0)}, manifest says {written.get((t, p), 0)}"
        for t, p in sorted(set(expected) | set(written))
        if expected.get((t, p), 0) != written.get((t, p), 0)
    ]
    if wrong:
        raise ValidationFailedError(f"record counts of the {what} do not match the data validated: " + "; ".join(wrong))


# -- Great Expectations ---------------------------------------------------------------


@dataclass(frozen=True)
class GxOutcome:
    success: bool
    results: list[dict[str, Any]]  # one per expectation in suite order: the user's, then built-ins
    data_docs: Path | None
    data_docs_index: Path | None
    result_path: Path


def _suite_expectations(feed: Feed) -> list[tuple[str, dict[str, Any], bool]]:
    """(type, kwargs, builtin) for the suite: the feed's expectations, then Tidemark's."""
    items = [(e.type, dict(e.kwargs), False) for e in feed.validation.expectations]
    minimum = 1 if feed.validation.expect_records else 0
    items.append((ROW_COUNT_EXPECTATION, {"min_value": minimum}, True))
    return items


def cache_data_docs_templates(directory: Path | None = None) -> Path | None:
    """Keep GX's compiled Data Docs templates on disk between pages, runs and processes.

    GX builds a new Jinja environment for every page it renders, so each run compiled its
    ~50 templates again: about 1.5 s of a small run's validation. Jinja's bytecode cache
    (keyed by template name and source checksum, written by rename) loads them instead.
    Returns the folder, or None when it cannot be created (the pages are then compiled).
    """
    from great_expectations.render.view.view import DefaultJinjaView
    from jinja2 import FileSystemBytecodeCache

    class BytecodeCache(FileSystemBytecodeCache):
        def dump_bytecode(self, bucket: Any) -> None:
            try:
                super().dump_bytecode(bucket)
            except OSError:  # a cache that cannot be written only costs the compile, never the page
                pass

    folder = directory or cache_root() / "jinja"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    cache = BytecodeCache(str(folder))
    init = getattr(DefaultJinjaView.__init__, "tidemark_wrapped", DefaultJinjaView.__init__)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.env.bytecode_cache = cache

    __init__.tidemark_wrapped = init  # type: ignore[attr-defined]
    DefaultJinjaView.__init__ = __init__  # type: ignore[method-assign]
    return folder


def run_gx(df: DataFrame, feed: Feed, plan: Plan, run_dir: Path, *, list_unexpected: bool = True) -> GxOutcome:
    """Run the feed's suite on ``df`` in an ephemeral GX context; build Data Docs under run_dir/gx.

    ``list_unexpected=False`` asks GX for no sample of unexpected rows (``partial_unexpected_count``
    0): for the caller that already counted every expectation's unexpected rows and found
    none, the lists would be empty anyway, and GX's Spark engine spends one query per list
    and expectation to find that out (three of its four per expectation become ``LIMIT 0``,
    which Spark answers without a job). The counts, the verdicts and the Data Docs' text
    stay the same; GX's result then leaves out the empty index and value-count lists.
    """
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.base import ProgressBarsConfig
    from great_expectations.expectations.registry import get_expectation_impl

    docs_root = run_dir / "gx"
    docs_root.mkdir(parents=True, exist_ok=True)
    cache_data_docs_templates()
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    context.add_data_docs_site(
        site_name="tidemark",
        site_config={
            "class_name": "SiteBuilder",
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_root)},
        },
    )
    batch = (
        # persist=False: GX would otherwise cache the whole batch (5 s of 5M rows, never
        # released); the DataFrame it gets is already cheap to scan (staged Parquet).
        context.data_sources.add_spark("tidemark", persist=False)
        .add_dataframe_asset(f"{feed.name}.records")
        .add_batch_definition_whole_dataframe("plan")
    )
    suite = gx.ExpectationSuite(name=feed.name)
    for kind, kwargs, _ in _suite_expectations(feed):
        try:
            suite.add_expectation(get_expectation_impl(kind)(**kwargs))
        except Exception as exc:  # GX raises several types for an unknown name or bad kwargs
            raise ConfigError(
                f"feed '{feed.name}': validation.expectations: {kind}({kwargs}) is invalid: {exc}"
            ) from exc
    suite = context.suites.add(suite)
    definition = context.validation_definitions.add(gx.ValidationDefinition(name=feed.name, data=batch, suite=suite))
    checkpoint = context.checkpoints.add(
        gx.Checkpoint(
            name=f"{feed.name}-checkpoint",
            validation_definitions=[definition],
            actions=[gx.checkpoint.UpdateDataDocsAction(name="data_docs", site_names=["tidemark"])],
            result_format={
                "result_format": "SUMMARY",
                "partial_unexpected_count": SAMPLE_SIZE if list_unexpected else 0,
                "unexpected_index_column_names": ["topic", "partition", "offset"],
            },
        )
    )
    # The run time is given, so GX does not parse the plan id as a date: an id of only
    # digits would otherwise become a year too large for datetime (OverflowError), and one
    # that reads as a date would stamp the result with that date.
    run_id = RunIdentifier(run_name=plan.plan_id, run_time=datetime.now(UTC))
    run = checkpoint.run(batch_parameters={"dataframe": df}, run_id=run_id)
    (_identifier, result), *_ = run.run_results.items()
    doc = result.to_json_dict()
    result_path = docs_root / "validation_result.json"
    result_path.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str))
    order = {e.id: i for i, e in enumerate(suite.expectations)}
    ids = [r["expectation_config"].get("id") for r in doc["results"]]
    if len(ids) == len(order) and set(ids) == set(order):
        results: list[dict[str, Any]] = [{} for _ in ids]
        for r, rid in zip(doc["results"], ids, strict=True):
            results[order[rid]] = r
    else:  # no ids to match on: GX reports in suite order
        results = list(doc["results"])
    pages = sorted((docs_root / "validations").rglob("*.html"))
    index = docs_root / "index.html"
    return GxOutcome(
        bool(doc["success"]), results, pages[-1] if pages else None, index if index.exists() else None, result_path
    )


# -- validate -------------------------------------------------------------------------


@dataclass
class ValidationOutcome:
    """The good rows, the quarantined rows (``_reason`` added) if any, and a JSON summary."""

    good: DataFrame
    quarantined: DataFrame | None
    summary: dict[str, Any]
    data_docs: Path | None
    good_counts: dict[TP, int] = field(default_factory=dict)
    quarantined_counts: dict[TP, int] = field(default_factory=dict)
    range_stats: list[RangeStats] | None = None  # with ``raw_value_column`` or ``digested``


class ValidationRejectedError(ValidationFailedError):
    """The run must fail; carries the summary and Data Docs path for the run report."""

    def __init__(self, message: str, summary: Mapping[str, Any], data_docs: Path | None) -> None:
        super().__init__(message)
        self.summary = dict(summary)
        self.data_docs = data_docs


def _or(conditions: Sequence[Column]) -> Column:
    from pyspark.sql import functions as F

    out = F.lit(False)
    for c in conditions:
        out = out | c
    return out


def _describe_samples(samples: Sequence[Mapping[str, Any]]) -> str:
    shown = [f"{s['topic']}[{s['partition']}]@{s['offset']} ({s['reason']})" for s in samples[:5]]
    more = f" and {len(samples) - 5} more sampled" if len(samples) > 5 else ""
    return ", ".join(shown) + more


def _gx_samples(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = (result.get("result") or {}).get("partial_unexpected_index_list") or []
    label = result.get("expectation_config", {}).get("type", "?")
    return [
        {"topic": r.get("topic"), "partition": r.get("partition"), "offset": r.get("offset"), "reason": label}
        for r in rows
        if isinstance(r, dict)
    ]


def _decode_reason(decode_failed: DataFrame) -> Column:
    from pyspark.sql import functions as F

    column = next((c for c in DECODE_ERROR_COLUMNS if c in decode_failed.columns), None)
    if column is None:
        return F.lit("decode_error")
    return F.concat(F.lit("decode_error: "), F.coalesce(F.col(column), F.lit("unknown")))


def _undecoded_for_quarantine(decode_failed: DataFrame, good: DataFrame) -> DataFrame:
    """Undecoded rows shaped to sit beside the others: raw columns whose type differs become ``_raw_*``."""
    types = dict(good.dtypes)
    out = decode_failed.withColumn(REASON_COLUMN, _decode_reason(decode_failed))
    for name, dtype in decode_failed.dtypes:
        if name in DECODE_ERROR_COLUMNS:
            out = out.drop(name)
        elif name in types and types[name] != dtype:
            out = out.withColumnRenamed(name, f"_raw_{name}")
    return out


@dataclass(frozen=True)
class _Counts:
    """What the one aggregation found: per-partition rows, bad and undecoded records, per-rule bad rows."""

    rows: list[Any]
    total: int
    bad: dict[TP, int]
    bad_total: int
    undecoded: int
    by_rule: list[int]


def _marked(
    df: DataFrame,
    decode_failed: DataFrame | None,
    flags: list[Column],
    raw_value_column: str | None,
    raw_key_column: str = "key",
    digested: bool = False,
) -> DataFrame:
    """The decoded records and the ones that failed to decode, each marked bad / undecoded / per rule."""
    from pyspark.sql import functions as F

    carried: list[Column | str] = []
    if digested:  # each row's hash and bytes, computed from its raw key and value when it was staged
        carried = ["timestamp", *DIGEST_COLUMNS]
    elif raw_value_column:  # the range statistics hash the key's bytes as Kafka holds them, under the name "key"
        carried = ["timestamp", F.col(raw_key_column).alias("key"), raw_value_column]
    marks = df.select(
        "topic", "partition", "offset", *carried, _or(flags).alias("_bad"), F.lit(False).alias("_undecoded"),
        *[f.alias(f"_rule_{i}") for i, f in enumerate(flags)],
    )  # fmt: skip
    if decode_failed is not None:
        marks = marks.unionByName(
            decode_failed.select(
                "topic", "partition", "offset", *carried, F.lit(True).alias("_bad"), F.lit(True).alias("_undecoded"),
                *[F.lit(False).alias(f"_rule_{i}") for i in range(len(flags))],
            )
        )  # fmt: skip
    return marks


def _aggregations(rules: int, raw_value_column: str | None, exact_duplicates: bool, digested: bool) -> list[Column]:
    """Range statistics and every rule's bad count, per partition, in one aggregation."""
    from pyspark.sql import functions as F

    content = bool(raw_value_column) or digested
    return [
        *range_stat_aggs(raw_value_column or "value", digested=digested, content=content, distinct=exact_duplicates),
        F.sum(F.col("_bad").cast("int")).alias("bad"),
        F.sum(F.col("_undecoded").cast("int")).alias("undecoded"),
        *[F.sum(F.col(f"_rule_{i}").cast("int")).alias(f"rule_{i}") for i in range(rules)],
    ]


def _counted(rows: list[Any], rules: int) -> _Counts:
    bad = {(r["topic"], int(r["partition"])): int(r["bad"] or 0) for r in rows}
    return _Counts(
        rows=rows,
        total=sum(int(r["records"]) for r in rows),
        bad=bad,
        bad_total=sum(bad.values()),
        undecoded=sum(int(r["undecoded"] or 0) for r in rows),
        by_rule=[sum(int(r[f"rule_{i}"] or 0) for r in rows) for i in range(rules)],
    )


def _bad_samples(
    df: DataFrame, bad: Column, rules: list[RowRule], decode_failed: DataFrame | None, counts: _Counts, size: int
) -> list[dict[str, Any]]:
    """Up to ``size`` bad records (rule failures and decode failures), in offset order, with their reason."""
    from pyspark.sql import functions as F

    picked: list[Any] = []
    if counts.bad_total - counts.undecoded:
        picked += (
            df.where(bad)
            .select("topic", "partition", "offset", F.expr(reason_sql(rules)).alias("reason"))
            .limit(size)
            .collect()
        )
    if counts.undecoded and decode_failed is not None:
        picked += (
            decode_failed.select("topic", "partition", "offset", _decode_reason(decode_failed).alias("reason"))
            .limit(size)
            .collect()
        )
    return [
        {"topic": r["topic"], "partition": int(r["partition"]), "offset": int(r["offset"]), "reason": r["reason"]}
        for r in sorted(picked, key=lambda r: (r["topic"], r["partition"], r["offset"]))[:size]
    ]


def _by_rule(rules: list[RowRule], counts: list[int]) -> dict[str, int]:
    labels = [r.label for r in rules]
    # Two expectations of one kind on one column share a label: tell them apart in the summary.
    return {
        (label if labels.count(label) == 1 else f"{label}#{rule.index}"): n
        for label, rule, n in zip(labels, rules, counts, strict=True)
    }


@dataclass
class _Judged:
    expectations: list[dict[str, Any]] = field(default_factory=list)
    failing: list[str] = field(default_factory=list)
    hard: list[str] = field(default_factory=list)  # failures quarantine cannot absorb


def _judged(
    feed: Feed,
    gx_out: GxOutcome,
    rules: list[RowRule],
    rule_counts: list[int],
    untranslatable: Mapping[int, str],
    samples: list[dict[str, Any]],
    sample_size: int,
) -> _Judged:
    """Each expectation's GX result beside the aggregation's count; GX's own samples join ``samples``."""
    rule_by_index = {r.index: (r, n) for r, n in zip(rules, rule_counts, strict=True) if r.index is not None}
    out = _Judged()
    for i, ((kind, kwargs, builtin), result) in enumerate(zip(_suite_expectations(feed), gx_out.results, strict=True)):
        ok = bool(result.get("success", False))
        raised = bool((result.get("exception_info") or {}).get("raised_exception"))
        rule, bad_rows = (None, 0) if builtin else rule_by_index.get(i, (None, 0))
        gx_unexpected = (result.get("result") or {}).get("unexpected_count")
        entry: dict[str, Any] = {
            "type": kind,
            "kwargs": kwargs,
            "builtin": builtin,
            "success": ok,
            "row_level": rule is not None,
            "unexpected_count": gx_unexpected,
            "observed_value": (result.get("result") or {}).get("observed_value"),
        }
        if rule is not None:
            entry["quarantine_count"] = bad_rows
            if gx_unexpected is not None and gx_unexpected != bad_rows:
                entry["translation_mismatch"] = True
        elif not builtin:
            entry["not_row_level_because"] = untranslatable.get(i)
        if raised:
            entry["exception"] = (result.get("exception_info") or {}).get("exception_message")
        out.expectations.append(entry)
        name = f"{kind}({kwargs.get('column', '')})" if "column" in kwargs else kind
        if not ok:
            out.failing.append(name)
            if rule is None or raised or entry.get("translation_mismatch"):
                out.hard.append(name)
            if rule is None:  # no Spark condition: GX's own sample of unexpected rows names the offsets
                samples.extend(_gx_samples(result)[: max(0, sample_size - len(samples))])
    return out


def _failure(feed: Feed, plan: Plan, counts: _Counts, judged: _Judged, decode_errors: int) -> str | None:
    """Why the run must fail under the feed's bad-record policy, or ``None``."""
    policy = feed.validation
    ratio = counts.bad_total / counts.total if counts.total else 0.0
    quarantine = policy.on_bad_records == "quarantine"
    if counts.total == 0 and policy.expect_records:
        return (
            f"feed '{feed.name}' expects records but plan {plan.plan_id} read none "
            f"({plan.total_records} offsets planned over {len(plan.partitions)} partitions)"
        )
    if quarantine and judged.hard:
        return f"expectations that cannot be quarantined row by row failed: {', '.join(judged.hard)}"
    if quarantine and ratio > policy.quarantine_max_ratio:
        return (
            f"{counts.bad_total} of {counts.total} records are bad ({ratio:.2%}), above quarantine_max_ratio "
            f"{policy.quarantine_max_ratio:.2%}"
        )
    if not quarantine and (judged.failing or decode_errors):
        what = judged.failing + ([f"{decode_errors} records failed to decode"] if decode_errors else [])
        return f"failing: {', '.join(what)}"
    return None


def _summary(
    feed: Feed,
    plan: Plan,
    failure: str | None,
    counts: _Counts,
    judged: _Judged,
    ranges: RangeCheck,
    gx_out: GxOutcome,
    *,
    by_rule: Mapping[str, int],
    decode_errors: int,
    good: Mapping[TP, int],
    quarantined: Mapping[TP, int],
    samples: list[dict[str, Any]],
) -> dict[str, Any]:
    """``validation.json``: the decision, the counts, each expectation, samples and where the Data Docs are."""
    return {
        "success": failure is None,
        "failure": failure,
        "on_bad_records": feed.validation.on_bad_records,
        "counts": {
            "rows": counts.total,
            "good": sum(good.values()),
            "quarantined": sum(quarantined.values()),
            "bad": counts.bad_total,
            "decode_errors": decode_errors,
            "by_rule": by_rule,
        },
        "good_records": sum(good.values()),
        "quarantined_records": sum(quarantined.values()),
        "bad_ratio": counts.bad_total / counts.total if counts.total else 0.0,
        "quarantine_max_ratio": feed.validation.quarantine_max_ratio,
        "partitions": ranges.to_dict(plan),
        "gaps": sum(ranges.gaps.values()),
        "gx_success": gx_out.success,
        "expectations": judged.expectations,
        "failing_expectations": judged.failing,
        "sample_bad_records": samples,
        "data_docs": str(gx_out.data_docs) if gx_out.data_docs else None,
        "data_docs_index": str(gx_out.data_docs_index) if gx_out.data_docs_index else None,
        "gx_result": str(gx_out.result_path),
    }


def validate(
    df: DataFrame,
    plan: Plan,
    feed: Feed,
    run_dir: Path,
    *,
    positions: Mapping[TP, int] | None = None,
    decode_failed: DataFrame | None = None,
    sample_size: int = SAMPLE_SIZE,
    exact_duplicates: bool = True,
    raw_value_column: str | None = None,
    raw_key_column: str = "key",
    digested: bool = False,
) -> ValidationOutcome:
    """Built-in checks, the feed's GX suite and the bad-record policy on the read DataFrame.

    ``df`` holds the decoded records (GX runs on it). Records that failed to decode come
    either as a ``decode_error`` column of ``df`` or, as :func:`tidemark.spark.decode.decode`
    splits them, as ``decode_failed`` (raw columns plus ``decode_error``); either way
    they count in the range checks and are bad records. Writes
    ``<run_dir>/validation.json`` (the summary) and the Data Docs under ``<run_dir>/gx``
    in every case; raises :class:`ValidationRejectedError` when the run must fail, and
    :class:`ValidationFailedError` when the built-in checks fail. ``exact_duplicates=False``
    skips counting distinct offsets (see :func:`tidemark.spark.stats.range_stat_aggs`); only for Tidemark's reader.
    With ``raw_value_column`` (the raw value's column in ``df`` and ``decode_failed``, both
    also holding ``timestamp`` and ``key``), the same aggregation yields the per-range
    statistics of :func:`tidemark.spark.stats.range_stats` as ``outcome.range_stats``;
    ``raw_key_column`` names the raw key there when ``key`` holds a decoded one. With
    ``digested``, both frames instead carry each row's hash and bytes
    (:func:`tidemark.spark.stats.row_digest`, computed when the job staged them), and the
    statistics come from those.

    Steps: mark every record and aggregate once (ranges, bad counts) while GX runs beside
    it, sample bad records, judge each expectation, decide under the policy, write the
    summary, then split good from quarantined records.
    """
    from pyspark.sql import functions as F
    from pyspark.util import inheritable_thread_target

    run_dir.mkdir(parents=True, exist_ok=True)
    policy = feed.validation
    rules, untranslatable = feed_rules(feed, column_paths(df.schema))
    flags = [F.coalesce(F.expr(r.sql), F.lit(False)) for r in rules]
    bad = _or(flags)
    marks = _marked(df, decode_failed, flags, raw_value_column, raw_key_column, digested)
    content = bool(raw_value_column) or digested  # the range statistics need the records' raw bytes
    aggs = _aggregations(len(flags), raw_value_column, exact_duplicates, digested)
    # GX runs beside the aggregation, in a thread of its own: its context, queries and Data
    # Docs overlap the aggregation's scan instead of following it. When every expectation is
    # translated, whether GX lists unexpected rows hangs on the aggregation's counts (none
    # found: no lists, see run_gx), so GX starts without lists, and runs once more with
    # them in the rarer run whose counts find bad rows.
    speculative = not untranslatable
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tidemark-gx") as pool:
        # Leaving the block waits for GX, also when the aggregation raises: none of GX's
        # queries outlives validate() (after a failure the job discards the staged files).
        gx_future = pool.submit(
            inheritable_thread_target(df.sparkSession)(run_gx), df, feed, plan, run_dir, list_unexpected=not speculative
        )
        rows = marks.groupBy("topic", "partition").agg(*aggs).collect()
        stats = stats_from_rows(rows, plan, positions, content=content, distinct=exact_duplicates)
        ranges = check_ranges(stats, plan, positions=positions)
        counts = _counted(rows, len(rules))
        samples = _bad_samples(df, bad, rules, decode_failed, counts, sample_size)
    by_rule = _by_rule(rules, counts.by_rule)

    gx_out = gx_future.result()
    if speculative and any(counts.by_rule):  # bad rows after all: GX's result and Data Docs list them
        shutil.rmtree(run_dir / "gx", ignore_errors=True)
        gx_out = run_gx(df, feed, plan, run_dir, list_unexpected=True)
    judged = _judged(feed, gx_out, rules, counts.by_rule, untranslatable, samples, sample_size)
    # Tidemark's own rules (change_rules) are no expectation of the suite: their bad rows fail as one would.
    judged.failing += [r.label for r, n in zip(rules, counts.by_rule, strict=True)
                       if n and r.index is None and r.label != DECODE_LABEL]  # fmt: skip

    decode_errors = counts.undecoded + (counts.by_rule[0] if rules and rules[0].label == DECODE_LABEL else 0)
    failure = _failure(feed, plan, counts, judged, decode_errors)
    quarantine = policy.on_bad_records == "quarantine"
    quarantined_counts = {tp: n for tp, n in counts.bad.items() if n} if quarantine else {}
    good_counts = {s.key: s.records - quarantined_counts.get(s.key, 0) for s in stats if s.records}
    summary = _summary(
        feed, plan, failure, counts, judged, ranges, gx_out,
        by_rule=by_rule, decode_errors=decode_errors, good=good_counts, quarantined=quarantined_counts, samples=samples,
    )  # fmt: skip
    (run_dir / "validation.json").write_text(json.dumps(summary, indent=2, sort_keys=True, default=str))
    if failure is not None:
        where = f"; sample bad records: {_describe_samples(samples)}" if samples else ""
        raise ValidationRejectedError(
            f"validation of plan {plan.plan_id} (feed '{feed.name}') failed: {failure}{where}. "
            f"Data Docs: {gx_out.data_docs or gx_out.data_docs_index}. Nothing was published and the group's "
            "offsets were not committed: fix the records' producer or the feed's expectations (or its "
            "validation.on_bad_records / quarantine_max_ratio), then rerun (the same plan is read again)",
            summary,
            gx_out.data_docs,
        )
    good: DataFrame = df
    quarantined: DataFrame | None = None
    if quarantine and counts.bad_total:
        good = df.where(~bad)
        quarantined = df.where(bad).withColumn(REASON_COLUMN, F.expr(reason_sql(rules)))
        if counts.undecoded and decode_failed is not None:
            quarantined = quarantined.unionByName(
                _undecoded_for_quarantine(decode_failed, df), allowMissingColumns=True
            )
    range_stats = stats if content else None  # the checks passed: every range is a planned one
    return ValidationOutcome(good, quarantined, summary, gx_out.data_docs, good_counts, quarantined_counts, range_stats)
