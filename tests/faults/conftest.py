"""The fault suite's fixtures; its closing count is printed by ``tests/conftest.py`` (also under xdist)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import S3_BUCKET, KafkaTestCluster
from tests.faults.harness import LOCAL, S3_STAGING, SCOREBOARD, FaultEnv, Tally, write_scoreboard
from tidemark.devtools import registry as local_registry
from tidemark.devtools.registry import LocalRegistry
from tidemark.kafka.registry import ENV_URL
from tidemark.output.staging import STAGE_ON_STORE_ENV


@pytest.fixture(scope="session")
def kafka(own_kafka: KafkaTestCluster) -> KafkaTestCluster:
    """The fault suite stops, pauses and restarts brokers: never those of the cluster other workers share."""
    return own_kafka


@pytest.fixture
def fenv(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         request: pytest.FixtureRequest) -> Iterator[FaultEnv]:  # fmt: skip
    """A fault environment on the embedded default (local state and output, SQLite checkpoints),
    or, with ``@ON_BOTH_SHAPES``, also on the deployment shape: state and output on the
    session's S3 server (s3proxy), checkpoints in its PostgreSQL; and that shape with Spark
    staging on S3 (``TIDEMARK_STAGE_ON_STORE=1``) as a cluster without a shared disk does."""
    remote = None
    shape = getattr(request, "param", LOCAL)
    # The store's settings get a patch of their own, as the session's S3 settings do: a test
    # may undo its monkeypatch midway and still read the output.
    with pytest.MonkeyPatch.context() as store_env:
        if shape == S3_STAGING:  # Spark stages through s3a: on the S3 server whose backend takes its renames
            for key, value in request.getfixturevalue("s3a_store").env().items():
                store_env.setenv(key, value)
            store_env.setenv(STAGE_ON_STORE_ENV, "1")
        elif shape != LOCAL:
            request.getfixturevalue("s3")  # its AWS_* settings are in the environment for the session
        if shape != LOCAL:
            remote = f"s3://{S3_BUCKET}/faults-{uuid.uuid4().hex[:12]}"
            monkeypatch.setenv("TIDEMARK_CHECKPOINT_URL", request.getfixturevalue("postgres"))
        env = FaultEnv(kafka, spark, tmp_path, request.node.name, remote=remote)
        SCOREBOARD.setdefault(request.node.name, Tally())  # counted as run even where no record is checked
        env.install(monkeypatch)
        yield env


@dataclass
class FaultRegistry:
    """The fault suite's schema registry: durable, so that a scenario can stop it and bring it back
    on the same URL with the same schemas and ids (:func:`tidemark.devtools.registry.restart`)."""

    server: LocalRegistry

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        self.server.stop(purge=False)

    def restart(self) -> None:
        self.server = local_registry.restart(self.server)

    def up(self) -> bool:
        return local_registry.answers(self.url)


@pytest.fixture(scope="session")
def fault_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultRegistry]:
    held = FaultRegistry(local_registry.start(tmp_path_factory.mktemp("fault-registry"), durable=True))
    try:
        yield held
    finally:
        held.server.stop(purge=True)


@pytest.fixture
def avro_registry(fault_registry: FaultRegistry, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultRegistry]:
    """The fault registry as the feeds' registry (for the CLI and the job); up again after the test."""
    monkeypatch.setenv(ENV_URL, fault_registry.url)
    yield fault_registry
    if not fault_registry.up():  # a scenario that failed while it was stopped
        fault_registry.restart()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the count where the scenarios ran (under xdist: the one worker tests/conftest.py gives them)."""
    if SCOREBOARD:
        write_scoreboard()
