"""Whole runs against the real cluster: offsets move only after a successful publish.

Each test asserts the group's committed offsets and the published rows afterwards.
Most runs execute the Spark job in the test session (same code as ``spark-submit``);
one goes through ``tidemark run`` and ``spark-submit`` exactly as a user would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import KafkaTestCluster
from tests.integration.read_helpers import run_job_in_process
from tidemark.errors import TidemarkError, ValidationFailedError
from tidemark.kafka.admin import Record
from tidemark.kafka.connection import KafkaConnection
from tidemark.runs.pipeline import RunHandle, commit_run, plan_run, run_feed

pytestmark = [pytest.mark.integration, pytest.mark.spark]


class Env:
    """A feeds folder, a state dir and a topic for one test."""

    def __init__(self, kafka: KafkaTestCluster, tmp_path: Path, spark: Any) -> None:
        self.kafka = kafka
        self.spark = spark
        self.root = tmp_path / "state"
        self.feeds = tmp_path / "feeds"
        self.feeds.mkdir()
        self.topic = kafka.new_topic(partitions=3, prefix="pipe")
        self.group = f"g-pipe-{uuid.uuid4().hex[:8]}"
        self.output = tmp_path / "out"
        self.sent = 0
        self.write_feed()

    def write_feed(self, **overrides: Any) -> None:
        doc: dict[str, Any] = {
            "topics": [self.topic],
            "group": self.group,
            "records_per_task": 50,
            "deserialization": {"format": "json", "fields": [{"name": "n", "type": "integer"}]},
            "output": str(self.output),
            "validation": {"on_bad_records": "quarantine", "quarantine_max_ratio": 0.3},
        }
        doc.update(overrides)
        (self.feeds / "pipe.yaml").write_text(yaml.safe_dump(doc))

    def produce(self, count: int, bad: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        records = []
        for i in range(self.sent, self.sent + count):
            value = b"{broken" if i in bad else json.dumps({"n": i}).encode()
            records.append(Record(value=value, key=f"k{i}".encode(), partition=i % 3))
        self.sent += count
        self.kafka.produce(self.topic, records)

    def committed(self) -> dict[int, int | None]:
        tps = [(self.topic, p) for p in range(3)]
        return {p: c.offset for (_, p), c in self.kafka.adapter.committed(self.group, tps).items()}

    def published_rows(self) -> list[tuple[int, int]]:
        """(partition, offset) of every good row across all published plans."""
        import pyarrow.parquet as pq

        rows = []
        for plan_dir in sorted(self.output.glob("plan_id=*")):
            for part in plan_dir.glob("topic=*/**/*.parquet"):
                table = pq.read_table(part, columns=["partition", "offset"])
                rows.extend(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True))
        return sorted(rows)

    def in_process(self, handle: RunHandle, connection: KafkaConnection) -> dict[str, Any]:
        return run_job_in_process(self.spark, handle, connection)

    def run(self) -> tuple[RunHandle, dict[str, Any], Any]:
        return run_feed("pipe", self.kafka.connection, root=self.root, job_runner=self.in_process)


@pytest.fixture
def env(kafka: KafkaTestCluster, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch) -> Env:
    e = Env(kafka, tmp_path, spark)
    monkeypatch.setenv("TIDEMARK_FEEDS_DIR", str(e.feeds))
    monkeypatch.setenv("TIDEMARK_STATE_DIR", str(e.root))
    return e


@pytest.mark.parametrize(
    ("case", "reader"),
    [("small", "driver"), ("driver_rdd", "driver"), ("data_source", "data_source"), ("over_bytes", "data_source")],
)
def test_clean_run_commits_planned_ends_and_a_second_run_reads_nothing(
    env: Env, case: str, reader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if case == "data_source":  # small plans are read by the driver unless the feed says otherwise
        env.write_feed(driver_read_max_records=0)
    if case == "driver_rdd":  # the driver's batches reach Spark as an RDD, as larger plans' do
        monkeypatch.setattr("tidemark.spark.source.LOCAL_RELATION_MAX_RECORDS", 10)
    if case == "over_bytes":  # records too large to hold in the driver: the executors read them
        monkeypatch.setattr("tidemark.spark.source.DRIVER_READ_MAX_BYTES", 100)
    env.produce(30, bad={7})
    handle, job, outcome = env.run()
    assert job["reader"] == reader
    plan = handle.plan()
    assert outcome.committed
    assert env.committed() == {p.partition: p.end for p in plan.partitions}
    assert sum(env.committed().values()) == 30  # type: ignore[arg-type]
    assert job["records_read"] == 30 and job["records_quarantined"] == 1
    good = env.published_rows()
    assert len(good) == 29 and len(set(good)) == 29

    again, job2, outcome2 = env.run()
    assert again.records == 0 and job2["records_read"] == 0
    assert outcome2.committed
    assert env.published_rows() == good  # nothing new, nothing duplicated
    assert sum(env.committed().values()) == 30  # type: ignore[arg-type]


def _no_spark(handle: RunHandle, connection: KafkaConnection) -> dict[str, Any]:
    raise AssertionError(f"plan {handle.plan_id} has {handle.records} records; an empty plan must not start Spark")


def test_empty_plan_starts_no_spark_and_recommits_idle_partitions(env: Env) -> None:
    from tidemark.planning.metadata import metadata_run_id

    env.produce(6)
    env.run()
    handle, job, outcome = run_feed("pipe", env.kafka.connection, root=env.root, job_runner=_no_spark)

    assert handle.records == 0 and job["spark_skipped"] and job["published"]
    assert outcome.committed
    got = env.kafka.adapter.committed(env.group, [(env.topic, p) for p in range(3)])
    assert {tp[1]: c.offset for tp, c in got.items()} == {0: 2, 1: 2, 2: 2}
    assert {metadata_run_id(c.metadata) for c in got.values()} == {handle.run_id}  # refreshed by this run
    report = json.loads(Path(outcome.report_path).read_text())
    assert report["status"] == "succeeded" and report["counts"]["planned"] == 0

    env.write_feed(validation={"on_bad_records": "quarantine", "expect_records": True})
    with pytest.raises(ValidationFailedError, match=r"no records .*expect_records"):
        run_feed("pipe", env.kafka.connection, root=env.root, job_runner=_no_spark)
    assert {tp[1]: c.offset for tp, c in env.kafka.adapter.committed(env.group, list(got)).items()} == {
        0: 2, 1: 2, 2: 2,
    }  # fmt: skip


def test_validation_failure_leaves_offsets_then_a_fixed_feed_commits(env: Env) -> None:
    env.produce(12)
    env.run()
    before = env.committed()
    env.produce(9, bad={13, 14})
    env.write_feed(validation={"on_bad_records": "fail"})
    with pytest.raises(ValidationFailedError, match=r"pipe|decode|bad"):
        env.run()
    assert env.committed() == before
    env.write_feed()  # back to quarantine: the same records now pass
    _, job, outcome = env.run()
    assert outcome.committed and job["records_quarantined"] == 2
    assert sum(env.committed().values()) == 21  # type: ignore[arg-type]
    assert len(env.published_rows()) == 19


def test_a_record_breaking_eight_rules_is_quarantined_with_every_reason(env: Env) -> None:
    """Eight broken rules make a reason longer than a file name may be: it must not name a folder."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from tests.integration.read_helpers import consume_independently

    fields = [f"f{i}" for i in range(8)]
    env.write_feed(
        deserialization={
            "format": "json", "fields": [{"name": f, "type": "string", "required": False} for f in fields],
        },
        validation={
            "on_bad_records": "quarantine", "quarantine_max_ratio": 0.3,
            "expectations": [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": f}}
                             for f in fields],
        },
    )  # fmt: skip
    values = {i: json.dumps({f: f"{f}-{i}" for f in fields}).encode() for i in range(12)}
    values[4] = b"{}"
    env.kafka.produce(env.topic, [Record(value=v, key=f"k{i}".encode(), partition=i % 3) for i, v in values.items()])

    handle, job, outcome = env.run()

    plan = handle.plan()
    assert outcome.committed and env.committed() == {p.partition: p.end for p in plan.partitions}
    truth = {(part, offset): value for _, part, offset, _, value in consume_independently(env.kafka.connection, plan)}
    assert len(truth) == 12
    (plan_dir,) = env.output.glob("plan_id=*")
    quarantine = ds.dataset(str(plan_dir / "_quarantine"), format="parquet", partitioning="hive", ignore_prefixes=["."])
    bad = quarantine.to_table().to_pylist()
    assert [((r["partition"], r["offset"]), r["_raw_value"]) for r in bad] == [((1, 1), b"{}")]
    assert bad[0]["_reason"] == "; ".join(f"expect_column_values_to_not_be_null({f})" for f in fields)
    good = [r for f in sorted(plan_dir.glob("topic=*/**/*.parquet")) for r in pq.read_table(f).to_pylist()]
    pairs = [(r["partition"], r["offset"]) for r in good]
    assert sorted([*pairs, (1, 1)]) == sorted(truth)  # every offset once: published, or quarantined
    assert all({f: r[f] for f in fields} == json.loads(truth[r["partition"], r["offset"]]) for r in good)
    assert job["records_published"] == 11 and job["records_quarantined"] == 1


def test_sink_failure_leaves_offsets_and_rerun_publishes_once(env: Env) -> None:
    env.produce(15)
    env.output.parent.mkdir(parents=True, exist_ok=True)
    env.output.write_text("a file where the output folder should be")
    with pytest.raises(Exception, match=r".+"):
        env.run()
    assert env.committed() == {0: None, 1: None, 2: None}
    env.output.unlink()
    env.run()
    assert sorted(env.committed().items()) == [(0, 5), (1, 5), (2, 5)]
    rows = env.published_rows()
    assert rows == sorted((i % 3, i // 3) for i in range(15))
    # The failed run shares its plan id with the rerun that published: it is not left
    # "published, not committed" for the next run to finish (and be refused on).
    again, _, outcome = env.run()
    assert again.resumed is None and again.records == 0 and outcome.committed
    assert env.published_rows() == rows


def test_crash_between_publish_and_commit_is_finished_by_the_next_run(env: Env) -> None:
    env.produce(9)
    handle = plan_run("pipe", env.kafka.connection, root=env.root)
    env.in_process(handle, env.kafka.connection)  # staged for publication ... and the process dies here
    assert env.committed() == {0: None, 1: None, 2: None}
    assert env.published_rows() == []  # staged, not shown: the group has not committed it

    env.produce(3)
    nxt = plan_run("pipe", env.kafka.connection, root=env.root)
    assert nxt.resumed == handle.plan_id  # the staged run was committed and shown first
    assert env.published_rows() == sorted((i % 3, i // 3) for i in range(9))
    assert {p.partition: p.start for p in nxt.plan().partitions} == {0: 3, 1: 3, 2: 3}
    env.in_process(nxt, env.kafka.connection)
    commit_run(nxt, env.kafka.connection, root=env.root)
    assert env.committed() == {0: 4, 1: 4, 2: 4}
    assert env.published_rows() == sorted((i % 3, i // 3) for i in range(12))


def test_commit_refuses_unpublished_run(env: Env) -> None:
    env.produce(3)
    handle = plan_run("pipe", env.kafka.connection, root=env.root)
    with pytest.raises(TidemarkError, match="has not staged"):
        commit_run(handle, env.kafka.connection, root=env.root)
    assert env.committed() == {0: None, 1: None, 2: None}


def test_tidemark_run_cli_through_spark_submit(env: Env) -> None:
    from tidemark.spark.session import CLASS_ARCHIVE_ENV, SMALL_RUN_JAVA_OPTIONS, class_archive_path

    env.produce(6, bad={2})
    cds_log = env.root / "cds.log"  # the driver JVM's class-data sharing, logged to a file
    options = f"{SMALL_RUN_JAVA_OPTIONS} -Xlog:cds=info:file={cds_log}"
    cli_env = {**os.environ, **env.kafka.connection.to_env(), "TIDEMARK_SMALL_RUN_JAVA_OPTIONS": options}
    archive = class_archive_path(Path(os.environ[CLASS_ARCHIVE_ENV]))  # the suite's, shared by every test
    archived = archive.exists()
    proc = subprocess.run(
        [sys.executable, "-m", "tidemark.cli", "run", "pipe"], env=cli_env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The driver started from the class archive, or (the suite's first small run) wrote it.
    if archived:
        cds = cds_log.read_text()
        assert f"Opened archive {archive}." in cds and "Mapped dynamic region" in cds
    assert archive.stat().st_size > 0 and not list(archive.parent.glob(f"{archive.name}.*.tmp"))
    assert "validated passed: 5 good, 1 quarantined" in proc.stdout
    assert f"output    {env.output}" in proc.stdout
    assert sorted(env.committed().items()) == [(0, 2), (1, 2), (2, 2)]
    runs = subprocess.run(
        [sys.executable, "-m", "tidemark.cli", "runs", "pipe"], env=cli_env, capture_output=True, text=True, check=False
    )
    assert runs.returncode == 0 and "succeeded" in runs.stdout

    idle = subprocess.run(
        [sys.executable, "-m", "tidemark.cli", "run", "pipe"], env=cli_env, capture_output=True, text=True, check=False
    )
    assert idle.returncode == 0, idle.stdout + idle.stderr
    assert "no Spark application started" in idle.stdout
    newest = sorted((env.root / "runs" / "pipe").iterdir())[-1]
    assert not (newest / "spark-submit.log").exists()
    assert sorted(env.committed().items()) == [(0, 2), (1, 2), (2, 2)]


# -- events of real runs: in the report and in the run's log -------------------------------


def _run_logged(env: Env) -> tuple[RunHandle, Any, list[str]]:
    """A run whose progress lines (what ``tidemark run`` prints and the Airflow tasks log) are kept."""
    lines: list[str] = []
    handle, _, outcome = run_feed(
        "pipe", env.kafka.connection, root=env.root, job_runner=env.in_process, progress=lines.append
    )
    return handle, outcome, lines


def _reported(outcome: Any, kind: str) -> list[dict[str, Any]]:
    report = json.loads(Path(outcome.report_path).read_text())
    return [e for e in report["events"] if e["kind"] == kind]


def test_aborted_transactions_inside_a_range_are_gap_events_in_the_report_and_the_log(env: Env) -> None:
    from tests.integration.read_helpers import consume_independently, produce_transactions

    def batch(first: int) -> list[bytes]:
        return [json.dumps({"n": n}).encode() for n in range(first, first + 4)]

    # offsets 0-3 committed, 4 marker, 5-8 aborted, 9 marker, 10-13 committed, 14 marker
    produce_transactions(env.kafka.connection, env.kafka.adapter, env.topic,
                         [(batch(0), True), (batch(4), False), (batch(8), True)])  # fmt: skip

    handle, outcome, lines = _run_logged(env)

    assert outcome.committed and env.committed()[0] == 15
    truth = [(p, o) for _, p, o, _, _ in consume_independently(env.kafka.connection, handle.plan())]
    assert truth == [(0, o) for o in (0, 1, 2, 3, 10, 11, 12, 13)]
    assert env.published_rows() == truth  # what read_committed sees, once; nothing aborted
    [gap] = _reported(outcome, "gap")
    assert (gap["topic"], gap["partition"]) == (env.topic, 0)
    assert {k: gap["details"][k] for k in ("start", "end", "gaps", "records")} == {
        "start": 0, "end": 15, "gaps": 7, "records": 8,
    }  # fmt: skip
    report = json.loads(Path(outcome.report_path).read_text())
    assert report["gaps"][f"{env.topic}[0]"] == 7
    assert any(f"event gap: {env.topic}[0] offsets [0, 15): 7 of 15 offsets hold no record" in line
               for line in lines), lines  # fmt: skip


@pytest.mark.parametrize(("policy", "start"), [("earliest", 0), ("latest", 2)])
def test_a_group_without_offsets_is_a_reset_event_in_the_report_and_the_log(env: Env, policy: str, start: int) -> None:
    from tests.integration.read_helpers import consume_independently

    env.write_feed(on_missing=policy)
    env.produce(6)

    handle, outcome, lines = _run_logged(env)

    assert outcome.committed and env.committed() == {0: 2, 1: 2, 2: 2}
    events = _reported(outcome, "reset")
    assert sorted((e["topic"], e["partition"], e["details"]["offset"]) for e in events) == [
        (env.topic, p, start) for p in range(3)
    ]
    for p in range(3):
        message = f"{env.topic}[{p}] has no committed offset and no checkpoint: reset policy {policy} starts at {start}"
        assert any(f"event reset: {message}" in line for line in lines), lines
    truth = [(p, o) for _, p, o, _, _ in consume_independently(env.kafka.connection, handle.plan())]
    assert env.published_rows() == truth == sorted((p, o) for p in range(3) for o in range(start, 2))


def test_records_deleted_past_the_committed_offset_are_a_data_loss_event_in_the_report_and_the_log(
    env: Env,
) -> None:
    from tests.integration.read_helpers import consume_independently, plan_for

    env.write_feed(on_data_loss="skip")
    env.produce(30)
    env.run()
    env.produce(30)
    assert env.kafka.adapter.delete_records({(env.topic, 1): 15}) == {(env.topic, 1): 15}  # committed: 10

    handle, outcome, lines = _run_logged(env)

    assert outcome.committed and env.committed() == {0: 20, 1: 20, 2: 20}
    [loss] = _reported(outcome, "data_loss")
    assert (loss["topic"], loss["partition"], loss["details"]["lost_start"], loss["details"]["lost_end"]) == (
        env.topic, 1, 10, 15,
    )  # fmt: skip
    assert any(f"event data_loss: {env.topic}[1]: records [10, 15) were deleted before being read" in line
               for line in lines), lines  # fmt: skip
    second = {(p, o) for _, p, o, _, _ in consume_independently(env.kafka.connection, handle.plan())}
    assert second == {(p, o) for p in range(3) for o in range(10, 20)} - {(1, o) for o in range(10, 15)}
    # The whole output against the whole log (partition 1 now starts at 15): each offset once;
    # the lost ones are named by the event only. Partition 1's [0, 10) was read before the delete.
    log = [
        (p, o)
        for _, p, o, _, _ in consume_independently(env.kafka.connection, plan_for(env.kafka.adapter, [env.topic]))
    ]
    assert env.published_rows() == sorted([*log, *((1, o) for o in range(10))])


def test_a_committed_offset_past_the_end_is_an_offset_ahead_event_in_the_report_and_the_log(env: Env) -> None:
    from tests.integration.read_helpers import consume_independently, plan_for

    env.write_feed(on_ahead="latest")
    env.produce(6)
    env.run()
    # The group is moved past the log's end from outside (an operator's reset tool, a truncated log).
    assert env.kafka.adapter.alter_committed(env.group, {(env.topic, 2): (50, "")}) == {(env.topic, 2): None}

    _, outcome, lines = _run_logged(env)

    assert outcome.committed and env.committed() == {0: 2, 1: 2, 2: 2}
    [ahead] = _reported(outcome, "offset_ahead")
    assert (ahead["topic"], ahead["partition"], ahead["details"]["was"], ahead["details"]["offset"]) == (
        env.topic, 2, 50, 2,
    )  # fmt: skip
    assert any(f"event offset_ahead: {env.topic}[2]: committed offset 50 is past the high watermark 2" in line
               for line in lines), lines  # fmt: skip
    log = consume_independently(env.kafka.connection, plan_for(env.kafka.adapter, [env.topic]))
    assert env.published_rows() == [(p, o) for _, p, o, _, _ in log]  # each once, none skipped


def test_nested_json_declared_in_spark_ddl_publishes_the_scan_with_its_types_and_checks_a_nested_field(
    env: Env,
) -> None:
    """A JSON feed with a ``schema_ddl``: structs, arrays, decimals, timestamps in the Parquet output, equal
    to an independent read_committed scan parsed with ``json``; an expectation names a nested field and
    sends the record that breaks it to the quarantine, with the record of the wrong nested type."""
    from decimal import Decimal

    import pyarrow.parquet as pq

    from tests.integration.read_helpers import consume_independently

    env.write_feed(
        deserialization={"format": "json", "schema_ddl": "n long NOT NULL, customer struct<id: long, vip: boolean>, "
                         "amount decimal(10,2), tags array<string>, placed_at timestamp"},
        validation={"on_bad_records": "quarantine", "quarantine_max_ratio": 0.5, "expectations": [
            {"type": "expect_column_values_to_be_between", "kwargs": {"column": "customer.id", "min_value": 0}}]},
    )  # fmt: skip
    docs = [{"n": i, "customer": {"id": i * 10, "vip": i % 2 == 0}, "amount": f"{i}.25", "tags": [f"t{i}"] * (i % 3),
             "placed_at": f"2026-03-0{1 + i % 3}T10:00:00Z"} for i in range(12)]  # fmt: skip
    docs[4]["customer"]["id"] = -1  # breaks the nested expectation
    docs[7]["customer"]["id"] = "seventy"  # not a long: does not decode
    env.kafka.produce(env.topic, [Record(json.dumps(d).encode(), partition=i % 3) for i, d in enumerate(docs)])

    handle, job, outcome = env.run()

    assert outcome.committed and job["records_read"] == 12 and job["records_quarantined"] == 2
    scanned = {(r[1], r[2]): json.loads(r[4]) for r in consume_independently(env.kafka.connection, handle.plan())}
    assert len(scanned) == 12
    tables = [pq.read_table(f) for f in sorted(env.output.glob("plan_id=*/topic=*/**/*.parquet"))]
    published = [row for t in tables for row in t.to_pylist()]
    assert not [name for name in tables[0].schema.names if name.startswith("_tidemark")]
    assert str(tables[0].schema.field("customer").type) == "struct<id: int64, vip: bool>"
    assert str(tables[0].schema.field("amount").type) == "decimal128(10, 2)"
    assert str(tables[0].schema.field("tags").type) == "list<element: string>"
    assert str(tables[0].schema.field("placed_at").type).startswith("timestamp")
    expected = {k: v for k, v in scanned.items() if v["n"] not in (4, 7)}
    assert {(r["partition"], r["offset"]): r["n"] for r in published} == {k: v["n"] for k, v in expected.items()}
    for r in published:
        want = expected[(r["partition"], r["offset"])]
        assert r["customer"] == want["customer"] and r["amount"] == Decimal(want["amount"])
        assert r["tags"] == want["tags"]
        assert r["placed_at"].strftime("%Y-%m-%dT%H:%M:%SZ") == want["placed_at"]
    quarantined = [
        row for f in env.output.glob("plan_id=*/_quarantine/**/*.parquet") for row in pq.read_table(f).to_pylist()
    ]
    reasons = {
        json.loads(bytes(q["_raw_value"]) if "_raw_value" in q else q["value"])["n"]: q["_reason"] for q in quarantined
    }
    assert sorted(reasons) == [4, 7], reasons
    assert "customer.id" in reasons[4] and "declared field types" in reasons[7]
