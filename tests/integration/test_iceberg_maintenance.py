"""An Iceberg feed's guarantees after the table maintenance every Iceberg guide asks for.

Many small plans go into a real table (the SQLite catalog in the state dir, local Spark);
then pyiceberg's own compaction (an overwrite of every row) and snapshot expiry leave no
snapshot that names a plan. After that: a replay of a plan already in the table, a crash
after a plan's table commit, and a checkpoint store emptied with the group's offsets
deleted must each find what the table holds (the ledger in its properties), never add a
plan twice, and recover the position exactly. The table is compared with an independent
``read_committed`` scan of Kafka (the fault suite's oracle).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.faults.harness import FaultEnv, oracle
from tidemark.runs.pipeline import RunHandle, commit_run, plan_run

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def fenv(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultEnv:
    env = FaultEnv(kafka, spark, tmp_path, "iceberg-maintenance")
    env.install(monkeypatch)
    return env


def assert_table_matches_kafka(fenv: FaultEnv) -> None:
    """The table's rows are the oracle over ``[0, committed)``: nothing twice, nothing missing."""
    committed = fenv.committed()
    expected = oracle(fenv.kafka.connection, {(fenv.topic, p): (0, c or 0) for p, c in committed.items()})
    got = fenv.published()
    twice = sorted(r for r, n in got.items() if n > 1)
    assert not twice, f"in the table more than once: {twice[:5]} ({sum(got[r] - 1 for r in twice)} extra copies)"
    assert got == expected, f"missing {sorted(expected - got)[:5]}, not committed {sorted(got - expected)[:5]}"


def pyiceberg_compact_and_expire(fenv: FaultEnv) -> None:
    """What a user's own maintenance does, with pyiceberg alone: rewrite every row into new files (an overwrite),
    then expire every snapshot but the current one. No snapshot names a Tidemark plan afterwards."""
    from tidemark.config.models import load_feed
    from tidemark.output.iceberg import PLAN_KEY, IcebergPublisher

    table = IcebergPublisher(load_feed(fenv.feed)).load()
    assert table is not None
    before = {f["file_path"] for f in table.inspect.files().to_pylist()}
    table.overwrite(table.scan().to_arrow())
    table.maintenance.expire_snapshots().older_than(datetime.now(UTC) + timedelta(seconds=1)).commit()
    table = table.refresh()
    assert len(table.snapshots()) == 1 and not {f["file_path"] for f in table.inspect.files().to_pylist()} & before
    assert not [s for s in table.snapshots() if (s.summary or {}).get(PLAN_KEY)]


def publisher_table(fenv: FaultEnv) -> Any:
    from tidemark.config.models import load_feed
    from tidemark.output.iceberg import IcebergPublisher

    table = IcebergPublisher(load_feed(fenv.feed)).load()
    assert table is not None
    return table


def test_guarantees_survive_pyiceberg_compaction_and_snapshot_expiry(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidemark.checkpoints.store import open_store
    from tidemark.config.models import load_feed
    from tidemark.output.iceberg import IcebergPublisher

    fenv.use_iceberg("tidemark.kept")
    handles: list[RunHandle] = []
    for _ in range(5):  # many small plans, one snapshot each
        fenv.produce(6)
        handle, _, _ = fenv.run()
        handles.append(handle)
    # A crash right after a plan's table commit, before the run ledger records it shown.
    fenv.produce(6)
    crashed = fenv.crash_after_table_commit(monkeypatch)
    assert open_store(root=fenv.root).run(fenv.group, crashed.run_id).state == "committed"  # type: ignore[union-attr]
    assert fenv.committed() == {0: 12, 1: 12, 2: 12}
    assert_table_matches_kafka(fenv)

    pyiceberg_compact_and_expire(fenv)
    publisher = IcebergPublisher(load_feed(fenv.feed))

    # 1. Every plan of the last runs is still known to be in the table.
    for handle in (*handles, crashed):
        found = publisher.published(handle.plan_id)
        assert found is not None and found.reused, f"plan {handle.plan_id} no longer found after expiry"
    # 2. A replay of a published plan (a cleared DAG run's job and commit): nothing read, nothing added.
    replayed = fenv.in_process(handles[2], fenv.kafka.connection)
    assert replayed["reused"] is True
    commit_run(handles[2], fenv.kafka.connection, root=fenv.root)
    assert_table_matches_kafka(fenv)
    # 3. The crashed run is finished by the next run: found in the table, not committed to it again.
    fenv.produce(3)
    nxt, _, _ = fenv.run()
    assert nxt.resumed == crashed.plan_id
    assert fenv.committed() == {0: 13, 1: 13, 2: 13}
    assert_table_matches_kafka(fenv)

    # 4. The group's offsets and the checkpoint store gone, snapshots expired again: the position is the table's.
    pyiceberg_compact_and_expire(fenv)
    fenv.kafka.adapter.admin.delete_consumer_groups([fenv.group], request_timeout=10)[fenv.group].result(timeout=10)
    (fenv.root / "checkpoints.sqlite").unlink()
    assert fenv.committed() == {0: None, 1: None, 2: None}
    fenv.produce(6)
    resumed, _, _ = fenv.run()
    plan = resumed.plan()
    assert [(p.partition, p.reason, p.start, p.end) for p in plan.partitions] == [
        (0, "table", 13, 15), (1, "table", 13, 15), (2, "table", 13, 15),
    ]  # fmt: skip
    assert {e.kind for e in plan.events} >= {"position_from_table"}
    assert fenv.committed() == {0: 15, 1: 15, 2: 15}
    assert_table_matches_kafka(fenv)
    assert fenv.published() != Counter()


def small_target(fenv: FaultEnv, **extra: Any) -> None:
    """Maintenance settings for a test table of a few KB: every file is small, everything old enough expires."""
    settings = {"target_file_mb": 1, "min_input_files": 2, "keep_snapshots": 1, "snapshot_max_age": "1s",
                "orphan_min_age": "1h", **extra}  # fmt: skip
    fenv.write_feed(maintenance=settings)


def live_files(fenv: FaultEnv) -> list[str]:
    from tidemark.config.models import load_feed
    from tidemark.output.iceberg import IcebergPublisher

    table = IcebergPublisher(load_feed(fenv.feed)).load()
    assert table is not None
    return [t.file.file_path for t in table.scan().plan_files()]


def test_tidemark_maintenance_compacts_expires_and_removes_orphans_keeping_the_guarantees(fenv: FaultEnv) -> None:
    """Tidemark's own maintenance, with a run staged and not yet committed: its files (orphans to the table, old
    enough to go) are kept, the run commits afterwards, and the table equals the oracle throughout."""
    from tidemark.config.models import load_feed
    from tidemark.output.iceberg import IcebergPublisher
    from tidemark.output.maintenance import last_record, maintain

    fenv.use_iceberg("tidemark.maintained")
    small_target(fenv)
    handles = []
    for _ in range(4):
        fenv.produce(6)
        handles.append(fenv.run()[0])
    fenv.produce(6)
    staged = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.in_process(staged, fenv.kafka.connection)  # pending: uploaded files no snapshot names
    feed = load_feed(fenv.feed)
    before = live_files(fenv)
    assert len(before) >= 4  # a file per plan at least
    cli = subprocess.run([sys.executable, "-m", "tidemark.cli", "maintain", fenv.feed, "--dry-run"],
                         capture_output=True, text=True, check=False, env=os.environ.copy())  # fmt: skip
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert f"dry run: table tidemark.maintained of feed '{fenv.feed}'" in cli.stdout
    assert f"would rewrite {len(before)} small files into 1 in 1 partitions" in cli.stdout
    dry = maintain(feed, dry_run=True)
    assert dry.files_rewritten == len(before) and dry.snapshots_expired == dry.snapshots_before - 1
    assert dry.orphans_removed == 0 and live_files(fenv) == before  # orphans younger than an hour stay
    assert last_record(feed.name) is None  # a dry run records nothing

    later = datetime.now(UTC) + timedelta(hours=2)  # every file older than orphan_min_age, every snapshot expired
    report = maintain(feed, now=later)
    after = live_files(fenv)
    assert report.files_before == len(before) and report.files_after == len(after) == 1, report
    assert report.files_rewritten == len(before) and report.files_written == 1
    assert report.snapshots_expired == report.snapshots_before - 1, report
    assert report.orphans_removed >= len(before), report  # the small files, unreachable once their snapshots expired
    assert all(not Path(p.removeprefix("file:")).exists() for p in before)
    assert last_record(feed.name) == report
    table = IcebergPublisher(feed).load()
    assert table is not None and len(table.snapshots()) == 1
    assert_table_matches_kafka(fenv)

    commit_run(staged, fenv.kafka.connection, root=fenv.root)  # its files survived the orphan removal
    assert fenv.committed() == {0: 10, 1: 10, 2: 10}
    assert_table_matches_kafka(fenv)
    assert IcebergPublisher(feed).published(handles[0].plan_id) is not None  # the ledger outlived the history
    fenv.produce(3)
    fenv.run()
    assert_table_matches_kafka(fenv)


def test_maintenance_racing_a_feed_commit_loses_neither(fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both orders: a feed's promotion lands between maintenance's load and its commit (maintenance is refused and
    retries on the new table), and maintenance commits between a promotion's load and its commit (the promotion is
    refused and commits on the new table). Both commits land; the table equals the oracle; the ledger has both plans.
    """
    from tidemark.config.models import load_feed
    from tidemark.output import iceberg as iceberg_output
    from tidemark.output import maintenance
    from tidemark.output.iceberg import IcebergPublisher

    fenv.use_iceberg("tidemark.raced")
    small_target(fenv)
    for _ in range(3):
        fenv.produce(6)
        fenv.run()
    feed = load_feed(fenv.feed)
    publisher = IcebergPublisher(feed)

    # 1. The feed commits while maintenance holds the table it loaded.
    fenv.produce(6)
    first = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.in_process(first, fenv.kafka.connection)
    replace_files = maintenance._replace_files
    calls: list[int] = []

    def feed_commits_first(table: Any, old: Any, new: Any) -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            commit_run(first, fenv.kafka.connection, root=fenv.root)
        replace_files(table, old, new)

    monkeypatch.setattr(maintenance, "_replace_files", feed_commits_first)
    report = maintenance.maintain(feed)
    monkeypatch.setattr(maintenance, "_replace_files", replace_files)
    assert len(calls) == 2 and report.commit_retries >= 1, report
    assert report.files_rewritten > 0 and not report.notes, report
    assert publisher.published(first.plan_id) is not None
    assert fenv.committed() == {0: 8, 1: 8, 2: 8}
    assert_table_matches_kafka(fenv)

    # 2. Maintenance commits while the feed's promotion holds the table it loaded.
    fenv.produce(6)
    second = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.in_process(second, fenv.kafka.connection)
    point = iceberg_output.fault_point
    ran: list[Any] = []

    def maintenance_commits_first(name: Any) -> None:
        if name == "iceberg.before_commit" and not ran:
            ran.append(maintenance.maintain(feed))
        point(name)

    monkeypatch.setattr(iceberg_output, "fault_point", maintenance_commits_first)
    commit_run(second, fenv.kafka.connection, root=fenv.root)
    monkeypatch.setattr(iceberg_output, "fault_point", point)
    [during] = ran
    assert during.files_rewritten > 0, during  # it committed a compaction under the promotion's feet
    table = publisher.load()
    assert table is not None
    operations = [(s.summary or {}).get("tidemark.maintenance") for s in table.snapshots()]
    assert operations.count("compaction") >= 1
    assert publisher.published(second.plan_id) is not None
    assert fenv.committed() == {0: 10, 1: 10, 2: 10}
    assert_table_matches_kafka(fenv)


def test_a_topic_recreated_after_expiry_starts_on_its_new_id_without_a_refusal(fenv: FaultEnv) -> None:
    """The ledger's ends are per topic id: the recreated topic's offsets (from 0 again) are new records, not a
    repeat of the old topic's, even with the history expired and the checkpoint store and the group gone."""
    from tests.integration.runs.test_topic_identity import recreate

    fenv.use_iceberg("tidemark.recreated")
    for _ in range(3):
        fenv.produce(6)
        fenv.run()
    old = oracle(fenv.kafka.connection, {(fenv.topic, p): (0, 6) for p in range(3)})
    assert fenv.published() == old
    pyiceberg_compact_and_expire(fenv)
    [overwrite] = [s.snapshot_id for s in publisher_table(fenv).snapshots()]
    recreate(fenv)  # Kafka drops the group's offsets of the deleted topic with it
    assert fenv.committed() == {0: None, 1: None, 2: None}
    (fenv.root / "checkpoints.sqlite").unlink()
    fenv.produce(9)
    first, _, _ = fenv.run()
    plan = first.plan()
    assert [(p.start, p.end) for p in plan.partitions] == [(0, 3), (0, 3), (0, 3)]
    # The table's ends were recorded on the old topic's id: not a position on the new one (runs.gather), so the
    # partitions start by the reset policy; the ledger's check at the commit takes the new id's ranges as new.
    # Beside the resets, the ledger's check names pyiceberg's overwrite: a snapshot that added records and that no
    # Tidemark plan wrote (foreign), not a rollback: the plans whose snapshots were expired stand.
    assert sorted(e.kind for e in plan.events) == ["reset"] * 3 + ["table_ledger_mismatch"], plan.events
    [mismatch] = [e for e in plan.events if e.kind == "table_ledger_mismatch"]
    assert mismatch.details == {"table": mismatch.details["table"], "snapshots": [overwrite]}, mismatch
    assert fenv.committed() == {0: 3, 1: 3, 2: 3}
    new = oracle(fenv.kafka.connection, {(fenv.topic, p): (0, 3) for p in range(3)})
    assert fenv.published() == old + new
    # The table refuses, at its own commit, ranges it already holds on either id, whatever the checkpoint store says.
    from tidemark.config.models import load_feed
    from tidemark.errors import PublishError
    from tidemark.output.iceberg import FEED_KEY, GROUP_KEY, PLAN_KEY, RANGES_KEY, IcebergPublisher, commit_files
    from tidemark.output.ledger import Ledger, ledger_key

    publisher = IcebergPublisher(load_feed(fenv.feed))
    table = publisher.load()
    assert table is not None
    ledger = Ledger.from_json(table.properties[ledger_key(fenv.feed)])
    assert len(ledger.ends[fenv.topic]) == 2  # the old id's ends and the new one's
    for topic_id, end in ledger.ends[fenv.topic].items():
        ranges = [{"topic": fenv.topic, "partition": 0, "start": end[0] - 1, "end": end[0] + 1, "topic_id": topic_id}]
        properties = {PLAN_KEY: f"again-{topic_id}", FEED_KEY: fenv.feed, GROUP_KEY: fenv.group,
                      RANGES_KEY: json.dumps(ranges)}  # fmt: skip
        with pytest.raises(PublishError, match="would be in the table twice"):
            commit_files(table, [], properties, "tidemark.recreated")
    assert fenv.published() == old + new


def test_the_partitioning_a_feed_chooses_and_its_evolution(fenv: FaultEnv) -> None:
    """``iceberg.partition_by: hour``: the table is partitioned by hour(timestamp) and topic, each file in one hour;
    changed to ``month``, the next commit evolves the spec (old files keep theirs) and the table still equals the
    oracle; maintenance compacts within the current spec."""
    from tidemark.config.models import load_feed
    from tidemark.output.iceberg import IcebergPublisher, spec_of
    from tidemark.output.maintenance import maintain

    fenv.use_iceberg("tidemark.parted")
    fenv.write_feed(iceberg={"table": "tidemark.parted", "partition_by": "hour"})
    fenv.produce(6)
    fenv.run()
    publisher = IcebergPublisher(load_feed(fenv.feed))
    table = publisher.load()
    assert table is not None and spec_of(table) == {("timestamp", "hour"), ("topic", "identity")}
    files = table.inspect.files().to_pylist()
    assert files and all(set(f["partition"]) == {"timestamp_hour", "topic"} for f in files)
    assert all("/timestamp_hour=" in f["file_path"] for f in files)
    assert_table_matches_kafka(fenv)

    fenv.write_feed(iceberg={"table": "tidemark.parted", "partition_by": "month"},
                    maintenance={"min_input_files": 2, "target_file_mb": 1})  # fmt: skip
    for _ in range(2):
        fenv.produce(6)
        fenv.run()
    table = publisher.load()
    assert table is not None and spec_of(table) == {("timestamp", "month"), ("topic", "identity")}
    assert {str(f.transform) for spec in table.specs().values() for f in spec.fields} == {"hour", "month", "identity"}
    by_spec = sorted(t.file.spec_id for t in table.scan().plan_files())
    assert by_spec[0] != by_spec[-1]  # the first run's files keep the hour spec
    assert_table_matches_kafka(fenv)
    current = [t.file.file_path for t in table.scan().plan_files() if t.file.spec_id == table.spec().spec_id]
    older = {t.file.file_path for t in table.scan().plan_files()} - set(current)
    report = maintain(load_feed(fenv.feed))
    assert report.files_rewritten == len(current) >= 2 and report.files_written == 1, report
    table = publisher.load()
    assert table is not None and older <= {t.file.file_path for t in table.scan().plan_files()}  # hour files kept
    assert_table_matches_kafka(fenv)
    fenv.write_feed(iceberg={"table": "tidemark.parted", "partition_by": "none"})
    fenv.produce(6)
    fenv.run()
    table = publisher.load()
    assert table is not None and spec_of(table) == set()
    newest = [t.file for t in table.scan().plan_files() if t.file.spec_id == table.spec().spec_id]
    assert newest and all(len(f.partition) == 0 and "/data/" in f.file_path for f in newest)
    assert_table_matches_kafka(fenv)


INTERRUPT_POINTS = ("maintenance.after_rewrite", "maintenance.after_compaction", "maintenance.after_expiry",
                    "maintenance.before_orphans", "maintenance.after_orphan")  # fmt: skip


def test_a_sigint_reaching_tidemark_maintain_at_each_step_leaves_the_table_equal_to_kafka(fenv: FaultEnv) -> None:
    """Ctrl-C (or a task timeout) reaching ``tidemark maintain`` at each of its fault points, one after the other on
    one feed's table with runs between: a real SIGINT to a real subprocess. After each, pyiceberg scans the current
    snapshot and every kept one (a deleted file a snapshot names raises), and the table equals the read_committed
    oracle; a last uninterrupted run finishes the job."""
    import time

    from tidemark.config.models import load_feed
    from tidemark.output.iceberg import IcebergPublisher

    fenv.use_iceberg("tidemark.interrupted")
    small_target(fenv, keep_snapshots=2)
    cmd = [sys.executable, "-m", "tidemark.cli", "maintain", fenv.feed]
    for point in INTERRUPT_POINTS:
        for _ in range(2 if point == INTERRUPT_POINTS[0] else 1):  # then one small file beside the compacted one
            fenv.produce(6)
            fenv.run()
        then = time.time() - 3 * 3600  # every file older than orphan_min_age (1h), every snapshot than 1s
        for path in [p for p in Path(str(fenv.output)).rglob("*") if p.is_file()]:
            os.utime(path, (then, then))
        time.sleep(1.1)
        cut = subprocess.run(cmd, capture_output=True, text=True, check=False,
                             env={**os.environ, "TIDEMARK_FAULTS": f"{point}:sigint"})  # fmt: skip
        assert cut.returncode == 130, f"{point}: {cut.stdout}{cut.stderr}"  # the CLI's answer to an interrupt
        table = IcebergPublisher(load_feed(fenv.feed)).load()
        assert table is not None
        for snapshot in table.snapshots():  # every kept snapshot still scans: no file it names was deleted
            table.scan(snapshot_id=snapshot.snapshot_id).to_arrow()
        assert_table_matches_kafka(fenv)
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=dict(os.environ))
    assert done.returncode == 0, done.stdout + done.stderr
    assert_table_matches_kafka(fenv)
    fenv.produce(3)
    fenv.run()
    assert_table_matches_kafka(fenv)
