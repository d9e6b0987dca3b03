"""The reader schema "latest" stands for is fixed when the run is planned, on the real cluster and registry.

The subject gets a newer version between the plan and the job (as between a failed
attempt and its retry): the job still decodes with the version the plan recorded, and
the published records are the independent scan's decoded with that reader.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.integration.job.test_avro import (
    ORDER_V1,
    ORDER_V2,
    AvroEnv,
    _as_published,
    _published_value,
    env_of,
    order,
)
from tidemark.kafka.connection import KafkaConnection
from tidemark.planning.plan import Plan
from tidemark.runs.pipeline import RunHandle

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def env(kafka: KafkaTestCluster, registry: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch) -> AvroEnv:
    return env_of(AvroEnv, kafka, registry, tmp_path, spark, monkeypatch)


def test_a_newer_version_registered_after_planning_does_not_change_the_plans_reader(env: AvroEnv) -> None:
    from confluent_kafka.schema_registry import Schema

    v1 = env.serializer(ORDER_V1)
    for partition in range(2):
        env.produce([v1(order(i)) for i in range(partition, 8, 2)], partition)
    subject = f"{env.topic}-value"
    v1_id = env.sr.get_latest_version(subject).schema_id

    def newer_version_then_job(handle: RunHandle, connection: KafkaConnection) -> dict[str, Any]:
        env.sr.register_schema(subject, Schema(json.dumps(ORDER_V2), "AVRO"))  # the latest moves after the plan
        assert env.sr.get_versions(subject) == [1, 2]
        return env.in_process(handle, connection)

    handle, _, _ = env.run(newer_version_then_job)

    plan = Plan.from_json(Path(handle.plan_path).read_text())
    assert dict(plan.readers) == {"value": {"subject": subject, "version": 1, "id": v1_id}}
    names = [f["name"] for f in ORDER_V1["fields"]]
    published = env.published()
    assert {k: _published_value(r, names) for k, r in published.items()} == {
        k: _as_published(v) for k, v in env.scan(ORDER_V1).items()
    }
    assert all("channel" not in r for r in published.values())  # v2's added field: not the plan's reader
    report = env.report()
    assert report["schemas"]["reader"] == {"subject": subject, "version": 1, "id": v1_id}
    assert env.committed() == {0: 4, 1: 4}
