"""The replay and backfill DAGs' check under FAB's auth manager: users and roles read by ``access.fab_user``.

FAB's own models make its tables in a SQLite file (the ``tidemark_auth_db`` connection), with
one role per team holding ``DAG:<dag_id>`` permissions as FAB's CLI grants them; ``[core]
auth_manager`` is FAB's and ``[tidemark] run_user_lookup`` is :func:`fab_user`. FAB's own
``is_authorized_dag`` decides. The e2e test ``tests/e2e/test_team_per_feed_fab.py`` makes the
same check through a real triggered run on a running Airflow.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from tidemark.errors import ConfigError

FAB = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
# user -> (role's DAG:<id> resources, their actions); every team may also create DAG Runs.
ROLES = {
    "alice": (["DAG:tidemark_alpha", "DAG:tidemark_replay"], ["can_read", "can_edit"]),
    "bob": (["DAG:tidemark_beta", "DAG:tidemark_replay"], ["can_read", "can_edit"]),
    "carol": (["DAG:tidemark_alpha", "DAG:tidemark_replay"], ["can_read", "can_edit"]),  # no DAG Runs: no commit
}


def _fab_database(path: Path) -> None:
    """FAB's tables in ``path`` with a role per user (as ``airflow roles add-perms`` grants) and the users."""
    from airflow.providers.fab.auth_manager import models as fab

    engine = create_engine(f"sqlite:///{path}")
    tables = [fab.Action, fab.Resource, fab.Permission, fab.Role, fab.User, fab.Group]
    fab.Model.metadata.create_all(engine, tables=[t.__table__ for t in tables] + [
        fab.assoc_permission_role, fab.assoc_user_role, fab.assoc_group_role, fab.assoc_user_group])  # fmt: skip
    with Session(engine) as session:
        actions: dict[str, Any] = {}
        resources: dict[str, Any] = {}
        permissions: dict[tuple[str, str], Any] = {}

        def permission(action: str, resource: str) -> Any:
            """One row per (action, resource), shared by the roles, as FAB keeps them."""
            if (action, resource) not in permissions:
                act = actions.setdefault(action, fab.Action(name=action))
                res = resources.setdefault(resource, fab.Resource(name=resource))
                permissions[action, resource] = fab.Permission(action=act, resource=res)
            return permissions[action, resource]

        for user, (dags, granted) in ROLES.items():
            perms = [permission(a, r) for r in dags for a in granted]
            if user != "carol":
                perms += [permission("can_create", "DAG Runs"), permission("can_read", "DAG Runs")]
            role = fab.Role(name=f"team_{user}", permissions=perms)
            session.add(fab.User(first_name=user, last_name="team", username=user, email=f"{user}@example.com",
                                 active=True, roles=[role]))  # fmt: skip
        session.add(fab.User(first_name="eve", last_name="gone", username="eve", email="eve@example.com",
                             active=False, roles=[]))  # fmt: skip
        session.commit()
    engine.dispose()


@pytest.fixture(autouse=True)
def fab_auth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from airflow.api_fastapi import app as airflow_app

    _fab_database(tmp_path / "fab.db")
    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", FAB)
    monkeypatch.setenv("AIRFLOW__TIDEMARK__RUN_USER_LOOKUP", "tidemark.orchestration.access.fab_user")
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_AUTH_DB", json.dumps({"conn_type": "sqlite",
                                                                     "host": str(tmp_path / "fab.db")}))  # fmt: skip
    airflow_app.purge_cached_app()
    yield
    airflow_app.purge_cached_app()


@pytest.mark.parametrize(
    ("user", "feed", "params"),
    [("alice", "alpha", {"commit": True}), ("bob", "beta", {}), ("carol", "alpha", {"commit": False})],
)  # fmt: skip
def test_fab_users_may_replay_the_feeds_their_roles_allow(user: str, feed: str, params: dict[str, bool]) -> None:
    from tidemark.orchestration.access import refuse_unless_allowed

    refuse_unless_allowed(feed, "replay", params, user)


@pytest.mark.parametrize(
    ("user", "feed", "params", "needs"),
    [("alice", "beta", {}, "edit"), ("bob", "alpha", {"commit": True}, "edit"),
     ("carol", "alpha", {"commit": True}, "run"), ("eve", "alpha", {}, "edit"), ("mallory", "beta", {}, "edit")],
)  # fmt: skip
def test_fab_users_are_refused_the_feeds_their_roles_do_not_allow(
    user: str, feed: str, params: dict[str, bool], needs: str
) -> None:
    from tidemark.orchestration.access import refuse_unless_allowed

    expected = rf"user '{user}' may not .*{feed}'.*right to {needs} the DAG tidemark_{feed}"
    with pytest.raises(ConfigError, match=expected):
        refuse_unless_allowed(feed, "backfill", params, user)


def test_a_lookup_connection_of_another_type_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from tidemark.orchestration.access import refuse_unless_allowed

    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_AUTH_DB", json.dumps({"conn_type": "http", "host": "db"}))
    with pytest.raises(ConfigError, match=r"'tidemark_auth_db' has type 'http'.*type postgres"):
        refuse_unless_allowed("alpha", "replay", {}, "alice")
