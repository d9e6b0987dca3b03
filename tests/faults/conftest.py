"""The fault suite's fixtures and its closing count (scenarios, records checked, lost, duplicated)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.faults.harness import SCOREBOARD, FaultEnv, Tally, write_scoreboard


@pytest.fixture
def fenv(kafka: KafkaTestCluster, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         request: pytest.FixtureRequest) -> FaultEnv:  # fmt: skip
    env = FaultEnv(kafka, spark, tmp_path, request.node.name)
    SCOREBOARD.setdefault(request.node.name, Tally())  # counted as run even where no record is checked
    monkeypatch.setenv("TIDEMARK_FEEDS_DIR", str(env.feeds))
    monkeypatch.setenv("TIDEMARK_STATE_DIR", str(env.root))
    monkeypatch.delenv("TIDEMARK_FAULTS", raising=False)
    return env


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not SCOREBOARD:
        return
    doc = write_scoreboard()
    terminalreporter.write_line(
        f"fault suite: {doc['scenarios_run']} scenario tests, {doc['checks']} invariant checks, "
        f"{doc['records_checked']} records checked, {doc['records_lost']} lost, "
        f"{doc['records_duplicated']} duplicated"
    )
