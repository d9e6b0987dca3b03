"""A publishing re-drive (:func:`tidemark.runs.redrive.redrive_feed`) against the real cluster.

A feed of string values with one regex rule gets poison records of two kinds (bytes that
are not UTF-8 do not decode; ``x-…`` values the rule refuses) among good ones and
tombstones; then the rule is fixed to take ``x-…`` too. The expectation comes from an
independent ``read_committed`` scan of the committed offsets classified under the *fixed*
rule by the fault suite's oracle (:meth:`tests.faults.harness.FaultEnv.classifier`), not by
Tidemark: after a re-drive the feed's good output must be exactly that good set, each
record once (the first runs' good records plus the re-driven ones), whatever crashes,
second re-drives and normal runs come between. An Iceberg feed's dead-letter table, read
through pyiceberg's own catalog, holds every record the oracle classified as bad when it
was read, once: a re-drive appends nothing to it and takes nothing out (the listing leaves
out what a re-drive published).
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import S3_BUCKET, KafkaTestCluster
from tests.faults.harness import GOOD, QUARANTINED, FaultEnv, Row, digest, scan
from tests.support.poison import produce_with_poison, table_rows
from tidemark.faults import FAULTS_ENV, InjectedFault
from tidemark.output.deadletters import dead_letters
from tidemark.runs.redrive import redrive_feed
from tidemark.runs.report import load_report
from tidemark.runs.run import open_checkpoints

pytestmark = [pytest.mark.integration, pytest.mark.spark]

FIXED_RULE = {
    "on_bad_records": "quarantine", "quarantine_max_ratio": 0.5,
    "expectations": [{"type": "expect_column_values_to_match_regex", "kwargs": {"column": "value", "regex": "^[vx]-"}}],
}  # fmt: skip


@pytest.fixture
def fenv(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         request: pytest.FixtureRequest) -> FaultEnv:  # fmt: skip
    env = FaultEnv(kafka, spark, tmp_path, request.node.name)
    env.install(monkeypatch)
    return env


def oracle(env: FaultEnv) -> dict[str, Counter[Row]]:
    """The committed records by the oracle's kind under the feed file's rule now, from a read_committed scan."""
    ranges = {(env.topic, p): (0, c or 0) for p, c in env.committed().items()}
    kind = env.classifier()
    out: dict[str, Counter[Row]] = {GOOD: Counter(), QUARANTINED: Counter()}
    for row, value in scan(env.kafka.connection, ranges):
        out[kind(value)][row] += 1
    return out


def good_output(env: FaultEnv) -> Counter[Row]:
    return env.published_by_kind()[GOOD]


def assert_output_is_the_oracles_good_set(env: FaultEnv) -> None:
    got, want = good_output(env), oracle(env)[GOOD]
    assert [r for r, n in got.items() if n > 1] == [], "a record is in the feed's output twice"
    assert set(got) == set(want)


def x_rows(env: FaultEnv, letters: list[Any]) -> set[Row]:
    return {(d.topic, d.partition, d.offset, digest(d.value)) for d in letters if d.value.startswith(b"x-")}


@pytest.fixture
def s3_fenv(kafka: KafkaTestCluster, spark: Any, s3: Any, postgres: str, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> FaultEnv:  # fmt: skip
    """The deployment shape: state and output on the S3 server, the checkpoint store (and run ledger) in PostgreSQL."""
    monkeypatch.setenv("TIDEMARK_CHECKPOINT_URL", postgres)
    env = FaultEnv(kafka, spark, tmp_path, "redrive-s3", remote=f"s3://{S3_BUCKET}/redrive-{uuid.uuid4().hex[:12]}")
    env.install(monkeypatch)
    return env


@pytest.mark.parametrize("output", ["parquet", "iceberg", "parquet-s3"])
def test_a_redrive_publishes_exactly_the_records_the_fixed_rule_passes_once(
    request: pytest.FixtureRequest, output: str
) -> None:
    fenv: FaultEnv = request.getfixturevalue("s3_fenv" if output == "parquet-s3" else "fenv")
    if output == "iceberg":
        fenv.use_iceberg(f"rd.t_{fenv.topic.replace('-', '_')}")
    produce_with_poison(fenv, 30)
    fenv.run()
    before = dead_letters(fenv.feed)
    assert len(before) == 9  # 6 undecodable, 3 refused by the rule
    passing = x_rows(fenv, before)
    assert len(passing) == 3
    good_before = good_output(fenv)
    assert set(good_before) == set(oracle(fenv)[GOOD])
    table = table_rows(fenv) if output == "iceberg" else Counter()
    if output == "iceberg":
        assert table == Counter(set(oracle(fenv)[QUARANTINED]))  # each once

    fenv.write_feed(validation=FIXED_RULE)
    first = redrive_feed(fenv.spark, fenv.feed, root=fenv.root)
    assert (first.state, first.published, first.passing) == ("shown", 3, 3)
    assert good_output(fenv) == good_before + Counter(passing)  # exactly them, once
    assert_output_is_the_oracles_good_set(fenv)
    # The rest keep their new reason; the re-driven ones are listed only when asked for.
    left = dead_letters(fenv.feed)
    assert len(left) == 6 and all(d.reason_codes == ("decode_error",) and d.rechecked_by == first.run_id
                                  for d in left)  # fmt: skip
    # The view reads the same table through its own store: the six left, by reason, with their examples.
    from fastapi.testclient import TestClient

    from tidemark.config.models import load_feed
    from tidemark.web.app import create_app

    view = TestClient(create_app(feeds=lambda: {fenv.feed: load_feed(fenv.feed)},
                                 connection=lambda: fenv.kafka.connection,
                                 checkpoints=lambda: open_checkpoints(fenv.root))).get(
        f"/api/feeds/{fenv.feed}/deadletters").json()  # fmt: skip
    assert view["records"] == 6 and {g["reason"] for g in view["groups"]} == {"decode_error"}
    assert all(e["rechecked_by"] == first.run_id for g in view["groups"] for e in g["examples"])
    every = dead_letters(fenv.feed, redriven_too=True)
    assert {(d.topic, d.partition, d.offset, digest(d.value)) for d in every if d.redriven_by} == passing
    report = load_report(str(first.run_id), fenv.feed, root=fenv.root)
    assert report.status == "succeeded" and report.mode == "redrive"
    assert report.counts["published"] == 3 and report.events[-1]["details"]["redrive_id"] == first.redrive_id

    second = redrive_feed(fenv.spark, fenv.feed, root=fenv.root)
    assert (second.state, second.published, second.passing) == ("shown", 0, 0)
    assert good_output(fenv) == good_before + Counter(passing)
    if output == "iceberg":
        assert table_rows(fenv) == table  # the re-drives appended nothing to the dead-letter table

    # A normal run beside: new records under the fixed rule, the output still the oracle's good set once.
    produce_with_poison(fenv, 15)
    fenv.run()
    assert_output_is_the_oracles_good_set(fenv)
    assert {(d.topic, d.partition, d.offset) for d in dead_letters(fenv.feed)} == {
        r[:3] for r in oracle(fenv)[QUARANTINED]
    }
    if output == "iceberg":  # the re-driven rows stay in the table, each once; the listing leaves them out
        assert table_rows(fenv) == Counter(set(oracle(fenv)[QUARANTINED]) | passing)


@pytest.mark.parametrize(
    ("point", "output"),
    [("redrive.after_stage", "parquet"), ("commit.after_show", "parquet"), ("redrive.after_stage", "iceberg"),
     ("commit.after_show", "iceberg")],
)  # fmt: skip
def test_a_crash_during_a_redrive_leaves_nothing_twice(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch, point: str, output: str
) -> None:
    """The re-drive dies after staging (nothing shown) or after showing its records but before its ledger row says
    so; a normal run comes between and settles it as any open run of the feed; the next re-drive publishes nothing
    more."""
    if output == "iceberg":
        fenv.use_iceberg(f"rc.t_{fenv.topic.replace('-', '_')}")
    produce_with_poison(fenv, 30)
    fenv.run()
    good_before = good_output(fenv)
    passing = x_rows(fenv, dead_letters(fenv.feed))
    fenv.write_feed(validation=FIXED_RULE)

    monkeypatch.setenv(FAULTS_ENV, point)
    with pytest.raises(InjectedFault):
        redrive_feed(fenv.spark, fenv.feed, root=fenv.root)
    monkeypatch.delenv(FAULTS_ENV)
    if point == "redrive.after_stage":
        assert good_output(fenv) == good_before  # staged, not shown
        assert x_rows(fenv, dead_letters(fenv.feed)) == passing
    else:
        assert good_output(fenv) == good_before + Counter(passing)  # shown: the listing leaves them out already
        assert x_rows(fenv, dead_letters(fenv.feed)) == set()

    produce_with_poison(fenv, 15)
    fenv.run()  # a normal run of the feed: it settles the open re-drive first, as any open run
    assert open_checkpoints(fenv.root).open_runs(fenv.feed) == []
    assert good_output(fenv) - good_before >= Counter(passing)
    again = redrive_feed(fenv.spark, fenv.feed, root=fenv.root)
    assert (again.settled_first, again.state, again.published, again.passing) == ((), "shown", 0, 0)
    assert_output_is_the_oracles_good_set(fenv)
    third = redrive_feed(fenv.spark, fenv.feed, root=fenv.root)
    assert (third.settled_first, third.published) == ((), 0)
    assert_output_is_the_oracles_good_set(fenv)
    if output == "iceberg":  # each dead letter once, the re-driven ones kept; the crashed re-drive appended nothing
        assert table_rows(fenv) == Counter(set(oracle(fenv)[QUARANTINED]) | passing)


def test_two_redrives_staged_at_once_over_overlapping_dead_letters_show_each_letter_once(fenv: FaultEnv) -> None:
    """Two re-drives chose before either showed: one took all three passing dead letters, the other two of them
    (another id). Whichever shows first wins; the other is given up and its staged copy discarded."""
    from tidemark.config.models import load_feed
    from tidemark.job.redrive import recheck, stage_passing
    from tidemark.output import publisher_for
    from tidemark.output.deadletters import RedriveRecord
    from tidemark.planning.plan import PLAN_FILE, redrive_plan, write_plan
    from tidemark.runs.protocol import settle
    from tidemark.runs.run import run_dir_for

    produce_with_poison(fenv, 30)
    fenv.run()
    good_before = good_output(fenv)
    fenv.write_feed(validation=FIXED_RULE)
    feed = load_feed(fenv.feed)
    store, publisher = open_checkpoints(fenv.root), publisher_for(feed)
    checked = recheck(fenv.spark, feed, dead_letters(feed, store=store))
    everything = tuple(sorted(v.letter.key_of for v in checked.passing))
    assert len(everything) == 3
    runs = []
    for run_id, taken in (("20990101T000000000000Z-aaaaaaaa", everything),
                          ("20990101T000000000001Z-bbbbbbbb", everything[:2])):  # fmt: skip
        plan = redrive_plan(feed.name, feed.group, feed.isolation, taken, "now")
        run_dir = run_dir_for(feed.name, run_id, fenv.root)
        run_dir.mkdir()
        write_plan(plan, run_dir / PLAN_FILE)
        store.plan_redrive(feed.group, run_id, feed=feed.name, plan_id=plan.plan_id, run_dir=str(run_dir),
                           record=RedriveRecord(plan.plan_id, run_id, feed.name, taken).to_json())  # fmt: skip
        narrowed = type(checked)(tuple(v for v in checked.verdicts if not v.passes or v.letter.key_of in taken),
                                 checked.frame.where(  # type: ignore[union-attr]
                                     " OR ".join(f"(partition = {k[2]} AND offset = {k[3]})" for k in taken)),
                                 checked.codes)  # fmt: skip
        stage_passing(narrowed, plan, feed, publisher, run_id=run_id, extra={})
        runs.append((plan, run_id, str(run_dir)))

    with store.commit_lock(feed.group):
        first, second = (settle(plan, run_id, run_dir, publisher=publisher, store=store, kafka=None)
                         for plan, run_id, run_dir in runs)  # fmt: skip
    assert (first.state, second.state) == ("shown", "abandoned")
    assert "published by re-drive" in second.events[-1].message
    assert publisher.staged(runs[1][0].plan_id, runs[1][1]) is None  # its staged copy is gone
    assert good_output(fenv) == good_before + Counter(x_rows(fenv, dead_letters(fenv.feed, redriven_too=True)))
    assert_output_is_the_oracles_good_set(fenv)


def test_a_redrive_whose_staging_fails_is_given_up_and_the_next_one_publishes_its_records_once(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidemark.errors import PublishError
    from tidemark.runs import redrive as module
    from tidemark.runs.report import load_report

    produce_with_poison(fenv, 30)
    fenv.run()
    good_before = good_output(fenv)
    passing = x_rows(fenv, dead_letters(fenv.feed))
    fenv.write_feed(validation=FIXED_RULE)

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise PublishError("the output's store refused the upload")

    with monkeypatch.context() as broken:
        broken.setattr(module, "stage_passing", refused)
        with pytest.raises(PublishError):
            redrive_feed(fenv.spark, fenv.feed, root=fenv.root)
    [failed] = [r for r in (fenv.root / "runs" / fenv.feed).iterdir() if (r / "redrive.json").exists()]
    assert "refused the upload" in str(load_report(failed.name, fenv.feed, root=fenv.root).error)
    again = redrive_feed(fenv.spark, fenv.feed, root=fenv.root)
    assert (again.settled_first, again.published) == ((), 3)  # the failed one was given up, not left open
    assert good_output(fenv) == good_before + Counter(passing)


def test_a_redrive_submitted_to_a_spark_cluster_publishes_the_passing_records_once(
    fenv: FaultEnv, spark_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The re-check and the staging as ``spark-submit`` jobs on a standalone cluster, as ``tidemark redrive --master``
    and the DAG submit them: exactly the records the fixed rule passes, once; the staging job's log in the run dir,
    and a connection's secret only in the private file, never on the command line or in the log."""
    from tidemark.config.models import load_feed
    from tidemark.job.redrive_job import RedriveJob
    from tidemark.runs.submit import redrive_submitter

    produce_with_poison(fenv, 30)
    fenv.run()
    good_before = good_output(fenv)
    passing = x_rows(fenv, dead_letters(fenv.feed))
    fenv.write_feed(validation=FIXED_RULE)
    secret = f"tm-{uuid.uuid4().hex}"
    monkeypatch.setenv("TIDEMARK_SCHEMA_REGISTRY_PASSWORD", secret)  # a string feed's job never uses it: it travels
    job = RedriveJob(redrive_submitter(load_feed(fenv.feed), master=spark_cluster.master_url))
    first = redrive_feed(job, fenv.feed, root=fenv.root)
    assert (first.state, first.published, first.passing) == ("shown", 3, 3)
    assert good_output(fenv) == good_before + Counter(passing)
    assert_output_is_the_oracles_good_set(fenv)
    log = (fenv.root / "runs" / fenv.feed / str(first.run_id) / "spark-submit.log").read_text()
    command, *logged = log.split("\n")
    assert f"--master {spark_cluster.master_url}" in command
    job, flag, _folder = command.split()[-3:]
    assert job.endswith("spark_jobs/tidemark_redrive.py") and flag == "--work"
    assert "tidemark re-drive job failed" not in "\n".join(logged) and secret not in log
    again = redrive_feed(fenv.spark, fenv.feed, root=fenv.root)
    assert (again.published, again.passing) == (0, 0)
    assert good_output(fenv) == good_before + Counter(passing)


def test_a_redrive_job_that_fails_after_staging_is_settled_by_the_next_redrive_once(
    fenv: FaultEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The staging job staged, then its ``spark-submit`` failed: the re-drive's row stays ``planned`` with its
    publication pending (as after a crash there); the next re-drive settles it first (as the feed's next run would),
    once."""
    from tidemark.config.models import load_feed
    from tidemark.job import redrive_job
    from tidemark.job.redrive_job import REQUEST_FILE, RedriveJob, RedriveJobError
    from tidemark.output import publisher_for

    produce_with_poison(fenv, 30)
    fenv.run()
    good_before = good_output(fenv)
    passing = x_rows(fenv, dead_letters(fenv.feed))
    fenv.write_feed(validation=FIXED_RULE)

    def dies_after_staging(folder: Path, records: int) -> None:  # the job in this process, on the tests' session
        assert redrive_job.main(["--work", str(folder)]) == 0
        if '"stage"' in (folder / REQUEST_FILE).read_text():
            raise RuntimeError("spark-submit was killed")

    with pytest.raises(RedriveJobError, match="spark-submit was killed"):
        redrive_feed(RedriveJob(dies_after_staging), fenv.feed, root=fenv.root)
    [row] = open_checkpoints(fenv.root).open_runs(fenv.feed)
    assert row.state == "planned"
    publisher = publisher_for(load_feed(fenv.feed))
    assert publisher.staged(row.plan_id, row.run_id) is not None  # staged, not shown
    assert good_output(fenv) == good_before

    again = redrive_feed(fenv.spark, fenv.feed, root=fenv.root)
    assert again.settled_first == (row.run_id,) and (again.published, again.passing) == (0, 0)
    assert good_output(fenv) == good_before + Counter(passing)
    assert_output_is_the_oracles_good_set(fenv)
