"""Replay parameters: the bounds every entry point shares, and where a replay may write."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemark.config.models import Feed
from tidemark.errors import ConfigError, shown
from tidemark.planning.requests import MAX_OFFSET, OUTPUT_ROOTS_ENV, parse_replay_params, run_request
from tidemark.runs.pipeline import publish_target
from tidemark.storage import Location


def target(feed: Feed, mode: str, params: dict[str, object]) -> Location | None:
    """Where a run of ``mode`` with trigger ``params`` publishes: the parameters parsed, then checked for ``feed``."""
    return publish_target(feed, run_request(mode, params))


@pytest.fixture
def feed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Feed:
    monkeypatch.delenv(OUTPUT_ROOTS_ENV, raising=False)
    return Feed(name="orders", topics=("t",), group="g", output=str(tmp_path / "out" / "orders"))


@pytest.mark.parametrize(
    "params",
    [{"start_from": "offset", "start_offset": MAX_OFFSET + 1}, {"start_from": "offset", "start_offset": 10**40},
     {"end_at": "offset", "end_offset": 2**64}, {"start_from": "shift_by", "shift_by": -MAX_OFFSET - 1},
     {"start_from": "offset", "start_offset": "9" * 5000},
     {"start_from": "by_duration", "duration": "P" + "9" * 30 + "D"},
     {"start_from": "by_duration", "duration": 6}, {"commit": "false"}, {"start_from": ["offset"]}],
)  # fmt: skip
def test_out_of_range_and_mistyped_parameters_are_refused_by_name(params: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=r"parameter '\w+'") as info:
        parse_replay_params(params)
    assert len(str(info.value)) < 300


def test_the_largest_offset_is_accepted() -> None:
    spec = parse_replay_params({"start_from": "offset", "start_offset": MAX_OFFSET})
    assert spec.start_offset == MAX_OFFSET


def test_inputs_are_quoted_only_in_part() -> None:
    assert shown("x" * 10) == repr("x" * 10)
    assert shown("x" * 1_000_000) == repr("x" * 1_000_000)[:80] + "…"


def test_replay_outputs_are_confined_to_the_feeds_location_or_the_configured_roots(
    feed: Feed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    replays = f"{tmp_path}/out/orders.replays"
    assert target(feed, "replay", {}) == Location(replays)
    assert target(feed, "replay", {"output": f"{replays}/./a/../b"}) == Location(f"{replays}/b")
    outside = [f"{tmp_path}/elsewhere", f"{replays}/../../elsewhere", f"{replays}x", "~/x", "~nosuchuser/x",
               "relative", "/proc/self/cwd/x", "s3://bucket/x", "file:///etc", "/tmp/a\x00b", "", " "]  # fmt: skip
    for output in outside:
        if output.strip():
            with pytest.raises(ConfigError, match="'output'") as info:
                target(feed, "replay", {"output": output})
            assert output.startswith(("~", "relative", "file", "/tmp/a")) or replays in str(info.value), output

    window = {"start_timestamp": "2026-01-01T00:00:00Z", "end_timestamp": "2026-01-02T00:00:00Z"}
    with pytest.raises(ConfigError, match=OUTPUT_ROOTS_ENV) as info:
        target(feed, "backfill", {"output": f"{tmp_path}/elsewhere", **window})
    assert f"{tmp_path}/out/orders.backfills" in str(info.value)

    monkeypatch.setenv(OUTPUT_ROOTS_ENV, f"{tmp_path}/shared/, s3://bucket/replays")
    assert target(feed, "replay", {"output": f"{tmp_path}/shared/x"}) == Location(f"{tmp_path}/shared/x")
    assert target(feed, "replay", {"output": "s3://bucket/replays/x"}) == Location("s3://bucket/replays/x")
    for output in ("s3://bucket/replays2", "s3://bucket/replays/../x", f"{tmp_path}/shared/../out/orders"):
        with pytest.raises(ConfigError, match="'output'"):
            target(feed, "replay", {"output": output})


def test_a_symlink_under_a_root_is_followed_as_the_writer_would(feed: Feed, tmp_path: Path) -> None:
    replays = tmp_path / "out" / "orders.replays"
    (replays / "kept").mkdir(parents=True)
    (replays / "link").symlink_to(tmp_path)  # out of the root: the writer would follow it there
    with pytest.raises(ConfigError, match="outside the places"):
        target(feed, "replay", {"output": f"{replays}/link/x"})
    (replays / "inside").symlink_to(replays / "kept")
    assert target(feed, "replay", {"output": f"{replays}/inside/x"}) == Location(f"{replays}/inside/x")
    (tmp_path / "elsewhere").symlink_to(replays)
    with pytest.raises(ConfigError, match="outside the places"):
        target(feed, "replay", {"output": f"{tmp_path}/elsewhere/x"})


@pytest.mark.parametrize("name", ["commit", "dry_run"])
@pytest.mark.parametrize("value", ["false", "true", 0, 1, None, [True]])
def test_a_backfills_flags_are_true_or_false_only(feed: Feed, name: str, value: object) -> None:
    """The string "false" must never commit or read: refused by name before anything is planned."""
    params = {"start_timestamp": "2026-01-01T00:00:00Z", "end_timestamp": "2026-01-02T00:00:00Z", name: value}
    with pytest.raises(ConfigError, match=f"parameter '{name}': expected true or false"):
        run_request("backfill", params)  # the request is parsed before the feed is loaded or Kafka asked
