"""The local Airflow's api-server and a port another process holds (tests start servers side by side)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tidemark.devtools import airflow as airflow_module
from tidemark.devtools.airflow import AirflowStartError, LocalAirflow
from tidemark.devtools.kafka.cluster import free_port

pytestmark = pytest.mark.integration


def test_a_port_in_use_fails_naming_it_and_leaves_nothing_running(tmp_path: Path, held_port: int) -> None:
    airflow = LocalAirflow(home=tmp_path / "home", port=held_port)
    with pytest.raises(AirflowStartError, match=rf"could not listen on 127\.0\.0\.1:{held_port}: another process uses "
                                                r"that port; .*--port N"):  # fmt: skip
        airflow.up(timeout_s=120)
    assert airflow.running() == {}


@pytest.mark.extended  # starts a whole Airflow to test a retry of the dev tool's own port choice
def test_any_port_is_chosen_again_when_the_first_is_taken(
    tmp_path: Path, held_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = [held_port]  # the first choice: taken between choosing it and the api-server's bind

    def choose() -> int:
        chosen.append(free_port())
        return chosen.pop(0)

    monkeypatch.setattr(airflow_module, "free_port", choose)
    airflow = LocalAirflow(home=tmp_path / "home", port=0)
    try:
        airflow.up(timeout_s=180)
        assert airflow.port not in (0, held_port)
        with urllib.request.urlopen(f"{airflow.url}/api/v2/monitor/health", timeout=10) as resp:
            assert json.loads(resp.read())["metadatabase"]["status"] == "healthy"
        assert sorted(airflow.running()) == sorted(airflow_module.PROCESSES)
    finally:
        airflow.down(timeout_s=10)
    assert airflow.running() == {}
