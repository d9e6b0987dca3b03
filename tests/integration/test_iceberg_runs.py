"""An Iceberg feed end to end on the deployment shape: Spark standalone cluster, S3, PostgreSQL.

``tidemark run`` goes through ``spark-submit`` to the standalone master (``spark_cluster``)
with state and the table on the local S3 server (``s3``), checkpoints *and* the Iceberg
SQL catalog in PostgreSQL (``postgres``), on the real Kafka cluster. One test walks the
acceptance of issue 10, item 3, in order (each step builds on the table the previous
left):

1. a run commits exactly the planned ends; the table holds exactly the planned good
   records (checked against an independent read_committed consumer, the fault suite's
   oracle) in one snapshot whose summary names the plan;
2. the same plan once more (the job run again on it, as a retried Spark task would) adds nothing;
3. a crash after the group's commit and before the catalog commit that shows the plan
   (``TIDEMARK_FAULTS=iceberg.before_commit``, in the commit step's promotion) leaves the
   table's snapshots unchanged (the job's data files are uploaded, in no snapshot) and the
   group at the plan's ends, the run ledger saying ``committed``; the next run commits the
   staged plan to the table once before planning, reading nothing again;
4. with the group's offsets deleted in Kafka and its checkpoints deleted in PostgreSQL,
   the next run resumes at the ends the table's newest snapshot records, with a
   ``position_from_table`` event: it reads nothing again (no Spark application, the
   table unchanged) and commits those ends back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from tests.conftest import KafkaTestCluster
from tests.faults.harness import Row, digest, oracle
from tests.support.servers.spark import LocalSpark
from tidemark.checkpoints.store import URL_ENV, PostgresCheckpointStore
from tidemark.config.models import load_feed
from tidemark.job.steps import run
from tidemark.kafka.admin import Record
from tidemark.output.iceberg import CATALOG_URI_ENV, PLAN_KEY, IcebergPublisher, plan_history
from tidemark.runs.pipeline import RunHandle
from tidemark.storage import Location

pytestmark = [pytest.mark.integration, pytest.mark.spark]

BAD = 3  # the record that fails to decode: quarantined, never in the table


def _value(i: int) -> bytes:
    return b"{broken" if i == BAD else json.dumps({"n": i}).encode()


def _table_rows(publisher: IcebergPublisher) -> Counter[Row]:
    table = publisher.load()
    assert table is not None
    rows: Counter[Row] = Counter()
    for r in table.scan().to_arrow().select(["topic", "partition", "offset", "n"]).to_pylist():
        rows[(r["topic"], r["partition"], r["offset"], digest(json.dumps({"n": r["n"]}).encode()))] += 1
    return rows


def _expected(kafka: KafkaTestCluster, topic: str, ends: dict[int, int]) -> Counter[Row]:
    """The oracle's records in ``[0, end)`` of each partition, without the quarantined one."""
    seen = oracle(kafka.connection, {(topic, p): (0, end) for p, end in ends.items()})
    return Counter({row: n for row, n in seen.items() if row[3] != digest(_value(BAD))})


def test_an_iceberg_feed_on_cluster_s3_and_postgres_publishes_once_survives_a_crash_and_recovers_from_history(
    kafka: KafkaTestCluster,
    spark_cluster: LocalSpark,
    spark: Any,
    s3_prefix: str,
    postgres: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = kafka.new_topic(partitions=2, prefix="ice")
    group = f"g-ice-{uuid.uuid4().hex[:8]}"
    table_name = f"lake.orders_{uuid.uuid4().hex[:8]}"  # the catalog database is shared by the session
    feeds = tmp_path / "feeds"
    feeds.mkdir()
    output = Location.of(f"{s3_prefix}/lake/orders")
    state = Location.of(f"{s3_prefix}/state")
    (feeds / "orders.yaml").write_text(yaml.safe_dump({
        "topics": [topic], "group": group, "output": output.url,
        "output_format": "iceberg", "iceberg": {"table": table_name},
        "deserialization": {"format": "json", "fields": [{"name": "n", "type": "integer"}]},
        "validation": {"on_bad_records": "quarantine", "quarantine_max_ratio": 0.5},
    }))  # fmt: skip
    settings = {**kafka.connection.to_env(), "TIDEMARK_FEEDS_DIR": str(feeds), "TIDEMARK_STATE_DIR": state.url,
                URL_ENV: postgres, CATALOG_URI_ENV: postgres, "TIDEMARK_SPARK_MASTER": spark_cluster.master_url,
                "TIDEMARK_STAGING_DIR": str(tmp_path / "staging"), "HOME": str(tmp_path / "home")}  # fmt: skip
    for key, value in settings.items():  # for this process too: run_job and the table reads below
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TIDEMARK_FAULTS", raising=False)
    feed = load_feed("orders")
    publisher = IcebergPublisher(feed)
    store = PostgresCheckpointStore(postgres)
    tps = [(topic, 0), (topic, 1)]

    def produce(first: int, count: int) -> None:
        kafka.produce(topic, [Record(value=_value(i), key=b"k", partition=i % 2) for i in range(first, first + count)])

    def tidemark_run(**extra_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tidemark.cli", "run", "orders"],
                              env={**os.environ, **extra_env}, capture_output=True, text=True, check=False)  # fmt: skip

    def committed() -> dict[int, int | None]:
        return {p: c.offset for (_, p), c in kafka.adapter.committed(group, tps).items()}

    def newest_handle() -> RunHandle:
        run_dir = (state / "runs" / "orders").children(folders_only=True)[-1]
        return RunHandle.from_xcom(json.loads((run_dir / "run.json").read_text())["handle"])

    def history() -> list[dict[str, str]]:
        table = publisher.load()
        assert table is not None
        return [dict(s.summary.additional_properties) for s in plan_history(table) if s.summary is not None]

    # 1. One run: exactly the planned ends, exactly the planned records, one snapshot naming the plan.
    produce(0, 8)
    first = tidemark_run()
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"output    iceberg:{table_name} ({output.url})" in first.stdout
    handle = newest_handle()
    assert committed() == {0: 4, 1: 4}
    assert {tp[1]: c.offset for tp, c in store.get(group, tps).items()} == {0: 4, 1: 4}
    (summary,) = history()
    assert summary[PLAN_KEY] == handle.plan_id and summary["tidemark.run-id"] == handle.run_id
    assert summary["tidemark.feed"] == "orders" and summary["tidemark.group"] == group
    assert [(r["partition"], r["start"], r["end"]) for r in json.loads(summary["tidemark.ranges"])] == [
        (0, 0, 4), (1, 0, 4),
    ]  # fmt: skip
    assert _table_rows(publisher) == _expected(kafka, topic, {0: 4, 1: 4})
    assert sum(_table_rows(publisher).values()) == 7
    quarantine = Location.of(f"{output.url}.quarantine") / f"run_id={handle.run_id}" / f"plan_id={handle.plan_id}"
    assert [name for name, _ in quarantine.files()]  # the undecodable record, beside the table
    dead = publisher.dead_letter_table()  # and appended to the dead-letter table, on S3, in the PostgreSQL catalog
    assert dead is not None and dead.location() == f"{output.url}.dead_letters"
    assert [(r["partition"], r["plan_id"]) for r in dead.scan().to_arrow().to_pylist()] == [(BAD % 2, handle.plan_id)]

    # 2. The same plan once more (a retried Spark task): nothing is read or added.
    again = run(spark, handle.plan(), feed, kafka.connection, tmp_path / "rerun")
    assert again.reused and again.published
    assert len(history()) == 1 and sum(_table_rows(publisher).values()) == 7

    # 3. Crash between the group's commit and the catalog commit: the table unchanged, the plan staged.
    produce(8, 6)
    table_before = publisher.load()
    assert table_before is not None
    files_before = {f["file_path"] for f in table_before.inspect.files().to_pylist()}
    crashed = tidemark_run(TIDEMARK_FAULTS="iceberg.before_commit")
    assert crashed.returncode != 0, crashed.stdout + crashed.stderr
    crashed_handle = newest_handle()
    crashed_plan = crashed_handle.plan_id
    assert "injected fault at iceberg.before_commit" in crashed.stdout + crashed.stderr
    log = (Location.of(crashed_handle.run_dir) / "spark-submit.log").read_text()
    assert "InjectedFault" not in log  # the job staged the plan; the crash is the commit step's promotion
    assert committed() == {0: 7, 1: 7}  # the group's commit went first
    assert {tp[1]: c.offset for tp, c in store.get(group, tps).items()} == {0: 7, 1: 7}
    ledger = store.run(group, crashed_handle.run_id)
    assert ledger is not None and ledger.state == "committed"
    assert len(history()) == 1 and sum(_table_rows(publisher).values()) == 7  # readers see the old table
    assert publisher.published(crashed_plan) is None
    staged = publisher.staged(crashed_plan, crashed_handle.run_id)
    assert staged is not None and staged.records == 6
    uploaded = {f"{output.url}/data/{name}" for name, _ in (output / "data").files()}
    orphans = uploaded - files_before
    assert orphans and all(crashed_plan in u for u in orphans)  # written, invisible to readers

    recovered = tidemark_run()
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert newest_handle().resumed == crashed_plan  # the crashed run's plan shown first, once
    assert newest_handle().records == 0 and "no Spark application started" in recovered.stdout
    assert committed() == {0: 7, 1: 7}
    ledger = store.run(group, crashed_handle.run_id)
    assert ledger is not None and ledger.state == "shown"
    assert publisher.staged(crashed_plan, crashed_handle.run_id) is None
    assert [h[PLAN_KEY] for h in history()] == [crashed_plan, handle.plan_id]
    table_after = publisher.load()
    assert table_after is not None
    assert {f["file_path"] for f in table_after.inspect.files().to_pylist()} - files_before == orphans
    assert _table_rows(publisher) == _expected(kafka, topic, {0: 7, 1: 7})

    # 4. Offsets and checkpoints gone: the next run resumes from the table's history.
    kafka.adapter.admin.delete_consumer_groups([group], request_timeout=10)[group].result(timeout=10)
    engine = create_engine(make_url(postgres).set(drivername="postgresql+psycopg"), poolclass=NullPool)
    with engine.begin() as conn:
        for table in ("tidemark_checkpoints", "tidemark_committed_runs"):
            conn.execute(text(f"DELETE FROM {table} WHERE grp = :g"), {"g": group})
    engine.dispose()
    assert committed() == {0: None, 1: None} and store.get(group, tps) == {}
    resumed = tidemark_run()
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "event position_from_table" in resumed.stdout
    assert "no Spark application started" in resumed.stdout  # not the earliest reset: nothing to read again
    plan = newest_handle().plan()
    ranges = [(p.partition, p.reason, p.start, p.end) for p in plan.partitions]
    assert ranges == [(0, "table", 7, 7), (1, "table", 7, 7)]
    run_dir = (state / "runs" / "orders").children(folders_only=True)[-1]
    report: dict[str, Any] = json.loads((run_dir / "report.json").read_text())
    events = [e for e in report["events"] if e["kind"] == "position_from_table"]
    assert len(events) == 2 and all(e["details"]["plan_id"] == crashed_plan for e in events)
    assert committed() == {0: 7, 1: 7}
    assert {tp[1]: c.offset for tp, c in store.get(group, tps).items()} == {0: 7, 1: 7}
    assert len(history()) == 2
    assert _table_rows(publisher) == _expected(kafka, topic, {0: 7, 1: 7})  # every record once, none twice

    # No credential in the table's metadata (snapshot properties included) or in the run folders.
    secrets = [os.environ["AWS_SECRET_ACCESS_KEY"].encode(), str(make_url(postgres).password).encode()]
    metadata = [output / "metadata" / name for name, _ in (output / "metadata").files()]
    run_files = [d / name for d in (state / "runs" / "orders").children(folders_only=True) for name, _ in d.files()]
    assert metadata and run_files
    for loc in metadata + run_files:
        data = loc.read_bytes()
        assert not any(secret in data for secret in secrets), loc.url
