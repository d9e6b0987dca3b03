"""``topics: {pattern: ..., exclude: [...]}`` in a feed file: the pattern form loads, bad ones name feed and pattern."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.feed_files import assert_refused_naming
from tidemark.config.models import load_feed_file


def feed_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "orders.yaml"
    path.write_text(text + "group: orders-batch\n")
    return path


def test_the_pattern_form_loads_beside_the_list_form(tmp_path: Path) -> None:
    text = "topics:\n  pattern: 'orders\\..*'\n  exclude: ['orders\\.dlq', '.*\\.test']\n"
    feed = load_feed_file(feed_file(tmp_path, text))
    assert feed.topics == () and feed.topic_pattern is not None
    assert feed.topic_pattern.pattern == "orders\\..*"
    assert feed.topic_pattern.exclude == ("orders\\.dlq", ".*\\.test")
    assert feed.topics_label == "pattern 'orders\\..*' (excluding 'orders\\.dlq', '.*\\.test')"
    resolved = feed.with_topics(("orders.eu", "orders.us"))
    assert resolved.topics == ("orders.eu", "orders.us") and resolved.topic_pattern == feed.topic_pattern
    listed = load_feed_file(feed_file(tmp_path, "topics: [orders.eu, orders.us]\n"))
    assert listed.topics == ("orders.eu", "orders.us") and listed.topic_pattern is None
    assert listed.topics_label == "orders.eu, orders.us"


@pytest.mark.parametrize(
    ("topic", "taken"),
    [
        ("orders.eu", True),
        ("orders.", True),
        ("orders", False),  # the pattern needs the dot
        ("old.orders.eu", False),  # full match: not a search
        ("orders.eu.v2", True),
        ("orders.dlq", False),  # excluded by name
        ("orders.eu.test", False),  # excluded by a regex
        ("ordersXdlq", False),  # the pattern's escaped dot is a dot
    ],
)
def test_full_match_and_exclusions(tmp_path: Path, topic: str, taken: bool) -> None:
    text = "topics:\n  pattern: 'orders\\..*'\n  exclude: [orders\\.dlq, '.*\\.test']\n"
    feed = load_feed_file(feed_file(tmp_path, text))
    assert feed.topic_pattern is not None and feed.topic_pattern.matches(topic) is taken


@pytest.mark.parametrize(
    ("text", "names"),
    [
        pytest.param("topics: {pattern: 'orders['}\n", ["orders.yaml", "field 'topics'", "feed 'orders'",
                     "topics.pattern 'orders['", "not a regular expression", "unterminated character set"],
                     id="bad-pattern"),
        pytest.param("topics: {pattern: 'o.*', exclude: [ok, 'x(']}\n", ["feed 'orders'", "topics.exclude[1] 'x('",
                     "not a regular expression"], id="bad-exclusion"),
        pytest.param("topics: {}\n", ["field 'topics.pattern'", "Field required"], id="no-pattern"),
        pytest.param("topics: {pattern: ''}\n", ["field 'topics.pattern'", "at least 1"], id="empty-pattern"),
        pytest.param("topics: {pattern: 'o.*', only: [a]}\n", ["field 'topics.only'", "Extra inputs"],
                     id="unknown-key"),
        pytest.param("topics: {pattern: 'o.*'}\ndeserialization: {format: avro}\n",
                     ["deserialization.subject", "a topic pattern too"], id="registry-without-subject"),
        pytest.param("topics: [a]\ntopic_pattern: {pattern: 'o.*'}\n", ["topics: {pattern: ..."], id="internal-name"),
        pytest.param("topics: []\n", ["field 'topics'", "at least 1 topic", "or give a pattern"], id="empty-list"),
    ],
)  # fmt: skip
def test_bad_patterns_name_the_file_the_feed_and_the_pattern(tmp_path: Path, text: str, names: list[str]) -> None:
    assert_refused_naming(feed_file(tmp_path, text), names)


def test_a_pattern_feed_with_a_named_subject_loads(tmp_path: Path) -> None:
    text = "topics: {pattern: 'o.*'}\ndeserialization: {format: avro, subject: orders-value}\n"
    feed = load_feed_file(feed_file(tmp_path, text))
    assert feed.deserialization.reader_subject(feed.topics) == "orders-value"
