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
from tidemark.checkpoints.store import open_store
from tidemark.errors import OffsetsMovedError, PlanningError, TidemarkError
from tidemark.kafka.admin import Record
from tidemark.runs.pipeline import RunHandle, commit_run, plan_run
from tidemark.storage import Location

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def fenv(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultEnv:
    env = FaultEnv(kafka, spark, tmp_path, "feed-invariant")
    env.install(monkeypatch)
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


def pending(fenv: FaultEnv, handle: RunHandle) -> list[str]:
    """What run ``handle`` left staged and not shown: its pending Parquet folder, or its Iceberg pending record."""
    if fenv.iceberg is not None:
        folder = Location.of(f"{fenv.output}.pending") / handle.run_id
        return [name for name, _ in folder.files()] if folder.exists() else []
    return [str(p) for p in Path(fenv.output, "_pending", handle.run_id).glob("plan_id=*")]


def ledger_state(fenv: FaultEnv, handle: RunHandle) -> str:
    """Where the commit protocol left run ``handle`` (the run ledger of the checkpoint store)."""
    row = open_store(root=fenv.root).run(fenv.group, handle.run_id)
    assert row is not None, f"run {handle.run_id} is not in the ledger"
    return row.state


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
    """The scheduled run stages [0, 6) and the committing replay [0, 4); the replay commits first.

    The scheduled run's commit is refused; its staged publication was never visible (not
    before the replay's commit, not after it) and is discarded, the ledger records it
    abandoned and its report names the refusal; the next run goes on from the replay's ends.
    """
    fenv.produce(12)
    replay = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root, mode="replay",
                      params={"start_from": "committed", "commit": True})  # fmt: skip
    fenv.produce(6)
    scheduled = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.in_process(scheduled, fenv.kafka.connection)  # the scheduled run has staged [0, 6)
    fenv.in_process(replay, fenv.kafka.connection)
    assert pending(fenv, scheduled) and pending(fenv, replay)
    assert fenv.published() == Counter()  # staged, nothing shown before a commit
    commit_run(replay, fenv.kafka.connection, root=fenv.root)  # the replay commits first: group at 4
    assert fenv.published() == oracle(fenv.kafka.connection, {tp: (0, 4) for tp in fenv.tps()})
    with pytest.raises(OffsetsMovedError) as refused:
        commit_run(scheduled, fenv.kafka.connection, root=fenv.root)
    assert f"plan {scheduled.plan_id}" in str(refused.value)
    assert fenv.committed() == {0: 4, 1: 4, 2: 4}
    assert ledger_state(fenv, scheduled) == "abandoned" and ledger_state(fenv, replay) == "shown"
    assert not pending(fenv, scheduled)  # discarded, never shown
    assert_output_matches_kafka(fenv)
    [refusal] = events(fenv, "commit_refused")
    assert refusal["details"]["plan_id"] == scheduled.plan_id and "discarded" in refusal["message"]
    nxt, _, _ = fenv.run()
    assert nxt.resumed is None and fenv.committed() == {0: 6, 1: 6, 2: 6}
    assert_output_matches_kafka(fenv)


def test_cleared_old_dag_run_rerunning_after_later_runs_committed(fenv: FaultEnv) -> None:
    fenv.produce(9)
    old = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)  # its Spark task failed: nothing staged
    fenv.produce(3)
    fenv.run()  # the next DAG run reads [0, 4) and commits
    fenv.produce(3)
    fenv.run()  # and the one after it: [4, 5); settling the old run first, it finds the group moved
    assert ledger_state(fenv, old) == "abandoned"
    # Someone clears the old DAG run's read_validate_publish and commit tasks in the Airflow UI:
    # they run again with the old plan task's handle ([0, 3)).
    refusals: list[TidemarkError] = []
    for step in (fenv.in_process, lambda h, c: commit_run(h, c, root=fenv.root)):
        try:
            step(old, fenv.kafka.connection)
        except TidemarkError as exc:
            refusals.append(exc)
    assert fenv.committed() == {0: 5, 1: 5, 2: 5}
    assert not pending(fenv, old)  # the job refused before staging anything
    assert ledger_state(fenv, old) == "abandoned"
    assert_output_matches_kafka(fenv)
    job_refusal, commit_refusal = refusals
    assert isinstance(job_refusal, OffsetsMovedError) and "Nothing was published" in str(job_refusal)
    assert f"{fenv.topic}[0] plan saw none, group now at 5" in str(job_refusal)
    assert f"run {old.run_id} was abandoned" in str(commit_refusal)
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
    """As the Parquet case on an Iceberg table: the refused scheduled run never reaches the table's history
    (no snapshot adds it, none has to take it out) and the data files it uploaded are deleted."""
    from tidemark.config.models import load_feed
    from tidemark.output.iceberg import PLAN_KEY, RETRACTED_KEY, IcebergPublisher, plan_history

    fenv.use_iceberg("tidemark.invariant")
    fenv.produce(12)
    replay = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root, mode="replay",
                      params={"start_from": "committed", "commit": True})  # fmt: skip
    fenv.produce(6)
    scheduled = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.in_process(scheduled, fenv.kafka.connection)
    fenv.in_process(replay, fenv.kafka.connection)
    publisher = IcebergPublisher(load_feed(fenv.feed))
    staged = json.loads(Location.of(f"{fenv.output}.pending/{scheduled.run_id}/plan_id={scheduled.plan_id}.json")
                        .read_text())  # fmt: skip
    assert staged["paths"] and all(Location.of(path).exists() for path in staged["paths"])
    assert publisher.published(scheduled.plan_id) is None and publisher.published(replay.plan_id) is None
    assert fenv.published() == Counter()  # both staged, neither in the table
    commit_run(replay, fenv.kafka.connection, root=fenv.root)
    with pytest.raises(OffsetsMovedError):
        commit_run(scheduled, fenv.kafka.connection, root=fenv.root)
    assert fenv.committed() == {0: 4, 1: 4, 2: 4}
    assert ledger_state(fenv, scheduled) == "abandoned"
    assert not pending(fenv, scheduled)
    assert not [path for path in staged["paths"] if Location.of(path).exists()]  # in no snapshot, now deleted
    assert_output_matches_kafka(fenv)
    assert publisher.published(scheduled.plan_id) is None and publisher.published(replay.plan_id) is not None
    table = publisher.load()
    assert table is not None
    history = [s.summary or {} for s in plan_history(table)]
    assert [h.get(PLAN_KEY) for h in history] == [replay.plan_id]
    assert not [h for h in history if h.get(RETRACTED_KEY)]  # nothing was ever taken out of the table
    assert not Location.of(f"{fenv.output}.replays").exists()
    fenv.run()
    assert fenv.committed() == {0: 6, 1: 6, 2: 6}
    assert_output_matches_kafka(fenv)
    table = publisher.load()
    assert table is not None
    assert scheduled.plan_id not in [(s.summary or {}).get(PLAN_KEY) for s in plan_history(table)]


def test_iceberg_plan_in_the_table_but_not_committed_to_kafka_is_finished_once(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash after the job staged the plan and before the commit task committed anything.

    With the commit protocol a plan reaches the table only after the group's commit, so the
    crashed run's plan is staged (a pending record and data files in no snapshot), not in
    the table: readers do not see it. The next run settles it first (commits the group at
    its ends, then commits it to the table), never staging or reading it again; the table
    holds it once.
    """
    from tidemark.config.models import load_feed
    from tidemark.faults import FAULTS_ENV, InjectedFault
    from tidemark.output.iceberg import IcebergPublisher, plan_history

    fenv.use_iceberg("tidemark.crashed")
    fenv.produce(9)
    crashed = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.in_process(crashed, fenv.kafka.connection)  # staged: pending, in no snapshot
    monkeypatch.setenv(FAULTS_ENV, "commit.before")
    with pytest.raises(InjectedFault):
        commit_run(crashed, fenv.kafka.connection, root=fenv.root)
    monkeypatch.delenv(FAULTS_ENV)
    assert fenv.committed() == {0: None, 1: None, 2: None}
    publisher = IcebergPublisher(load_feed(fenv.feed))
    assert publisher.published(crashed.plan_id) is None  # not in the table: the group has not committed it
    staged = publisher.staged(crashed.plan_id, crashed.run_id)
    assert staged is not None and staged.records == 9
    assert ledger_state(fenv, crashed) == "planned"
    assert fenv.published() == Counter()

    fenv.produce(3)
    handle, _, _ = fenv.run()  # finishes the crashed run's commit first, then reads [3, 4)
    assert handle.resumed == crashed.plan_id
    assert ledger_state(fenv, crashed) == "shown" and not pending(fenv, crashed)
    assert fenv.committed() == {0: 4, 1: 4, 2: 4}
    assert_output_matches_kafka(fenv)
    table = publisher.load()
    assert table is not None
    published = [(s.summary or {}).get("tidemark.plan-id") for s in plan_history(table)]
    assert published.count(crashed.plan_id) == 1, published
    assert published == [handle.plan_id, crashed.plan_id], published  # the crashed plan first, once


def test_two_attempts_publishing_one_iceberg_plan_at_the_same_time_publish_it_once(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zombie and the retried attempt of one run stage one plan, then both commit it to the table; it is in once.

    The job stages (data files uploaded under the table's location, in no snapshot, and a
    pending record); the table commit is the run's promotion, after the group's commit.
    Staging: the zombie's job uploads its files and stalls; the retried job stages the same
    plan; then the zombie writes its pending record over the retry's. Only the files of the
    record the promotion commits ever reach the table. Promotion: a zombie commit task
    (its lock gone with its session) is inside ``promote`` with the table it loaded before
    the plan was in it, at the point where its commit goes; the retried commit task commits
    the group and promotes first; then the zombie commits. The catalog's compare-and-set
    refuses the zombie's commit (its table changed), the zombie looks at the history again,
    finds the plan and adds nothing: the table holds the plan once and equals the oracle.
    """
    import threading

    from tidemark.config.models import load_feed
    from tidemark.errors import PublishError
    from tidemark.output import iceberg as iceberg_output
    from tidemark.output.base import Manifest
    from tidemark.output.iceberg import PLAN_KEY, IcebergPublisher, plan_history

    fenv.use_iceberg("tidemark.twice")
    fenv.produce(6)
    fenv.run()  # the table exists: both attempts load it, neither creates it
    fenv.produce(15, bad={10})
    handle = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    publisher = IcebergPublisher(load_feed(fenv.feed))

    # 1. Two attempts of the job stage the plan: the zombie's pending record is written last.
    upload = IcebergPublisher._upload_data
    uploaded: dict[str, list[str]] = {}
    zombie_uploaded, retry_staged = threading.Event(), threading.Event()

    def upload_in_turn(self: IcebergPublisher, *args: Any) -> Any:
        names, entries = upload(self, *args)
        uploaded[threading.current_thread().name] = [str(self.location / n) for n in names]
        if threading.current_thread().name == "zombie":
            zombie_uploaded.set()
            retry_staged.wait(180)  # the zombie writes its pending record after the retried job staged
        return names, entries

    monkeypatch.setattr(IcebergPublisher, "_upload_data", upload_in_turn)
    outcomes: dict[str, Any] = {}

    def attempt(name: str, step: Any) -> None:
        try:
            outcomes[name] = step()
        except Exception as exc:  # noqa: BLE001 - an attempt's failure is part of the outcome asserted below
            outcomes[name] = exc

    zombie = threading.Thread(target=attempt, name="zombie",
                              args=("zombie", lambda: fenv.in_process(handle, fenv.kafka.connection)))  # fmt: skip
    zombie.start()
    assert zombie_uploaded.wait(180), f"the first attempt never uploaded its files: {outcomes}"
    retry = threading.Thread(target=attempt, name="retry",
                             args=("retry", lambda: fenv.in_process(handle, fenv.kafka.connection)))  # fmt: skip
    retry.start()
    retry.join(180)
    retry_staged.set()
    zombie.join(180)
    monkeypatch.setattr(IcebergPublisher, "_upload_data", upload)
    assert isinstance(outcomes.get("retry"), dict) and isinstance(outcomes.get("zombie"), dict), outcomes
    assert uploaded["zombie"] and uploaded["retry"] and not set(uploaded["zombie"]) & set(uploaded["retry"])
    record = json.loads(Location.of(f"{fenv.output}.pending/{handle.run_id}/plan_id={handle.plan_id}.json")
                        .read_text())  # fmt: skip
    assert sorted(record["paths"]) == sorted(uploaded["zombie"])
    assert publisher.published(handle.plan_id) is None  # staged twice, in the table not at all
    assert fenv.committed() == {0: 2, 1: 2, 2: 2}

    # 2. The zombie's promotion and the retried commit task's commit the plan to the table at the same time.
    both_promoting = threading.Barrier(2, timeout=180)
    zombie_promoting, retry_committed = threading.Event(), threading.Event()
    point, commit_files = iceberg_output.fault_point, iceberg_output.commit_files
    refused: dict[str, PublishError] = {}

    def commit_in_turn(name: Any) -> None:
        if name == "iceberg.before_commit":
            zombie_promoting.set()
            both_promoting.wait()  # each has loaded the table (the plan not in it) and is about to commit
            if threading.current_thread().name == "zombie":
                retry_committed.wait(180)  # the zombie wakes up after the retry's commit
        point(name)

    def commit_files_in_turn(*args: Any, **kwargs: Any) -> None:
        try:
            commit_files(*args, **kwargs)
        except PublishError as exc:
            refused[threading.current_thread().name] = exc
            raise
        finally:
            if threading.current_thread().name == "retry":
                retry_committed.set()

    monkeypatch.setattr(iceberg_output, "fault_point", commit_in_turn)
    monkeypatch.setattr(iceberg_output, "commit_files", commit_files_in_turn)
    outcomes.clear()
    zombie = threading.Thread(target=attempt, name="zombie",
                              args=("zombie", lambda: publisher.promote(handle.plan_id, handle.run_id)))  # fmt: skip
    zombie.start()
    assert zombie_promoting.wait(180), f"the zombie's promotion never reached the table commit: {outcomes}"
    commit_task = lambda: commit_run(handle, fenv.kafka.connection, root=fenv.root)  # noqa: E731
    retry = threading.Thread(target=attempt, name="retry", args=("retry", commit_task))
    retry.start()
    for thread in (zombie, retry):
        thread.join(180)
    monkeypatch.setattr(iceberg_output, "fault_point", point)
    monkeypatch.setattr(iceberg_output, "commit_files", commit_files)
    assert not both_promoting.broken and retry_committed.is_set(), f"the commits did not go in turn: {outcomes}"
    assert getattr(outcomes.get("retry"), "committed", False), outcomes
    assert set(refused) == {"zombie"}, refused  # the compare-and-set refused the zombie's stale commit
    assert_names(str(refused["zombie"]), "Iceberg table tidemark.twice", f"plan {handle.plan_id}", "refused",
                 "table changed")  # fmt: skip
    table = publisher.load()
    assert table is not None
    snapshots = [s for s in plan_history(table) if (s.summary or {}).get(PLAN_KEY) == handle.plan_id]
    assert len(snapshots) == 1, [(s.summary or {}).get(PLAN_KEY) for s in plan_history(table)]
    found = outcomes.get("zombie")
    assert isinstance(found, Manifest) and found.reused, outcomes  # it found the plan in the table, added nothing
    assert found.extra["snapshot_id"] == snapshots[0].snapshot_id
    files = {f["file_path"] for f in table.inspect.files().to_pylist()}
    assert set(uploaded["zombie"]) <= files and not set(uploaded["retry"]) & files
    assert ledger_state(fenv, handle) == "shown" and not pending(fenv, handle)
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
