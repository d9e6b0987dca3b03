"""Fault scenarios for the feed-level rule: every offset at most once in the feed's output, none skipped silently.

Crashes and interleavings of runs of one feed (scheduled, committing replays and
backfills, a cleared old run), on both shapes: local state and output with SQLite
checkpoints, and state and output on S3 with checkpoints in PostgreSQL. Each ends with
the harness's oracle check (:meth:`tests.faults.harness.FaultEnv.check`).
"""

from __future__ import annotations

import pytest

from tests.faults.harness import ON_BOTH_SHAPES, ON_EVERY_SHAPE, FaultEnv, assert_names, scenario
from tidemark.errors import OffsetsMovedError, PlanningError, TidemarkError
from tidemark.faults import FAULTS_ENV, InjectedFault
from tidemark.runs.pipeline import commit_run, plan_run

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.faults]


@scenario("23a", "A crashed run's staged publication, then a committing replay moves the group before the resume",
          injected="a committing replay planned; a scheduled run stages and crashes at commit.before; the "
                   "replay stages and commits; then the next scheduled run",
          asserted="the crashed run's staged publication was never visible; the next run's settling of it is "
                   "refused (a commit_refused event naming the run) and discards it; nothing twice; I1–I4")  # fmt: skip
@ON_BOTH_SHAPES
def test_crashed_staged_run_discarded_when_the_group_moved(fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    fenv.produce(12)
    replay = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root, mode="replay",
                      params={"start_from": "committed", "commit": True})  # fmt: skip
    fenv.produce(6)
    monkeypatch.setenv(FAULTS_ENV, "commit.before")
    with pytest.raises(InjectedFault):
        fenv.run()  # staged [0, 6) on every partition, crashed before committing
    monkeypatch.delenv(FAULTS_ENV)
    assert sum(fenv.published().values()) == 0  # staged, never shown
    fenv.in_process(replay, fenv.kafka.connection)
    commit_run(replay, fenv.kafka.connection, root=fenv.root)
    assert fenv.committed() == {0: 4, 1: 4, 2: 4}
    fenv.produce(3)
    nxt, _, _ = fenv.run()
    assert nxt.resumed is None and fenv.committed() == {0: 7, 1: 7, 2: 7}
    [refused] = fenv.report_events("commit_refused")
    assert_names(refused["message"], "settling run", rf"{fenv.topic}\[0\] plan saw none, group now at 4")
    assert sorted((r["partition"], r["start"], r["end"]) for r in refused["details"]["ranges"]) == [
        (0, 0, 6), (1, 0, 6), (2, 0, 6)
    ]  # fmt: skip
    fenv.check("test_crashed_staged_run_discarded_when_the_group_moved")


@scenario("23b", "Two runs of one feed race; the loser's staged publication is discarded",
          injected="a CLI run and a scheduled run planned from the same offsets (more data in between); both "
                   "jobs stage; the scheduled run commits first",
          asserted="the CLI run's commit is refused naming the writer (a commit_refused event); its publication "
                   "was never visible and is discarded; the next run goes on from the winner's ends; nothing "
                   "twice; I1–I4")  # fmt: skip
@ON_BOTH_SHAPES
def test_racing_runs_loser_discarded(fenv: FaultEnv) -> None:
    fenv.produce(9)
    cli = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.produce(6)
    scheduled = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.in_process(cli, fenv.kafka.connection)
    fenv.in_process(scheduled, fenv.kafka.connection)
    commit_run(scheduled, fenv.kafka.connection, root=fenv.root)
    with pytest.raises(OffsetsMovedError) as refused:
        commit_run(cli, fenv.kafka.connection, root=fenv.root)
    assert_names(str(refused.value), scheduled.run_id, rf"{fenv.topic}\[\d\] plan saw none, group now at 5")
    [event] = fenv.report_events("commit_refused")
    assert_names(event["message"], f"run {cli.run_id} was refused", "discarded")
    fenv.check("test_racing_runs_loser_discarded")
    fenv.produce(3)
    fenv.run()
    assert fenv.committed() == {0: 6, 1: 6, 2: 6}
    fenv.check("test_racing_runs_loser_discarded")


@scenario("23c", "A cleared old DAG run re-runs its job after later runs committed",
          injected="a run planned whose job never ran; two later runs commit; the old run's job and commit run "
                   "again with the old plan",
          asserted="the job refuses to stage (the group moved since planning) naming partition and offsets; "
                   "the commit refuses an unstaged plan; nothing twice; I1–I4")  # fmt: skip
@ON_BOTH_SHAPES
def test_cleared_old_run_does_not_publish(fenv: FaultEnv) -> None:
    fenv.produce(9)
    old = plan_run(fenv.feed, fenv.kafka.connection, root=fenv.root)
    fenv.produce(3)
    fenv.run()
    fenv.produce(3)
    fenv.run()
    with pytest.raises(OffsetsMovedError) as refused:
        fenv.in_process(old, fenv.kafka.connection)
    assert_names(str(refused.value), rf"{fenv.topic}\[\d\] plan saw none, group now at 5", "Nothing was published",
                 "Plan again")  # fmt: skip
    with pytest.raises(TidemarkError, match="was abandoned"):  # the later runs settled it: it never staged
        commit_run(old, fenv.kafka.connection, root=fenv.root)
    fenv.check("test_cleared_old_run_does_not_publish")


@scenario("23d", "Committing replays and backfills that would skip or rewind",
          injected="a committing replay from an offset past the committed one, with and without allow_gap; a "
                   "committing replay rewinding by shift_by; a committing replay from the committed offset",
          asserted="the gap and the rewind are refused naming topic, partition and offsets; with allow_gap the "
                   "skipped range is an offsets_skipped event and the only records missing from the output; the "
                   "committing replay publishes into the feed's output; I1–I4")  # fmt: skip
@ON_EVERY_SHAPE
def test_committing_replays_skip_and_rewind(fenv: FaultEnv) -> None:
    fenv.produce(9)
    fenv.run()
    fenv.produce(9)
    with pytest.raises(PlanningError) as gap:
        fenv.run("replay", {"start_from": "offset", "start_offset": 4, "commit": True})
    assert_names(str(gap.value), rf"{fenv.topic}\[0\] \[3, 4\)", "allow_gap")
    with pytest.raises(PlanningError) as rewind:
        fenv.run("replay", {"start_from": "shift_by", "shift_by": -1, "commit": True})
    assert_names(str(rewind.value), rf"{fenv.topic}\[0\] starts at 2, the group is at 3", "without commit")
    assert fenv.committed() == {0: 3, 1: 3, 2: 3}
    fenv.run("replay", {"start_from": "committed", "end_at": "offset", "end_offset": 4, "commit": True})
    assert fenv.committed() == {0: 4, 1: 4, 2: 4}
    fenv.check("test_committing_replays_skip_and_rewind")
    fenv.run("replay", {"start_from": "offset", "start_offset": 5, "commit": True, "allow_gap": True})
    assert fenv.committed() == {0: 6, 1: 6, 2: 6}
    skipped = fenv.report_events("offsets_skipped")
    assert sorted((e["partition"], e["details"]["start"], e["details"]["end"]) for e in skipped) == [
        (0, 4, 5), (1, 4, 5), (2, 4, 5)
    ]  # fmt: skip
    # The oracle from 5 on, and [0, 4) as it was: offset 4 is the skipped one, named by the events.
    fenv.check("test_committing_replays_skip_and_rewind", starts={0: 5, 1: 5, 2: 5})
    published = {(r[1], r[2]) for r in fenv.published()}
    assert {(p, o) for p in range(3) for o in range(4)} <= published and not any(o == 4 for _, o in published)
