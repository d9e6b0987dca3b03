"""A feed with no local state at all: state and output on S3 (s3proxy), checkpoints in PostgreSQL.

The run goes through ``tidemark run`` and ``spark-submit`` exactly as a user's would, on
the real Kafka cluster. The steps exchange only ids and URLs: every file a run leaves is
under the S3 state prefix, the published plan is readable through its manifest, running
the same plan again adds nothing, and an idle rerun neither reads nor publishes.
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
from sqlalchemy.engine import make_url

from tests.conftest import KafkaTestCluster
from tests.integration.read_helpers import published_pairs
from tidemark.checkpoints.store import URL_ENV, PostgresCheckpointStore
from tidemark.config.models import load_feed
from tidemark.job.steps import run
from tidemark.kafka.admin import Record
from tidemark.output.output_schema import CARRIER_NAME, ROOT_FILES
from tidemark.output.parquet import (
    MANIFEST_NAME,
    PENDING_DIR,
    load_manifest,
    load_pending,
    published_dir,
    published_files,
)
from tidemark.runs.pipeline import RunHandle
from tidemark.storage import Location

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_a_run_with_state_and_output_on_s3_publishes_once(
    kafka: KafkaTestCluster, s3_prefix: str, postgres: str, spark: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(partitions=2, prefix="s3run")
    group = f"g-s3-{uuid.uuid4().hex[:8]}"
    feeds = tmp_path / "feeds"
    feeds.mkdir()
    output = Location.of(f"{s3_prefix}/lake/orders")
    state = Location.of(f"{s3_prefix}/state")
    (feeds / "orders.yaml").write_text(yaml.safe_dump({
        "topics": [topic], "group": group, "output": output.url,
        "deserialization": {"format": "json", "fields": [{"name": "n", "type": "integer"}]},
        "validation": {"on_bad_records": "quarantine", "quarantine_max_ratio": 0.5},
    }))  # fmt: skip
    values = [b"{broken" if i == 3 else json.dumps({"n": i}).encode() for i in range(8)]
    kafka.produce(topic, [Record(value=v, key=b"k", partition=i % 2) for i, v in enumerate(values)])
    # No local state dir: HOME points at an empty folder, the state dir and output are URLs. The
    # machine's cache (compiled Data Docs templates) is not state: it has its own folder here.
    env = {**os.environ, **kafka.connection.to_env(), "TIDEMARK_FEEDS_DIR": str(feeds),
           "TIDEMARK_STATE_DIR": state.url, URL_ENV: postgres, "HOME": str(tmp_path / "home"),
           "TIDEMARK_CACHE_DIR": str(tmp_path / "cache")}  # fmt: skip

    first = subprocess.run([sys.executable, "-m", "tidemark.cli", "run", "orders"], env=env,
                           capture_output=True, text=True, check=False)  # fmt: skip

    assert first.returncode == 0, first.stdout + first.stderr
    assert f"output    {output.url}/plan_id=" in first.stdout
    ends = {(topic, 0): 4, (topic, 1): 4}
    assert {tp: c.offset for tp, c in kafka.adapter.committed(group, list(ends)).items()} == ends
    assert {tp: c.offset for tp, c in PostgresCheckpointStore(postgres).get(group, ends).items()} == ends
    assert not (tmp_path / "home").exists()  # nothing was written locally
    assert {p.name for p in (tmp_path / "cache").iterdir()} <= {"jinja"}  # but the template cache
    (run_dir,) = (state / "runs" / "orders").children(folders_only=True)
    left = [name for name, _ in run_dir.files()]
    assert {"plan.json", "run.json", "job.json", "validation.json", "report.json", "spark-submit.log"} <= set(left)
    assert any(name.startswith("gx/") and name.endswith("index.html") for name in left)  # the Data Docs
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "succeeded" and report["counts"]["planned"] == 8
    secrets = [os.environ["AWS_SECRET_ACCESS_KEY"], str(make_url(postgres).password)]
    for name in left:  # no credential in any file the run left (logs and Data Docs included)
        assert not any(secret.encode() in (run_dir / name).read_bytes() for secret in secrets), name
    handle = RunHandle.from_xcom(json.loads((run_dir / "run.json").read_text())["handle"])
    assert handle.run_dir == run_dir.url and handle.plan_path == (run_dir / "plan.json").url
    assert published_pairs(published_files(output)) == sorted((i % 2, i // 2) for i in range(8) if i != 3)
    manifest = load_manifest(output, handle.plan_id)
    assert manifest is not None and (manifest.records, manifest.quarantined) == (7, 1)
    published = sorted(published_dir(output, handle.plan_id).files())
    assert MANIFEST_NAME in [name for name, _ in published]
    # The job staged the manifest pending under the run's id; the commit step moved it into place.
    assert load_pending(output, handle.plan_id, handle.run_id) is None
    assert not [name for name, _ in (output / PENDING_DIR).files()]

    # The same plan once more (a retried Spark task of the same run): nothing is read or added.
    again = run(spark, handle.plan(), load_feed(str(feeds / "orders.yaml")), kafka.connection, tmp_path / "retry")
    assert again.reused and again.manifest == manifest.to_dict()
    assert sorted(published_dir(output, handle.plan_id).files()) == published

    # An idle rerun: no Spark, no new plan folder, the offsets stay.
    idle = subprocess.run([sys.executable, "-m", "tidemark.cli", "run", "orders"], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert idle.returncode == 0, idle.stdout + idle.stderr
    assert "no Spark application started" in idle.stdout
    # Readers see one plan folder. Beside it only `_pending` (skipped by readers, as every `_` folder), which
    # holds no file: a pending manifest moved into place leaves at most the store's empty folder marker.
    # The output's one schema is recorded at its root too (a file of no rows; Spark's `_common_metadata`).
    children = [c.name for c in output.children()]
    assert sorted(name for name in children if not name.startswith("_")) == sorted(
        [CARRIER_NAME, f"plan_id={handle.plan_id}"]
    )
    assert set(children) - {f"plan_id={handle.plan_id}", *ROOT_FILES} <= {PENDING_DIR}, children
    assert not [name for name, _ in (output / PENDING_DIR).files()]
    assert len((state / "runs" / "orders").children(folders_only=True)) == 2
    runs = subprocess.run([sys.executable, "-m", "tidemark.cli", "runs", "orders"], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert runs.returncode == 0 and runs.stdout.count("succeeded") == 2, runs.stdout + runs.stderr
    shown = subprocess.run([sys.executable, "-m", "tidemark.cli", "report", handle.run_id], env=env,
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert shown.returncode == 0 and handle.plan_id in shown.stdout, shown.stdout + shown.stderr
    assert {tp: c.offset for tp, c in kafka.adapter.committed(group, list(ends)).items()} == ends
