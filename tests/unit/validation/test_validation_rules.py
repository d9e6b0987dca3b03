"""Translating GX expectations into Spark SQL row conditions, and the range checks, without Spark."""

from __future__ import annotations

from typing import Any

import pytest

from tidemark.config.models import Expectation
from tidemark.errors import ValidationFailedError
from tidemark.planning.plan import PartitionPlan, Plan, compute_plan_id
from tidemark.spark.stats import RangeStats
from tidemark.staged import reason_codes
from tidemark.validation.rules import (
    DECODE_LABEL,
    OutcomeCodes,
    Untranslatable,
    check_ranges,
    check_written_counts,
    quote_ident,
    reason_sql,
    split_rules,
    sql_literal,
    translate,
)


def exp(kind: str, **kwargs: Any) -> Expectation:
    return Expectation(type=kind, kwargs=kwargs)


@pytest.mark.parametrize(
    ("expectation", "sql"),
    [
        (exp("expect_column_values_to_not_be_null", column="id"), "`id` IS NULL"),
        (exp("expect_column_values_to_be_null", column="id"), "`id` IS NOT NULL"),
        (
            exp("expect_column_values_to_be_between", column="amount", min_value=0, max_value=10000),
            "`amount` IS NOT NULL AND (`amount` < 0 OR `amount` > 10000)",
        ),
        (
            exp("expect_column_values_to_be_between", column="x", min_value=0.5, strict_min=True),
            "`x` IS NOT NULL AND (`x` <= 0.5)",
        ),
        (
            exp("expect_column_values_to_be_between", column="x", max_value=3, strict_max=True, mostly=0.9),
            "`x` IS NOT NULL AND (`x` >= 3)",
        ),
        (
            exp("expect_column_values_to_be_in_set", column="c", value_set=["a", "b", None]),
            "`c` IS NOT NULL AND NOT (`c` IN ('a', 'b'))",
        ),
        (
            exp("expect_column_values_to_be_in_set", column="c", value_set=[]),
            "`c` IS NOT NULL AND NOT (FALSE)",
        ),
        (
            exp("expect_column_values_to_not_be_in_set", column="n", value_set=[1, 2]),
            "`n` IS NOT NULL AND (`n` IN (1, 2))",
        ),
        (
            exp("expect_column_values_to_match_regex", column="c", regex=r"^cust-\d+$"),
            r"`c` IS NOT NULL AND NOT (`c` RLIKE '^cust-\\d+$')",
        ),
        (
            exp("expect_column_values_to_not_match_regex", column="c", regex="it's"),
            r"`c` IS NOT NULL AND (`c` RLIKE 'it\'s')",
        ),
        (
            exp("expect_column_value_lengths_to_be_between", column="c", min_value=1, max_value=8),
            "`c` IS NOT NULL AND (length(`c`) < 1 OR length(`c`) > 8)",
        ),
        (
            exp("expect_column_value_lengths_to_equal", column="c", value=4),
            "`c` IS NOT NULL AND length(`c`) <> 4",
        ),
        (exp("expect_column_values_to_not_be_null", column="a.b`c"), "`a.b``c` IS NULL"),
    ],
)
def test_translation(expectation: Expectation, sql: str) -> None:
    rule = translate(expectation)
    assert rule.sql == sql
    assert rule.expectation == expectation.type
    assert rule.label == f"{expectation.type}({expectation.kwargs['column']})"


def test_a_nested_path_below_a_struct_column_is_quoted_part_by_part() -> None:
    columns = ["id", "customer", "customer.id", "customer.address", "customer.address.zip", "a.b"]
    between = translate(exp("expect_column_values_to_be_between", column="customer.id", min_value=0), columns)
    assert between.sql == "`customer`.`id` IS NOT NULL AND (`customer`.`id` < 0)"
    deep = translate(exp("expect_column_values_to_not_be_null", column="customer.address.zip"), columns)
    assert deep.sql == "`customer`.`address`.`zip` IS NULL"
    assert translate(exp("expect_column_values_to_not_be_null", column="a.b"), columns).sql == "`a.b` IS NULL"
    with pytest.raises(Untranslatable, match=r"'customer\.email' is not in the data"):
        translate(exp("expect_column_values_to_not_be_null", column="customer.email"), columns)


@pytest.mark.parametrize(
    ("expectation", "why"),
    [
        (exp("expect_column_values_to_be_unique", column="id"), "not a per-row"),
        (exp("expect_table_row_count_to_be_between", min_value=1), "not a per-row"),
        (exp("expect_column_mean_to_be_between", column="x", min_value=1), "not a per-row"),
        (exp("expect_column_values_to_not_be_null", column="id", row_condition='x > 1'), "row_condition"),
        (exp("expect_column_values_to_not_be_null"), "no 'column'"),
        (exp("expect_column_values_to_be_between", column="x"), "neither min_value nor max_value"),
        (exp("expect_column_values_to_be_between", column="x", min_value=True), "no comparison literal"),
        (exp("expect_column_values_to_be_between", column="x", min_value=float("nan")), "not finite"),
        (exp("expect_column_values_to_be_in_set", column="x", value_set="abc"), "not a list"),
        (exp("expect_column_values_to_be_in_set", column="x", value_set=[{"a": 1}]), "no SQL literal"),
        (exp("expect_column_values_to_match_regex", column="x"), "no 'regex'"),
        (exp("expect_column_values_to_be_between", column="x", min_value=1, parse_strings_as_datetimes=True),
         "not translated"),
        (exp("expect_column_value_lengths_to_equal", column="x", value="4"), "not an integer"),
    ],
)  # fmt: skip
def test_untranslatable(expectation: Expectation, why: str) -> None:
    with pytest.raises(Untranslatable, match=why):
        translate(expectation)


def test_missing_column_is_untranslatable() -> None:
    with pytest.raises(Untranslatable, match="column 'nope' is not in the data"):
        translate(exp("expect_column_values_to_not_be_null", column="nope"), columns=["id"])


def test_split_rules_adds_decode_rule_and_explains_the_rest() -> None:
    expectations = [
        exp("expect_column_values_to_not_be_null", column="id"),
        exp("expect_column_values_to_be_unique", column="id"),
    ]
    rules, untranslatable = split_rules(expectations, ["topic", "id", "_decode_error"])
    assert [r.label for r in rules] == ["decode_error", "expect_column_values_to_not_be_null(id)"]
    assert rules[0].label == DECODE_LABEL and rules[0].sql == "`_decode_error` IS NOT NULL"
    assert rules[1].index == 0
    assert set(untranslatable) == {1}
    rules, _ = split_rules(expectations, ["topic", "id"])
    assert [r.label for r in rules] == ["expect_column_values_to_not_be_null(id)"]


def test_reason_expression_names_each_violated_rule() -> None:
    rules, _ = split_rules([exp("expect_column_values_to_not_be_null", column="id")], ["id", "_decode_error"])
    sql = reason_sql(rules)
    assert sql.startswith("concat_ws('; ', ")
    assert "concat('decode_error: ', `_decode_error`)" in sql
    assert "THEN 'expect_column_values_to_not_be_null(id)' END" in sql
    assert reason_sql([]) == "CAST(NULL AS STRING)"


def test_outcome_codes_name_rules_by_bit_and_decode_failures_by_index() -> None:
    columns = [f"c{i}" for i in range(70)]
    rules, _ = split_rules([exp("expect_column_values_to_not_be_null", column=c) for c in columns], columns)
    codes = OutcomeCodes(tuple(rules), ("value is not valid UTF-8", "required field 'n' is missing or null"))
    # bits 0 and 59 of the first chunk, bit 0 of the second (the 61st rule)
    assert codes.reason(f"rules-{(1 << 59) | 1:x}-1") == (
        "expect_column_values_to_not_be_null(c0); expect_column_values_to_not_be_null(c59); "
        "expect_column_values_to_not_be_null(c60)"
    )
    assert codes.reason("decode-2") == "decode_error: required field 'n' is missing or null"
    for unknown in ("decode-3", "decode-0", "rules-0", "ok", "outside_window"):
        with pytest.raises(ValueError, match="names no decode failure or rule"):
            codes.reason(unknown)
        with pytest.raises(ValueError, match="names no decode failure or rule"):
            codes.labels(unknown)
    # The reason codes a dead letter carries: what the reason's text says, as codes.
    assert codes.labels(f"rules-{(1 << 59) | 1:x}-1") == tuple(
        f"expect_column_values_to_not_be_null({c})" for c in ("c0", "c59", "c60")
    )
    assert codes.labels("decode-1") == codes.labels("decode-2") == ("decode_error",)
    for code in (f"rules-{(1 << 59) | 1:x}-1", "decode-2"):
        assert reason_codes(codes.reason(code)) == codes.labels(code)


@pytest.mark.parametrize(
    ("value", "literal"),
    [(3, "3"), (-2.5, "-2.5"), ("a'b", r"'a\'b'"), ("back\\slash", r"'back\\slash'")],
)
def test_sql_literal(value: Any, literal: str) -> None:
    assert sql_literal(value) == literal


def test_quote_ident() -> None:
    assert quote_ident("weird`name") == "`weird``name`"


# -- range checks over plain statistics --------------------------------------------


def plan_of(*ranges: tuple[int, int, int]) -> Plan:
    parts = tuple(PartitionPlan("t", p, 1, None, None, 0, e, e, s, e, "earliest") for p, s, e in ranges)
    return Plan(
        compute_plan_id("f", "g", "scheduled", "read_committed", parts),
        "f", "g", "scheduled", True, "read_committed", "2026-01-01T00:00:00+00:00", parts, (),
    )  # fmt: skip


def counted(
    partition: int,
    records: int,
    distinct: int | None,
    first: int,
    last: int,
    *,
    position: int | None = None,
    start: int = 10,
    end: int = 20,
) -> RangeStats:
    """What the range checks count of one partition of ``t`` planned ``[start, end)``: no content figures."""
    return RangeStats("t", partition, start, end, records, first, last, end - start - records, None, None, None, None,
                      distinct_offsets=distinct, position=position)  # fmt: skip


def test_clean_ranges_count_gaps_without_failing() -> None:
    plan = plan_of((0, 10, 20), (1, 0, 5), (2, 7, 7))
    check = check_ranges([counted(0, 8, 8, 10, 19), counted(1, 5, 5, 0, 4, start=0, end=5)], plan)
    assert check.gaps == {("t", 0): 2, ("t", 1): 0, ("t", 2): 0}
    rows = check.to_dict(plan)
    assert rows[2] == {
        "topic": "t", "partition": 2, "start": 7, "end": 7, "rows": 0, "gaps": 0,
        "min_offset": None, "max_offset": None,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("stats", "message"),
    [
        (counted(0, 3, 2, 10, 12), r"t\[0\]: 1 duplicate offsets"),
        (counted(0, 3, 3, 9, 12), r"t\[0\]: offsets 9..12 outside the planned range \[10, 20\)"),
        (counted(0, 3, 3, 15, 20), r"offsets 15..20 outside"),
        (counted(5, 1, 1, 0, 0, start=0, end=0), r"t\[5\]: 1 records from a partition the plan does not read"),
        (
            counted(0, 3, 3, 10, 12, position=13),
            r"t\[0\]: read stopped at offset 13, before the planned end 20",
        ),
    ],
)
def test_range_problems_fail_naming_partition_and_offsets(stats: RangeStats, message: str) -> None:
    with pytest.raises(ValidationFailedError, match=message):
        check_ranges([stats], plan_of((0, 10, 20)))


def test_more_records_than_planned_offsets_are_duplicates() -> None:
    with pytest.raises(ValidationFailedError, match=r"t\[0\]: 12 records, more than the 10 offsets planned"):
        check_ranges([counted(0, 12, 12, 10, 19)], plan_of((0, 10, 20)))


def test_reader_statistics_are_accepted() -> None:
    # The reader's statistics (tidemark.spark.stats.range_stats) carry no distinct count.
    reader_stats = RangeStats("t", 0, 10, 20, 9, 10, 19, 1, None, None, 90, "")
    check = check_ranges([reader_stats], plan_of((0, 10, 20)))
    assert check.gaps == {("t", 0): 1}
    too_many = RangeStats("t", 0, 10, 20, 11, 10, 19, -1, None, None, 110, "")
    with pytest.raises(ValidationFailedError, match="duplicates"):
        check_ranges([too_many], plan_of((0, 10, 20)))


def test_positions_prove_completion() -> None:
    plan = plan_of((0, 10, 20))
    check_ranges([counted(0, 3, 3, 10, 12)], plan, positions={("t", 0): 20})
    with pytest.raises(ValidationFailedError, match="read stopped at offset 0"):
        check_ranges([], plan, positions={("t", 0): 0})


def test_written_counts_must_match() -> None:
    check_written_counts({("t", 0): 3}, {("t", 0): 3})
    with pytest.raises(ValidationFailedError, match=r"t\[1\]: expected 0, manifest says 2"):
        check_written_counts({("t", 0): 3}, {("t", 0): 3, ("t", 1): 2})
