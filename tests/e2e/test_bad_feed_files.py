"""A bad feed file in a running Airflow: its import error in Airflow's API, its error in the Tidemark view.

Airflow (api-server, scheduler, dag-processor) runs on the project's ``dags/`` folder with
a feeds folder holding one good feed and one with a YAML typo. The dag-processor parses
the files as in production: the good feed's DAG and the built-in DAGs appear, Airflow's
import errors name the bad file, and the view lists the broken feed with its error.
Nothing here reads Kafka: parsing must not need it.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tidemark.devtools.airflow import LocalAirflow

pytestmark = pytest.mark.integration


def get(airflow: LocalAirflow, token: str, path: str) -> tuple[int, Any]:
    req = urllib.request.Request(airflow.url + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalAirflow, str, Path]]:
    base = tmp_path_factory.mktemp("airflow-bad-feeds")
    feeds = base / "feeds"
    feeds.mkdir()
    (feeds / "good.yaml").write_text(f"topics: [orders]\ngroup: g-good\noutput: {base / 'out'}\n")
    (feeds / "typo.yaml").write_text("topics: [orders\ngroup: g-typo\n")
    env = {"TIDEMARK_FEEDS_DIR": str(feeds), "TIDEMARK_STATE_DIR": str(base / "state")}
    running = LocalAirflow(home=base / "home", port=0, bootstrap_servers="127.0.0.1:9", extra_env=env)  # no broker
    try:
        running.up()
        yield running, running.token("admin"), feeds
    finally:
        running.down(timeout_s=10)


def test_airflow_loads_the_good_feed_and_shows_the_bad_file_as_an_import_error(
    airflow: tuple[LocalAirflow, str, Path],
) -> None:
    running, token, feeds = airflow
    deadline = time.monotonic() + 240
    errors: list[dict[str, Any]] = []
    missing = ["tidemark_good", "tidemark_replay", "tidemark_backfill"]
    while time.monotonic() < deadline and (missing or not errors):
        missing = [d for d in missing if get(running, token, f"/api/v2/dags/{d}")[0] != 200]
        errors = get(running, token, "/api/v2/importErrors")[1].get("import_errors", [])
        time.sleep(3)

    assert missing == [], f"not parsed: {missing}; see {running.home / 'logs'}"
    [error] = errors
    assert error["filename"].endswith("tidemark_feed_errors.py")
    assert str(feeds / "typo.yaml") in error["stack_trace"] and "not valid YAML" in error["stack_trace"]
    assert get(running, token, "/api/v2/dags/tidemark_typo")[0] == 404

    status, rows = get(running, token, "/tidemark/api/feeds")
    assert status == 200, rows
    by_name = {row["name"]: row for row in rows}
    assert sorted(by_name) == ["good", "typo"]
    assert by_name["typo"]["broken"] is True and "typo.yaml" in by_name["typo"]["error"]
