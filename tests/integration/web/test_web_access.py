"""Team per feed, in process: two users on two feeds through Airflow's own auth dependencies and auth manager.

The app is built as the plugin builds it (``airflow_auth()``, ``AirflowFeedAccess``), with
the per-DAG auth manager of ``tests.support.airflow_auth`` configured as ``[core]
auth_manager`` and real JWTs it signs. ``alice`` may run feed ``alpha``'s DAG, ``bob``
feed ``beta``'s; ``carol`` may edit ``alpha`` (replay, not commit); ``dave`` only reads it.
Kafka is the session's real cluster. The token-revocation lookup (a table of Airflow's
metadata database, which no in-process test starts) answers "not revoked"; the e2e tests
run the whole of it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi import Request
from fastapi.testclient import TestClient

from tests.conftest import KafkaTestCluster, keyed_records
from tests.support.airflow_auth import GRANTS_ENV, PATH, TEAMS_ENV
from tidemark.checkpoints.store import SqliteCheckpointStore
from tidemark.config.models import Feed
from tidemark.output.deadletters import DeadLetter
from tidemark.runs.report import RunReport
from tidemark.web.app import create_app

pytestmark = pytest.mark.integration

GRANTS = {
    "alice": {"tidemark_alpha": "run", "tidemark_replay": "run"},
    "bob": {"tidemark_beta": "run", "tidemark_replay": "run"},
    "carol": {"tidemark_alpha": "edit", "tidemark_replay": "run"},
    "dave": {"tidemark_alpha": "read"},
    # Both may run both feeds' DAGs: only the feeds' teams (``team:``) keep each to its own.
    "erin": {"tidemark_alpha": "run", "tidemark_beta": "run", "tidemark_replay": "run"},
    "frank": {"tidemark_alpha": "run", "tidemark_beta": "run", "tidemark_replay": "run"},
}
USERS = "alice:user,bob:user,carol:user,dave:viewer,admin:admin,erin:user,frank:user"
FEED_TEAMS = {"alpha": "red", "beta": "blue"}
USER_TEAMS = {"erin": ["red"], "frank": ["blue"]}
SECRET_IN_RUN = "value-of-beta-only"  # in beta's run history: must never reach alice


@pytest.fixture
def auth(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The per-DAG auth manager as Airflow's configured one; a function giving a user's token."""
    from airflow.api_fastapi import app as airflow_app
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.models.revoked_token import RevokedToken

    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", PATH)
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", USERS)
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", uuid.uuid4().hex * 2)  # 64 bytes, as HS512 wants
    monkeypatch.setenv(GRANTS_ENV, json.dumps(GRANTS))
    monkeypatch.setattr(RevokedToken, "is_revoked", classmethod(lambda cls, jti, session=None: False))
    airflow_app.purge_cached_app()
    manager = airflow_app.create_auth_manager()
    roles = dict(u.split(":") for u in USERS.split(","))

    def token(user: str) -> str:
        return str(manager.generate_jwt(SimpleAuthManagerUser(username=user, role=roles[user])))

    yield token
    airflow_app.purge_cached_app()


@pytest.fixture
def feeds(kafka: KafkaTestCluster, tmp_path: Path) -> dict[str, Feed]:
    out = {}
    for name in ("alpha", "beta"):
        topic = kafka.new_topic(partitions=1, prefix=f"acl-{name}")
        kafka.produce(topic, keyed_records(4, partition=0))
        out[name] = Feed(name=name, topics=(topic,), group=f"g-{name}-{uuid.uuid4().hex[:8]}",
                         isolation="read_uncommitted", output=str(tmp_path / "out" / name))  # fmt: skip
    return out


@pytest.fixture
def started() -> list[dict[str, Any]]:
    return []


@pytest.fixture
def client(auth: Any, kafka: KafkaTestCluster, feeds: dict[str, Feed], tmp_path: Path,
           started: list[dict[str, Any]]) -> TestClient:  # fmt: skip
    from tidemark.orchestration.access import AirflowFeedAccess
    from tidemark.orchestration.dags import airflow_auth

    store = SqliteCheckpointStore(tmp_path / "cp.sqlite")
    runs_root = tmp_path / "state"  # the state dir: runs are under its runs/
    docs = runs_root / "runs" / "beta" / "r1" / "gx"
    docs.mkdir(parents=True)
    (docs / "index.html").write_text(f"<p>{SECRET_IN_RUN}</p>")
    failed = RunReport(run_id="r1", feed="beta", status="failed", error=f"record {SECRET_IN_RUN} refused",
                       data_docs=str(docs / "index.html"))  # fmt: skip
    reports = {"beta": [failed]}

    def trigger(request: Request, conf: dict[str, Any]) -> dict[str, Any]:
        started.append(conf)
        return {"dag_run_id": "manual__1", "conf": conf}

    def redrive(request: Request, conf: dict[str, Any]) -> dict[str, Any]:
        started.append({**conf, "redrive": True})
        return {"dag_run_id": "manual__2", "conf": conf}

    def letters(feed: Feed) -> list[DeadLetter]:
        value = f"{SECRET_IN_RUN}-dead".encode() if feed.name == "beta" else b"alpha-dead"
        return [DeadLetter(feed.topics[0], 0, 3, datetime(2026, 11, 20, tzinfo=UTC), b"k3", value, (), "p1", "r1",
                           ("decode_error",), "did not decode")]  # fmt: skip

    app = create_app(
        feeds=lambda: feeds, connection=lambda: kafka.connection, checkpoints=lambda: store,
        runs=lambda name: reports.get(name, []), runs_root=runs_root, timeout_s=3.0,
        dependencies=airflow_auth(), trigger=trigger,
        access=AirflowFeedAccess(feed_teams=lambda: {n: f.team for n, f in feeds.items()}),
        api_base=lambda: "http://testserver", letters=letters, redrive=redrive,
    )  # fmt: skip
    test_client = TestClient(app)
    return test_client


def as_(client: TestClient, token: Any, user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(user)}"}


def _refused(response: Any, feeds: dict[str, Feed], *hidden: str) -> None:
    """403 with Airflow's bare answer: no feed name, topic, group or value."""
    assert response.status_code == 403, response.text
    assert response.json() == {"detail": "Forbidden"}
    for feed in feeds.values():
        for text in (feed.name, *feed.topics, feed.group, *hidden):
            assert text not in response.text


def test_each_user_lists_and_reads_only_its_own_feed(client: TestClient, auth: Any,
                                                      feeds: dict[str, Feed]) -> None:  # fmt: skip
    for user, own, other in (("alice", "alpha", "beta"), ("bob", "beta", "alpha")):
        headers = as_(client, auth, user)
        listed = client.get("/api/feeds", headers=headers)
        assert listed.status_code == 200 and [f["name"] for f in listed.json()] == [own]
        index = client.get("/", headers=headers).text
        assert f'href="feeds/{own}"' in index and other not in index and feeds[other].topics[0] not in index
        assert client.get(f"/feeds/{own}", headers=headers).status_code == 200
        doc = client.get(f"/api/feeds/{own}", headers=headers).json()
        assert doc["status"]["partitions"][0]["end"] == 4
        for path in (f"/feeds/{other}", f"/api/feeds/{other}", "/feeds/no-such-feed", "/api/feeds/no-such-feed"):
            _refused(client.get(path, headers=headers), feeds, SECRET_IN_RUN)
    admin = client.get("/api/feeds", headers=as_(client, auth, "admin")).json()
    assert [f["name"] for f in admin] == ["alpha", "beta"]
    missing = client.get("/api/feeds/no-such-feed", headers=as_(client, auth, "admin"))
    assert missing.status_code == 404  # the admin may read any DAG: told what exists
    assert client.get("/api/feeds", headers={"Authorization": "Bearer forged"}).status_code in (401, 403)
    assert client.get("/api/feeds").status_code == 401


def test_the_other_feeds_run_files_and_docs_answer_403(client: TestClient, auth: Any,
                                                         feeds: dict[str, Feed]) -> None:  # fmt: skip
    for path in ("/runs/beta/r1/files/gx/index.html", "/runs/beta/r1/docs"):
        _refused(client.get(path, headers=as_(client, auth, "alice"), follow_redirects=False), feeds, SECRET_IN_RUN)
    own = client.get("/runs/beta/r1/files/gx/index.html", headers=as_(client, auth, "bob"))
    assert own.status_code == 200 and SECRET_IN_RUN in own.text


def test_previews_and_replays_answer_only_to_their_feeds_users(
    client: TestClient, auth: Any, feeds: dict[str, Feed], started: list[dict[str, Any]]
) -> None:
    body = {"start_from": "earliest"}
    alice = as_(client, auth, "alice")
    for path in ("/api/feeds/beta/replay/preview", "/api/feeds/beta/replay"):
        _refused(client.post(path, json=body, headers=alice), feeds)
    _refused(client.post("/api/feeds/beta/replay", json={**body, "dry_run": False, "commit": True}, headers=alice),
             feeds)  # fmt: skip
    assert started == []
    preview = client.post("/api/feeds/alpha/replay/preview", json=body, headers=alice)
    assert preview.status_code == 200 and preview.json()["records"] == 4
    assert client.post("/api/feeds/alpha/replay", json=body, headers=alice).status_code == 200
    assert [c["feed"] for c in started] == ["alpha"]

    dave = as_(client, auth, "dave")  # reads alpha: previews it, may not replay it
    assert client.post("/api/feeds/alpha/replay/preview", json=body, headers=dave).status_code == 200
    _refused(client.post("/api/feeds/alpha/replay", json=body, headers=dave), feeds)
    carol = as_(client, auth, "carol")  # edits alpha: replays it, may not commit it (that is running its DAG)
    assert client.post("/api/feeds/alpha/replay", json=body, headers=carol).status_code == 200
    committing = {"start_from": "committed", "dry_run": False, "commit": True}
    _refused(client.post("/api/feeds/alpha/replay", json=committing, headers=carol), feeds)
    assert [c["feed"] for c in started] == ["alpha", "alpha"] and not any(c.get("commit") for c in started)


def test_dead_letters_and_the_redrive_form_answer_only_to_their_feeds_users(
    client: TestClient, auth: Any, feeds: dict[str, Feed], started: list[dict[str, Any]]
) -> None:
    alice = as_(client, auth, "alice")
    assert 'href="/feeds/alpha/deadletters"' in client.get("/feeds/alpha", headers=alice).text
    page = client.get("/feeds/alpha/deadletters", headers=alice)
    assert page.status_code == 200 and "alpha-dead" in page.text and 'id="redrive-form"' in page.text
    doc = client.get("/api/feeds/alpha/deadletters", headers=alice).json()
    assert doc["records"] == 1 and doc["groups"][0]["reason"] == "decode_error"
    assert doc["groups"][0]["examples"][0]["value"] == "alpha-dead"
    for path in ("/feeds/beta/deadletters", "/api/feeds/beta/deadletters"):
        _refused(client.get(path, headers=alice), feeds, SECRET_IN_RUN)
    _refused(client.post("/api/feeds/beta/redrive", json={"dry_run": False}, headers=alice), feeds)
    assert client.get("/feeds/alpha/deadletters").status_code == 401  # every page needs an Airflow user
    assert client.post("/api/feeds/alpha/redrive", json={}).status_code == 401
    carol = as_(client, auth, "carol")  # edits alpha: may not re-drive it (that publishes into its output)
    _refused(client.post("/api/feeds/alpha/redrive", json={"dry_run": False}, headers=carol), feeds)
    # The form's CSRF rules are the replay trigger's: a JSON body, from this origin only.
    form = client.post("/api/feeds/alpha/redrive", data={"dry_run": "false"}, headers=alice)
    assert form.status_code == 415
    foreign = client.post("/api/feeds/alpha/redrive", json={}, headers={**alice, "Origin": "https://evil.example"})
    assert foreign.status_code == 403
    assert client.post("/api/feeds/alpha/redrive", json={"colour": "red"}, headers=alice).status_code == 422
    assert started == []
    ok = client.post("/api/feeds/alpha/redrive", json={"dry_run": False, "reason": "decode_error",
                                                        "since": "2026-11-20"}, headers=alice)  # fmt: skip
    assert ok.status_code == 200, ok.text
    assert started == [{"feed": "alpha", "dry_run": False, "reason": "decode_error",
                        "since": "2026-11-20T00:00:00+00:00", "redrive": True}]  # fmt: skip


@pytest.fixture
def team_feeds(feeds: dict[str, Feed], monkeypatch: pytest.MonkeyPatch) -> dict[str, Feed]:
    """The two feeds, each owned by a team (``team:``); ``erin`` is in red (alpha's), ``frank`` in blue (beta's)."""
    monkeypatch.setenv(TEAMS_ENV, json.dumps(USER_TEAMS))
    for name, team in FEED_TEAMS.items():
        feeds[name] = feeds[name].model_copy(update={"team": team})
    return feeds


@pytest.mark.parametrize(("user", "own", "other"), [("erin", "alpha", "beta"), ("frank", "beta", "alpha")])
def test_a_user_with_rights_on_both_dags_reaches_only_its_teams_feed(
    team_feeds: dict[str, Feed], client: TestClient, auth: Any, started: list[dict[str, Any]],
    user: str, own: str, other: str,
) -> None:  # fmt: skip
    """The attacker's probe: a user whose DAG rights reach both feeds lists, reads, replays, re-drives and sees the
    dead letters of its own team's feed only; the other team's answers 403 and names nothing."""
    headers = as_(client, auth, user)
    assert [f["name"] for f in client.get("/api/feeds", headers=headers).json()] == [own]
    assert client.get(f"/api/feeds/{own}", headers=headers).status_code == 200
    assert client.get(f"/api/feeds/{own}/deadletters", headers=headers).status_code == 200
    for path in (f"/feeds/{other}", f"/api/feeds/{other}", f"/feeds/{other}/deadletters",
                 f"/api/feeds/{other}/deadletters", f"/runs/{other}/r1/docs"):  # fmt: skip
        _refused(client.get(path, headers=headers), team_feeds, SECRET_IN_RUN)
    for path in (f"/api/feeds/{other}/replay", f"/api/feeds/{other}/redrive", f"/api/feeds/{other}/replay/preview"):
        _refused(client.post(path, json={"dry_run": False}, headers=headers), team_feeds, SECRET_IN_RUN)
    assert started == []
    admin = as_(client, auth, "admin")  # in every team
    assert {f["name"] for f in client.get("/api/feeds", headers=admin).json()} == set(FEED_TEAMS)
