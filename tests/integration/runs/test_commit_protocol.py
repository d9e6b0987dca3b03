"""The commit protocol on the real cluster: the output shows only what the group committed.

Each test reproduces one finding of the issue that replaced the retraction with the commit
protocol (``docs/ARCHITECTURE.md``, "The commit protocol"), through the pipeline API the
DAG tasks and the CLI call, and ends by comparing the feed's whole output with an
independent ``read_committed`` scan of Kafka (``tests.faults.harness.oracle``), reading the
group's offsets with a plain consumer: nothing twice, and every offset below the group's
position in the output unless an event of a run's report names it.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.conftest import KafkaTestCluster
from tests.faults.harness import FaultEnv, Row, oracle
from tidemark.checkpoints.store import open_store
from tidemark.errors import OffsetsMovedError, TidemarkError
from tidemark.faults import FAULTS_ENV, InjectedFault
from tidemark.runs.pipeline import commit_run, plan_run

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def fenv(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultEnv:
    env = FaultEnv(kafka, spark, tmp_path, "commit-protocol")
    env.install(monkeypatch)
    return env


def foreign_commit(fenv: FaultEnv, offset: int) -> None:
    """A plain consumer on the feed's group commits ``offset`` on every partition (no Tidemark metadata)."""
    consumer = Consumer(fenv.kafka.connection.client_config(**{"group.id": fenv.group, "enable.auto.commit": False}))
    try:
        consumer.commit(offsets=[TopicPartition(fenv.topic, p, offset) for p in range(fenv.partitions)],
                        asynchronous=False)  # fmt: skip
    finally:
        consumer.close()


def scan(fenv: FaultEnv, start: int, end: int) -> Counter[Row]:
    return oracle(fenv.kafka.connection, {(fenv.topic, p): (start, end) for p in range(fenv.partitions)})


def assert_output_is_the_scan(fenv: FaultEnv, named: Counter[Row] | None = None) -> None:
    """The whole output equals the scan of ``[0, committed)`` less the records events name; nothing twice."""
    committed = fenv.committed()
    expected = oracle(fenv.kafka.connection, {(fenv.topic, p): (0, c or 0) for p, c in committed.items()})
    expected -= named or Counter()
    got = fenv.published()
    twice = sorted(r for r, n in got.items() if n > 1)
    assert not twice, f"shown more than once: {twice[:5]}"
    assert not (expected - got), f"below the group's position, in no output and no event: {sorted(expected - got)[:5]}"
    assert not (got - expected), f"shown but not below the group's position: {sorted(got - expected)[:5]}"


def test_a_crash_after_the_kafka_commit_then_a_stray_consumer_loses_no_committed_record(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 1: run A commits [3, 5) to Kafka and dies before its checkpoint; a plain consumer then commits 8.

    Before, the next run retracted A's publication: 6 records below the group's position were
    in no output and no event. Now A was never visible until shown, and the next run shows
    it (the group is past it) and names [5, 8) as the range the other writer moved past.
    """
    fenv.produce(9)  # 3 per partition
    fenv.run()
    fenv.produce(6)  # offsets 3, 4
    monkeypatch.setenv(FAULTS_ENV, "commit.after_kafka")
    with pytest.raises(InjectedFault):
        fenv.run()
    monkeypatch.delenv(FAULTS_ENV)
    assert fenv.committed() == {0: 5, 1: 5, 2: 5}
    assert fenv.published() == scan(fenv, 0, 3)  # A's records are staged, not shown
    fenv.produce(9)  # offsets 5, 6, 7
    foreign_commit(fenv, 8)

    handle, _, outcome = fenv.run()
    assert outcome.committed and handle.records == 0 and fenv.committed() == {0: 8, 1: 8, 2: 8}
    moved = [e for e in fenv.report_events("group_moved") if e.get("partition") is not None]
    assert sorted((e["partition"], e["details"]["start"], e["details"]["end"]) for e in moved) == [
        (0, 5, 8), (1, 5, 8), (2, 5, 8)
    ]  # fmt: skip
    assert fenv.published() == scan(fenv, 0, 5)  # A's [3, 5) shown once, nothing of [5, 8)
    assert_output_is_the_scan(fenv, named=scan(fenv, 5, 8))


def test_a_refused_run_whose_discard_fails_does_not_wedge_the_feed(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 2: after a refusal, a failure while cleaning up must not leave a run every later plan trips over."""
    import tidemark.output.parquet as parquet

    fenv.produce(9)
    loser = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.produce(3)
    winner = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.in_process(loser, fenv.kafka.connection)
    fenv.in_process(winner, fenv.kafka.connection)
    commit_run(winner, fenv.kafka.connection, root=fenv.root)

    def broken_discard(*_: Any) -> None:
        raise OSError("the disk went away while discarding")

    monkeypatch.setattr(parquet, "discard", broken_discard)
    with pytest.raises(OSError, match="went away"):
        commit_run(loser, fenv.kafka.connection, root=fenv.root)
    monkeypatch.undo()
    fenv.install(monkeypatch)
    store = open_store(root=fenv.root)
    assert store.run(fenv.group, loser.run_id).state == "discarding"  # type: ignore[union-attr]  # owed
    for _ in range(2):  # the later runs are not stuck on the refused one: the first finishes its discard
        fenv.produce(3)
        _, _, outcome = fenv.run()
        assert outcome.committed
        assert store.run(fenv.group, loser.run_id).state == "abandoned"  # type: ignore[union-attr]
        assert not list(Path(fenv.output, "_pending").glob(f"{loser.run_id}/plan_id=*"))
    assert fenv.committed() == {0: 6, 1: 6, 2: 6}
    assert_output_is_the_scan(fenv)
    # The refused run's own retry finds it given up; its records were never shown.
    with pytest.raises(TidemarkError):
        commit_run(loser, fenv.kafka.connection, root=fenv.root)
    assert not list(Path(fenv.output, "_pending").glob(f"{loser.run_id}/plan_id=*"))
    assert_output_is_the_scan(fenv)


def poll_output(fenv: FaultEnv, stop: threading.Event, seen: list[Counter[Row]]) -> None:
    """A reader polling the feed's output as fast as it can while runs race."""
    while not stop.is_set():
        seen.append(fenv.published())


def race_two_runs_and_a_committing_replay(fenv: FaultEnv) -> list[Counter[Row]]:
    """Two scheduled runs and a committing replay planned from the same offsets, all staged; then their commits.

    Returns every state of the output a polling reader saw meanwhile.
    """
    fenv.produce(9)
    fenv.run()
    fenv.produce(6)
    first = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    params = {"start_from": "committed", "end_at": "offset", "end_offset": 4, "commit": True}
    replay = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root, mode="replay", params=params)
    fenv.produce(3)
    second = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    stop, seen = threading.Event(), []  # type: ignore[var-annotated]
    reader = threading.Thread(target=poll_output, args=(fenv, stop, seen), daemon=True)
    reader.start()
    try:
        for handle in (first, replay, second):
            fenv.in_process(handle, fenv.kafka.connection)
        assert fenv.published() == scan(fenv, 0, 3)  # staged, none shown
        commit_run(replay, fenv.kafka.connection, root=fenv.root)
        for loser in (first, second):
            with pytest.raises(OffsetsMovedError):
                commit_run(loser, fenv.kafka.connection, root=fenv.root)
        fenv.run()
    finally:
        stop.set()
        reader.join(60)
    seen.append(fenv.published())
    return seen


def test_a_reader_polling_a_race_never_sees_an_offset_twice(fenv: FaultEnv) -> None:
    """Item 3: the losers' publications are never visible, not even between the winner's commit and theirs."""
    seen = race_two_runs_and_a_committing_replay(fenv)
    assert len(seen) > 5, "the reader polled during the race"
    for state in seen:
        twice = sorted(r for r, n in state.items() if n > 1)
        assert not twice, f"a reader saw offsets twice: {twice[:5]}"
    assert fenv.committed() == {0: 6, 1: 6, 2: 6}
    assert_output_is_the_scan(fenv)


def test_a_reader_polling_a_race_on_iceberg_never_sees_an_offset_twice(fenv: FaultEnv) -> None:
    """Item 3 on an Iceberg table: a reader scanning the table while two runs and a committing replay race."""
    fenv.use_iceberg("tidemark.polled")
    seen = race_two_runs_and_a_committing_replay(fenv)
    assert len(seen) > 3, "the reader polled during the race"
    for state in seen:
        assert not [r for r, n in state.items() if n > 1]
    assert_output_is_the_scan(fenv)


@pytest.mark.usefixtures("s3")
def test_a_reader_polling_a_race_on_s3_never_sees_an_offset_twice(
    kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres: str
) -> None:
    """Item 3 with the output and state on S3 (readers go by manifests) and the checkpoint store in PostgreSQL."""
    import uuid

    remote = f"s3://tidemark/commit-protocol-{uuid.uuid4().hex[:8]}"
    env = FaultEnv(kafka, spark, tmp_path, "commit-protocol-s3", remote=remote)
    env.install(monkeypatch)
    monkeypatch.setenv("TIDEMARK_CHECKPOINT_URL", postgres)
    seen = race_two_runs_and_a_committing_replay(env)
    for state in seen:
        assert not [r for r, n in state.items() if n > 1]
    assert_output_is_the_scan(env)


def test_an_iceberg_race_with_a_compaction_between_never_shows_an_offset_twice(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Items 3 and 4 on an Iceberg table: a compaction (every file rewritten under new names) between the winner's
    commit and the losers' refusal; the losers were never in the table, so nothing needs finding by name."""
    fenv.use_iceberg("tidemark.commit_protocol")
    from tidemark.config.models import load_feed
    from tidemark.output.iceberg import IcebergPublisher

    seen: list[Counter[Row]] = []
    fenv.produce(9)
    fenv.run()
    fenv.produce(6)
    first = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    second = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    for handle in (first, second):
        fenv.in_process(handle, fenv.kafka.connection)
    seen.append(fenv.published())
    commit_run(first, fenv.kafka.connection, root=fenv.root)
    table = IcebergPublisher(load_feed(fenv.feed)).load()
    assert table is not None
    files_before = {t.file.file_path for t in table.scan().plan_files()}
    table.overwrite(table.scan().to_arrow())  # a compaction: the same rows in new files
    table = IcebergPublisher(load_feed(fenv.feed)).load()
    assert table is not None and not files_before & {t.file.file_path for t in table.scan().plan_files()}
    seen.append(fenv.published())
    with pytest.raises(OffsetsMovedError):
        commit_run(second, fenv.kafka.connection, root=fenv.root)
    seen.append(fenv.published())
    fenv.produce(3)
    fenv.run()
    for state in seen:
        assert not [r for r, n in state.items() if n > 1]
    assert fenv.committed() == {0: 6, 1: 6, 2: 6}
    assert_output_is_the_scan(fenv)


def test_a_group_rewound_by_an_operator_is_not_shown_twice(fenv: FaultEnv) -> None:
    """An operator resets the group behind what the output shows: the next run starts at the output's end."""
    fenv.produce(15)
    fenv.run()  # [0, 5) shown
    foreign_commit(fenv, 2)
    fenv.produce(3)
    handle, _, outcome = fenv.run()
    assert outcome.committed and {p.partition: p.start for p in handle.plan().partitions} == {0: 5, 1: 5, 2: 5}
    rewound = fenv.report_events("group_rewound")
    assert sorted(e["partition"] for e in rewound) == [0, 1, 2]
    assert fenv.committed() == {0: 6, 1: 6, 2: 6}
    assert_output_is_the_scan(fenv)


def test_on_group_moved_fail_refuses_until_an_operator_decides(fenv: FaultEnv) -> None:
    fenv.write_feed(on_group_moved="fail")
    fenv.produce(9)
    fenv.run()
    fenv.produce(9)
    foreign_commit(fenv, 5)
    with pytest.raises(TidemarkError, match="on_group_moved is fail") as refused:
        fenv.run()
    assert f"{fenv.topic}[0] group at 5, output at 3" in str(refused.value)
    assert fenv.committed() == {0: 5, 1: 5, 2: 5}
    assert_output_is_the_scan(fenv, named=scan(fenv, 3, 5))  # the output is untouched: [0, 3)


def test_a_staged_file_lost_before_validation_fails_the_run_instead_of_counting_gaps(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 6: rows missing from the staging folder were called gaps and committed past; now they fail the run."""
    import tidemark.job.steps as steps  # the job's staged write (job.steps imports the writer from output.staging)

    real_writer = steps.parquet_writer

    class LosingWriter:
        """Spark's writer, then one staged file goes (a staging folder the driver does not fully see)."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def partitionBy(self, *columns: str) -> LosingWriter:
            self.inner = self.inner.partitionBy(*columns)
            return self

        def parquet(self, path: str) -> None:
            self.inner.parquet(path)
            victim = sorted(Path(path.removeprefix("file:")).glob("_outcome=*/topic=*/date=*/*.parquet"))[0]
            victim.unlink()

    monkeypatch.setattr(steps, "parquet_writer", lambda df, mode: LosingWriter(real_writer(df, mode)))
    monkeypatch.setenv("TIDEMARK_READ_TASK_STAGING", "0")
    fenv.write_feed(driver_read_max_records=0)  # the data source's read, as on a cluster
    fenv.produce(600)
    with pytest.raises(TidemarkError, match=r"differ from the records the reader produced") as failed:
        fenv.run()
    assert "read 200, staged" in str(failed.value) and "TIDEMARK_STAGING_DIR" in str(failed.value)
    assert fenv.committed() == {0: None, 1: None, 2: None}
    assert fenv.published() == Counter()
    monkeypatch.setattr(steps, "parquet_writer", real_writer)
    _, _, outcome = fenv.run()
    assert outcome.committed and fenv.committed() == {0: 200, 1: 200, 2: 200}
    assert_output_is_the_scan(fenv)


def test_an_operator_reset_to_a_racing_runs_offsets(fenv: FaultEnv) -> None:
    """Two runs planned from the same offsets; the first is committed and shown; an operator resets the group to
    exactly those offsets, so the second's compare-and-set passes. The output's own check keeps it out."""
    fenv.produce(9)
    fenv.run()  # group and output at 3
    fenv.produce(6)
    first = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)  # [3, 5)
    fenv.produce(3)
    second = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)  # [3, 6)
    for handle in (first, second):
        fenv.in_process(handle, fenv.kafka.connection)
    commit_run(first, fenv.kafka.connection, root=fenv.root)
    foreign_commit(fenv, 3)  # the reset
    with pytest.raises(TidemarkError, match="no offset is shown twice"):
        commit_run(second, fenv.kafka.connection, root=fenv.root)
    assert fenv.committed() == {0: 6, 1: 6, 2: 6}
    [kept_out] = fenv.report_events("not_shown")
    assert sorted((r["partition"], r["start"], r["end"]) for r in kept_out["details"]["ranges"]) == [
        (0, 3, 6), (1, 3, 6), (2, 3, 6)
    ]  # fmt: skip
    assert fenv.published() == scan(fenv, 0, 5)
    assert_output_is_the_scan(fenv, named=scan(fenv, 5, 6))


def test_a_committing_replay_past_records_retention_deleted_follows_on_data_loss(fenv: FaultEnv) -> None:
    """Item 5: group at 3, records deleted to 6: ``--start-from earliest --commit`` under ``on_data_loss: fail``
    used to move the group to the end with no event; now it is refused, and under ``skip`` it names the loss."""
    fenv.produce(9)
    fenv.run()
    shown = scan(fenv, 0, 3)  # read before retention takes it
    fenv.produce(18)  # offsets 3..8
    fenv.kafka.adapter.delete_records({(fenv.topic, p): 6 for p in range(fenv.partitions)})
    with pytest.raises(TidemarkError, match=r"\[3, 6\).*on_data_loss is fail"):
        fenv.run("replay", {"start_from": "earliest", "commit": True})
    assert fenv.committed() == {0: 3, 1: 3, 2: 3}
    fenv.write_feed(on_data_loss="skip")
    fenv.run("replay", {"start_from": "earliest", "commit": True})
    assert fenv.committed() == {0: 9, 1: 9, 2: 9}
    lost = fenv.report_events("data_loss")
    assert sorted((e["partition"], e["details"]["start"], e["details"]["end"]) for e in lost) == [
        (0, 3, 6), (1, 3, 6), (2, 3, 6)
    ]  # fmt: skip
    committed = fenv.committed()
    expected = shown + oracle(fenv.kafka.connection, {(fenv.topic, p): (6, c or 0) for p, c in committed.items()})
    assert fenv.published() == expected  # [3, 6) is gone from Kafka and named by the events


def test_a_committing_replay_on_a_recreated_topic_starts_at_the_new_topic(fenv: FaultEnv) -> None:
    """Item 5: on a topic recreated with fewer records, ``--start-from earliest --commit`` was refused as a rewind
    and ``--start-offset 1 --commit`` skipped the new topic's first record silently."""
    from tests.integration.runs.test_topic_identity import recreate

    fenv.produce(30)
    fenv.run()  # the old topic: group at 10
    recreate(fenv)
    fenv.produce(9)  # the new topic: 3 per partition
    with pytest.raises(TidemarkError, match=r"\[0, 1\).*allow_gap"):
        fenv.run("replay", {"start_from": "offset", "start_offset": 1, "commit": True})
    handle, _, outcome = fenv.run("replay", {"start_from": "earliest", "commit": True})
    assert outcome.committed and {p.start for p in handle.plan().partitions} == {0}
    assert fenv.committed() == {0: 3, 1: 3, 2: 3}
    new_records = scan(fenv, 0, 3)
    assert new_records <= fenv.published()  # the new topic's records, once


def test_a_topic_recreated_between_planning_and_the_read_is_refused(fenv: FaultEnv) -> None:
    """Item 5: the plan's offsets belong to the old topic; the job refuses to read them from the new one."""
    from tests.integration.runs.test_topic_identity import recreate

    fenv.produce(9)
    handle = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    recreate(fenv)
    fenv.produce(9)
    with pytest.raises(OffsetsMovedError, match="deleted and recreated after planning") as refused:
        fenv.in_process(handle, fenv.kafka.connection)
    assert f"'{fenv.topic}' was {handle.plan().partitions[0].topic_id} at planning" in str(refused.value)
    assert fenv.published() == Counter() and fenv.committed() == {0: None, 1: None, 2: None}


@pytest.mark.parametrize("output", ["parquet", "iceberg"])
def test_a_refused_runs_discard_cut_short_is_finished_by_the_next_settle(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch, output: str
) -> None:
    """A refused run's discard crashes after deleting its own files, before its pending record
    (``discard.before_pending``): the ledger keeps the discard owed (``discarding``), and the next run's settle
    finishes it: no pending publication is left to pin the run's files, nothing of it is shown."""
    from tidemark.config.models import load_feed
    from tidemark.output import publisher_for

    if output == "iceberg":
        fenv.use_iceberg(f"cp.d_{fenv.topic.replace('-', '_')}")
    fenv.produce(9)
    loser = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.produce(3)
    winner = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.in_process(loser, fenv.kafka.connection)
    fenv.in_process(winner, fenv.kafka.connection)
    commit_run(winner, fenv.kafka.connection, root=fenv.root)
    publisher = publisher_for(load_feed(fenv.feed), loser.plan())
    assert publisher.staged(loser.plan_id, loser.run_id) is not None
    monkeypatch.setenv(FAULTS_ENV, "discard.before_pending")
    with pytest.raises(InjectedFault):
        commit_run(loser, fenv.kafka.connection, root=fenv.root)  # refused: the group moved; its discard crashes
    monkeypatch.delenv(FAULTS_ENV)
    store = open_store(root=fenv.root)
    assert store.run(fenv.group, loser.run_id).state == "discarding"  # type: ignore[union-attr]
    assert publisher.staged(loser.plan_id, loser.run_id) is not None  # cut short: its pending record is still there

    fenv.produce(3)
    _, _, outcome = fenv.run()
    assert outcome.committed
    assert store.run(fenv.group, loser.run_id).state == "abandoned"  # type: ignore[union-attr]
    assert publisher.staged(loser.plan_id, loser.run_id) is None
    pending = Path(f"{fenv.output}.pending") if output == "iceberg" else Path(fenv.output, "_pending")
    assert not [p for p in pending.rglob("*") if loser.run_id in str(p)]
    assert fenv.committed() == {0: 5, 1: 5, 2: 5}
    assert_output_is_the_scan(fenv)
