"""A feed's dead letters, read through :func:`tidemark.output.deadletters.dead_letters`, against the real cluster.

A feed of string values with one regex rule gets poison records of two kinds (bytes that
are not UTF-8 do not decode; values the rule refuses) among good ones and tombstones. The
expected dead letters come from an independent ``read_committed`` scan of the committed
offsets, classified from the raw bytes by the fault suite's oracle
(:meth:`tests.faults.harness.FaultEnv.classifier`), not by Tidemark. They must equal what
the reader returns, each ``(topic, partition, offset)`` once, on a Parquet feed and on an
Iceberg feed, through a crash of the job after it staged the plan (the next run finishes
that plan), a job run twice for one plan (a retried task), a crash between the group's
commit and the plan being shown, and a run with nothing new. The dead-letter table is also
read apart, without Tidemark's reader (:func:`tests.support.poison.table_rows`): an Iceberg
feed's through pyiceberg's own catalog, a Parquet feed's as the quarantine files its published
manifests list, with pyarrow. Its rows equal the same oracle's, each once, through the same
crashes and, for Iceberg, a crash between the data's commit and the dead-letters' append, a
crash after both before the run ledger says ``shown`` (the promotion is then entered again),
and snapshot expiry of both tables.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.faults.harness import QUARANTINED, FaultEnv, Row, digest, scan
from tests.support.poison import produce_with_poison, table_rows
from tidemark.checkpoints.store import open_store
from tidemark.errors import StuckRunError
from tidemark.faults import FAULTS_ENV, InjectedFault
from tidemark.output.deadletters import DeadLetter, count_dead_letters, dead_letters, fetch_dead_letters, summarize
from tidemark.runs.pipeline import commit_run, plan_run

pytestmark = [pytest.mark.integration, pytest.mark.spark]

RULE = "expect_column_values_to_match_regex(value)"


@pytest.fixture
def fenv(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         request: pytest.FixtureRequest) -> FaultEnv:  # fmt: skip
    env = FaultEnv(kafka, spark, tmp_path, request.node.name)
    env.install(monkeypatch)
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    return env


def oracle_bad(env: FaultEnv) -> dict[Row, bytes | None]:
    """The records below the group's committed offsets that the oracle classifies as bad, with their raw value."""
    ranges = {(env.topic, p): (0, c or 0) for p, c in env.committed().items()}
    kind = env.classifier()
    return {row: value for row, value in scan(env.kafka.connection, ranges) if kind(value) == QUARANTINED}


def as_rows(letters: list[DeadLetter]) -> Counter[Row]:
    return Counter((d.topic, d.partition, d.offset, digest(d.value)) for d in letters)


def assert_the_table_is_the_oracle(env: FaultEnv) -> Counter[Row]:
    """The dead-letter table holds each record the oracle classifies as bad, once, and nothing else."""
    got = table_rows(env)
    assert [r for r, n in got.items() if n > 1] == [], "a dead letter is in the table more than once"
    assert set(got) == set(oracle_bad(env))
    return got


def assert_exactly_the_oracle(env: FaultEnv) -> list[DeadLetter]:
    letters = dead_letters(env.feed)
    expected = oracle_bad(env)
    got = as_rows(letters)
    assert [r for r, n in got.items() if n > 1] == [], "a dead letter is listed more than once"
    assert set(got) == set(expected)
    for d in letters:  # each row carries the record as Kafka holds it, and why it is bad
        i = int(d.key.decode()[1:]) if d.key else -1
        assert d.key == f"k{i}".encode() and d.headers == (("origin", f"h{i}".encode()),)
        assert d.reason_codes == (("decode_error",) if i % 5 == 1 else (RULE,)), d
        assert d.reason and d.plan_id and d.run_id and d.timestamp is not None
    return letters


@pytest.mark.parametrize("output", ["parquet", "iceberg"])
def test_dead_letters_equal_the_oracles_bad_records_once_through_crashes_and_reruns(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch, output: str
) -> None:
    if output == "iceberg":
        fenv.use_iceberg(f"dl.t_{fenv.topic.replace('-', '_')}")
    produce_with_poison(fenv, 30)

    # The job stages the plan (dead letters included) and dies before it reports: nothing is shown.
    crashed = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    monkeypatch.setenv(FAULTS_ENV, "job.after_publish")
    with pytest.raises(InjectedFault):
        fenv.in_process(crashed, fenv.kafka.connection)
    monkeypatch.delenv(FAULTS_ENV)
    assert dead_letters(fenv.feed) == []
    assert table_rows(fenv) == Counter()

    # The next run finds the crashed run's staged plan, commits and shows it once, then reads nothing new.
    rerun, _, _ = fenv.run()
    assert rerun.resumed == crashed.plan_id and rerun.records == 0
    assert fenv.committed() == {0: 10, 1: 10, 2: 10}
    first = assert_exactly_the_oracle(fenv)
    assert len(first) == 9  # 6 undecodable, 3 refused by the rule, of 30
    assert assert_the_table_is_the_oracle(fenv) == as_rows(first)

    # The next plan's job runs twice (a retried task: the same plan staged again, its dead letters replaced),
    # then the group commits it and the run dies before the plan is shown.
    produce_with_poison(fenv, 15)
    retried = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.in_process(retried, fenv.kafka.connection)
    fenv.in_process(retried, fenv.kafka.connection)
    assert as_rows(dead_letters(fenv.feed)) == as_rows(first)
    monkeypatch.setenv(FAULTS_ENV, "commit.before_show")
    with pytest.raises(InjectedFault):
        commit_run(retried, fenv.kafka.connection, root=fenv.root)
    monkeypatch.delenv(FAULTS_ENV)
    assert fenv.committed() == {0: 15, 1: 15, 2: 15}
    assert as_rows(dead_letters(fenv.feed)) == as_rows(first)  # committed, not shown: not yet dead letters
    assert table_rows(fenv) == as_rows(first)

    handle, _, _ = fenv.run()  # finishes the committed plan first, then reads nothing new
    assert handle.resumed == retried.plan_id and handle.records == 0
    letters = assert_exactly_the_oracle(fenv)
    assert len(letters) == 15
    fenv.run()  # nothing new
    assert as_rows(dead_letters(fenv.feed)) == as_rows(letters)
    assert assert_the_table_is_the_oracle(fenv) == as_rows(letters)
    fenv.check(f"dead letters ({output})")

    # Filters and the summary by reason and day.
    assert {d.offset for d in dead_letters(fenv.feed, reason="decode_error")} == {
        d.offset for d in letters if d.reason_codes == ("decode_error",)
    }
    assert len(dead_letters(fenv.feed, reason="expect_column_values_to_match_regex")) == 6
    late = max(d.timestamp for d in letters)
    assert dead_letters(fenv.feed, since=late) == [d for d in letters if d.timestamp == late]
    groups = summarize(letters)
    assert {(g.reason, g.count) for g in groups} == {("decode_error", 9), (RULE, 6)}
    assert all(len(g.examples) == min(g.count, 3) for g in groups)

    # The view's bounded reading: the same counts from the reason and time columns alone, examples fetched whole.
    counted = count_dead_letters(fenv.feed, examples=2)
    assert counted.records == len(letters)
    assert [(g.reason, g.day, g.count) for g in counted.groups] == [(g.reason, g.day, g.count) for g in groups]
    assert all(len(g.examples) == min(g.count, 2) for g in counted.groups)
    wanted = [p for g in counted.groups for p in g.examples]
    by_key = {d.key_of: d for d in letters}
    assert fetch_dead_letters(fenv.feed, counted, wanted) == [by_key[p.key] for p in wanted]
    assert all(by_key[p.key].reason_codes.count(g.reason) == 1 for g in counted.groups for p in g.examples)


def test_deadletters_cli_lists_a_feeds_dead_letters_by_reason_and_day(fenv: FaultEnv) -> None:
    produce_with_poison(fenv, 30)
    fenv.run()
    proc = subprocess.run(
        [sys.executable, "-m", "tidemark.cli", "deadletters", fenv.feed, "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["records"] == 9
    assert sorted((g["reason"], g["count"]) for g in doc["groups"]) == [("decode_error", 6), (RULE, 3)]
    proc = subprocess.run(
        [sys.executable, "-m", "tidemark.cli", "deadletters", fenv.feed, "--reason", "decode_error"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "decode_error" in proc.stdout and RULE not in proc.stdout and "6" in proc.stdout


def test_redrive_dry_run_lists_the_dead_letters_a_fixed_rule_now_lets_pass(
    fenv: FaultEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    """The rule is widened to take ``x-`` values too: exactly the records it refused would now pass, the ones
    that do not decode still do not, and nothing is published."""
    from tidemark.cli import main

    produce_with_poison(fenv, 30)
    fenv.run()
    before = as_rows(dead_letters(fenv.feed))
    fenv.write_feed(validation={
        "on_bad_records": "quarantine", "quarantine_max_ratio": 0.5,
        "expectations": [{"type": "expect_column_values_to_match_regex",
                          "kwargs": {"column": "value", "regex": "^[vx]-"}}],
    })  # fmt: skip
    capsys.readouterr()
    assert main(["redrive", fenv.feed, "--dry-run", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dead_letters"] == 9 and doc["would_pass"] == 3
    passing = {r["offset"] * 3 + r["partition"] for r in doc["records"] if r["passes"]}  # back to the record's number
    assert passing == {i for i in range(30) if i % 5 != 1 and i % 7 == 2}
    assert all(r["reason_codes_now"] == ["decode_error"] for r in doc["records"] if not r["passes"])
    assert as_rows(dead_letters(fenv.feed)) == before  # a dry run changes nothing
    assert len(list((fenv.root / "runs" / fenv.feed).iterdir())) == 1  # and records no run

    # Without --dry-run the command publishes them, as a run; a second one publishes nothing.
    assert main(["redrive", fenv.feed, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["published"], doc["state"], doc["would_pass"]) == (3, "shown", 3)
    assert doc["report"] and doc["run_id"] in doc["report"]
    assert len(dead_letters(fenv.feed)) == 6
    assert main(["redrive", fenv.feed, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["published"] == 0


def test_an_iceberg_feeds_dead_letters_survive_snapshot_expiry(fenv: FaultEnv) -> None:
    """Every snapshot but the current one of the table (by pyiceberg, as any engine may) and of its dead-letter
    table (by ``tidemark maintain``, with the files they left) expired: the dead letters are the same set, each
    once, in the listing and in the dead-letter table, and a plan promoted again appends nothing (its rows, not
    the expired snapshots, say it was appended)."""
    from tidemark.config.models import load_feed
    from tidemark.output.iceberg import IcebergPublisher
    from tidemark.output.maintenance import maintain

    fenv.use_iceberg(f"dl.x_{fenv.topic.replace('-', '_')}")
    for _ in range(3):
        produce_with_poison(fenv, 15)
        fenv.run()
    before = assert_exactly_the_oracle(fenv)
    assert len({d.plan_id for d in before}) == 3
    table = IcebergPublisher(load_feed(fenv.feed)).load()
    assert table is not None and table.current_snapshot() is not None
    current = table.current_snapshot().snapshot_id
    older = [s.snapshot_id for s in table.snapshots() if s.snapshot_id != current]
    assert len(older) >= 2
    table.maintenance.expire_snapshots().by_ids(older).commit()
    table = IcebergPublisher(load_feed(fenv.feed)).load()
    assert table is not None and [s.snapshot_id for s in table.snapshots()] == [current]
    dead = IcebergPublisher(load_feed(fenv.feed)).dead_letter_table()
    assert dead is not None and dead.current_snapshot() is not None and len(dead.snapshots()) == 3
    kept = dead.current_snapshot().snapshot_id
    # Tidemark's maintenance expires the dead-letter table's old snapshots too, and removes the files they left.
    fenv.write_feed(maintenance={"keep_snapshots": 1, "snapshot_max_age": "1h", "orphan_min_age": "1h"})
    report = maintain(load_feed(fenv.feed), now=datetime.now(UTC) + timedelta(hours=2))
    assert (report.dead_letter_snapshots_expired, report.dead_letter_orphans_removed > 0) == (2, True), report
    dead = IcebergPublisher(load_feed(fenv.feed)).dead_letter_table()
    assert dead is not None and [s.snapshot_id for s in dead.snapshots()] == [kept]
    after = assert_exactly_the_oracle(fenv)
    assert as_rows(after) == as_rows(before)
    assert assert_the_table_is_the_oracle(fenv) == as_rows(before)
    publisher = IcebergPublisher(load_feed(fenv.feed))
    for plan_id, run_id in {(d.plan_id, d.run_id) for d in before}:
        assert run_id is not None
        count = sum(1 for d in before if d.plan_id == plan_id)
        assert publisher.append_dead_letters(plan_id, run_id, datetime.now(UTC), count) == 0
    assert assert_the_table_is_the_oracle(fenv) == as_rows(before)


def test_an_iceberg_feeds_dead_letter_table_is_appended_once_through_a_crash_between_its_two_commits(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash after the plan's data commit, before its dead letters' append (``iceberg.before_dead_letters``): the
    table holds none of the plan's rows, the listing reads them from the plan's quarantine folder meanwhile, and
    the next run's settle appends them once. A crash after both commits, before the run ledger says ``shown``:
    the next settle enters the promotion again, which appends nothing. Plans published before the feed had a
    dead-letter table are listed from their folders."""
    from tidemark.config.models import load_feed
    from tidemark.output.iceberg import IcebergPublisher

    fenv.use_iceberg(f"dl.c_{fenv.topic.replace('-', '_')}")
    produce_with_poison(fenv, 30)
    crashed = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.in_process(crashed, fenv.kafka.connection)
    monkeypatch.setenv(FAULTS_ENV, "iceberg.before_dead_letters")
    with pytest.raises(InjectedFault):
        commit_run(crashed, fenv.kafka.connection, root=fenv.root)
    monkeypatch.delenv(FAULTS_ENV)
    publisher = IcebergPublisher(load_feed(fenv.feed))
    assert publisher.published(crashed.plan_id) is not None  # the data's commit landed
    assert table_rows(fenv) == Counter()
    first = as_rows(assert_exactly_the_oracle(fenv))  # read from the plan's quarantine folder meanwhile
    assert sum(first.values()) == 9

    # The folder moved away meanwhile: the settle refuses, naming it, rather than append nothing and lose them.
    folder = publisher.quarantine_folder(crashed.plan_id, crashed.run_id).local_path()
    assert folder.parent.name == f"run_id={crashed.run_id}"  # the run's own folder
    aside = folder.with_name(folder.name + ".aside")
    folder.rename(aside)
    refused = rf"plan {crashed.plan_id} .* 9 quarantined records, but its .*plan_id={crashed.plan_id} holds 0: restore"
    with pytest.raises(StuckRunError, match=refused):  # the run stays committed; nothing new is planned
        fenv.run()
    assert table_rows(fenv) == Counter()
    aside.rename(folder)

    handle, _, _ = fenv.run()  # settles the crashed run first: its promotion appends the dead letters
    assert handle.resumed == crashed.plan_id and handle.records == 0
    assert assert_the_table_is_the_oracle(fenv) == first
    assert as_rows(assert_exactly_the_oracle(fenv)) == first

    produce_with_poison(fenv, 15)
    again = fenv.crash_after_table_commit(monkeypatch)  # data and dead letters committed, not yet `shown`
    assert sum(table_rows(fenv).values()) == 15
    handle, _, _ = fenv.run()
    assert handle.resumed == again.plan_id and handle.records == 0
    rows = assert_the_table_is_the_oracle(fenv)
    assert sum(rows.values()) == 15
    assert as_rows(assert_exactly_the_oracle(fenv)) == rows
    fenv.run()  # nothing new
    assert table_rows(fenv) == rows
    dead = publisher.dead_letter_table()
    assert dead is not None
    appends = sorted(str(s.summary.get("tidemark.plan-id")) for s in dead.snapshots() if s.summary is not None)
    assert appends == sorted([crashed.plan_id, again.plan_id])  # one append per plan, naming it

    # Plans published before the feed had a dead-letter table: the listing reads their folders, once each.
    from tidemark.output.iceberg import open_catalog

    open_catalog().drop_table(publisher.dead_letters_name)
    assert table_rows(fenv) == Counter()
    assert as_rows(assert_exactly_the_oracle(fenv)) == rows
    produce_with_poison(fenv, 15)
    newest, _, _ = fenv.run()
    assert {r[:3] for r in table_rows(fenv)} == {(d.topic, d.partition, d.offset) for d in dead_letters(fenv.feed)
                                                 if d.plan_id == newest.plan_id}  # fmt: skip
    assert sum(as_rows(assert_exactly_the_oracle(fenv)).values()) == 15 + sum(table_rows(fenv).values())
    fenv.check("dead-letter table through a crash between its two commits")


@pytest.mark.parametrize("output", ["parquet", "iceberg"])
def test_two_runs_of_one_plan_keep_their_own_quarantine_through_a_refusal(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch, output: str
) -> None:
    """Two runs plan the same ranges (one plan id). Run A stages and dies before its commit; run B stages, commits
    the group and dies before the show. The next run settles A first: its commit is refused and its discard drops
    what A staged, and only that; then B is shown with every one of its dead letters, appended once."""
    from tidemark.config.models import load_feed
    from tidemark.output import publisher_for

    if output == "iceberg":
        fenv.use_iceberg(f"dl.s_{fenv.topic.replace('-', '_')}")
    produce_with_poison(fenv, 30)
    a = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    b = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    assert a.plan_id == b.plan_id and a.run_id != b.run_id
    fenv.in_process(a, fenv.kafka.connection)  # A staged, then its process died before the commit
    fenv.in_process(b, fenv.kafka.connection)
    monkeypatch.setenv(FAULTS_ENV, "commit.before_show")
    with pytest.raises(InjectedFault):
        commit_run(b, fenv.kafka.connection, root=fenv.root)
    monkeypatch.delenv(FAULTS_ENV)
    assert fenv.committed() == {0: 10, 1: 10, 2: 10}

    handle, _, outcome = fenv.run()  # settles A (refused, discarded), then shows B
    assert handle.resumed == b.plan_id and handle.records == 0 and outcome.committed
    store = open_store(root=fenv.root)
    assert [store.run(fenv.group, r).state for r in (a.run_id, b.run_id)] == ["abandoned", "shown"]  # type: ignore[union-attr]
    publisher = publisher_for(load_feed(fenv.feed), b.plan())
    assert publisher.staged(a.plan_id, a.run_id) is None and publisher.staged(b.plan_id, b.run_id) is None
    letters = assert_exactly_the_oracle(fenv)
    assert len(letters) == 9 and {d.run_id for d in letters} == {b.run_id}
    assert assert_the_table_is_the_oracle(fenv) == as_rows(letters)
    fenv.check(f"two runs of one plan ({output})")


def test_abandoning_a_run_stuck_after_its_table_commit_keeps_its_records_and_leaves_nothing_pending(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run crashed between its catalog commit and its dead letters' append, and its quarantine folder is lost: the
    feed is stuck. ``tidemark abandon`` gives it up without an error: its records stay in the table (what is shown
    is never taken back), the run is recorded shown, no pending record is left, and the feed goes on."""
    import shutil

    from tests.faults.harness import GOOD
    from tidemark.cli import main
    from tidemark.config.models import load_feed
    from tidemark.output.iceberg import IcebergPublisher
    from tidemark.storage import Location

    fenv.use_iceberg(f"dl.a_{fenv.topic.replace('-', '_')}")
    produce_with_poison(fenv, 30)
    stuck = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.in_process(stuck, fenv.kafka.connection)
    monkeypatch.setenv(FAULTS_ENV, "iceberg.before_dead_letters")
    with pytest.raises(InjectedFault):
        commit_run(stuck, fenv.kafka.connection, root=fenv.root)
    monkeypatch.delenv(FAULTS_ENV)
    for folder in Path(f"{fenv.output}.quarantine").rglob(f"plan_id={stuck.plan_id}"):
        shutil.rmtree(folder)  # the run's dead letters are lost
    with pytest.raises(StuckRunError, match=f"tidemark abandon {fenv.feed} {stuck.run_id}"):
        fenv.run()

    capsys.readouterr()
    assert main(["abandon", fenv.feed, stuck.run_id, "--reason", "quarantine folder lost"]) == 0
    said = capsys.readouterr().out
    assert f"run {stuck.run_id}" in said and "they stay there" in said and "9 quarantined records" in said
    publisher = IcebergPublisher(load_feed(fenv.feed))
    assert publisher.staged(stuck.plan_id, stuck.run_id) is None
    assert not [n for n, _ in Location.of(f"{fenv.output}.pending").files()]  # no pending record left behind
    assert open_store(root=fenv.root).run(fenv.group, stuck.run_id).state == "shown"  # type: ignore[union-attr]

    produce_with_poison(fenv, 15)
    handle, _, outcome = fenv.run()  # not stuck: the feed goes on from the group
    assert outcome.committed and handle.records == 15 and fenv.committed() == {0: 15, 1: 15, 2: 15}
    expected, kinds = fenv.expect({tp: (0, 15) for tp in fenv.tps()})
    good = fenv.published_by_kind()[GOOD]
    assert good == Counter({r: n for r, n in expected.items() if kinds[r] == GOOD})  # every good record once
    newer = {(d.topic, d.partition, d.offset) for d in dead_letters(fenv.feed)}
    assert newer == {r[:3] for r in oracle_bad(fenv) if r[2] >= 10}  # the lost folder's letters alone are missing
