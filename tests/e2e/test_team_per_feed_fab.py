"""Team per feed through FAB's auth manager: roles holding ``DAG:<dag_id>`` permissions, in a real Airflow, over REST.

A real Airflow of its own (:class:`tidemark.devtools.airflow.LocalAirflow`) whose ``[core]
auth_manager`` is the FAB provider's ``FabAuthManager``, against the session's Kafka
cluster, with two feeds (``alpha``, ``beta``). Users and roles are made with FAB's own tools,
as an admin would: ``airflow users create`` the admin, ``airflow sync-perm --include-dags``
each DAG's ``DAG:<dag_id>`` resource, and FAB's REST API (``/auth/fab/v1/roles``,
``/users``, as the admin) one role per team and its user (the CLI's ``roles add-perms``
grants the same; each CLI call costs a fresh interpreter). ``alice``'s role may read and edit ``DAG:tidemark_alpha`` and
``DAG:tidemark_replay``, read and create ``DAG Runs`` and read ``Plugins`` (the Tidemark
view); ``bob``'s the same on ``beta``. The replay DAG's own check looks the triggering user
up with :func:`tidemark.orchestration.access.fab_user` (``[tidemark] run_user_lookup``),
through the connection ``tidemark_auth_db`` (here the metadata database's SQLite file).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from tests.conftest import KafkaTestCluster, keyed_records
from tests.e2e.conftest import answer_in_browser, http_call
from tidemark.devtools.airflow import LocalAirflow

# A real Airflow of its own, started in the first test's setup: more than the suite's 600 s on a loaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(1200)]

FAB = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
TEAMS = {"alice": "alpha", "bob": "beta"}
OTHER = {"alice": "beta", "bob": "alpha"}
# Each team's role: its feed's DAG and the replay DAG, their runs, and the plugin's view; nothing on "DAGs" (all).
TEAM_PERMISSIONS = [
    (["DAG:tidemark_{feed}", "DAG:tidemark_replay"], ["can_read", "can_edit"]),
    (["DAG Runs"], ["can_read", "can_create"]),
    (["Plugins"], ["can_read"]),
]


@dataclass
class FabAirflow:
    airflow: LocalAirflow
    passwords: dict[str, str]
    tokens: dict[str, str]
    topics: dict[str, str]

    def request(self, path: str, *, user: str, body: Any = None) -> tuple[int, Any]:
        """One call as ``user`` with its Bearer token; JSON answers decoded."""
        headers = {"Authorization": f"Bearer {self.tokens[user]}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        return http_call(self.airflow.url + path, headers=headers, body=body)

    def wait_run(self, dag_id: str, run_id: str, timeout_s: float = 300) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status, doc = self.request(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}", user="admin")
            assert status == 200, doc
            if doc["state"] in ("success", "failed"):
                return str(doc["state"])
            time.sleep(0.5)
        raise AssertionError(f"{dag_id} run {run_id} did not finish in {timeout_s:.0f}s; logs: {self.airflow.home}")

    def task_logs(self, dag_id: str, run_id: str) -> str:
        folder = self.airflow.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(folder.rglob("*.log")))


def _foreign_paths(feed: str) -> list[tuple[str, Any]]:
    """The routes of ``feed`` (GET, or POST with a body) the other team tries: its page, JSON, preview and replay."""
    body = {"start_from": "earliest"}
    return [
        (f"/tidemark/feeds/{feed}", None), (f"/tidemark/api/feeds/{feed}", None),
        (f"/tidemark/api/feeds/{feed}/replay/preview", body), (f"/tidemark/api/feeds/{feed}/replay", body),
    ]  # fmt: skip


def _token(airflow: LocalAirflow, user: str, password: str) -> str:
    """A REST API token from FAB's own ``POST /auth/token``."""
    body = json.dumps({"username": user, "password": password}).encode()
    req = urllib.request.Request(f"{airflow.url}/auth/token", data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")  # fmt: skip
    with urllib.request.urlopen(req, timeout=60) as resp:
        return str(json.loads(resp.read())["access_token"])


def _password(user: str) -> str:
    return f"{user}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def fab_airflow(kafka: KafkaTestCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FabAirflow]:
    base = tmp_path_factory.mktemp("airflow-fab")
    feeds = base / "feeds"
    feeds.mkdir()
    topics = {}
    for feed in TEAMS.values():
        topics[feed] = kafka.new_topic(partitions=1, prefix=f"fab{feed}")
        kafka.produce(topics[feed], keyed_records(3, partition=0, prefix=feed))
        (feeds / f"{feed}.yaml").write_text(yaml.safe_dump({
            "topics": [topics[feed]], "group": f"g-fab-{feed}-{uuid.uuid4().hex[:8]}",
            "deserialization": {"format": "string"}, "output": str(base / "out" / feed),
        }))  # fmt: skip
    home = base / "home"
    airflow = LocalAirflow(
        home=home,
        port=0,
        bootstrap_servers=kafka.bootstrap_servers,
        extra_env={
            "TIDEMARK_FEEDS_DIR": str(feeds),
            "TIDEMARK_STATE_DIR": str(base / "state"),
            "AIRFLOW__CORE__AUTH_MANAGER": FAB,
            "AIRFLOW__TIDEMARK__RUN_USER_LOOKUP": "tidemark.orchestration.access.fab_user",
            # The replay DAG's check reads FAB's users and roles here: the metadata database's own file.
            "AIRFLOW_CONN_TIDEMARK_AUTH_DB": json.dumps({"conn_type": "sqlite", "host": str(home / "airflow.db")}),
        },
    )
    try:
        airflow.up()
        passwords = {"admin": _password("admin")}
        admin = ["--username", "admin", "--password", passwords["admin"], "--role", "Admin",
                 "--email", "admin@example.com", "--firstname", "admin", "--lastname", "admin"]  # fmt: skip
        airflow.airflow("users", "create", *admin)
        tokens = {"admin": _token(airflow, "admin", passwords["admin"])}
        running = FabAirflow(airflow, passwords, tokens, topics)
        _wait_for_dags(running, [f"tidemark_{feed}" for feed in TEAMS.values()] + ["tidemark_replay"])
        airflow.airflow("sync-perm", "--include-dags")  # each DAG's DAG:<dag_id> resource
        for user, feed in TEAMS.items():
            role = f"team_{feed}"
            actions = [
                {"action": {"name": action}, "resource": {"name": resource.format(feed=feed)}}
                for resources, granted in TEAM_PERMISSIONS
                for resource in resources
                for action in granted
            ]
            status, doc = running.request("/auth/fab/v1/roles", user="admin", body={"name": role, "actions": actions})
            assert status == 200, doc
            passwords[user] = _password(user)
            status, doc = running.request("/auth/fab/v1/users", user="admin", body={
                "username": user, "email": f"{user}@example.com", "first_name": user, "last_name": "team",
                "roles": [{"name": role}], "password": passwords[user]})  # fmt: skip
            assert status == 200, doc
            tokens[user] = _token(airflow, user, passwords[user])
        yield running
    finally:
        airflow.down(timeout_s=10)


def _wait_for_dags(airflow: FabAirflow, dag_ids: list[str], timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    missing = dag_ids
    while time.monotonic() < deadline:
        missing = [d for d in dag_ids if airflow.request(f"/api/v2/dags/{d}", user="admin")[0] != 200]
        if not missing:
            return
        time.sleep(2)
    raise AssertionError(f"DAGs {missing} not parsed after {timeout_s:.0f}s; see {airflow.airflow.home / 'logs'}")


def test_with_fab_roles_each_user_lists_and_reads_only_its_own_feed(fab_airflow: FabAirflow) -> None:
    for user, own in TEAMS.items():
        other = OTHER[user]
        status, doc = fab_airflow.request("/tidemark/api/feeds", user=user)
        assert status == 200 and [f["name"] for f in doc] == [own], (user, doc)
        status, doc = fab_airflow.request(f"/tidemark/api/feeds/{own}", user=user)
        assert status == 200 and doc["status"]["partitions"], doc
        # Airflow's own API answers from the same roles.
        status, doc = fab_airflow.request("/api/v2/dags?limit=100", user=user)
        assert status == 200 and {d["dag_id"] for d in doc["dags"]} == {f"tidemark_{own}", "tidemark_replay"}, doc
        for path, body in _foreign_paths(other):
            status, doc = fab_airflow.request(path, user=user, body=body)
            assert (status, doc) == (403, {"detail": "Forbidden"}), (user, path, doc)
            assert fab_airflow.topics[other] not in json.dumps(doc)
        status, _ = fab_airflow.request(f"/api/v2/dags/tidemark_{other}/dagRuns", user=user,
                                        body={"logical_date": None})  # fmt: skip
        assert status == 403
    status, doc = fab_airflow.request("/tidemark/api/feeds", user="admin")
    assert status == 200 and {f["name"] for f in doc} == set(TEAMS.values())


def test_with_fab_roles_each_user_replays_its_own_feed_and_the_dag_refuses_the_other(fab_airflow: FabAirflow) -> None:
    for user, own in TEAMS.items():
        # Through the view, as the user: the replay DAG's first task looks the user up in FAB and lets it pass.
        status, doc = fab_airflow.request(f"/tidemark/api/feeds/{own}/replay", user=user,
                                          body={"start_from": "earliest"})  # fmt: skip
        assert status == 200, doc
        run_id = doc["dag_run_id"]
        state = fab_airflow.wait_run("tidemark_replay", run_id)
        assert state == "success", fab_airflow.task_logs("tidemark_replay", run_id)
        # Through Airflow's own REST trigger, naming the other team's feed: the run starts, its first task refuses.
        other = OTHER[user]
        status, doc = fab_airflow.request("/api/v2/dags/tidemark_replay/dagRuns", user=user, body={
            "logical_date": None, "conf": {"feed": other, "start_from": "earliest", "dry_run": False}})  # fmt: skip
        assert status == 200, doc
        refused = doc["dag_run_id"]
        assert fab_airflow.wait_run("tidemark_replay", refused) == "failed"
        logs = fab_airflow.task_logs("tidemark_replay", refused)
        assert f"user '{user}' may not replay feed '{other}'" in logs, logs[-3000:]
        assert f"edit the DAG tidemark_{other}" in logs, logs[-3000:]


def _fab_login(page: Any, airflow: FabAirflow, user: str, then: str) -> None:
    """Sign ``user`` in through FAB's own login page (``/auth/login/``), which redirects to ``then`` with the cookie."""
    base = airflow.airflow.url
    page.goto(f"{base}/auth/login/?{urllib.parse.urlencode({'next': base + then})}")
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(airflow.passwords[user])
    page.get_by_role("button", name="Sign In").click()
    page.wait_for_url(base + then, timeout=60_000)


def test_with_fab_roles_in_a_browser_each_user_sees_and_opens_only_its_own_feed(fab_airflow: FabAirflow,
                                                                                 browser: Any) -> None:  # fmt: skip
    from playwright.sync_api import expect

    base = fab_airflow.airflow.url
    for user, own in TEAMS.items():
        other = OTHER[user]
        context = browser.new_context()
        page = context.new_page()
        _fab_login(page, fab_airflow, user, then="/tidemark/")
        expect(page.get_by_role("link", name=own, exact=True)).to_be_visible(timeout=60_000)
        assert page.get_by_role("link", name=other, exact=True).count() == 0
        assert fab_airflow.topics[other] not in page.locator("body").inner_text()

        with page.expect_response(f"{base}/tidemark/feeds/{own}") as opened:
            page.get_by_role("link", name=own, exact=True).click()
        assert opened.value.status == 200, (user, opened.value.status)
        expect(page.locator("#partitions")).to_be_visible(timeout=60_000)
        assert fab_airflow.topics[own] in page.locator("body").inner_text()
        # The replay form is offered for the user's own feed, and it answers: a preview of the feed.
        expect(page.locator("#replay-form")).to_be_visible()
        page.locator("#preview-btn").click()
        expect(page.locator("#preview-summary")).to_be_visible(timeout=60_000)

        # The other feed: its page (no replay form in it), JSON, preview and replay answer 403 and name nothing.
        for path, body in _foreign_paths(other):
            status, text = answer_in_browser(page, base, path, body)
            assert status == 403, (user, path, text)
            assert json.loads(text) == {"detail": "Forbidden"}, (user, path, text)
            assert fab_airflow.topics[other] not in text
            if body is None:
                assert page.locator("#replay-form").count() == 0, (user, path)
        context.close()
