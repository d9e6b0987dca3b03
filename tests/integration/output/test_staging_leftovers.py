"""Staging is left by no run: what a run stages is its own, and goes when the run is done with it.

A staging folder holds the plan's records as read (for a masked feed,
:func:`tests.integration.job.test_masking.feed_doc`, masked, with what the quarantine needs
of its bad records). Whatever happens, the folders a run stages in
(``<output>/_staging/<run id>.<nonce>/`` and, on an object store where Spark stages there,
the same name under ``<output>/_staging/`` on the store) are removed: by the job as soon as
it has staged its pending publication or failed, by the commit protocol when the run is
promoted or given up, and, after a driver killed mid-write (``job.after_stage:exit``, as
``kill -9``), by the next settle, which proves the job dead by the folder's lock and never
touches a folder another live job holds or another run's. The marker is searched in the
files themselves (bytes and Parquet rows).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import S3_BUCKET, KafkaTestCluster
from tests.faults.harness import FaultEnv
from tests.integration.job.test_masking import KEY, feed_doc, file_texts, produce
from tests.support.servers.s3 import LocalS3
from tidemark.checkpoints.store import open_store
from tidemark.config.masking import MASKING_KEY_ENV
from tidemark.errors import TidemarkError
from tidemark.faults import FAULTS_ENV
from tidemark.output.staging import STAGE_ON_STORE_ENV
from tidemark.runs.pipeline import commit_run, plan_run
from tidemark.storage import Location

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def marked(root: Path, marker: str) -> list[str]:
    return sorted({str(p.relative_to(root)) for p, text in file_texts(root) if marker in text})


def test_a_driver_killed_mid_staging_leaves_raw_bytes_only_until_the_next_settle(
    kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = FaultEnv(kafka, spark, tmp_path, "staging-killed")
    env.install(monkeypatch)
    monkeypatch.setenv(MASKING_KEY_ENV, KEY)
    env.write_feed(**feed_doc(None))
    marker = "ZQXMARK" + uuid.uuid4().hex[:12]
    produce(env, marker)
    staging = Path(env.output, "_staging")

    # Another live job's staging folder beside it (this process holds its lock), of a run sharing the prefix.
    from tidemark.output.parquet import new_staging

    live = new_staging(env.output, "p" * 20, run_id="20990101T000000000000Z-live")
    (live.root / "part.bin").write_bytes(marker.encode())

    monkeypatch.setenv(FAULTS_ENV, "job.after_stage:exit")  # the driver dies as under kill -9
    with pytest.raises(TidemarkError, match="exit 137"):
        env.run(master="local[1]")
    monkeypatch.delenv(FAULTS_ENV)
    (crashed,) = open_store(root=env.root).open_runs(env.feed)
    left = [p for p in staging.iterdir() if p.is_dir() and p.name.startswith(f"{crashed.run_id}.")]
    assert left and list(left[0].rglob("*.parquet")), "the killed driver left its staged records"

    produce(env, "ZQXOTHER" + uuid.uuid4().hex[:8])  # new records: the next run stages another plan
    handle, _, outcome = env.run()
    assert outcome.committed and handle.plan_id != crashed.plan_id
    # Removed by the settle (the job's lock is free); the live job's folder and lock are untouched.
    assert sorted(p.name for p in staging.iterdir()) == [live.root.name, live.root.name + ".lock"]
    assert marked(staging, marker) == [live.root.name + "/part.bin"]
    live.discard()
    assert list(staging.iterdir()) == []
    assert not [p for p in marked(tmp_path, marker) if "_staging" in p]


def test_staging_on_the_store_is_removed_after_the_run(
    kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3a_store: LocalS3,
    postgres: str,
) -> None:  # fmt: skip
    """Spark stages on S3 (as on a cluster without a shared disk): after the run, ``<output>/_staging/`` on the store
    holds nothing, and the marker is in no object there; the local staging base neither."""
    for key, value in s3a_store.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(STAGE_ON_STORE_ENV, "1")
    monkeypatch.setenv("TIDEMARK_STAGING_DIR", str(tmp_path / "staging"))
    monkeypatch.setenv("TIDEMARK_CHECKPOINT_URL", postgres)
    env = FaultEnv(kafka, spark, tmp_path, "staging-s3", remote=f"s3://{S3_BUCKET}/staging-{uuid.uuid4().hex[:12]}")
    env.install(monkeypatch)
    monkeypatch.setenv(MASKING_KEY_ENV, KEY)
    env.write_feed(**feed_doc(None))
    marker = "ZQXMARK" + uuid.uuid4().hex[:12]
    produce(env, marker)
    remote = Location.of(f"{env.output}/_staging")
    handle = plan_run(env.feed, env.kafka.connection, root=env.root)
    job = env.in_process(handle, env.kafka.connection)
    assert job["records_quarantined"] > 0
    # As soon as the job has staged its pending publication: nothing of it is left in staging, long before the
    # commit step (which may come hours later) promotes it.
    assert [name for name, _ in remote.files()] == []
    assert not [p for p in (tmp_path / "staging").rglob("*") if p.is_file()]
    outcome = commit_run(handle, env.kafka.connection, root=env.root)
    assert outcome.committed
    assert [name for name, _ in remote.files()] == []
    output = Location.of(str(env.output))
    assert [name for name, _ in output.files() if "_staging" in name or "_pending" in name] == []
