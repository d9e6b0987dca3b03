"""``maintenance:`` in a feed file: an Iceberg feed's section loads, invalid ones fail naming the file and field."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from tests.support.feed_files import assert_refused_naming
from tidemark.config.models import load_feed_file
from tidemark.errors import ConfigError

ICEBERG = "topics: [orders]\ngroup: orders-batch\noutput_format: iceberg\n"


def feed_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "orders.yaml"
    path.write_text(text)
    return path


def test_a_full_section_loads_with_its_numbers(tmp_path: Path) -> None:
    feed = load_feed_file(feed_file(tmp_path, ICEBERG + (
        "maintenance:\n  schedule: '0 3 * * *'\n  target_file_mb: 256\n  min_input_files: 10\n  keep_snapshots: 50\n"
        "  snapshot_max_age: 168h\n  orphan_min_age: 24h\n")))  # fmt: skip
    m = feed.maintenance
    assert m is not None and m.schedule == "0 3 * * *" and m.target_file_bytes == 256 * 1024 * 1024
    assert m.min_input_files == 10 and m.keep_snapshots == 50
    assert m.snapshot_max_age_td == timedelta(days=7) and m.orphan_min_age_td == timedelta(days=1)


def test_defaults_follow_icebergs_own(tmp_path: Path) -> None:
    m = load_feed_file(feed_file(tmp_path, ICEBERG + "maintenance: {}\n")).maintenance
    assert m is not None and m.schedule == "@daily" and m.target_file_mb == 128 and m.min_input_files == 5
    assert m.snapshot_max_age_td == timedelta(days=5) and m.orphan_min_age_td == timedelta(days=3)
    assert load_feed_file(feed_file(tmp_path, ICEBERG)).maintenance is None


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("topics: [orders]\ngroup: g\nmaintenance: {}\n", ["'maintenance' is for Iceberg tables"]),
        (ICEBERG + "maintenance: {orphan_min_age: 10m}\n", ["maintenance.orphan_min_age", "at least 1h"]),
        (ICEBERG + "maintenance: {snapshot_max_age: soon}\n", ["maintenance.snapshot_max_age", "'soon'"]),
        (ICEBERG + "maintenance: {min_input_files: 1}\n", ["maintenance.min_input_files"]),
        (ICEBERG + "maintenance: {target_file_mb: 0}\n", ["maintenance.target_file_mb"]),
        (ICEBERG + "maintenance: {schedule: whenever}\n", ["maintenance.schedule"]),
        (ICEBERG + "maintenance: {vacuum: true}\n", ["maintenance.vacuum", "Extra inputs"]),
    ],
)
def test_invalid_sections_name_the_file_and_the_field(tmp_path: Path, text: str, names: list[str]) -> None:
    assert_refused_naming(feed_file(tmp_path, text), names)


def test_partition_by_is_one_of_the_specs(tmp_path: Path) -> None:
    feed = load_feed_file(feed_file(tmp_path, ICEBERG + "iceberg: {partition_by: hour}\n"))
    assert feed.iceberg is not None and feed.iceberg.partition_by == "hour"
    path = feed_file(tmp_path, ICEBERG + "iceberg: {partition_by: week}\n")
    with pytest.raises(ConfigError, match=r"iceberg\.partition_by"):
        load_feed_file(path)
