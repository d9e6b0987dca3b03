"""Fault scenarios for topic identity: a topic deleted and recreated under the same name.

Each scenario ends with the feed's whole output equal to the old topic's records (an
independent scan taken before the delete) plus an independent ``read_committed`` scan of
the new topic up to the group's committed offsets: nothing twice, nothing missing. Both
shapes: the embedded default, and state and output on S3 with checkpoints in PostgreSQL.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.faults.harness import ON_EVERY_SHAPE, SCOREBOARD, FaultEnv, Row, scenario
from tests.integration.runs.test_topic_identity import recreate
from tidemark.faults import FAULTS_ENV, InjectedFault

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.faults]


def scan(fenv: FaultEnv, ends: dict[int, int]) -> tuple[Counter[Row], dict[Row, str]]:
    return fenv.expect({(fenv.topic, p): (0, end) for p, end in ends.items()})


def assert_whole_output(
    fenv: FaultEnv, test: str, old: tuple[Counter[Row], dict[Row, str]], new_ends: dict[int, int]
) -> None:
    """The feed's output is exactly the old topic's records and the new topic's committed ones."""
    assert fenv.committed() == new_ends
    new, kinds = scan(fenv, new_ends)
    expected = old[0] + new
    got = fenv.published()
    tally = SCOREBOARD[test]
    tally.compared(expected, {**old[1], **kinds})
    tally.records_lost += len(expected - got)
    tally.records_duplicated += sum(n - 1 for n in got.values() if n > 1)
    assert not expected - got, f"lost: {sorted(expected - got)[:5]}"
    assert got == expected, f"twice or foreign: {sorted(got - expected)[:5]}"


@scenario("24a", "Topic recreated longer than the checkpoint",
          injected="30 records committed; the topic deleted, recreated and refilled with 45 (15 a partition, "
                   "more than the checkpoint's 10); a cap of 6 records a partition per run",
          asserted="a topic_recreated event; the new topic read from offset 0 (on_missing earliest), its "
                   "capped first run not taken for the old topic's; output = old + new scan")  # fmt: skip
@ON_EVERY_SHAPE
def test_topic_recreated_longer_than_the_checkpoint(fenv: FaultEnv, request: pytest.FixtureRequest) -> None:
    fenv.write_feed(max_records_per_partition=6)
    fenv.produce(30)
    while fenv.run()[0].records:
        pass
    old = scan(fenv, {0: 10, 1: 10, 2: 10})
    assert fenv.published() == old[0]

    recreate(fenv)
    fenv.produce(45)
    first, _, _ = fenv.run()

    assert [p.start for p in first.plan().partitions] == [0, 0, 0]
    assert "topic_recreated" in {e.kind for e in first.plan().events}
    while fenv.run()[0].records:
        pass
    assert_whole_output(fenv, request.node.name, old, {0: 15, 1: 15, 2: 15})


@scenario("24b", "Crash after staging, then the topic recreated",
          injected="fault point commit.before on the old topic; the topic deleted, recreated and refilled",
          asserted="the staged run is never shown: its commit is refused (the topic's id changed since its plan) "
                   "and it is discarded; the next run reads the new topic from 0; output = old committed + new "
                   "scan, nothing twice")  # fmt: skip
@ON_EVERY_SHAPE
def test_crash_before_commit_then_topic_recreated(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    fenv.produce(9)
    fenv.run()
    fenv.produce(9)
    monkeypatch.setenv(FAULTS_ENV, "commit.before")
    with pytest.raises(InjectedFault):
        fenv.run()
    monkeypatch.delenv(FAULTS_ENV)
    old = scan(fenv, {0: 3, 1: 3, 2: 3})  # the crashed run staged [3, 6): never shown, never committed
    assert fenv.published() == old[0]

    recreate(fenv)
    fenv.produce(30)
    while fenv.run()[0].records:
        pass

    assert_whole_output(fenv, request.node.name, old, {0: 10, 1: 10, 2: 10})
