"""The feed's alert rules: lag in time over the maximum, and the data-loss and expiry policies."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from tidemark.config.models import Alerts, Feed
from tidemark.runs.alerts import check_alerts, stale_feeds
from tidemark.runs.status import FeedStatus, PartitionStatus

LOSS = {"kind": "data_loss", "topic": "t", "partition": 1, "message": "t[1]: offsets [0, 40) deleted by retention"}
EXPIRED = {"kind": "group_offsets_expired", "topic": "t", "partition": 0, "message": "t[0]: the offset vanished"}
KINDS = ("data_loss", "group_offsets_expired")


def _kinds(messages: tuple[str, ...]) -> list[str]:
    return [next(k for k in KINDS if f"event {k} " in m) for m in messages]


def _feed(**alerts: Any) -> Feed:
    return Feed(name="f", topics=("t",), group="g", alerts=Alerts(**alerts) if alerts else None)


def _status(*lag_ms: int | None) -> FeedStatus:
    rows = tuple(PartitionStatus("t", p, 1, 10, None, 0, 25, 15, None, ms) for p, ms in enumerate(lag_ms))
    return FeedStatus("f", "g", "read_committed", rows)


def test_only_partitions_lagging_more_than_max_lag_fail() -> None:
    found = check_alerts(_feed(max_lag="30m"), _status(30 * 60_000, 30 * 60_000 + 1, None), [])
    assert found.warnings == ()
    assert len(found.failures) == 1
    assert (
        "feed 'f': t[1] lags 30.0 min (15 records from offset 10 to 25), more than alerts.max_lag 30m"
        in (found.failures[0])
    )


@pytest.mark.parametrize(
    ("alerts", "fails", "warns"),
    [
        ({}, [], ["data_loss", "group_offsets_expired"]),  # both policies default to warn
        ({"on_data_loss": "fail"}, ["data_loss"], ["group_offsets_expired"]),
        ({"on_expired_offsets": "fail"}, ["group_offsets_expired"], ["data_loss"]),
    ],
)
def test_event_policies_fail_or_warn(alerts: dict[str, str], fails: list[str], warns: list[str]) -> None:
    found = check_alerts(_feed(max_lag="1h", **alerts), _status(0), [LOSS, EXPIRED, {"kind": "capped"}])
    assert _kinds(found.failures) == fails
    assert _kinds(found.warnings) == warns
    assert all("feed 'f'" in m and "t[" in m for m in found.failures + found.warnings)


def test_a_feed_without_alerts_is_never_checked() -> None:
    assert check_alerts(_feed(), _status(10**9), [LOSS]).failures == ()


def test_max_lag_must_be_a_duration() -> None:
    with pytest.raises(ValidationError, match=r"alerts.max_lag"):
        _feed(max_lag="soon")


def test_a_feed_whose_last_commit_is_older_than_stale_after_is_named_others_are_not() -> None:
    now = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    feeds = [
        Feed(name=name, topics=("t",), group="g", alerts=Alerts(stale_after="2h") if name != "unwatched" else None)
        for name in ("old", "fresh", "never", "unwatched")
    ]
    last = {"old": now - timedelta(hours=2, seconds=1), "fresh": now - timedelta(hours=2), "never": None,
            "unwatched": now - timedelta(days=9)}  # fmt: skip

    found = stale_feeds(feeds, last, now)

    assert found == (
        "feed 'old' last committed a run 120.0 min ago (at 2026-03-01T09:59:59+00:00), more than "
        "alerts.stale_after 2h: check that its DAG tidemark_old is unpaused, scheduled and its runs succeed",
        "feed 'never' has no committed run (alerts.stale_after 2h): check that its DAG tidemark_never is "
        "unpaused, scheduled and its runs succeed",
    )


def test_stale_after_must_be_a_duration() -> None:
    with pytest.raises(ValidationError, match=r"alerts\.stale_after"):
        Alerts(stale_after="soon")
