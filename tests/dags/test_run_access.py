"""The replay and backfill DAGs' own check: the triggering user may replay (and, to commit, run) the feed named.

The auth manager is ``tests.support.airflow_auth``'s per-DAG one, configured as ``[core]
auth_manager``; users and grants as in ``tests/integration/web/test_web_access.py``. The
e2e tests make the same refusal through a real triggered run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.airflow_auth import GRANTS_ENV, PATH, TEAMS_ENV
from tidemark.errors import ConfigError

GRANTS = {
    "alice": {"tidemark_alpha": "run", "tidemark_replay": "run"},
    "bob": {"tidemark_beta": "run", "tidemark_replay": "run"},
    "carol": {"tidemark_alpha": "edit", "tidemark_replay": "run"},
    # Both may run feed gamma's DAG; gamma's file says `team: red`, and only erin is in red.
    "erin": {"tidemark_gamma": "run", "tidemark_replay": "run"},
    "frank": {"tidemark_gamma": "run", "tidemark_replay": "run"},
}


@pytest.fixture(autouse=True)
def per_dag_auth(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from airflow.api_fastapi import app as airflow_app

    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", PATH)
    users = "alice:user,bob:user,carol:user,admin:admin,erin:user,frank:user"
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", users)
    monkeypatch.setenv(TEAMS_ENV, json.dumps({"erin": ["red"], "frank": ["blue"]}))
    monkeypatch.setenv(GRANTS_ENV, json.dumps(GRANTS))
    airflow_app.purge_cached_app()
    yield
    airflow_app.purge_cached_app()


@pytest.mark.parametrize(
    ("user", "feed", "params"),
    [("alice", "alpha", {}), ("bob", "beta", {"commit": True}), ("carol", "alpha", {"commit": False}),
     ("admin", "beta", {"commit": True}), (None, "beta", {"commit": True})],
)  # fmt: skip
def test_users_may_replay_the_feeds_they_may_run(user: str | None, feed: str, params: dict[str, bool]) -> None:
    from tidemark.orchestration.access import refuse_unless_allowed

    refuse_unless_allowed(feed, "replay", params, user)  # None: started by another DAG or the scheduler


@pytest.mark.parametrize(
    ("user", "feed", "params", "needs"),
    [("alice", "beta", {}, "edit"), ("bob", "alpha", {"commit": True}, "edit"),
     ("carol", "alpha", {"commit": True}, "run"), ("mallory", "alpha", {}, "edit")],
)  # fmt: skip
def test_a_request_for_a_feed_the_user_may_not_run_is_refused(
    user: str, feed: str, params: dict[str, bool], needs: str
) -> None:
    from tidemark.orchestration.access import refuse_unless_allowed

    expected = rf"user '{user}' may not .*{feed}'.*right to {needs} the DAG tidemark_{feed}"
    with pytest.raises(ConfigError, match=expected) as refused:
        refuse_unless_allowed(feed, "backfill", params, user)
    assert "nothing was read or committed" in str(refused.value)


def test_airflow_dags_test_runs_the_replay_without_a_user_to_check() -> None:
    """``airflow dags test`` / ``dag.test()`` record the triggering user ``dag_test``: the caller runs the DAG in
    its own process, so there is no user to ask the auth manager about (the e2e replay DAG test runs this way)."""
    from tidemark.orchestration.access import DAG_TEST_USER, refuse_unless_allowed

    refuse_unless_allowed("alpha", "replay", {"commit": True}, DAG_TEST_USER)


def test_a_real_user_named_dag_test_is_checked_like_anyone(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.api_fastapi import app as airflow_app

    from tidemark.orchestration.access import DAG_TEST_USER, refuse_unless_allowed

    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", f"alice:user,{DAG_TEST_USER}:viewer")
    airflow_app.purge_cached_app()
    with pytest.raises(ConfigError, match=rf"user '{DAG_TEST_USER}' may not replay feed 'alpha'"):
        refuse_unless_allowed("alpha", "replay", {}, DAG_TEST_USER)


class PerDagManager:
    """An auth manager that is not SimpleAuthManager (as FAB is not): it allows nothing on any DAG."""

    def is_authorized_dag(self, **kwargs: Any) -> bool:
        return False


def known_user(manager: Any, name: str) -> Any:
    """``[tidemark] run_user_lookup`` for :class:`PerDagManager`: every name is a user."""
    return {"name": name}


@pytest.mark.parametrize("user", ["mallory", "dag_test"])
def test_all_admins_and_the_dag_test_name_pass_only_where_simple_auth_manager_says_so(
    monkeypatch: pytest.MonkeyPatch, user: str
) -> None:
    """``simple_auth_manager_all_admins`` is SimpleAuthManager's setting: under another manager (FAB) it lets no one
    through; and a user named ``dag_test`` that the manager knows is checked like anyone."""
    from airflow.api_fastapi import app as airflow_app

    from tidemark.orchestration.access import refuse_unless_allowed

    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "True")
    refuse_unless_allowed("alpha", "replay", {"commit": True}, "mallory")  # SimpleAuthManager's (subclass): admins
    monkeypatch.setattr(airflow_app, "create_auth_manager", PerDagManager)
    monkeypatch.setenv("AIRFLOW__TIDEMARK__RUN_USER_LOOKUP", f"{__name__}.known_user")
    with pytest.raises(ConfigError, match=rf"user '{user}' may not replay feed 'alpha'"):
        refuse_unless_allowed("alpha", "replay", {}, user)
    monkeypatch.delenv("AIRFLOW__TIDEMARK__RUN_USER_LOOKUP")  # no lookup: refused, naming the setting
    with pytest.raises(ConfigError, match=r"run_user_lookup"):
        refuse_unless_allowed("alpha", "replay", {}, user)


def test_a_feed_of_another_team_is_refused_though_its_dag_rights_allow(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The attacker's probe: frank may run gamma's DAG, but gamma's file names team red, which frank is not in: the
    replay DAG's first task refuses him (the team read from the feed's file, as the task does); erin passes."""
    from tidemark.orchestration.access import refuse_unless_allowed
    from tidemark.orchestration.dags import team_of

    (tmp_path / "gamma.yaml").write_text("topics: [t-gamma]\ngroup: g-gamma\nteam: red\n")
    monkeypatch.setenv("TIDEMARK_FEEDS_DIR", str(tmp_path))
    assert team_of("gamma") == "red" and team_of("no-such-feed") is None
    refuse_unless_allowed("gamma", "replay", {"commit": True}, "erin", team_of("gamma"))
    refuse_unless_allowed("gamma", "replay", {"commit": True}, "admin", team_of("gamma"))  # admins: every team
    for params in ({}, {"commit": True}):
        with pytest.raises(ConfigError, match=r"user 'frank' may not replay feed 'gamma': it belongs to team 'red'"):
            refuse_unless_allowed("gamma", "replay", params, "frank", team_of("gamma"))
    refuse_unless_allowed("gamma", "replay", {}, "frank", None)  # without `team:` the DAG's rights alone decide
    # Without the DAG's rights, the refusal names the right missing, team or not (bob's is beta's DAG only).
    with pytest.raises(ConfigError, match=r"user 'bob' may not replay feed 'gamma': that needs the right to edit"):
        refuse_unless_allowed("gamma", "replay", {}, "bob", team_of("gamma"))


def test_a_team_under_fab_is_a_role_of_that_name() -> None:
    """FAB's manager has no ``is_authorized_team``: a FAB user is in a team when one of its roles has its name."""
    from types import SimpleNamespace

    from tidemark.orchestration.access import in_team

    class NoTeams:
        def is_authorized_team(self, **kwargs: Any) -> bool:
            raise NotImplementedError

    fab_user = SimpleNamespace(roles=[SimpleNamespace(name="Viewer"), SimpleNamespace(name="red")])
    assert in_team(NoTeams(), fab_user, "red")
    assert not in_team(NoTeams(), fab_user, "blue")
    assert not in_team(NoTeams(), SimpleNamespace(), "red")  # no roles, no teams: a check that cannot pass
