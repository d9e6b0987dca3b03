"""Where a replay or backfill may publish, with symlinks followed and every feed's output out of bounds.

Two feeds, ``alpha`` and ``beta``, keep their outputs under one data folder. A root broad
enough to hold both, or a symlink under an allowed place, must not let a replay of
``alpha`` write into ``beta``'s output (nor into ``alpha``'s own).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tidemark.config.models import load_feed
from tidemark.errors import ConfigError
from tidemark.planning.requests import OUTPUT_ROOTS_ENV, run_request
from tidemark.runs.pipeline import publish_target


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    feeds, data = tmp_path / "feeds", tmp_path / "data"
    feeds.mkdir()
    for name in ("alpha", "beta"):
        (data / name).mkdir(parents=True)
        doc = {"topics": [f"t-{name}"], "group": f"g-{name}", "output": str(data / name)}
        (feeds / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    (data / "alpha.replays").mkdir()
    monkeypatch.setenv("TIDEMARK_FEEDS_DIR", str(feeds))
    return data


def _replay_to(output: Path) -> Path | None:
    target = publish_target(load_feed("alpha"), run_request("replay", {"output": str(output)}))
    return None if target is None else Path(target.url)


def test_a_broad_root_does_not_open_other_feeds_outputs(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OUTPUT_ROOTS_ENV, str(data))
    assert _replay_to(data / "scratch" / "r1") == data / "scratch" / "r1"
    for inside in (data / "beta", data / "beta" / "date=2026-01-01", data / "alpha" / "sub"):
        with pytest.raises(ConfigError, match="inside a feed's output") as refused:
            _replay_to(inside)
        assert "beta" not in str(refused.value).replace(str(inside), "")  # the other feed is not named


def test_a_symlink_under_an_allowed_place_is_followed(data: Path, tmp_path: Path) -> None:
    (data / "alpha.replays" / "into-beta").symlink_to(data / "beta")
    with pytest.raises(ConfigError, match="inside a feed's output"):
        _replay_to(data / "alpha.replays" / "into-beta" / "r1")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (data / "alpha.replays" / "out").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match="outside the places replays and backfills may write"):
        _replay_to(data / "alpha.replays" / "out" / "r1")
    assert _replay_to(data / "alpha.replays" / "r2") == data / "alpha.replays" / "r2"
