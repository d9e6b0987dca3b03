"""The fault suite's fixtures and its closing count (scenarios, records checked, lost, duplicated)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import S3_BUCKET, KafkaTestCluster
from tests.faults.harness import LOCAL, SCOREBOARD, FaultEnv, Tally, write_scoreboard

_LOADED_AT = time.time()  # collection time: before any worker of this run wrote a count


@pytest.fixture
def fenv(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         request: pytest.FixtureRequest) -> FaultEnv:  # fmt: skip
    """A fault environment on the embedded default (local state and output, SQLite checkpoints),
    or, with ``@ON_BOTH_SHAPES``, also on the deployment shape: state and output on the
    session's S3 server (s3proxy), checkpoints in its PostgreSQL."""
    remote = None
    if getattr(request, "param", LOCAL) != LOCAL:
        request.getfixturevalue("s3")  # its AWS_* settings are in the environment for the session
        remote = f"s3://{S3_BUCKET}/faults-{uuid.uuid4().hex[:12]}"
        monkeypatch.setenv("TIDEMARK_CHECKPOINT_URL", request.getfixturevalue("postgres"))
    env = FaultEnv(kafka, spark, tmp_path, request.node.name, remote=remote)
    SCOREBOARD.setdefault(request.node.name, Tally())  # counted as run even where no record is checked
    monkeypatch.setenv("TIDEMARK_FEEDS_DIR", str(env.feeds))
    monkeypatch.setenv("TIDEMARK_STATE_DIR", str(env.root))
    monkeypatch.delenv("TIDEMARK_FAULTS", raising=False)
    return env


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the count where the scenarios ran: under pytest-xdist that is one worker (their xdist_group)."""
    if SCOREBOARD:
        write_scoreboard()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # In-process: this session's scoreboard. Under xdist (the controller ran no test): the
    # file the fault suite's worker wrote at its session's end, if it was written by this run.
    doc = write_scoreboard() if SCOREBOARD else _written_since(_LOADED_AT)
    if doc is None:
        return
    terminalreporter.write_line(
        f"fault suite: {doc['scenarios_run']} scenario tests, {doc['checks']} invariant checks, "
        f"{doc['records_checked']} records checked, {doc['records_lost']} lost, "
        f"{doc['records_duplicated']} duplicated"
    )


def _written_since(started: float) -> dict[str, Any] | None:
    import json

    from tests.faults.harness import LAST_RUN

    if not LAST_RUN.exists() or LAST_RUN.stat().st_mtime < started:
        return None
    doc: dict[str, Any] = json.loads(LAST_RUN.read_text())
    return doc
