"""One real Airflow for the e2e tests that need a running one (api-server, scheduler, dag-processor).

Started once for the e2e tests by :class:`tidemark.devtools.airflow.LocalAirflow` (the code behind
``make airflow``) against the session's Kafka cluster, with its own home, state dir and
feeds folder. The feed ``view`` (manual schedule) reads a 3-partition topic holding a few
records; the DAGs folder holds the project's DAG file and a downstream DAG scheduled on
the feed's Asset. The feed ``docs`` (manual) has an expectation on its text column and a
record whose value is markup with script (``MARKUP``), which Great Expectations writes into
its Data Docs. Users: ``admin`` and ``viewer`` (SimpleAuthManager's roles over every DAG),
and one team per feed (``TEAMS``): ``alice`` may run feed ``view``'s DAG, ``bob`` feed
``docs``'s, both ``tidemark_replay``; the auth manager is ``tests.support.airflow_auth``'s
(SimpleAuthManager plus per-DAG grants), configured as ``[core] auth_manager``. The two feeds'
files name teams (``team: red`` for ``view``, ``blue`` for ``docs``; ``FEED_TEAMS``): ``erin``
(red) and ``frank`` (blue) may run both feeds' DAGs and the shared ones, and only their teams keep
each to its own feed (``USER_TEAMS``; ``viewer`` is in both).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import KafkaTestCluster, keyed_records
from tests.support.airflow_auth import GRANTS_ENV, TEAMS_ENV
from tests.support.airflow_auth import PATH as AUTH_MANAGER
from tidemark.devtools.airflow import LocalAirflow, project_root
from tidemark.kafka.admin import Record

CHROMIUM = "/usr/bin/chromium"  # Debian's package: Playwright's own browser download is not reachable
FEED = "view"
DOCS_FEED = "docs"
CLEARED_FEED = "view_cleared"  # its own topic and group: test_cleared_run clears its old runs
# A rejected value that would run as script in any page that inlines it: it marks the page it ran in.
MARKUP = (
    "<img src=x onerror=\"document.documentElement.dataset.xss=document.cookie.includes('_token=')?'cookie':'ran'\">"
    "<script>document.documentElement.dataset.xss='ran'</script>"
)
SECRET = "pa55-never-shown"
# One team per feed: its user may run the feed's DAG and the replay DAG, nothing else.
TEAMS = {"alice": FEED, "bob": DOCS_FEED}
GRANTS = {user: {f"tidemark_{feed}": "run", "tidemark_replay": "run"} for user, feed in TEAMS.items()}
# Teams by the feed files' `team:` key: erin and frank may run both feeds' DAGs, their teams keep each to its own.
FEED_TEAMS = {FEED: "red", DOCS_FEED: "blue"}
TEAM_MEMBERS = {"erin": FEED, "frank": DOCS_FEED}
USER_TEAMS = {"alice": ["red"], "bob": ["blue"], "viewer": ["red", "blue"], "erin": ["red"], "frank": ["blue"]}
GRANTS.update({user: {f"tidemark_{f}": "run" for f in (FEED, DOCS_FEED, "replay", "redrive")} for user in TEAM_MEMBERS})
USERS = "admin:admin,viewer:viewer," + ",".join(f"{user}:user" for user in (*TEAMS, *TEAM_MEMBERS))
DOWNSTREAM_DAG = "downstream_of_view"
DOWNSTREAM = '''
"""Consumes the view feed's Asset: scheduled whenever the feed's DAG publishes."""
from __future__ import annotations

from airflow.sdk import DAG, task

from tidemark.config.models import load_feed
from tidemark.orchestration.dags import feed_asset

with DAG("downstream_of_view", schedule=[feed_asset(load_feed("view"))], tags=["test"]) as dag:

    @task
    def consume(**context):
        events = context["triggering_asset_events"]
        return sorted(str(e.extra.get("plan_id")) for evs in events.values() for e in evs)

    consume()
'''


def http_call(url: str, *, headers: dict[str, str], body: Any = None, method: str | None = None) -> tuple[int, Any]:
    """One HTTP call (POST with a JSON ``body``, else GET, unless ``method``): its status and answer, JSON decoded."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, headers=headers, method=method or ("POST" if data is not None else "GET")
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        status, text = err.code, err.read().decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


@dataclass
class RunningAirflow:
    airflow: LocalAirflow
    kafka: KafkaTestCluster
    state: Path
    topic: str
    group: str
    output: Path
    tokens: dict[str, str]
    docs_topic: str
    cleared_topic: str

    @property
    def base(self) -> str:
        return self.airflow.url

    def request(self, path: str, *, user: str | None = "admin", body: Any = None, method: str | None = None,
                cookie: bool = False, headers: dict[str, str] | None = None) -> tuple[int, Any]:  # fmt: skip
        """One HTTP call as ``user`` (``None``: anonymous); JSON answers are decoded."""
        headers = {**({"Content-Type": "application/json"} if body is not None else {}), **(headers or {})}
        if user is not None:
            if cookie:
                headers["Cookie"] = f"_token={self.tokens[user]}"
            else:
                headers["Authorization"] = f"Bearer {self.tokens[user]}"
        return http_call(self.base + path, headers=headers, body=body, method=method)

    def runs(self, dag_id: str) -> int:
        """How many runs ``dag_id`` has (Airflow's own count)."""
        status, doc = self.request(f"/api/v2/dags/{dag_id}/dagRuns")
        assert status == 200, doc
        return int(doc["total_entries"])

    def login(self, page: Any, user: str = "admin") -> None:
        """Sign ``user`` in through Airflow's login form in a Playwright page."""
        page.goto(self.base + "/")
        page.get_by_label("Username").fill(user)
        page.get_by_label("Password").fill(self.airflow.passwords()[user])
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(self.base + "/", timeout=60_000)

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        status, doc = self.request(f"/api/v2/dags/{dag_id}/dagRuns", body={"logical_date": None, "conf": conf or {}})
        assert status == 200, doc
        return str(doc["dag_run_id"])

    def wait_run(self, dag_id: str, run_id: str, timeout_s: float = 300) -> str:
        """The run's final state (success or failed), polling the REST API."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status, doc = self.request(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
            assert status == 200, doc
            if doc["state"] in ("success", "failed"):
                return str(doc["state"])
            time.sleep(0.5)
        raise AssertionError(f"{dag_id} run {run_id} did not finish in {timeout_s:.0f}s; logs: {self.airflow.home}")

    def task_logs(self, dag_id: str, run_id: str) -> str:
        """Every task log of one run, as written under the home (to explain a failure)."""
        folder = self.airflow.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(folder.rglob("*.log")))


@pytest.fixture
def browser() -> Iterator[Any]:
    """Debian's Chromium driven by Playwright, closed after the test."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


def answer_in_browser(page: Any, base: str, path: str, body: Any = None) -> tuple[int, str]:
    """What the logged-in ``page`` gets for ``path``: opened as a page (no ``body``) or POSTed as the view does.

    A POST is sent by ``fetch`` from the view's own page, so it carries the login cookie and the
    view's origin, as a real form submission would.
    """
    if body is None:
        response = page.goto(base + path)
        assert response is not None, path
        return int(response.status), str(page.locator("body").inner_text())
    page.goto(base + "/tidemark/")
    answer = page.evaluate(
        """async ([path, body]) => {
            const r = await fetch(path, {method: "POST", headers: {"Content-Type": "application/json"},
                                         body: JSON.stringify(body)});
            return {status: r.status, text: await r.text()};
        }""",
        [path, body],
    )
    return int(answer["status"]), str(answer["text"])


# Package scope: stopped after the last e2e test, so it does not idle through the rest of the suite.
@pytest.fixture(scope="package")
def airflow(kafka: KafkaTestCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAirflow]:
    base = tmp_path_factory.mktemp("airflow-e2e")
    feeds, dags, state, output = base / "feeds", base / "dags", base / "state", base / "out" / FEED
    feeds.mkdir()
    dags.mkdir()
    topic = kafka.new_topic(partitions=3, prefix="view")
    group = f"g-view-{uuid.uuid4().hex[:8]}"
    for partition, count in enumerate((8, 5, 3)):
        kafka.produce(topic, keyed_records(count, partition=partition, prefix=f"p{partition}"))
    feed = {"topics": [topic], "group": group, "deserialization": {"format": "string"}, "output": str(output),
            "team": FEED_TEAMS[FEED]}  # fmt: skip
    (feeds / f"{FEED}.yaml").write_text(yaml.safe_dump(feed))
    docs_topic = kafka.new_topic(partitions=1, prefix="docs")
    kafka.produce(docs_topic, [*keyed_records(3, partition=0), Record(value=MARKUP.encode(), partition=0)])
    rule = {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "value", "regex": "^v-"}}
    checks = {"on_bad_records": "quarantine", "quarantine_max_ratio": 0.5, "expectations": [rule]}
    docs = {"topics": [docs_topic], "group": f"g-docs-{uuid.uuid4().hex[:8]}", "deserialization": {"format": "string"},
            "output": str(base / "out" / DOCS_FEED), "validation": checks, "team": FEED_TEAMS[DOCS_FEED]}  # fmt: skip
    (feeds / f"{DOCS_FEED}.yaml").write_text(yaml.safe_dump(docs))
    cleared_topic = kafka.new_topic(partitions=3, prefix="cleared")
    cleared = {"topics": [cleared_topic], "group": f"g-cleared-{uuid.uuid4().hex[:8]}",
               "deserialization": {"format": "string"}, "output": str(base / "out" / CLEARED_FEED)}  # fmt: skip
    (feeds / f"{CLEARED_FEED}.yaml").write_text(yaml.safe_dump(cleared))
    shutil.copy(project_root() / "dags" / "tidemark_dags.py", dags / "tidemark_dags.py")
    (dags / "downstream.py").write_text(DOWNSTREAM)
    airflow = LocalAirflow(
        home=base / "home",
        port=0,  # a free one, chosen again if another test's server takes it first
        bootstrap_servers=kafka.bootstrap_servers,
        extra_env={
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "TIDEMARK_FEEDS_DIR": str(feeds),
            "TIDEMARK_STATE_DIR": str(state),
            "TIDEMARK_REPLAY_OUTPUT_ROOTS": str(base / "replays") + ",s3://replays/allowed",
            "AIRFLOW__CORE__AUTH_MANAGER": AUTH_MANAGER,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": USERS,
            GRANTS_ENV: json.dumps(GRANTS),
            TEAMS_ENV: json.dumps(USER_TEAMS),
            # The auth manager's module, for the api-server and the tasks (the DAGs' own check asks it too).
            "PYTHONPATH": os.pathsep.join(p for p in (str(project_root()), os.environ.get("PYTHONPATH")) if p),
            # The security tests send dozens of previews in a row; the limit itself is tested in process.
            "TIDEMARK_VIEW_PREVIEW_RATE": "10000/60",
            # A PLAINTEXT cluster ignores SASL settings when no mechanism is set; the password is
            # here to prove it never reaches the view, its JSON or the task logs.
            "AIRFLOW_CONN_TIDEMARK_KAFKA": json.dumps(
                {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka.bootstrap_servers, "sasl.password": SECRET}}
            ),
        },
    )
    try:
        airflow.up()
        tokens = {user: airflow.token(user) for user in ("admin", "viewer", *TEAMS, *TEAM_MEMBERS)}
        running = RunningAirflow(airflow, kafka, state, topic, group, output, tokens, docs_topic, cleared_topic)
        dag_ids = [f"tidemark_{f}" for f in (FEED, DOCS_FEED, CLEARED_FEED)]
        _wait_for_dags(running, [*dag_ids, "tidemark_replay", DOWNSTREAM_DAG])
        yield running
    finally:
        airflow.down(timeout_s=10)  # the scheduler's graceful stop can take 30 s; nothing here needs it


def _wait_for_dags(airflow: RunningAirflow, dag_ids: list[str], timeout_s: float = 180) -> None:
    """The dag-processor has parsed the DAGs (they exist in the API), unpaused."""
    deadline = time.monotonic() + timeout_s
    missing = dag_ids
    while time.monotonic() < deadline:
        missing = [d for d in dag_ids if airflow.request(f"/api/v2/dags/{d}")[0] != 200]
        if not missing:
            return
        time.sleep(2)
    raise AssertionError(f"DAGs {missing} not parsed after {timeout_s:.0f}s; see {airflow.airflow.home / 'logs'}")
