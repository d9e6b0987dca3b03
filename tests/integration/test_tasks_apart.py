"""The three tasks of a run on three "machines": nothing crosses through local disk.

Celery and Kubernetes workers share no folder: each task of a DAG run may land on another
machine, with its own working directory, home and temp dir. Here each step (plan, the
Spark job, commit) runs in its own process with a fresh HOME, TMPDIR, working directory,
Spark scratch dir and its own copy of the feed file, and that folder is deleted as soon as
the step ends. The steps exchange only the XCom document (ids and URLs), as the DAG's
tasks do; state and output live on the S3 server, checkpoints in PostgreSQL. The run must
still publish exactly the produced records once and commit the plan's ends.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import KafkaTestCluster
from tests.integration.read_helpers import published_pairs
from tidemark.checkpoints.store import URL_ENV
from tidemark.kafka.admin import Record
from tidemark.output.parquet import published_files
from tidemark.storage import Location, is_url

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# Each step does what its DAG task does (tidemark.orchestration.dags), with the connections
# taken from the environment: plan_step → plan_run, the Spark task → spark-submit of the
# job with the plan's URL, commit_step → commit_run. Only the XCom document crosses.
STEP = """
import json, sys
from tidemark.kafka.connection import from_env
from tidemark.runs.pipeline import RunHandle, commit_run, plan_run, run_job
step, doc = sys.argv[1], json.loads(sys.argv[2])
if step == "plan":
    out = plan_run(doc["feed"], from_env(), mode="scheduled").to_xcom()
elif step == "job":
    job = run_job(RunHandle.from_xcom(doc), from_env())
    out = {"published": job["published"], "records_published": job["records_published"]}
else:
    out = commit_run(RunHandle.from_xcom(doc), from_env()).to_xcom()
print("XCOM " + json.dumps(out))
"""


def _run_step(step: str, doc: dict[str, Any], machine: Path, feed_doc: dict[str, Any], env: dict[str, str]) -> Any:
    """Run one step in a fresh 'machine' folder, delete the folder, return the step's XCom."""
    home, tmp, cwd, feeds = (machine / d for d in ("home", "tmp", "work", "feeds"))
    for folder in (home, tmp, cwd, feeds):
        folder.mkdir(parents=True)
    (feeds / "orders.yaml").write_text(yaml.safe_dump(feed_doc))
    step_env = {**env, "HOME": str(home), "TMPDIR": str(tmp), "TIDEMARK_STAGING_DIR": str(tmp),
                "SPARK_LOCAL_DIRS": str(tmp), "TIDEMARK_FEEDS_DIR": str(feeds)}  # fmt: skip
    try:
        proc = subprocess.run([sys.executable, "-c", STEP, step, json.dumps(doc)], cwd=cwd, env=step_env,
                              capture_output=True, text=True, check=False, timeout=600)  # fmt: skip
    finally:
        shutil.rmtree(machine)  # the worker is gone: nothing it wrote locally survives
    assert proc.returncode == 0, f"step {step} failed:\n{proc.stdout}\n{proc.stderr}"
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("XCOM ")]
    return json.loads(line[len("XCOM ") :])


def test_plan_job_and_commit_on_separate_workers_share_nothing_local(
    kafka: KafkaTestCluster, s3_prefix: str, postgres: str, tmp_path: Path
) -> None:
    topic = kafka.new_topic(partitions=3, prefix="apart")
    group = f"g-apart-{uuid.uuid4().hex[:8]}"
    output = Location.of(f"{s3_prefix}/lake/orders")
    state = Location.of(f"{s3_prefix}/state")
    feed_doc = {"topics": [topic], "group": group, "output": output.url,
                "deserialization": {"format": "json", "fields": [{"name": "n", "type": "integer"}]}}  # fmt: skip
    kafka.produce(topic, [Record(value=json.dumps({"n": i}).encode(), partition=i % 3) for i in range(30)])
    # The process environment minus any local state dir: what every worker is configured with.
    env = {k: v for k, v in os.environ.items() if k not in ("TIDEMARK_STATE_DIR", "TIDEMARK_FEEDS_DIR")}
    env.update(kafka.connection.to_env())
    env.update({"TIDEMARK_STATE_DIR": state.url, URL_ENV: postgres})

    handle = _run_step("plan", {"feed": "orders"}, tmp_path / "worker-1", feed_doc, env)
    assert handle["records"] == 30
    # XCom carries ids and URLs only: no value names a local file.
    for key in ("plan_path", "run_dir"):
        assert is_url(handle[key]) and handle[key].startswith(state.url), (key, handle[key])
    assert not any(isinstance(v, str) and v.startswith("/") for v in handle.values()), handle

    job = _run_step("job", handle, tmp_path / "worker-2", feed_doc, env)
    assert job == {"published": True, "records_published": 30}
    # The job's staging was local to its worker; between tasks nothing is committed yet.
    before = kafka.adapter.committed(group, [(topic, p) for p in range(3)])
    assert all(c.offset is None for c in before.values()), before

    outcome = _run_step("commit", handle, tmp_path / "worker-3", feed_doc, env)
    ends = {(topic, p): 10 for p in range(3)}
    assert outcome["committed"] is True and outcome["plan_id"] == handle["plan_id"]
    assert {tp: c.offset for tp, c in kafka.adapter.committed(group, list(ends)).items()} == ends

    # each record once
    assert published_pairs(published_files(output)) == sorted((p, o) for p in range(3) for o in range(10))
    report = json.loads((Location.of(handle["run_dir"]) / "report.json").read_text())
    assert report["status"] == "succeeded" and report["counts"]["planned"] == 30
    assert not list(tmp_path.iterdir())  # every worker folder was removed after its step
