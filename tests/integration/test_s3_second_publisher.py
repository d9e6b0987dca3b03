"""Two publishers of one plan on S3 (an Airflow zombie beside its retry): the published output stays whole.

The zombie (B) runs the job of a planned run and passes its last look for a manifest;
right there the retry (A) runs the same plan's job, publishes and commits the group.
Then B goes on: it either dies mid-upload (SIGKILL: nothing tidies up) or finishes. At
B's upload, and at the end, the output read through its manifests must be exactly an
independent ``read_committed`` scan of the committed offsets: nothing lost, nothing twice.
State and output are on the session's S3 server (s3proxy), checkpoints in PostgreSQL.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import S3_BUCKET, KafkaTestCluster
from tests.faults.harness import FaultEnv
from tidemark.faults import InjectedFault
from tidemark.output import parquet as sink
from tidemark.runs.pipeline import commit_run, plan_run
from tidemark.storage import Location

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def env(
    kafka: KafkaTestCluster, spark: Any, s3: Any, postgres: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> FaultEnv:
    monkeypatch.setenv("TIDEMARK_CHECKPOINT_URL", postgres)
    e = FaultEnv(kafka, spark, tmp_path, "second-publisher", remote=f"s3://{S3_BUCKET}/second-{uuid.uuid4().hex[:12]}")
    e.install(monkeypatch)
    return e


def readable(env: FaultEnv) -> Any:
    """The output as a reader sees it through the manifests, or why it cannot be read."""
    try:
        return env.published()
    except OSError as exc:  # a manifest listing files that are gone
        return f"unreadable: {exc}"


@pytest.mark.parametrize("zombie", ["dies_mid_upload", "finishes"])
def test_a_second_publisher_never_removes_a_committed_publication(
    env: FaultEnv, zombie: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.produce(60, bad={7})
    handle = plan_run(env.feed, env.kafka.connection, root=env.root)
    seen_at_b_upload: list[Any] = []
    phase = {"b_checked": False, "a_done": False}
    real_load, real_upload = sink.load_manifest, Location.upload_tree

    def load_manifest(output: Any, plan_id: str) -> Any:
        found = real_load(output, plan_id)
        # B's look just before it uploads (old code: then deleted the plan folder): A runs right here.
        if found is None and sys._getframe(1).f_code.co_name == "_upload" and not phase["b_checked"]:
            phase["b_checked"] = True
            with monkeypatch.context() as retry_worker:  # the retry runs on another worker: its own staging
                retry_worker.setenv("TIDEMARK_STAGING_DIR", str(env.tmp / "retry-staging"))
                env.in_process(handle, env.kafka.connection)
                assert commit_run(handle, env.kafka.connection, root=env.root).committed
            phase["a_done"] = True
        return found

    def upload_tree(self: Location, source: Path, files: list[str] | None = None) -> None:
        if phase["a_done"] and not seen_at_b_upload:
            seen_at_b_upload.append(readable(env))  # what a reader sees while B uploads
            if zombie == "dies_mid_upload":
                real_upload(self, source, (files or [])[:1])
                raise InjectedFault("the zombie task is killed mid-upload")
        real_upload(self, source, files)

    monkeypatch.setenv("TIDEMARK_STAGING_DIR", str(env.tmp / "zombie-staging"))
    monkeypatch.setattr(sink, "load_manifest", load_manifest)
    monkeypatch.setattr(Location, "upload_tree", upload_tree)

    if zombie == "dies_mid_upload":
        with pytest.raises(InjectedFault):
            env.in_process(handle, env.kafka.connection)
    else:
        env.in_process(handle, env.kafka.connection)

    assert phase["a_done"] and seen_at_b_upload
    expected = env.check(f"second-publisher-{zombie}")  # whole output vs the read_committed scan
    assert expected.checked == 60
    assert seen_at_b_upload[0] == env.published()  # and so it was while B uploaded
    manifest = real_load(env.output, handle.plan_id)
    assert manifest is not None and sink.verify(manifest) == []
