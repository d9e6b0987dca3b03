"""Recovery from an Iceberg table uses only what the table's current snapshot's ancestry holds.

Two plans go into a real table; an operator rolls the table back to the first plan's
snapshot with pyiceberg's own ``manage_snapshots()``; the group's offsets and the checkpoint
store are lost. The next run resumes from the table: from the first plan's ends (the
rolled-back plan's ranges are read again), with a ``table_ledger_mismatch`` event naming the
rolled-back plan. Without the rollback the same loss resumes exactly as before: from the
ledger's ends, with no such event. Each ends with the table compared with an independent
``read_committed`` scan of Kafka: every offset below the group's position once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.faults.harness import FaultEnv
from tests.integration.test_iceberg_maintenance import assert_table_matches_kafka

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def fenv(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultEnv:
    env = FaultEnv(kafka, spark, tmp_path, "iceberg-rollback")
    env.install(monkeypatch)
    env.use_iceberg(f"tidemark.rb_{env.topic.replace('-', '_')}")
    return env


def _lose_group_and_store(fenv: FaultEnv) -> None:
    fenv.kafka.adapter.admin.delete_consumer_groups([fenv.group], request_timeout=10)[fenv.group].result(timeout=10)
    (fenv.root / "checkpoints.sqlite").unlink()
    assert fenv.committed() == {0: None, 1: None, 2: None}


@pytest.mark.parametrize("rolled_back", [True, False], ids=["rolled-back", "ledger-agrees"])
def test_recovery_from_the_table_uses_only_the_current_ancestry(fenv: FaultEnv, rolled_back: bool) -> None:
    from tidemark.config.models import load_feed
    from tidemark.output.iceberg import PLAN_KEY, IcebergPublisher

    fenv.produce(15)
    first, _, _ = fenv.run()
    fenv.produce(30)
    second, _, _ = fenv.run()
    assert fenv.committed() == {0: 15, 1: 15, 2: 15}
    publisher = IcebergPublisher(load_feed(fenv.feed))
    table = publisher.load()
    assert table is not None
    [kept] = [s.snapshot_id for s in table.snapshots() if (s.summary or {}).get(PLAN_KEY) == first.plan_id]
    if rolled_back:
        table.manage_snapshots().rollback_to_snapshot(kept).commit()
        assert publisher.published(second.plan_id) is None  # rolled back: not in the table
        assert publisher.published(first.plan_id) is not None
    _lose_group_and_store(fenv)

    fenv.produce(6)
    resumed, _, outcome = fenv.run()
    assert outcome.committed
    plan = resumed.plan()
    start = 5 if rolled_back else 15
    assert [(p.partition, p.reason, p.start, p.end) for p in plan.partitions] == [
        (0, "table", start, 17), (1, "table", start, 17), (2, "table", start, 17),
    ]  # fmt: skip
    mismatch = [e for e in plan.events if e.kind == "table_ledger_mismatch"]
    if rolled_back:
        [event] = mismatch
        assert second.plan_id in event.message and "rolled back" in event.message
        assert event.details["rolled_back"] == [second.plan_id]
        assert f"[{15 - 10}, 15)" in event.message  # the ranges read again, named
        assert [e["kind"] for e in fenv.report_events("table_ledger_mismatch")] == ["table_ledger_mismatch"]
    else:
        assert mismatch == []
    assert fenv.committed() == {0: 17, 1: 17, 2: 17}
    assert_table_matches_kafka(fenv)  # every offset below the group's position once, from a read_committed scan
    again, _, _ = fenv.run()  # the corrected ledger is the table's from now on: nothing more to say
    assert [e for e in again.plan().events if e.kind == "table_ledger_mismatch"] == []
    assert_table_matches_kafka(fenv)
