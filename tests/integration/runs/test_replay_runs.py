"""Replays and backfills as whole runs: dry runs, partition choice, their own output location.

Issue 11's replay contract on the real cluster: a dry run plans and reports without
reading; a replay reads only the partitions asked for and publishes beside the feed's
output (never into it); the group's offsets do not move unless asked; bad parameters
are refused before anything is read, naming the parameter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.faults.harness import FaultEnv
from tidemark.checkpoints.store import SqliteCheckpointStore
from tidemark.errors import CommitError, ConfigError

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def env(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultEnv:
    e = FaultEnv(kafka, spark, tmp_path, "replays")
    e.install(monkeypatch)
    e.produce(12)
    e.run()
    return e


def test_dry_run_plans_and_reports_without_reading(env: FaultEnv) -> None:
    before = env.committed()
    handle, job, outcome = env.run("replay", {"start_from": "earliest", "dry_run": True, "commit": True})

    assert handle.dry_run and handle.records == 12 and job == {}
    assert not (Path(handle.run_dir) / "job.json").exists()
    assert not list(env.tmp.glob("out.replays*"))
    report = json.loads(Path(outcome.report_path).read_text())
    assert report["commit"]["status"] == "skipped" and "dry run" in report["commit"]["reason"]
    assert [r["end"] - r["start"] for r in report["ranges"]] == [4, 4, 4]
    assert env.committed() == before


def test_replay_of_one_partition_publishes_beside_the_feed_output(env: FaultEnv) -> None:
    before, published = env.committed(), env.published()
    handle, job, outcome = env.run("replay", {"start_from": "earliest", "partitions": [1], "dry_run": False})

    assert [p.partition for p in handle.plan().partitions] == [1]
    replays = env.output.with_name("out.replays")
    assert handle.plan().output == str(replays)
    rows = env.published(replays)
    assert {(r[1], r[2]) for r in rows} == {(1, o) for o in range(4)} and sum(rows.values()) == 4
    assert env.published() == published  # the feed's own output is untouched
    assert env.committed() == before and not outcome.committed
    assert job["records_published"] == 4


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"start_from": "earliest", "partitions": [7]}, "partitions"),
        ({"start_from": "earliest", "topics": ["not-a-topic"]}, "topics"),
        ({"start_from": "earliest", "partitions": [-1]}, "partitions"),
        ({"start_from": "earliest", "dry_run": "yes"}, "dry_run"),
        ({"start_from": "timestamp", "start_timestamp": "yesterday"}, "start_timestamp"),
        ({"start_from": "offset", "start_offset": -3}, "start_offset"),
        ({"start_from": "earliest", "window_mode": "roughly"}, "window_mode"),
    ],
)
def test_bad_replay_parameters_are_refused_naming_the_field(env: FaultEnv, params: dict[str, Any], field: str) -> None:
    runs_before = sorted(env.root.glob("runs/*/*"))
    with pytest.raises(ConfigError, match=f"'{field}'"):
        env.run("replay", params)
    assert sorted(env.root.glob("runs/*/*")) == runs_before


def test_a_replay_may_not_publish_into_the_feed_output(env: FaultEnv) -> None:
    with pytest.raises(ConfigError, match=r"'output'.*own output"):
        env.run("replay", {"start_from": "earliest", "output": str(env.output)})


def test_the_cli_refuses_outputs_outside_the_allowed_roots_and_offsets_past_2_63(
    env: FaultEnv, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tidemark import cli

    monkeypatch.setenv("TIDEMARK_BOOTSTRAP_SERVERS", env.kafka.bootstrap_servers)
    monkeypatch.setenv("TIDEMARK_REPLAY_OUTPUT_ROOTS", str(env.root / "shared"))
    runs_before = sorted(env.root.glob("runs/*/*"))
    elsewhere = env.root.parent / "elsewhere"
    assert cli.main(["replay", env.feed, "--start-from", "earliest", "--output", str(elsewhere)]) == 2
    err = capsys.readouterr().err
    assert "'output'" in err and str(env.root / "shared") in err and f"{env.output}.replays" in err, err
    assert cli.main(["replay", env.feed, "--start-from", "offset", "--start-offset", str(2**63)]) == 2
    assert "'start_offset'" in capsys.readouterr().err
    assert sorted(env.root.glob("runs/*/*")) == runs_before and not elsewhere.exists()


def test_commits_of_one_group_take_turns(env: FaultEnv) -> None:
    store = SqliteCheckpointStore(env.root / "checkpoints.sqlite")
    with store.commit_lock(env.group):
        with pytest.raises(CommitError, match=f"group '{env.group}'"), store.commit_lock(env.group, timeout_s=0.3):
            pass
        with store.commit_lock("another-group", timeout_s=0.3):
            pass  # other groups are not held up
