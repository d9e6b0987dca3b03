"""validate() on Spark DataFrames with the read schema: GX suites, Data Docs, quarantine, built-ins."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tidemark.config.models import Expectation, Feed, Validation
from tidemark.errors import ValidationFailedError
from tidemark.planning.plan import PartitionPlan, Plan, compute_plan_id
from tidemark.validation.rules import ValidationRejectedError, check_ranges, validate

pytestmark = pytest.mark.spark

SCHEMA = (
    "topic string, partition int, offset long, timestamp timestamp, timestamp_type int, key binary, value binary, "
    "headers array<struct<key string, value binary>>, plan_id string, "
    "order_id long, customer string, amount double, _decode_error string"
)
TOPIC = "orders"


def make_plan(ranges: dict[int, tuple[int, int]]) -> Plan:
    parts = tuple(
        PartitionPlan(TOPIC, p, 1, None, None, 0, end, end, start, end, "earliest")
        for p, (start, end) in ranges.items()
    )
    return Plan(
        compute_plan_id("orders", "g", "scheduled", "read_committed", parts),
        "orders", "g", "scheduled", True, "read_committed", "2026-01-01T00:00:00+00:00", parts, (),
    )  # fmt: skip


def row(partition: int, offset: int, order_id: int | None, customer: str | None, amount: float | None,
        decode_error: str | None = None) -> tuple[Any, ...]:  # fmt: skip
    ts = datetime(2026, 1, 1, tzinfo=UTC)
    return (
        TOPIC,
        partition,
        offset,
        ts,
        0,
        b"k",
        b"{}",
        [("h", b"1")],
        "pid",
        order_id,
        customer,
        amount,
        decode_error,
    )


def clean_rows(partition: int, start: int, count: int) -> list[tuple[Any, ...]]:
    return [row(partition, start + i, start + i, f"customer-{i % 3}", 10.0 + i) for i in range(count)]


def feed(mode: str = "fail", ratio: float = 0.05, expect_records: bool = False, *extra: Expectation) -> Feed:
    expectations = (
        Expectation(type="expect_column_values_to_not_be_null", kwargs={"column": "order_id"}),
        Expectation(type="expect_column_values_to_be_between", kwargs={"column": "amount", "min_value": 0,
                                                                       "max_value": 10000}),
        *extra,
    )  # fmt: skip
    return Feed(
        name="orders",
        topics=(TOPIC,),
        group="g",
        validation=Validation(
            on_bad_records=mode,  # type: ignore[arg-type]
            quarantine_max_ratio=ratio,
            expect_records=expect_records,
            expectations=expectations,
        ),
    )


def assert_data_docs(summary: dict[str, Any], run_dir: Path) -> None:
    page = Path(summary["data_docs"])
    assert page.is_file() and page.is_relative_to(run_dir / "gx")
    html = page.read_text()
    assert html.lstrip().lower().startswith("<!doctype html") and "</html>" in html
    assert Path(summary["data_docs_index"]).is_file()
    assert json.loads(Path(summary["gx_result"]).read_text())["statistics"]["evaluated_expectations"] >= 1
    assert json.loads((run_dir / "validation.json").read_text()) == json.loads(json.dumps(summary, default=str))


def test_clean_batch_passes_with_a_data_docs_page(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame(clean_rows(0, 100, 30) + clean_rows(1, 0, 20), SCHEMA).persist()
    plan = make_plan({0: (100, 132), 1: (0, 20)})  # two offsets of partition 0 are gaps

    outcome = validate(df, plan, feed(expect_records=True), tmp_path)

    assert outcome.summary["success"] is True
    assert outcome.quarantined is None
    assert outcome.good.count() == 50
    assert outcome.good_counts == {(TOPIC, 0): 30, (TOPIC, 1): 20}
    assert outcome.summary["counts"]["rows"] == 50
    assert outcome.summary["gaps"] == 2
    assert [e["success"] for e in outcome.summary["expectations"]] == [True, True, True]
    assert outcome.summary["expectations"][-1]["builtin"] is True
    assert outcome.data_docs is not None
    assert_data_docs(outcome.summary, tmp_path)
    json.dumps(outcome.summary)  # JSON-serialisable as is


def test_data_docs_templates_are_compiled_once_and_then_loaded_from_the_cache(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GX renders every page with a new Jinja environment: the templates compile in the first run only."""
    import jinja2

    from tidemark.validation.rules import run_gx

    monkeypatch.setenv("TIDEMARK_CACHE_DIR", str(tmp_path / "cache"))
    compiled: list[str | None] = []
    compile_template = jinja2.Environment.compile

    def counting(self: Any, source: Any, name: str | None = None, *args: Any, **kwargs: Any) -> Any:
        compiled.append(name)
        return compile_template(self, source, name, *args, **kwargs)

    monkeypatch.setattr(jinja2.Environment, "compile", counting)
    df = spark.createDataFrame(clean_rows(0, 0, 10), SCHEMA)
    plan = make_plan({0: (0, 10)})
    first = run_gx(df, feed(), plan, tmp_path / "a", list_unexpected=False)
    first_compiled = len(compiled)
    second = run_gx(df, feed(), plan, tmp_path / "b", list_unexpected=False)

    assert first_compiled > 10
    assert compiled[first_compiled:] == []  # the second run loaded every template it compiled before
    assert list((tmp_path / "cache" / "jinja").iterdir())
    pages = [o.data_docs.read_text() for o in (first, second) if o.data_docs is not None]
    assert len(pages) == 2 and all("order_id" in page and "amount" in page for page in pages)


def _gx_jobs(spark: Any, group: str, call: Any) -> tuple[Any, int]:
    """``call()``'s result and how many Spark jobs it ran."""
    spark.sparkContext.setJobGroup(group, group)
    try:
        result = call()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    return result, len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def test_gx_looks_for_no_unexpected_rows_once_the_row_counts_found_none(spark: Any, tmp_path: Path) -> None:
    from tidemark.validation.rules import run_gx

    plan = make_plan({0: (0, 40)})
    clean = spark.createDataFrame(clean_rows(0, 0, 40), SCHEMA).persist()
    # Not listing first: a first GX run on a DataFrame may run jobs a second one does not.
    unlisted, jobs_not_listing = _gx_jobs(
        spark, "gx-nolist", lambda: run_gx(clean, feed(), plan, tmp_path / "b", list_unexpected=False)
    )
    listed, jobs_listing = _gx_jobs(spark, "gx-list", lambda: run_gx(clean, feed(), plan, tmp_path / "a"))
    # The same verdicts and counts, without the queries for lists that are empty anyway.
    assert jobs_not_listing < jobs_listing
    assert unlisted.success is listed.success is True
    for a, b in zip(listed.results, unlisted.results, strict=True):
        assert (a["success"], a["result"].get("unexpected_count"), a["result"].get("element_count")) == (
            b["success"], b["result"].get("unexpected_count"), b["result"].get("element_count"))  # fmt: skip
    assert unlisted.data_docs is not None and unlisted.data_docs.is_file()

    # validate() lists nothing when its own counts found no bad row, and lists the bad
    # offsets in GX's result when they found some.
    validate(clean, plan, feed(), tmp_path / "c")
    clean_result = json.loads((tmp_path / "c" / "gx" / "validation_result.json").read_text())
    assert all("partial_unexpected_index_list" not in r["result"] for r in clean_result["results"][:2])
    rows = clean_rows(0, 0, 40)
    rows[9] = row(0, 9, None, "c", 5.0)
    with pytest.raises(ValidationRejectedError):
        validate(spark.createDataFrame(rows, SCHEMA), plan, feed(), tmp_path / "d")
    bad_result = json.loads((tmp_path / "d" / "gx" / "validation_result.json").read_text())
    assert bad_result["results"][0]["result"]["partial_unexpected_index_list"] == [
        {"topic": TOPIC, "partition": 0, "offset": 9, "order_id": None}
    ]
    # GX ran beside the counts without lists, then again with them: only the second run is
    # left in the Data Docs (validations/<suite>/<run name>/<run time>/<page>).
    runs = list((tmp_path / "d" / "gx" / "validations").glob("*/*/*"))
    assert len(runs) == 1 and len(list(runs[0].glob("*.html"))) == 1


def test_range_statistics_ride_along_the_validation_aggregation(spark: Any, tmp_path: Path) -> None:
    from tidemark.spark.stats import range_stats

    plan = make_plan({0: (100, 132), 1: (0, 20)})
    undecoded = spark.createDataFrame([row(1, 19, None, None, None, "x")], SCHEMA)
    good = spark.createDataFrame(clean_rows(0, 100, 30) + clean_rows(1, 0, 19), SCHEMA).drop("_decode_error")
    everything = good.unionByName(undecoded.drop("_decode_error"))

    outcome = validate(good, plan, feed("quarantine", 0.5), tmp_path, decode_failed=undecoded,
                       exact_duplicates=False, raw_value_column="value")  # fmt: skip

    assert outcome.range_stats == range_stats(everything, plan)  # one aggregation, the same figures
    by_partition = {s.partition: s for s in outcome.range_stats}
    assert (by_partition[0].records, by_partition[0].gaps, by_partition[1].records) == (30, 2, 20)
    assert by_partition[1].bytes == 20 * (len(b"k") + len(b"{}"))
    assert validate(good, plan, feed("quarantine", 0.5), tmp_path, decode_failed=undecoded).range_stats is None


def test_fail_mode_names_expectations_partitions_and_offsets(spark: Any, tmp_path: Path) -> None:
    rows = clean_rows(0, 0, 10)
    rows[3] = row(0, 3, None, "c", 5.0)
    rows[7] = row(0, 7, 7, "c", 20000.0)
    df = spark.createDataFrame(rows, SCHEMA).persist()

    with pytest.raises(ValidationRejectedError) as info:
        validate(df, make_plan({0: (0, 10)}), feed(), tmp_path)

    message = str(info.value)
    assert "expect_column_values_to_not_be_null(order_id)" in message
    assert "expect_column_values_to_be_between(amount)" in message
    assert f"{TOPIC}[0]@3" in message and f"{TOPIC}[0]@7" in message
    summary = info.value.summary
    assert summary["success"] is False
    assert [(s["partition"], s["offset"]) for s in summary["sample_bad_records"]] == [(0, 3), (0, 7)]
    assert_data_docs(summary, tmp_path)


def test_quarantine_splits_good_and_bad_records_within_the_threshold(spark: Any, tmp_path: Path) -> None:
    rows = clean_rows(0, 0, 40) + clean_rows(1, 0, 40)
    rows[5] = row(0, 5, None, "c", 1.0)
    rows[41] = row(1, 1, 41, "c", -3.0, decode_error=None)
    rows[60] = row(1, 20, None, None, None, decode_error="invalid JSON at byte 14")
    df = spark.createDataFrame(rows, SCHEMA).persist()

    outcome = validate(df, make_plan({0: (0, 40), 1: (0, 40)}), feed("quarantine", ratio=0.05), tmp_path)

    assert outcome.summary["success"] is True
    assert outcome.quarantined is not None
    bad = {(r["partition"], r["offset"]): r["_reason"] for r in outcome.quarantined.collect()}
    assert bad == {
        (0, 5): "expect_column_values_to_not_be_null(order_id)",
        (1, 1): "expect_column_values_to_be_between(amount)",
        (1, 20): "decode_error: invalid JSON at byte 14; expect_column_values_to_not_be_null(order_id)",
    }
    good = {(r["partition"], r["offset"]) for r in outcome.good.select("partition", "offset").collect()}
    assert len(good) == 77 and not good & set(bad)
    assert outcome.good_counts == {(TOPIC, 0): 39, (TOPIC, 1): 38}
    assert outcome.quarantined_counts == {(TOPIC, 0): 1, (TOPIC, 1): 2}
    counts = outcome.summary["counts"]
    assert (counts["good"], counts["quarantined"], counts["decode_errors"]) == (77, 3, 1)
    assert "_reason" not in outcome.good.columns
    assert_data_docs(outcome.summary, tmp_path)


def test_quarantine_over_the_threshold_fails_the_run(spark: Any, tmp_path: Path) -> None:
    rows = clean_rows(0, 0, 20)
    for i in (2, 4, 6):
        rows[i] = row(0, i, None, "c", 1.0)
    df = spark.createDataFrame(rows, SCHEMA).persist()

    with pytest.raises(
        ValidationRejectedError, match=r"3 of 20 records are bad \(15.00%\), above quarantine_max_ratio 10"
    ):
        validate(df, make_plan({0: (0, 20)}), feed("quarantine", ratio=0.10), tmp_path)


def test_decode_errors_fail_a_fail_mode_feed(spark: Any, tmp_path: Path) -> None:
    rows = clean_rows(2, 0, 5)
    rows[4] = row(2, 4, 4, "c", 1.0, decode_error="not UTF-8")
    df = spark.createDataFrame(rows, SCHEMA).persist()

    with pytest.raises(
        ValidationRejectedError, match=r"1 records failed to decode.*orders\[2\]@4 \(decode_error: not UTF-8\)"
    ):
        validate(df, make_plan({2: (0, 5)}), feed(), tmp_path)


def test_empty_batch_does_not_pass_vacuously_when_records_are_expected(spark: Any, tmp_path: Path) -> None:
    empty = spark.createDataFrame([], SCHEMA).persist()
    plan = make_plan({0: (5, 5)})

    with pytest.raises(ValidationRejectedError, match=r"expects records but plan .* read none") as info:
        validate(empty, plan, feed(expect_records=True), tmp_path / "expects")
    assert info.value.summary["expectations"][-1]["success"] is False  # GX's row-count check failed too
    assert_data_docs(info.value.summary, tmp_path / "expects")

    outcome = validate(empty, plan, feed(expect_records=False), tmp_path / "optional")
    assert outcome.summary["success"] is True and outcome.summary["counts"]["rows"] == 0


def test_untranslatable_failure_fails_even_in_quarantine_mode(spark: Any, tmp_path: Path) -> None:
    rows = clean_rows(0, 0, 10)
    rows[9] = row(0, 9, 1, "c", 1.0)  # order_id 1 again
    df = spark.createDataFrame(rows, SCHEMA).persist()
    unique = Expectation(type="expect_column_values_to_be_unique", kwargs={"column": "order_id"})

    with pytest.raises(ValidationRejectedError, match=r"cannot be quarantined row by row.*unique") as info:
        validate(df, make_plan({0: (0, 10)}), feed("quarantine", 0.5, False, unique), tmp_path)
    offsets = {(s["partition"], s["offset"]) for s in info.value.summary["sample_bad_records"]}
    assert offsets == {(0, 1), (0, 9)}  # GX's unexpected index names the offsets


def test_every_translated_rule_agrees_with_gx(spark: Any, tmp_path: Path) -> None:
    customers = ["cust-1", "cust-22", "bad id", None, "x", "cust-333333333", "cust-4", "it's", "cust-5", "cust-6"]
    rows = [row(0, i, i, c, float(i * 3)) for i, c in enumerate(customers)]
    df = spark.createDataFrame(rows, SCHEMA).persist()
    extra = [
        Expectation(type="expect_column_values_to_be_in_set", kwargs={"column": "customer",
                                                                      "value_set": ["cust-1", "x", "it's"]}),
        Expectation(type="expect_column_values_to_not_be_in_set", kwargs={"column": "order_id", "value_set": [2, 3]}),
        Expectation(type="expect_column_values_to_match_regex", kwargs={"column": "customer", "regex": r"^cust-\d+$"}),
        Expectation(type="expect_column_values_to_not_match_regex", kwargs={"column": "customer", "regex": "'"}),
        Expectation(type="expect_column_value_lengths_to_be_between", kwargs={"column": "customer", "min_value": 2,
                                                                              "max_value": 7}),
        Expectation(type="expect_column_value_lengths_to_equal", kwargs={"column": "customer", "value": 6}),
        Expectation(type="expect_column_values_to_be_between", kwargs={"column": "amount", "min_value": 3,
                                                                       "max_value": 24, "strict_min": True}),
        Expectation(type="expect_column_values_to_be_null", kwargs={"column": "_decode_error"}),
    ]  # fmt: skip

    outcome = validate(df, make_plan({0: (0, 10)}), feed("quarantine", 1.0, False, *extra), tmp_path)

    by_type = {
        (e["type"], json.dumps(e["kwargs"], sort_keys=True)): e
        for e in outcome.summary["expectations"]
        if e["row_level"]
    }
    assert len(by_type) == 10
    for entry in by_type.values():
        assert "translation_mismatch" not in entry, entry
        assert entry["quarantine_count"] == entry["unexpected_count"], entry
    counts = [e["quarantine_count"] for e in outcome.summary["expectations"] if e["row_level"]]
    # not_null, between(amount 0..10000), in_set, not_in_set, regex, not_regex, lengths 2..7, length 6,
    # between(3 < amount <= 24), be_null
    assert counts == [0, 0, 6, 2, 3, 1, 2, 4, 3, 0]


def test_duplicates_and_out_of_range_offsets_fail_the_built_in_checks(spark: Any, tmp_path: Path) -> None:
    import threading

    rows = clean_rows(0, 0, 5)
    dup = spark.createDataFrame([*rows, rows[2]], SCHEMA)
    with pytest.raises(ValidationFailedError, match=r"orders\[0\]: 1 duplicate offsets"):
        validate(dup, make_plan({0: (0, 5)}), feed(), tmp_path)
    # GX ran beside the failed checks; it finished before validate() raised, so none of its
    # queries can still be reading files that the job discards after a failure.
    assert not [t for t in threading.enumerate() if t.name.startswith("tidemark-gx")]
    with pytest.raises(ValidationFailedError, match=r"orders\[0\]: offsets 0..4 outside the planned range \[1, 5\)"):
        check_ranges(spark.createDataFrame(rows, SCHEMA), make_plan({0: (1, 5)}))


RAW_SCHEMA = (
    "topic string, partition int, offset long, timestamp timestamp, timestamp_type int, key binary, value binary, "
    "headers array<struct<key string, value binary>>, plan_id string"
)


def raw_rows(values: list[bytes]) -> list[tuple[Any, ...]]:
    ts = datetime(2026, 1, 1, tzinfo=UTC)
    return [(TOPIC, 0, i, ts, 0, f"k{i}".encode(), v, [], "pid") for i, v in enumerate(values)]


def json_feed(mode: str, ratio: float) -> Feed:
    from tidemark.config.models import Deserialization, JsonField

    return Feed(
        name="orders",
        topics=(TOPIC,),
        group="g",
        deserialization=Deserialization(
            format="json",
            fields=(JsonField(name="order_id", type="integer"), JsonField(name="amount", type="number")),
        ),
        validation=Validation(
            on_bad_records=mode,  # type: ignore[arg-type]
            quarantine_max_ratio=ratio,
            expectations=(
                Expectation(type="expect_column_values_to_be_between", kwargs={"column": "amount", "min_value": 0}),
            ),
        ),
    )


def test_records_that_failed_to_decode_are_bad_records(spark: Any, tmp_path: Path) -> None:
    from tidemark.spark.decode import decode

    values = [json.dumps({"order_id": i, "amount": 1.5 * i}).encode() for i in range(10)]
    values[3] = b'{"order_id": "broken'
    values[6] = json.dumps({"order_id": 6, "amount": -1.0}).encode()
    raw = spark.createDataFrame(raw_rows(values), RAW_SCHEMA).persist()
    plan = make_plan({0: (0, 10)})
    feed = json_feed("quarantine", 0.25)
    decoded = decode(raw, feed.deserialization)

    outcome = validate(decoded.good, plan, feed, tmp_path / "q", decode_failed=decoded.bad)

    counts = outcome.summary["counts"]
    assert (counts["rows"], counts["good"], counts["quarantined"], counts["decode_errors"]) == (10, 8, 2, 1)
    assert outcome.summary["gaps"] == 0  # the undecoded record counts as read
    assert outcome.quarantined is not None
    bad = {r["offset"]: r for r in outcome.quarantined.collect()}
    assert set(bad) == {3, 6}
    assert bad[3]["_reason"].startswith("decode_error: ") and bad[3]["value"] == values[3]
    assert bad[3]["_raw_key"] == b"k3"  # the raw binary key, beside the decoded string keys
    assert bad[6]["_reason"] == "expect_column_values_to_be_between(amount)" and bad[6]["key"] == "k6"
    assert sorted(r["offset"] for r in outcome.good.select("offset").collect()) == [0, 1, 2, 4, 5, 7, 8, 9]

    with pytest.raises(ValidationRejectedError, match=r"1 records failed to decode.*orders\[0\]@3 \(decode_error: "):
        validate(decoded.good, plan, json_feed("fail", 0.0), tmp_path / "f", decode_failed=decoded.bad)


def test_outcome_codes_stand_for_the_reasons_validate_gives_past_one_bitmask_chunk(spark: Any) -> None:
    """Each row's short code, turned back into text, is the reason the quarantine has always carried."""
    from pyspark.sql import functions as F

    from tidemark.config.models import Deserialization
    from tidemark.staged import OK_OUTCOME
    from tidemark.validation.rules import OutcomeCodes, reason_sql, split_rules

    columns = [f"c{i}" for i in range(65)]  # two bitmask chunks
    rules = [Expectation(type="expect_column_values_to_not_be_null", kwargs={"column": c}) for c in columns]
    feed = Feed(name="wide", topics=(TOPIC,), group="g", validation=Validation(expectations=tuple(rules)),
                deserialization=Deserialization(format="string"))  # fmt: skip
    schema = "decode_error string, " + ", ".join(f"{c} string" for c in columns)
    nulls = [set(), {0}, {59, 60}, {64}, set(range(65))]
    rows = [(None, *[None if i in n else "x" for i in range(65)]) for n in nulls]
    df = spark.createDataFrame([*rows, ("value is not valid UTF-8", *["x"] * 65)], schema)
    codes = OutcomeCodes.of(df.columns, feed)
    with_decode, _ = split_rules(feed.validation.expectations, df.columns)
    got = df.select(codes.column().alias("code"), F.expr(reason_sql(with_decode)).alias("reason")).collect()

    assert got[0]["code"] == OK_OUTCOME and got[0]["reason"] == ""
    assert [codes.reason(r["code"]) for r in got[1:]] == [r["reason"] for r in got[1:]]
    assert all(len(r["code"]) < 40 for r in got)


@pytest.mark.parametrize("plan_id", ["43061566701966215906", "20240101000000000000"])
def test_a_plan_id_that_looks_like_a_number_or_a_date_validates_and_keeps_todays_run_time(
    spark: Any, tmp_path: Path, plan_id: str
) -> None:
    df = spark.createDataFrame(clean_rows(0, 0, 5), SCHEMA)
    plan = replace(make_plan({0: (0, 5)}), plan_id=plan_id)
    before = datetime.now(UTC)

    outcome = validate(df, plan, feed(), tmp_path)

    run_id = json.loads(Path(outcome.summary["gx_result"]).read_text())["meta"]["run_id"]
    assert run_id["run_name"] == plan_id
    assert datetime.fromisoformat(run_id["run_time"]) >= before
