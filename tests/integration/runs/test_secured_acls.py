"""Least privilege on the secured cluster: the ACLs a feed's principal needs, and what a missing one does.

Each test authenticates as a principal of its own (OAUTHBEARER with unsecured JWTs names any
principal) holding exactly :func:`tidemark.devtools.kafka.secure.feed_grants`, or that set
with one ACL taken away. Kafka lets Read imply Describe, so the required set is topic Read
and group Read; DescribeConfigs on the topic and the cluster only feed retention warnings.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SecuredKafka
from tests.faults.harness import FaultEnv, assert_names
from tidemark.checkpoints.store import SqliteCheckpointStore
from tidemark.config.models import load_feed
from tidemark.devtools.kafka.secure import Grant, feed_grants
from tidemark.errors import AuthorizationError
from tidemark.kafka.adapter import KafkaAdapter
from tidemark.kafka.connection import KafkaConnection
from tidemark.runs.pipeline import run_feed
from tidemark.runs.status import feed_status

pytestmark = [pytest.mark.integration]


@pytest.fixture
def aenv(secure_kafka: SecuredKafka, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultEnv:
    env = FaultEnv(secure_kafka.admin, spark, tmp_path, "acls", partitions=2)
    env.install(monkeypatch)
    env.produce(6)
    return env


def _principal(secure_kafka: SecuredKafka, grants: list[Grant]) -> tuple[str, KafkaConnection]:
    name = f"feed-{uuid.uuid4().hex[:8]}"
    secure_kafka.cluster.grant(name, grants)
    return name, secure_kafka.cluster.connection("oauthbearer", name)


def _run(env: FaultEnv, conn: KafkaConnection, mode: str = "scheduled", params: dict[str, Any] | None = None) -> Any:
    return run_feed(env.feed, conn, mode=mode, params=params, root=env.root, job_runner=env.in_process)


@pytest.mark.spark
def test_the_least_privilege_principal_runs_every_run_type(secure_kafka: SecuredKafka, aenv: FaultEnv) -> None:
    _, conn = _principal(secure_kafka, feed_grants([aenv.topic], aenv.group))
    dry, _, _ = _run(aenv, conn, "replay", {"start_from": "earliest", "dry_run": True})
    assert dry.dry_run and dry.records == 6
    feed, _, outcome = _run(aenv, conn)
    assert outcome.committed and aenv.committed() == {0: 3, 1: 3}
    assert not [e for e in feed.plan().events if e.kind == "permission_missing"]
    aenv.check("acls_least_privilege")
    aenv.produce(4)
    replay, _, _ = _run(aenv, conn, "replay", {"start_from": "committed", "commit": True})
    assert replay.plan().commit and aenv.committed() == {0: 5, 1: 5}
    assert replay.plan().output is None  # a committing replay publishes into the feed's output
    aenv.check("acls_least_privilege")
    status = feed_status(load_feed(aenv.feed), KafkaAdapter(conn), SqliteCheckpointStore(aenv.tmp / "cp.sqlite"))
    assert [row.lag for row in status.partitions] == [0, 0]


REQUIRED = [
    # (what is taken away, the error's resource kind, the operation it names)
    (("topic", "read"), "topic", "Describe"),  # no topic ACL left at all
    (("topic", "describe"), "topic", "Read"),  # Describe alone: may plan, may not read
    (("group", "read"), "group", "Describe"),  # no group ACL left at all
    (("group", "describe"), "group", "Read"),  # Describe alone: may not commit
]


@pytest.mark.parametrize(
    ("removed", "kind", "operation"), REQUIRED, ids=lambda v: "-".join(v) if isinstance(v, tuple) else v
)
def test_a_missing_acl_fails_before_reading_naming_principal_resource_and_operation(
    secure_kafka: SecuredKafka, aenv: FaultEnv, removed: tuple[str, str], kind: str, operation: str
) -> None:
    grants = feed_grants([aenv.topic], aenv.group)
    resource = {"topic": aenv.topic, "group": aenv.group}[removed[0]]
    if removed[1] == "read":  # Read implies Describe: take the resource's every ACL away
        grants = [g for g in grants if g[:2] != (removed[0], resource)]
    else:
        grants = [g for g in grants if g != (removed[0], resource, "read")]
    name, conn = _principal(secure_kafka, grants)

    with pytest.raises(AuthorizationError) as err:
        _run(aenv, conn)

    assert_names(str(err.value), f"User:{name}", f"{kind} '{resource}'", f"may not {operation}",
                 f"--operation {operation}", "nothing was read or committed")  # fmt: skip
    assert aenv.committed() == {0: None, 1: None}
    assert not list(aenv.root.glob("runs/*/*/job.json")) and not list(aenv.tmp.glob("out*/**/*.parquet"))


@pytest.mark.spark
def test_without_describe_configs_a_run_degrades_to_events(secure_kafka: SecuredKafka, aenv: FaultEnv) -> None:
    _, conn = _principal(secure_kafka, feed_grants([aenv.topic], aenv.group, retention_warnings=False))
    handle, _, outcome = _run(aenv, conn)
    assert outcome.committed and aenv.committed() == {0: 3, 1: 3}
    missing = [e for e in handle.plan().events if e.kind == "permission_missing"]
    assert [(e.topic, "DescribeConfigs" in e.message) for e in missing] == [(aenv.topic, True), (None, True)]
    assert "--cluster" in missing[1].message
    aenv.check("acls_no_describe_configs")
