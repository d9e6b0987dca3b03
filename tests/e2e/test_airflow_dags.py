"""The DAGs run end to end in Airflow (``dag.test``) against the real cluster.

Airflow gets its own home and SQLite metadata database, the Kafka settings come from an
Airflow connection (``AIRFLOW_CONN_TIDEMARK_KAFKA``), and the Spark job goes through the
Spark provider's ``spark-submit`` with the ``tidemark_spark`` connection on ``local[*]``.
Each DAG run happens in a subprocess so that Airflow reads this configuration fresh.
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
from tidemark.kafka.admin import Record

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
SECRET = "pa55-not-for-logs"

# The interpreter ends with os._exit once the run's state is printed: the run is over and
# recorded in the metadata database, and the interpreter's own shutdown (Airflow's and the
# clients' exit handlers) took 2-3 s more of every run.
# Several runs of one DAG may share the interpreter (argv[2] a JSON list of confs); each run's
# output starts with a RUN_MARK line on both streams.
RUN_MARK = "=== tidemark e2e: next DAG run ==="
RUN_DAG = f"""
import faulthandler, json, os, sys
faulthandler.enable(file=open(sys.argv[3], "w"), all_threads=True)
from tidemark.orchestration.dags import all_dags
dag = all_dags()[sys.argv[1]]
for conf in json.loads(sys.argv[2]):
    print({RUN_MARK!r}, flush=True)
    print({RUN_MARK!r}, file=sys.stderr, flush=True)
    run = dag.test(run_conf=conf or None)
    print("DAGRUN_STATE=" + str(run.state), flush=True)
sys.stderr.flush()
os._exit(0)
"""


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory: pytest.TempPathFactory, kafka: KafkaTestCluster) -> dict[str, str]:
    extra = {**kafka.connection.client_config(), "client.id": "tidemark-e2e", "sasl.password": SECRET}
    # A PLAINTEXT cluster ignores SASL settings in librdkafka only when no mechanism is set;
    # the password is here to prove it never reaches logs, XCom or reports.
    return airflow_home(tmp_path_factory.mktemp("airflow-home"), extra)


def airflow_home(home: Path, kafka_extra: dict[str, str], **connections: dict[str, Any]) -> dict[str, str]:
    """A migrated Airflow home whose ``tidemark_kafka`` connection has ``kafka_extra``; its environment.

    ``connections``: more Airflow connections by id (``tidemark_storage={...}``), as environment variables.
    """
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW_CONN_TIDEMARK_KAFKA": json.dumps({"conn_type": "kafka", "extra": kafka_extra}),
        "AIRFLOW_CONN_TIDEMARK_SPARK": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        **{f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(conn) for conn_id, conn in connections.items()},
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "GX_ANALYTICS_ENABLED": "False",
    }
    env.pop("TIDEMARK_BOOTSTRAP_SERVERS", None)
    migrate = subprocess.run(
        [str(Path(sys.executable).with_name("airflow")), "db", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert migrate.returncode == 0, migrate.stdout[-2000:] + migrate.stderr[-2000:]
    return env


def _run_dag(env: dict[str, str], dag_id: str, conf: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one DAG with ``dag.test`` in a fresh interpreter; a native crash's stack is kept.

    (A SIGSEGV inside librdkafka's admin OffsetFetch once killed these runs; the adapter
    now fetches offsets through a consumer. The faulthandler trace makes any recurrence
    diagnosable from the assertion message.)
    """
    (run,) = _run_dags(env, dag_id, [conf])
    return run


def _run_dags(
    env: dict[str, str], dag_id: str, confs: list[dict[str, Any] | None]
) -> list[subprocess.CompletedProcess[str]]:
    """Runs of one DAG, one after the other in one fresh interpreter; each run's own output."""
    trace = Path(env["AIRFLOW_HOME"]) / f"faulthandler-{dag_id}.log"
    args = [sys.executable, "-c", RUN_DAG, dag_id, json.dumps([c or {} for c in confs]), str(trace)]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, check=False, timeout=600)
    if proc.returncode < 0:
        pytest.fail(f"{dag_id}: interpreter killed by signal {-proc.returncode}. Stack:\n{trace.read_text()}")
    outs, errs = proc.stdout.split(RUN_MARK)[1:], proc.stderr.split(RUN_MARK)[1:]
    assert len(outs) == len(errs) == len(confs), proc.stdout[-4000:] + proc.stderr[-4000:]
    return [subprocess.CompletedProcess(args, proc.returncode, out, err) for out, err in zip(outs, errs, strict=True)]


def test_feed_dag_then_replay_dag(kafka: KafkaTestCluster, airflow_env: dict[str, str], tmp_path: Path) -> None:
    topic = kafka.new_topic(partitions=2, prefix="af")
    group = f"g-af-{uuid.uuid4().hex[:8]}"
    feeds, state, output = tmp_path / "feeds", tmp_path / "state", tmp_path / "out"
    feeds.mkdir()
    (feeds / "af.yaml").write_text(
        yaml.safe_dump(
            {
                "topics": [topic],
                "group": group,
                "schedule": "@daily",
                "deserialization": {"format": "string"},
                "output": str(output),
            }
        )
    )
    kafka.produce(topic, [Record(value=f"v{i}".encode(), partition=i % 2) for i in range(10)])
    env = {**airflow_env, "TIDEMARK_FEEDS_DIR": str(feeds), "TIDEMARK_STATE_DIR": str(state)}

    scheduled = _run_dag(env, "tidemark_af")
    assert "DAGRUN_STATE=success" in scheduled.stdout, scheduled.stdout[-4000:] + scheduled.stderr[-4000:]
    committed = kafka.adapter.committed(group, [(topic, 0), (topic, 1)])
    assert {tp: c.offset for tp, c in committed.items()} == {(topic, 0): 5, (topic, 1): 5}

    conf = {"feed": "af", "start_from": "earliest", "commit": False, "dry_run": False}
    replay = _run_dag(env, "tidemark_replay", conf)
    assert "DAGRUN_STATE=success" in replay.stdout, replay.stdout[-4000:] + replay.stderr[-4000:]
    committed = kafka.adapter.committed(group, [(topic, 0), (topic, 1)])
    assert {tp: c.offset for tp, c in committed.items()} == {(topic, 0): 5, (topic, 1): 5}  # replay did not commit
    reports = sorted(state.glob("runs/af/*/report.json"))
    assert len(reports) == 2
    replay_report = json.loads(reports[-1].read_text())
    assert replay_report["mode"] == "replay" and replay_report["counts"]["planned"] == 10
    assert len(list((tmp_path / "out.replays").glob("plan_id=*/_manifest.json"))) == 1  # beside the feed's output
    assert len(list(output.glob("plan_id=*/_manifest.json"))) == 1  # the feed's own output: the scheduled run only

    dry, bad = _run_dags(env, "tidemark_replay", [
        {"feed": "af", "start_from": "earliest"},  # dry_run defaults to true
        {"feed": "af", "start_from": "offset"},
    ])  # fmt: skip
    assert "DAGRUN_STATE=success" in dry.stdout, dry.stdout[-4000:] + dry.stderr[-4000:]
    newest = sorted(state.glob("runs/af/*"))[-1]
    assert not (newest / "job.json").exists()  # nothing read
    assert json.loads((newest / "report.json").read_text())["commit"]["status"] == "skipped"
    assert "dry run" in dry.stdout + dry.stderr

    assert "DAGRUN_STATE=success" not in bad.stdout
    assert "start_from=offset needs parameter 'start_offset'" in bad.stdout + bad.stderr

    everything = scheduled.stdout + scheduled.stderr + replay.stdout + replay.stderr
    assert SECRET not in everything
    for path in state.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".log", ".html"):
            assert SECRET not in path.read_text(errors="replace"), path


def test_feed_dag_resumes_after_the_group_offsets_expired(
    kafka: KafkaTestCluster, airflow_env: dict[str, str], tmp_path: Path
) -> None:
    """Issue 14 through the feed DAG: run, run with nothing new, offsets deleted, run again."""
    topic = kafka.new_topic(partitions=2, prefix="afx")
    group = f"g-afx-{uuid.uuid4().hex[:8]}"
    feeds, state = tmp_path / "feeds", tmp_path / "state"
    feeds.mkdir()
    feed = {"topics": [topic], "group": group, "schedule": "@daily", "deserialization": {"format": "string"},
            "output": str(tmp_path / "out")}  # fmt: skip
    (feeds / "afx.yaml").write_text(yaml.safe_dump(feed))
    kafka.produce(topic, [Record(value=f"v{i}".encode(), partition=i % 2) for i in range(6)])
    env = {**airflow_env, "TIDEMARK_FEEDS_DIR": str(feeds), "TIDEMARK_STATE_DIR": str(state)}
    tps = [(topic, 0), (topic, 1)]

    for _ in range(2):  # a run that reads, then one that finds nothing new
        run = _run_dag(env, "tidemark_afx")
        assert "DAGRUN_STATE=success" in run.stdout, run.stdout[-4000:] + run.stderr[-4000:]
    assert "Spark was not started" in run.stdout + run.stderr  # the idle run skipped its Spark task
    kafka.adapter.admin.delete_consumer_groups([group], request_timeout=10)[group].result(timeout=10)
    assert {c.offset for c in kafka.adapter.committed(group, tps).values()} == {None}

    resumed = _run_dag(env, "tidemark_afx")

    assert "DAGRUN_STATE=success" in resumed.stdout, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    assert "event group_offsets_expired" in resumed.stdout + resumed.stderr  # said in the task log
    assert "Spark was not started" in resumed.stdout + resumed.stderr  # nothing new: no Spark either
    assert {tp: c.offset for tp, c in kafka.adapter.committed(group, tps).items()} == {(topic, 0): 3, (topic, 1): 3}
    newest = json.loads(sorted(state.glob("runs/afx/*/report.json"))[-1].read_text())
    assert newest["status"] == "succeeded" and newest["commit"]["status"] == "committed"
    assert {e["partition"] for e in newest["events"] if e["kind"] == "group_offsets_expired"} == {0, 1}


def test_redrive_dag_publishes_the_dead_letters_a_fixed_rule_passes_once_masked_and_no_task_log_holds_the_marker(
    kafka: KafkaTestCluster, airflow_env: dict[str, str], tmp_path: Path
) -> None:
    """A masked feed (its ``email`` hashed under the ``tidemark_masking`` connection's key, raw bytes kept apart) runs
    through its DAG and quarantines the ``x`` records; the rule is fixed in the feed file; ``tidemark_redrive`` (as the
    view's form triggers it) publishes exactly them, masked, into the feed's output, and a second run publishes
    nothing. A marker in every email is then searched for in the tasks' logs (each DAG run's output), Airflow's home,
    the state dir and the output, Parquet decoded row by row: found only in ``keep_raw``; the key found nowhere."""
    import pyarrow.parquet as pq

    from tests.support.masking import hashed, strong_key

    marker, key = f"mark-{uuid.uuid4().hex[:10]}", strong_key()
    topic = kafka.new_topic(partitions=1, prefix="af-rd")
    feeds, state, output, raw = tmp_path / "feeds", tmp_path / "state", tmp_path / "out", tmp_path / "raw"
    feeds.mkdir()
    doc: dict[str, Any] = {
        "topics": [topic], "group": f"g-af-rd-{uuid.uuid4().hex[:8]}", "schedule": "@daily", "output": str(output),
        "deserialization": {"format": "json", "schema_ddl": "id long NOT NULL, tag string, email string"},
        "masking": {"fields": {"email": "hash"}, "keep_raw": str(raw)},
        "validation": {"on_bad_records": "quarantine", "quarantine_max_ratio": 0.5, "expectations": [
            {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "tag", "regex": "^v"}}]},
    }  # fmt: skip
    (feeds / "afrd.yaml").write_text(yaml.safe_dump(doc))
    emails = {i: f"{marker}-{i}@example.com" for i in range(12)}
    kafka.produce(topic, [Record(value=json.dumps({"id": i, "tag": "x" if i % 4 == 0 else "v", "email": emails[i]})
                                 .encode(), partition=0) for i in range(12)])  # fmt: skip
    env = {**airflow_env, "TIDEMARK_FEEDS_DIR": str(feeds), "TIDEMARK_STATE_DIR": str(state),
           "AIRFLOW_CONN_TIDEMARK_MASKING": json.dumps({"conn_type": "generic", "password": key})}  # fmt: skip
    scheduled = _run_dag(env, "tidemark_afrd")
    assert "DAGRUN_STATE=success" in scheduled.stdout, scheduled.stdout[-4000:] + scheduled.stderr[-4000:]

    doc["validation"]["expectations"][0]["kwargs"]["regex"] = "^[vx]"
    (feeds / "afrd.yaml").write_text(yaml.safe_dump(doc))
    first, second = _run_dags(env, "tidemark_redrive", [{"feed": "afrd", "dry_run": False}] * 2)
    for run in (first, second):
        assert "DAGRUN_STATE=success" in run.stdout, run.stdout[-4000:] + run.stderr[-4000:]
    # The re-check and the staging went to spark-submit on the tidemark_spark connection, not into the task.
    submitted = [ln for ln in (first.stdout + first.stderr).splitlines() if "spark_jobs/tidemark_redrive.py" in ln]
    assert submitted and "spark-submit" in submitted[0], (first.stdout + first.stderr)[-4000:]

    published = [row for f in output.glob("plan_id=*/topic=*/**/*.parquet")
                 for row in pq.read_table(f, columns=["id", "email"]).to_pylist()]  # fmt: skip
    digest = {i: hashed(e, "email", key, "afrd") for i, e in emails.items()}  # HKDF + HMAC, computed apart
    assert sorted((r["id"], r["email"]) for r in published) == sorted(digest.items())  # each record once, masked
    assert len(list(output.glob("plan_id=redrive-*/_manifest.json"))) == 1
    reports = [json.loads(p.read_text()) for p in sorted(state.glob("runs/afrd/*/report.json"))]
    assert [(r["mode"], r["counts"].get("published")) for r in reports][-2:] == [("redrive", 3), ("redrive", 0)]

    def text_of(folder: Path) -> dict[Path, str]:
        found = {}
        for path in (p for p in folder.rglob("*") if p.is_file()):
            text = path.read_bytes().decode("latin-1")
            if path.suffix == ".parquet":
                text += repr(pq.read_table(path).to_pylist())
            found[path] = text
        return found

    logs = {"task logs": "".join(r.stdout + r.stderr for r in (scheduled, first, second))}
    artefacts = {str(p): t for folder in (Path(env["AIRFLOW_HOME"]), state, output) for p, t in text_of(folder).items()}
    for where, text in {**logs, **artefacts}.items():
        assert marker not in text, where
        assert key not in text, where
    kept = "".join(text_of(raw).values())
    assert all(emails[i] in kept for i in range(0, 12, 4))  # the quarantined records' raw bytes, only there
