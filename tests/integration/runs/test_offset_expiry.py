"""Issue 14: an idle feed whose group offsets expire resumes from the checkpoint and commits.

Each test runs whole runs (plan, the Spark job in this session, commit, report) against
the real cluster and ends with the group's offsets at the last plan's ends, the run
succeeded, and the events in its report. Offsets vanish the ways they do in production:
the broker deletes an empty group's offsets after ``offsets.retention.minutes``
(reproduced with the admin API's group delete), an operator deletes some partitions'
offsets (``kafka-consumer-groups --delete-offsets``), or resets the group to offsets it
already had.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.integration.runs.test_pipeline import Env
from tidemark.devtools.kafka.cluster import jars_dir, java
from tidemark.errors import ValidationFailedError
from tidemark.planning.metadata import metadata_run_id
from tidemark.runs.pipeline import CommitOutcome, RunHandle
from tidemark.runs.report import list_runs

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def env(kafka: KafkaTestCluster, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch) -> Env:
    e = Env(kafka, tmp_path, spark)
    monkeypatch.setenv("TIDEMARK_FEEDS_DIR", str(e.feeds))
    monkeypatch.setenv("TIDEMARK_STATE_DIR", str(e.root))
    return e


def report(outcome: CommitOutcome) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(Path(outcome.report_path).read_text())
    return doc


def expired_partitions(doc: dict[str, Any]) -> set[int]:
    return {e["partition"] for e in doc["events"] if e["kind"] == "group_offsets_expired"}


def delete_group(env: Env) -> None:
    env.kafka.adapter.admin.delete_consumer_groups([env.group], request_timeout=10)[env.group].result(timeout=10)


def delete_offsets(env: Env, partitions: list[int]) -> None:
    """What an operator's ``kafka-consumer-groups --delete-offsets`` does, with Kafka's own tool."""
    spec = f"{env.topic}:{','.join(map(str, partitions))}"
    cmd = [
        java(), "-cp", f"{jars_dir()}/*", "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
        "--bootstrap-server", env.kafka.bootstrap_servers, "--delete-offsets", "--group", env.group, "--topic", spec,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def assert_committed_by(env: Env, handle: RunHandle) -> None:
    plan = handle.plan()
    assert env.committed() == {p.partition: p.end for p in plan.partitions}
    got = env.kafka.adapter.committed(env.group, [p.key for p in plan.partitions])
    assert {metadata_run_id(c.metadata) for c in got.values()} == {handle.run_id}


def test_idle_feed_whose_group_offsets_expired_resumes_and_commits(env: Env) -> None:
    env.produce(9)
    env.run()
    idle, _, outcome = env.run()
    assert idle.records == 0 and outcome.committed
    delete_group(env)
    assert env.committed() == {0: None, 1: None, 2: None}

    resumed, job, outcome = env.run()

    assert resumed.plan_id == idle.plan_id  # same ranges as the idle run before: a new run all the same
    assert {p.reason for p in resumed.plan().partitions} == {"checkpoint"}
    assert outcome.committed and job["published"]
    assert_committed_by(env, resumed)
    doc = report(outcome)
    assert doc["status"] == "succeeded" and doc["commit"]["status"] == "committed"
    assert expired_partitions(doc) == {0, 1, 2}

    env.produce(6)
    after, _, outcome = env.run()
    assert {p.reason for p in after.plan().partitions} == {"committed"}
    assert outcome.committed and not report(outcome)["events"]
    assert env.committed() == {0: 5, 1: 5, 2: 5}
    assert env.published_rows() == sorted((i % 3, i // 3) for i in range(15))


def test_only_some_partitions_offsets_gone(env: Env) -> None:
    env.produce(9)
    env.run()
    env.run()
    delete_offsets(env, [0, 2])
    assert env.committed() == {0: None, 1: 3, 2: None}
    env.produce(3)

    handle, _, outcome = env.run()

    reasons = {p.partition: p.reason for p in handle.plan().partitions}
    assert reasons == {0: "checkpoint", 1: "committed", 2: "checkpoint"}
    assert outcome.committed
    assert_committed_by(env, handle)
    assert env.committed() == {0: 4, 1: 4, 2: 4}
    assert expired_partitions(report(outcome)) == {0, 2}
    assert env.published_rows() == sorted((i % 3, i // 3) for i in range(12))


def test_group_reset_to_offsets_it_already_had(env: Env) -> None:
    env.produce(9)
    first, _, _ = env.run()
    published = env.published_rows()
    # The operator rewinds the group to where the first run started: the feed's output already
    # shows those records, so the next run starts where the output ends (a group_rewound event).
    starts = {p.key: (p.start, "") for p in first.plan().partitions}
    assert set(env.kafka.adapter.alter_committed(env.group, starts).values()) == {None}

    again, _, outcome = env.run()

    assert again.records == 0 and {p.start for p in again.plan().partitions} == {3}
    assert [e.kind for e in again.plan().events] == ["group_rewound"] * 3
    assert outcome.committed and report(outcome)["status"] == "succeeded"
    assert_committed_by(env, again)
    assert env.published_rows() == published  # nothing shown twice

    # And a reset to exactly the offsets the group has now (an operator's no-op reset).
    ends = {p.key: (p.end, "") for p in again.plan().partitions}
    assert set(env.kafka.adapter.alter_committed(env.group, ends).values()) == {None}
    idle, _, outcome = env.run()
    assert idle.records == 0 and outcome.committed
    assert_committed_by(env, idle)


def test_failed_run_report_carries_its_plans_events(env: Env) -> None:
    env.produce(6)
    env.run()
    delete_group(env)
    env.produce(3, bad={7})
    env.write_feed(validation={"on_bad_records": "fail"})

    with pytest.raises(ValidationFailedError, match=r"bad|decode"):
        env.run()

    failed = list_runs("pipe", root=env.root)[0]  # the run never reached its report step
    assert failed.status == "failed"
    assert {p["reason"] for p in failed.ranges} == {"checkpoint"}
    assert expired_partitions(failed.model_dump()) == {0, 1, 2}
    assert env.committed() == {0: None, 1: None, 2: None}  # nothing committed by a failed run
