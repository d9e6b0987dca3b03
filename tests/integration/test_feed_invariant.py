"""The feed's output under the operations people do: every offset at most once, none skipped silently.

Each test interleaves runs of one feed as schedulers, people and shells do (through the
pipeline API the DAG tasks and the CLI call), then compares the feed's whole output
with an independent ``read_committed`` scan of Kafka (the fault suite's oracle): nothing
twice, and every offset below the group's committed position published, unless an event
of the run's report names it.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.faults.harness import FaultEnv, Row, assert_names, oracle
from tidemark.errors import OffsetsMovedError, PlanningError, TidemarkError
from tidemark.kafka.adapter import Record
from tidemark.runs.pipeline import commit_run, plan_run
from tidemark.storage import Location

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def fenv(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultEnv:
    env = FaultEnv(kafka, spark, tmp_path, "feed-invariant")
    monkeypatch.setenv("TIDEMARK_FEEDS_DIR", str(env.feeds))
    monkeypatch.setenv("TIDEMARK_STATE_DIR", str(env.root))
    return env


def report_of(path: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(Location.of(path).read_text())
    return doc


def events(fenv: FaultEnv, kind: str) -> list[dict[str, Any]]:
    """Every event of ``kind`` in the feed's run reports (what the Tidemark view lists)."""
    found = []
    for report in sorted(Path(fenv.root, "runs", fenv.feed).glob("*/report.json")):
        found += [e for e in json.loads(report.read_text())["events"] if e.get("kind") == kind]
    return found


def assert_output_matches_kafka(fenv: FaultEnv, skipped: Counter[Row] | None = None) -> None:
    """The feed's whole output is the oracle over ``[0, committed)`` less what events name as skipped."""
    committed = fenv.committed()
    ranges = {(fenv.topic, p): (0, c or 0) for p, c in committed.items()}
    expected = oracle(fenv.kafka.connection, ranges) - (skipped or Counter())
    got = fenv.published()
    twice = sorted(r for r, n in got.items() if n > 1)
    assert not twice, f"published more than once: {twice[:5]} ({sum(got[r] - 1 for r in twice)} extra copies)"
    assert not (expected - got), f"committed, in no output and no event: {sorted(expected - got)[:5]}"
    assert not (got - expected), f"published but not below the committed offsets: {sorted(got - expected)[:5]}"


def test_committing_replay_finishing_between_publish_and_commit(fenv: FaultEnv) -> None:
    fenv.produce(12)
    replay = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root, mode="replay",
                      params={"start_from": "committed", "commit": True})  # fmt: skip
    fenv.produce(6)
    scheduled = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.in_process(scheduled, fenv.kafka.connection)  # the scheduled run has published [0, 6)
    fenv.in_process(replay, fenv.kafka.connection)
    commit_run(replay, fenv.kafka.connection, root=fenv.root)  # the replay commits first: group at 4
    with pytest.raises(OffsetsMovedError) as refused:
        commit_run(scheduled, fenv.kafka.connection, root=fenv.root)
    assert fenv.committed() == {0: 4, 1: 4, 2: 4}
    assert_output_matches_kafka(fenv)
    assert f"plan {scheduled.plan_id} of run {scheduled.run_id} was retracted" in str(refused.value)
    nxt, _, _ = fenv.run()
    assert nxt.resumed is None and fenv.committed() == {0: 6, 1: 6, 2: 6}
    [retracted] = events(fenv, "publication_retracted")
    assert retracted["details"]["plan_id"] == scheduled.plan_id
    assert_output_matches_kafka(fenv)


def test_cleared_old_dag_run_rerunning_after_later_runs_committed(fenv: FaultEnv) -> None:
    fenv.produce(9)
    old = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)  # its Spark task failed: nothing published
    fenv.produce(3)
    fenv.run()  # the next DAG run reads [0, 4) and commits
    fenv.produce(3)
    fenv.run()  # and the one after it: [4, 5)
    # Someone clears the old DAG run's read_validate_publish and commit tasks in the Airflow UI:
    # they run again with the old plan task's handle ([0, 3)).
    refusals: list[TidemarkError] = []
    for step in (fenv.in_process, lambda h, c: commit_run(h, c, root=fenv.root)):
        try:
            step(old, fenv.kafka.connection)
        except TidemarkError as exc:
            refusals.append(exc)
    assert fenv.committed() == {0: 5, 1: 5, 2: 5}
    assert_output_matches_kafka(fenv)
    job_refusal, commit_refusal = refusals
    assert isinstance(job_refusal, OffsetsMovedError) and "Nothing was published" in str(job_refusal)
    assert f"{fenv.topic}[0] plan saw none, group now at 5" in str(job_refusal)
    assert "has not published" in str(commit_refusal)
    fenv.produce(3)
    fenv.run()
    assert_output_matches_kafka(fenv)


def test_cli_run_racing_a_scheduled_run(fenv: FaultEnv) -> None:
    fenv.produce(9)
    cli = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)  # `tidemark run` in a shell
    fenv.produce(3)
    scheduled = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)  # the DAG's run, a moment later
    assert cli.plan_id != scheduled.plan_id
    fenv.in_process(cli, fenv.kafka.connection)
    fenv.in_process(scheduled, fenv.kafka.connection)
    commit_run(cli, fenv.kafka.connection, root=fenv.root)
    with pytest.raises(OffsetsMovedError):
        commit_run(scheduled, fenv.kafka.connection, root=fenv.root)
    assert fenv.committed() == {0: 3, 1: 3, 2: 3}
    assert_output_matches_kafka(fenv)
    fenv.run()
    assert fenv.committed() == {0: 4, 1: 4, 2: 4}
    assert_output_matches_kafka(fenv)


def test_committing_replay_publishes_to_the_feed_output(fenv: FaultEnv) -> None:
    fenv.produce(9)
    fenv.run()
    fenv.produce(6)
    _, _, outcome = fenv.run("replay", {"start_from": "committed", "commit": True})
    assert outcome.committed and fenv.committed() == {0: 5, 1: 5, 2: 5}
    assert not Path(f"{fenv.output}.replays").exists()
    assert_output_matches_kafka(fenv)
    fenv.produce(3)
    fenv.run()
    assert_output_matches_kafka(fenv)


def test_committing_replay_rewind_is_refused(fenv: FaultEnv) -> None:
    fenv.produce(9)
    fenv.run()
    for params in ({"start_from": "earliest"}, {"start_from": "shift_by", "shift_by": -2}):
        with pytest.raises(PlanningError) as refused:
            fenv.run("replay", {**params, "commit": True})
        message = str(refused.value)
        assert f"{fenv.topic}[0] starts at" in message and "the group is at 3" in message
        assert "without commit" in message
    assert fenv.committed() == {0: 3, 1: 3, 2: 3}
    _, _, outcome = fenv.run("replay", {"start_from": "earliest"})  # without commit: beside the output
    assert not outcome.committed
    assert_output_matches_kafka(fenv)


def test_committing_replay_past_the_committed_offset_needs_allow_gap(fenv: FaultEnv) -> None:
    fenv.produce(9)
    fenv.run()
    fenv.produce(9)
    with pytest.raises(PlanningError) as refused:
        fenv.run("replay", {"start_from": "offset", "start_offset": 5, "commit": True})
    assert f"{fenv.topic}[1] [3, 5)" in str(refused.value) and "allow_gap" in str(refused.value)
    assert fenv.committed() == {0: 3, 1: 3, 2: 3}
    _, _, outcome = fenv.run("replay", {"start_from": "offset", "start_offset": 5, "commit": True, "allow_gap": True})
    assert fenv.committed() == {0: 6, 1: 6, 2: 6}
    gaps = [e for e in report_of(outcome.report_path)["events"] if e["kind"] == "offsets_skipped"]
    assert sorted((e["partition"], e["details"]["start"], e["details"]["end"]) for e in gaps) == [
        (0, 3, 5), (1, 3, 5), (2, 3, 5)
    ]  # fmt: skip
    skipped = oracle(fenv.kafka.connection, {(fenv.topic, e["partition"]): (3, 5) for e in gaps})
    assert_output_matches_kafka(fenv, skipped)


def test_committing_backfill_window_after_the_committed_offset(fenv: FaultEnv) -> None:
    base = int(datetime.now(UTC).timestamp() * 1000) - 3_600_000
    fenv.kafka.produce(fenv.topic, [Record(value=f"v-{i}".encode(), partition=0, timestamp_ms=base + i * 1000)
                                    for i in range(20)])  # fmt: skip

    def iso(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat()

    fenv.run("replay", {"start_from": "earliest", "end_at": "offset", "end_offset": 10, "commit": True,
                        "partitions": [0]})  # fmt: skip
    assert fenv.committed()[0] == 10
    window = {"start_timestamp": iso(base + 15_000), "end_timestamp": iso(base + 18_000), "commit": True,
              "window_mode": "offset_cut", "partitions": [0]}  # fmt: skip
    with pytest.raises(PlanningError) as refused:
        fenv.run("backfill", window)
    assert f"{fenv.topic}[0] [10, 15)" in str(refused.value)
    assert fenv.committed()[0] == 10
    _, _, outcome = fenv.run("backfill", {**window, "allow_gap": True})
    assert fenv.committed()[0] == 18
    [gap] = [e for e in report_of(outcome.report_path)["events"] if e["kind"] == "offsets_skipped"]
    assert (gap["details"]["start"], gap["details"]["end"]) == (10, 15)
    assert_output_matches_kafka(fenv, oracle(fenv.kafka.connection, {(fenv.topic, 0): (10, 15)}))


def test_committing_exact_window_names_the_records_it_commits_past(fenv: FaultEnv) -> None:
    base = int(datetime.now(UTC).timestamp() * 1000) - 3_600_000
    # Offsets 0..9 on partition 0; offsets 3 and 6 are stamped an hour earlier (outside the window).
    stamps = [base + i * 1000 - (3_600_000 if i in (3, 6) else 0) for i in range(10)]
    fenv.kafka.produce(fenv.topic, [Record(value=f"v-{i}".encode(), partition=0, timestamp_ms=ts)
                                    for i, ts in enumerate(stamps)])  # fmt: skip

    def iso(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat()

    _, _, outcome = fenv.run("backfill", {"start_timestamp": iso(base - 1000), "end_timestamp": iso(base + 60_000),
                                          "commit": True, "partitions": [0]})  # fmt: skip
    assert fenv.committed()[0] == 10
    [dropped] = [e for e in report_of(outcome.report_path)["events"] if e["kind"] == "records_outside_window"]
    assert dropped["partition"] == 0 and dropped["details"]["dropped"] == 2
    outside = oracle(fenv.kafka.connection, {(fenv.topic, 0): (3, 4)}) + oracle(
        fenv.kafka.connection, {(fenv.topic, 0): (6, 7)}
    )
    assert_output_matches_kafka(fenv, outside)


def test_iceberg_feed_committing_replay_finishing_between_publish_and_commit(fenv: FaultEnv) -> None:
    from tidemark.config.models import load_feed
    from tidemark.output.iceberg import IcebergPublisher, plan_history

    fenv.use_iceberg("tidemark.invariant")
    fenv.produce(12)
    replay = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root, mode="replay",
                      params={"start_from": "committed", "commit": True})  # fmt: skip
    fenv.produce(6)
    scheduled = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.in_process(scheduled, fenv.kafka.connection)
    fenv.in_process(replay, fenv.kafka.connection)
    commit_run(replay, fenv.kafka.connection, root=fenv.root)
    with pytest.raises(OffsetsMovedError):
        commit_run(scheduled, fenv.kafka.connection, root=fenv.root)
    assert_output_matches_kafka(fenv)
    publisher = IcebergPublisher(load_feed(fenv.feed))
    assert publisher.published(scheduled.plan_id) is None and publisher.published(replay.plan_id) is not None
    table = publisher.load()
    assert table is not None
    newest = plan_history(table)[0].summary
    assert newest is not None and newest.get("tidemark.retracted-plan-id") == scheduled.plan_id
    assert not Location.of(f"{fenv.output}.replays").exists()
    fenv.run()
    assert fenv.committed() == {0: 6, 1: 6, 2: 6}
    assert_output_matches_kafka(fenv)


def test_iceberg_plan_in_the_table_but_not_committed_to_kafka_is_finished_once(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash after the catalog commit and before Kafka's: the next run commits that plan, never re-publishes it."""
    from tidemark.config.models import load_feed
    from tidemark.faults import FAULTS_ENV, InjectedFault
    from tidemark.output.iceberg import IcebergPublisher, plan_history

    fenv.use_iceberg("tidemark.crashed")
    fenv.produce(9)
    crashed = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.in_process(crashed, fenv.kafka.connection)  # its snapshot is in the table
    monkeypatch.setenv(FAULTS_ENV, "commit.before")
    with pytest.raises(InjectedFault):
        commit_run(crashed, fenv.kafka.connection, root=fenv.root)
    monkeypatch.delenv(FAULTS_ENV)
    assert fenv.committed() == {0: None, 1: None, 2: None}
    assert IcebergPublisher(load_feed(fenv.feed)).published(crashed.plan_id) is not None

    fenv.produce(3)
    handle, _, _ = fenv.run()  # finishes the crashed run's commit first, then reads [3, 4)
    assert handle.resumed == crashed.plan_id
    assert fenv.committed() == {0: 4, 1: 4, 2: 4}
    assert_output_matches_kafka(fenv)
    table = IcebergPublisher(load_feed(fenv.feed)).load()
    assert table is not None
    published = [(s.summary or {}).get("tidemark.plan-id") for s in plan_history(table)]
    assert published.count(crashed.plan_id) == 1, published


def test_two_attempts_publishing_one_iceberg_plan_at_the_same_time_publish_it_once(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zombie driver and the retried task publish one plan into the table; the catalog's compare-and-set lets one in.

    The zombie stops where its data files are uploaded and the table it loaded (the basis
    of its commit, in which the plan was not yet published) is in hand; the retry runs to
    the same point and commits first; then the zombie commits. The zombie's commit is
    refused naming the table and the plan; the run commits the plan once and the table
    equals the oracle.
    """
    import threading

    from tidemark.config.models import load_feed
    from tidemark.errors import PublishError
    from tidemark.output import iceberg as iceberg_output
    from tidemark.output.iceberg import IcebergPublisher, plan_history

    fenv.use_iceberg("tidemark.twice")
    fenv.produce(6)
    fenv.run()  # the table exists: both attempts load it, neither creates it
    fenv.produce(15, bad={10})
    handle = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    zombie_waits = threading.Event()
    both_staged = threading.Barrier(2, timeout=120)
    retry_committed = threading.Event()
    point, commit_files = iceberg_output.fault_point, iceberg_output.commit_files

    def commit_in_turn(name: Any) -> None:
        if name == "iceberg.before_commit":
            zombie_waits.set()
            both_staged.wait()  # each attempt has loaded the table and uploaded its files
            if threading.current_thread().name == "zombie":
                retry_committed.wait(120)  # the zombie wakes up after the retry's commit
        point(name)

    def retry_commit_files(*args: Any, **kwargs: Any) -> None:
        try:
            commit_files(*args, **kwargs)
        finally:
            if threading.current_thread().name == "retry":
                retry_committed.set()

    monkeypatch.setattr(iceberg_output, "fault_point", commit_in_turn)
    monkeypatch.setattr(iceberg_output, "commit_files", retry_commit_files)
    outcomes: dict[str, Any] = {}

    def attempt(name: str) -> None:
        try:
            outcomes[name] = fenv.in_process(handle, fenv.kafka.connection)
        except Exception as exc:  # noqa: BLE001 - an attempt's failure is part of the outcome asserted below
            outcomes[name] = exc

    zombie = threading.Thread(target=attempt, args=("zombie",), name="zombie")
    zombie.start()
    assert zombie_waits.wait(120), f"the first attempt never reached the table commit: {outcomes}"
    retry = threading.Thread(target=attempt, args=("retry",), name="retry")
    retry.start()
    for thread in (zombie, retry):
        thread.join(180)
    monkeypatch.setattr(iceberg_output, "fault_point", point)
    monkeypatch.setattr(iceberg_output, "commit_files", commit_files)
    assert not both_staged.broken and retry_committed.is_set(), f"the attempts did not commit in turn: {outcomes}"
    assert isinstance(outcomes.get("retry"), dict), outcomes
    assert isinstance(outcomes.get("zombie"), PublishError), outcomes
    assert_names(str(outcomes["zombie"]), "Iceberg table tidemark.twice", f"plan {handle.plan_id}", "refused",
                 "table changed", "rerun")  # fmt: skip
    table = IcebergPublisher(load_feed(fenv.feed)).load()
    assert table is not None
    published = [(s.summary or {}).get("tidemark.plan-id") for s in plan_history(table)]
    assert published.count(handle.plan_id) == 1, published
    commit_run(handle, fenv.kafka.connection, root=fenv.root)
    assert fenv.committed() == {0: 7, 1: 7, 2: 7}
    assert_output_matches_kafka(fenv)
    fenv.check("test_two_attempts_publishing_one_iceberg_plan_at_the_same_time_publish_it_once")


def test_a_commit_another_writer_undid_in_part_fails_its_read_back_and_the_next_run_finishes_it(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the alter and the read-back another writer puts partition 0 back where the plan started.

    The read-back names the partition and both offsets and records no checkpoint; the run
    stays pending, and the next run commits it (partition 0's offset is again the one the
    plan was made from), so the output holds every committed record once.
    """
    from tidemark.errors import CommitError
    from tidemark.runs import commit

    fenv.produce(9)
    fenv.run()  # the group at 3 on every partition
    fenv.produce(6)
    handle = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.in_process(handle, fenv.kafka.connection)
    point = commit.fault_point

    def undo_partition_0(name: Any) -> None:
        if name == "commit.after_kafka":  # the alter went through, the read-back has not run
            fenv.kafka.adapter.alter_committed(fenv.group, {(fenv.topic, 0): (3, "someone else")})
        point(name)

    monkeypatch.setattr(commit, "fault_point", undo_partition_0)
    with pytest.raises(CommitError) as err:
        commit_run(handle, fenv.kafka.connection, root=fenv.root)
    monkeypatch.setattr(commit, "fault_point", point)

    assert not isinstance(err.value, OffsetsMovedError), err.value
    assert_names(str(err.value), f"group '{fenv.group}'", f"plan {handle.plan_id}",
                 rf"{fenv.topic}\[0\] expected 5, read back 3", "checkpoint was not updated",
                 "Run the feed again")  # fmt: skip
    assert fenv.committed() == {0: 3, 1: 5, 2: 5}
    nxt, _, _ = fenv.run()
    assert nxt.resumed == handle.plan_id and fenv.committed() == {0: 5, 1: 5, 2: 5}
    assert_output_matches_kafka(fenv)
    fenv.check("test_a_commit_another_writer_undid_in_part_fails_its_read_back_and_the_next_run_finishes_it")
