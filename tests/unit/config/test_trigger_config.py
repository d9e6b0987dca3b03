"""``trigger:`` in a feed file: valid sections load, invalid ones fail naming the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.feed_files import assert_refused_naming
from tidemark.config.models import load_feed_file

BASE = "topics: [orders]\ngroup: orders-batch\n"


def feed_file(tmp_path: Path, trigger: str) -> Path:
    path = tmp_path / "orders.yaml"
    path.write_text(BASE + trigger)
    return path


def test_a_full_trigger_loads_with_its_numbers(tmp_path: Path) -> None:
    feed = load_feed_file(
        feed_file(
            tmp_path,
            "schedule: '*/15 * * * *'\ntrigger:\n  lag_records: 5000\n  oldest_unread_age: 10m\n"
            "  min_interval: 2m\n  check_every: 15s\n",
        )
    )
    assert feed.trigger is not None
    assert feed.trigger.lag_records == 5000 and feed.trigger.oldest_unread_age_ms == 600_000
    assert feed.trigger.min_interval_s == 120 and feed.trigger.check_every_s == 15
    assert feed.schedule == "*/15 * * * *"


def test_defaults(tmp_path: Path) -> None:
    feed = load_feed_file(feed_file(tmp_path, "trigger:\n  lag_records: 1\n"))
    assert feed.trigger is not None and feed.trigger.min_interval_s == 60 and feed.trigger.check_every_s == 30
    assert load_feed_file(feed_file(tmp_path, "")).trigger is None


@pytest.mark.parametrize(
    ("section", "names"),
    [
        ("trigger: {}\n", ["trigger", "lag_records", "oldest_unread_age"]),
        ("trigger:\n  min_interval: 5m\n", ["a trigger needs a threshold"]),
        ("trigger:\n  lag_records: 0\n", ["trigger.lag_records", "greater than 0"]),
        ("trigger:\n  lag_records: many\n", ["trigger.lag_records"]),
        ("trigger:\n  oldest_unread_age: soon\n", ["trigger.oldest_unread_age", "'soon'"]),
        ("trigger:\n  lag_records: 5\n  min_interval: 1 week\n", ["trigger.min_interval"]),
        ("trigger:\n  lag_records: 5\n  check_every: 0s\n", ["trigger.check_every", "at least 1s"]),
        ("trigger:\n  lag_records: 5\n  cron: '* * * * *'\n", ["trigger.cron", "Extra inputs"]),
    ],
)
def test_invalid_trigger_sections_name_the_file_and_the_field(tmp_path: Path, section: str, names: list[str]) -> None:
    assert_refused_naming(feed_file(tmp_path, section), names)
