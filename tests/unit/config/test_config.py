"""Feed configs: valid files load, invalid ones fail naming the file and the field."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest

from tidemark.config.durations import schedule_interval
from tidemark.config.models import Feed, load_feed, load_feed_file, load_feeds, package_root, scan_feeds
from tidemark.errors import ConfigError
from tidemark.planning.resolve import Policy

MINIMAL = "topics: [orders]\ngroup: orders-batch\n"


def write(tmp_path: Path, text: str, name: str = "orders") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def test_demo_feed_loads() -> None:
    feed = load_feed("demo", package_root() / "feeds")
    assert feed.name == "demo" and feed.topics == ("tidemark.demo.events",)
    assert feed.interval == timedelta(hours=1)
    assert Policy.from_feed(feed).records_per_task == 500


def test_avro_demo_feed_loads_as_the_demo_writes_it() -> None:
    from tidemark.cli.demo import AVRO_FEED, AVRO_TOPIC

    feed = load_feed(AVRO_FEED, package_root() / "feeds")
    assert feed.topics == (AVRO_TOPIC,) and feed.deserialization.format == "avro"
    assert feed.deserialization.reader_subject(feed.topics) == f"{AVRO_TOPIC}-value"  # the serializer's subject
    assert feed.interval is None  # triggered only: the demo's registry does not outlive the demo


def test_minimal_feed_defaults_are_the_safe_ones(tmp_path: Path) -> None:
    feed = load_feed_file(write(tmp_path, MINIMAL))
    assert feed.name == "orders"
    assert (feed.on_missing, feed.on_data_loss, feed.on_ahead, feed.on_new_partition) == (
        "earliest",
        "fail",
        "fail",
        "earliest",
    )
    assert feed.isolation == "read_committed" and feed.interval is None


def test_timestamp_reset_feed(tmp_path: Path) -> None:
    feed = load_feed_file(write(tmp_path, MINIMAL + "on_missing: timestamp\nreset_timestamp: 2026-01-31T00:00:00Z\n"))
    assert feed.reset_timestamp_ms == 1_769_817_600_000


INVALID = [
    # id, extra YAML, the field the message must name, a phrase of the reason
    ("unknown-key", "topcis: [x]\n", "topcis", "Extra inputs are not permitted"),
    ("bad-on-missing", "on_missing: sometimes\n", "on_missing", "earliest"),
    ("bad-on-data-loss", "on_data_loss: ignore\n", "on_data_loss", "skip"),
    ("bad-on-ahead", "on_ahead: skip\n", "on_ahead", "latest"),
    ("bad-on-new-partition", "on_new_partition: timestamp\n", "on_new_partition", "earliest"),
    ("bad-isolation", "isolation: serializable\n", "isolation", "read_committed"),
    ("timestamp-without-time", "on_missing: timestamp\n", "(file)", "reset_timestamp"),
    ("time-without-timestamp", "reset_timestamp: 2026-01-31T00:00:00Z\n", "(file)", "only with on_missing"),
    (
        "naive-reset-time",
        "on_missing: timestamp\nreset_timestamp: 2026-01-31T00:00:00\n",
        "reset_timestamp",
        "timezone",
    ),
    ("zero-cap", "max_records_per_partition: 0\n", "max_records_per_partition", "greater than 0"),
    ("negative-run-cap", "max_records_per_run: -5\n", "max_records_per_run", "greater than 0"),
    ("zero-records-per-task", "records_per_task: 0\n", "records_per_task", "greater than 0"),
    (
        "partition-cap-above-run-cap",
        "max_records_per_partition: 100\nmax_records_per_run: 10\n",
        "(file)",
        "larger than max_records_per_run",
    ),
    ("bad-schedule", "schedule: every tuesday\n", "schedule", "neither a preset"),
    (
        "json-without-fields",
        "deserialization: {format: json}\n",
        "deserialization",
        "'fields' (top-level scalars) or 'schema_ddl'",
    ),
    (
        "json-fields-and-ddl",
        "deserialization: {format: json, fields: [{name: a, type: string}], schema_ddl: 'a string'}\n",
        "deserialization",
        "not both",
    ),
    (
        "ddl-without-json",
        "deserialization: {format: string, schema_ddl: 'a string'}\n",
        "deserialization",
        "need format: json",
    ),
    (
        "fields-without-json",
        "deserialization: {fields: [{name: a, type: string}]}\n",
        "deserialization",
        "format: json",
    ),
    (
        "bad-expectation",
        "validation: {expectations: [{type: check_it}]}\n",
        "validation.expectations.0.type",
        "pattern",
    ),
    ("subject-without-avro", "deserialization: {subject: orders-value}\n", "deserialization", "need format: avro"),
    (
        "zero-schema-version",
        "deserialization: {format: avro, schema_version: 0}\n",
        "deserialization.schema_version",
        "greater than 0",
    ),
    ("quarantine-ratio", "validation: {quarantine_max_ratio: 2}\n", "validation.quarantine_max_ratio", "less than"),
    ("unknown-output-format", "output_format: delta\n", "output_format", "'parquet' or 'iceberg'"),
    ("iceberg-settings-for-parquet", "iceberg: {table: lake.orders}\n", "(file)", "need output_format: iceberg"),
    (
        "iceberg-table-without-namespace",
        "output_format: iceberg\niceberg: {table: orders}\n",
        "iceberg.table",
        "namespace.name",
    ),
    (
        "iceberg-dead-letters-without-namespace",
        "output_format: iceberg\niceberg: {table: lake.orders, dead_letters: orders_bad}\n",
        "iceberg.dead_letters",
        "namespace.name",
    ),
    (
        "iceberg-dead-letters-are-the-table",
        "output_format: iceberg\niceberg: {table: lake.orders, dead_letters: lake.orders}\n",
        "(file)",
        "a table of their own",
    ),
    (
        "iceberg-catalog-in-feed",
        "output_format: iceberg\niceberg: {uri: 'postgresql://u:p@h/db'}\n",
        "iceberg.uri",
        "Extra inputs",
    ),
]


@pytest.mark.parametrize(("extra", "field", "reason"), [pytest.param(e, f, r, id=i) for i, e, f, r in INVALID])
def test_invalid_feed_names_file_and_field(tmp_path: Path, extra: str, field: str, reason: str) -> None:
    path = write(tmp_path, MINIMAL + extra)
    with pytest.raises(ConfigError) as info:
        load_feed_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert f"field '{field}'" in message
    assert reason in message


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        pytest.param("group: g\n", "topics", "Field required", id="no-topics"),
        pytest.param("topics: []\ngroup: g\n", "topics", "at least 1", id="empty-topics"),
        pytest.param("topics: [a, a]\ngroup: g\n", "topics", "listed twice", id="duplicate-topic"),
        pytest.param("topics: ['orders/eu']\ngroup: g\n", "topics", "not a Kafka topic name", id="bad-topic-name"),
        pytest.param(f"topics: [{'x' * 250}]\ngroup: g\n", "topics", "not a Kafka topic name", id="long-topic-name"),
        pytest.param("topics: [a]\n", "group", "Field required", id="no-group"),
        pytest.param("topics: [a]\ngroup: ''\n", "group", "at least 1", id="empty-group"),
        pytest.param("topics: [a]\ngroup: g\nname: other\n", "name", "file's stem", id="name-in-file"),
    ],
)
def test_invalid_topics_group_and_name(tmp_path: Path, text: str, field: str, reason: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_feed_file(path)
    assert str(path) in str(info.value)
    assert f"field '{field}'" in str(info.value) and reason in str(info.value)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        pytest.param("- a\n- b\n", "must be a YAML mapping, got list", id="not-a-mapping"),
        pytest.param("topics: [a\n", "not valid YAML", id="broken-yaml"),
    ],
)
def test_unreadable_feed_files(tmp_path: Path, text: str, reason: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=reason) as info:
        load_feed_file(path)
    assert str(path) in str(info.value)


def test_bad_feed_file_name_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL, name="-bad")
    with pytest.raises(ConfigError, match=r"field 'name'"):
        load_feed_file(path)


def test_unknown_feed_lists_known_ones(tmp_path: Path) -> None:
    write(tmp_path, MINIMAL, name="orders")
    write(tmp_path, MINIMAL.replace("orders-batch", "payments-batch"), name="payments")
    with pytest.raises(ConfigError, match=r"no feed named 'refunds' .*known feeds: orders, payments"):
        load_feed("refunds", tmp_path)
    assert sorted(load_feeds(tmp_path)) == ["orders", "payments"]


@pytest.mark.parametrize(
    ("schedule", "interval"),
    [
        ("@hourly", timedelta(hours=1)),
        ("@daily", timedelta(days=1)),
        ("6h", timedelta(hours=6)),
        ("90min", timedelta(minutes=90)),
        ("2w", timedelta(weeks=2)),
        ("*/15 * * * *", timedelta(minutes=15)),
        ("0 0 1 * *", timedelta(days=31)),  # the longest gap of a monthly cron
    ],
)
def test_schedule_intervals(schedule: str, interval: timedelta) -> None:
    assert schedule_interval(schedule) == interval
    feed = Feed(name="f", topics=("a",), group="g", schedule=schedule)
    assert feed.interval == interval


def test_avro_reader_subject_defaults_to_the_topics_value_subject(tmp_path: Path) -> None:
    feed = load_feed_file(write(tmp_path, MINIMAL + "deserialization: {format: avro}\n"))
    assert feed.deserialization.reader_subject(feed.topics) == "orders-value"
    two = "topics: [orders, refunds]\ngroup: g\ndeserialization: {format: avro}\n"
    with pytest.raises(ConfigError, match="several topics names the subject"):
        load_feed_file(write(tmp_path, two))
    pinned = load_feed_file(write(tmp_path, two.replace("avro}", "avro, subject: shop, schema_version: 2}")))
    assert (pinned.deserialization.reader_subject(pinned.topics), pinned.deserialization.schema_version) == ("shop", 2)


def test_iceberg_table_defaults_to_the_feed_name(tmp_path: Path) -> None:
    feed = load_feed_file(write(tmp_path, MINIMAL + "output_format: iceberg\n", name="orders-eu.v1"))
    assert feed.iceberg_table == "tidemark.orders_eu_v1"
    chosen = load_feed_file(write(tmp_path, MINIMAL + "output_format: iceberg\niceberg: {table: lake.orders}\n"))
    assert chosen.iceberg_table == "lake.orders" and chosen.output_format == "iceberg"
    assert (feed.iceberg_dead_letters, chosen.iceberg_dead_letters) == (
        "tidemark.orders_eu_v1_dead_letters",
        "lake.orders_dead_letters",
    )  # beside the table, in its namespace
    named = load_feed_file(write(tmp_path, MINIMAL + "output_format: iceberg\niceberg: {dead_letters: ops.bad}\n"))
    assert named.iceberg_dead_letters == "ops.bad"
    assert load_feed_file(write(tmp_path, MINIMAL)).output_format == "parquet"


@pytest.mark.parametrize(
    ("names", "dag"),
    [(["orders.v1", "orders_v1"], "tidemark_orders_v1"), (["orders.yaml", "orders.yml"], "tidemark_orders")],
)
def test_feeds_whose_dag_ids_collide_are_refused_naming_both_files(tmp_path: Path, names: list[str], dag: str) -> None:
    for name in names:
        (tmp_path / (name if name.endswith((".yaml", ".yml")) else f"{name}.yaml")).write_text(MINIMAL)
    with pytest.raises(ConfigError) as refused:
        load_feeds(tmp_path)
    message = str(refused.value)
    assert f"'{dag}'" in message and "rename" in message
    assert all(str(path) in message for path in tmp_path.iterdir())


@pytest.mark.parametrize("builtin", ["replay", "backfill"])
def test_a_feed_named_after_a_built_in_dag_is_refused(tmp_path: Path, builtin: str) -> None:
    path = write(tmp_path, MINIMAL, name=builtin)
    write(tmp_path, MINIMAL, name="orders")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(path))} would take the DAG id 'tidemark_{builtin}'"):
        load_feeds(tmp_path)


def test_scanning_the_feeds_folder_keeps_every_good_feed_and_names_each_bad_file(tmp_path: Path) -> None:
    good = write(tmp_path, MINIMAL, name="orders")
    typo = write(tmp_path, "topics: [orders\n", name="typo")
    invalid = write(tmp_path, MINIMAL + "on_missing: sometimes\n", name="invalid")
    for name in ("pay.v1", "pay_v1", "replay"):
        write(tmp_path, MINIMAL, name=name)

    scan = scan_feeds(tmp_path)

    assert list(scan.feeds) == ["orders"] and scan.feeds["orders"].group == load_feed_file(good).group
    problems = {p.name: p for p in scan.problems}
    assert sorted(problems) == ["invalid", "pay.v1", "pay_v1", "replay", "typo"]
    assert problems["typo"].files == (str(typo),) and "not valid YAML" in problems["typo"].error
    assert problems["invalid"].files == (str(invalid),) and "field 'on_missing'" in problems["invalid"].error
    assert problems["pay.v1"].files == problems["pay_v1"].files and len(problems["pay_v1"].files) == 2
    assert "'tidemark_replay'" in problems["replay"].error
    assert problems["typo"].message.endswith(f"'tidemark_typo') and does not run until {typo} is fixed; every other "
                                             "feed loads")  # fmt: skip
    with pytest.raises(ConfigError, match="not valid YAML"):  # the strict reading still refuses the lot
        load_feeds(tmp_path)
