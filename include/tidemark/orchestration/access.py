"""Per-feed authorization from Airflow's auth manager: the view's :class:`FeedAccess` and the triggered DAGs' check.

A feed's rights are its own DAG's (``tidemark_<feed>``), asked of whatever auth manager
``[core] auth_manager`` configures, through ``BaseAuthManager``'s public API only, so FAB's
per-DAG permissions, Keycloak's resources or a custom manager all apply unchanged:

======== ======================================== ==========================================
action   asked on the feed's DAG                  needed for
======== ======================================== ==========================================
read     GET                                      its page, JSON, lag and replay previews
runs     GET, ``DagAccessEntity.RUN``             its runs' files (Data Docs)
replay   PUT (edit the DAG)                       a replay or backfill of the feed
commit   POST, ``DagAccessEntity.RUN`` (run it)   a replay or backfill that commits the group
======== ======================================== ==========================================

A feed whose file names a ``team`` answers, besides, only to that team's members (:func:`in_team`), in the view
and at the shared DAGs' first task alike.

Starting ``tidemark_replay`` / ``tidemark_backfill`` at all stays Airflow's own check (POST
on their runs). The DAGs check again at their first task (:func:`refuse_unless_allowed`),
for the user Airflow recorded as the run's ``triggering_user_name``: a run triggered from
Airflow's own form or REST API names any feed. A task has no token, so that user is looked
up by name: SimpleAuthManager's users (and its subclasses') come from ``[core]
simple_auth_manager_users``; any other manager needs ``[tidemark] run_user_lookup``, the
import path of a function ``(auth_manager, name) -> user | None``: for FAB's,
:func:`fab_user`. Without one the request is refused (a check that cannot be made does not
pass). In multi-team mode the task's check leaves the DAG's team out (a task has no
metadata database to read it from); the view's includes it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal

from airflow.configuration import conf
from fastapi import Depends, Request

from tidemark.config.models import dag_id
from tidemark.errors import ConfigError
from tidemark.planning.requests import flag

# Airflow's API-server modules (its app and auth managers, the security dependency, the ORM's DagModel) are
# imported inside the functions that use them: they load the whole API server, which neither a DAG file's parse
# nor a task checking its triggering user (refuse_unless_allowed) should pay for.
log = logging.getLogger(__name__)
# tidemark.web.app's Action, spelled again: the view and orchestration are sibling layers, neither imports the other.
Action = Literal["read", "runs", "replay", "commit"]
USER_STATE = "tidemark_user"  # where remember_user keeps the request's Airflow user (request.state)


def _rights(action: Action) -> tuple[str, Any]:
    """The method and DAG entity that ``action`` asks the auth manager about."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity

    return {
        "read": ("GET", None),
        "runs": ("GET", DagAccessEntity.RUN),
        "replay": ("PUT", None),
        "commit": ("POST", DagAccessEntity.RUN),
    }[action]


def _teams(dag_ids: list[str]) -> Mapping[str, str | None]:
    """The team owning each DAG, in multi-team mode only (elsewhere no DAG has one, and no query is made)."""
    if not conf.getboolean("core", "multi_team", fallback=False):
        return {}
    from airflow.models.dag import DagModel

    return dict(DagModel.get_dag_id_to_team_name_mapping(dag_ids))


def allowed_feeds(
    auth_manager: Any,
    user: Any,
    action: Action,
    feeds: Collection[str],
    *,
    teams: bool = True,
    feed_teams: Mapping[str, str | None] | None = None,
) -> set[str]:
    """The feeds among ``feeds`` on whose DAG ``user`` may do ``action``, by ``auth_manager``'s answer.

    A feed whose file names a ``team`` (``feed_teams``: feed → team) is allowed only to that team's
    members besides (:func:`in_team`). ``teams=False`` leaves the DAGs' teams out (a task cannot read
    them: it has no metadata database).
    """
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    method, entity = _rights(action)
    by_dag = {dag_id(name): name for name in feeds}
    owners = _teams(list(by_dag)) if teams else {}
    wanted = feed_teams or {}
    return {
        name
        for dag, name in by_dag.items()
        if auth_manager.is_authorized_dag(
            method=method, access_entity=entity, details=DagDetails(id=dag, team_name=owners.get(dag)), user=user
        )
        and (wanted.get(name) is None or in_team(auth_manager, user, str(wanted[name])))
    }


def in_team(auth_manager: Any, user: Any, team: str) -> bool:
    """Whether ``user`` belongs to ``team``, as ``auth_manager`` tells (``is_authorized_team``).

    A manager without teams (FAB's) answers ``NotImplementedError``: there a team is a role of that
    name (``user.roles``). A user with neither is in no team: a check that cannot be made does not pass.
    """
    from airflow.api_fastapi.auth.managers.models.resource_details import TeamDetails

    try:
        return bool(auth_manager.is_authorized_team(method="GET", user=user, details=TeamDetails(name=team)))
    except NotImplementedError:
        return team in {getattr(role, "name", None) for role in getattr(user, "roles", None) or ()}


def remember_user() -> Any:
    """A FastAPI dependency keeping the request's Airflow user (Bearer token or ``_token`` cookie) for the view.

    The same resolution as Airflow's own routes (``get_user``); an anonymous or forged
    credential is refused there (401/403) before any Tidemark code runs.
    """
    from airflow.api_fastapi.core_api.security import get_user

    async def keep(request: Request, user: Any = Depends(get_user)) -> None:  # noqa: B008
        setattr(request.state, USER_STATE, user)

    return Depends(keep)


class AirflowFeedAccess:
    """The view's :class:`tidemark.web.app.FeedAccess`, answered by Airflow's auth manager for the request's user."""

    def __init__(
        self,
        auth_manager: Callable[[], Any] | None = None,
        feed_teams: Callable[[], Mapping[str, str | None]] | None = None,
    ) -> None:
        self._auth_manager = auth_manager
        self._feed_teams = feed_teams or _feed_teams

    def manager(self) -> Any:
        if self._auth_manager is not None:
            return self._auth_manager()
        from airflow.api_fastapi.app import get_auth_manager

        return get_auth_manager()

    def _user(self, request: Request) -> Any:
        user = getattr(request.state, USER_STATE, None)
        if user is None:  # the plugin wires remember_user() into every route: reaching here is a wiring fault
            raise RuntimeError("no Airflow user on the request: add tidemark.orchestration.access.remember_user()")
        return user

    def allowed(self, request: Request, action: Action, feeds: Collection[str]) -> set[str]:
        return allowed_feeds(self.manager(), self._user(request), action, feeds, feed_teams=self._feed_teams())

    def who(self, request: Request) -> str:
        return f"user:{self._user(request).get_id()}"


def _feed_teams() -> dict[str, str | None]:
    """Each loadable feed's ``team`` (the feeds folder, as the view reads it)."""
    from tidemark.config.models import scan_feeds

    return {name: feed.team for name, feed in scan_feeds().feeds.items()}


def run_user(name: str) -> Any:
    """The auth manager's user called ``name`` (the run's ``triggering_user_name``), or ``None`` if it has none.

    Raises :class:`ConfigError` when the configured manager cannot look a user up by name.
    """
    from airflow.api_fastapi.app import create_auth_manager
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    manager = create_auth_manager()
    lookup = conf.getimport("tidemark", "run_user_lookup", fallback=None)
    if lookup is not None:
        return lookup(manager, name)
    if isinstance(manager, SimpleAuthManager):
        return next((u for u in manager.get_users() if u.username == name), None)
    raise ConfigError(
        f"cannot tell whether user {name!r} may run this feed: the auth manager {type(manager).__name__} has no "
        "lookup by name here; set [tidemark] run_user_lookup to a function (auth_manager, name) -> user "
        "(see docs/deploy.md, 'Team-per-feed deployment')"
    )


AUTH_DB_CONN_ID = os.environ.get("TIDEMARK_AUTH_DB_CONN_ID", "tidemark_auth_db")


def fab_user(auth_manager: Any, name: str, conn_id: str = AUTH_DB_CONN_ID) -> Any:
    """``[tidemark] run_user_lookup`` for FAB's auth manager: FAB's user ``name`` with its roles' permissions.

    ``None`` when FAB has no such user or the account is inactive. FAB keeps users and roles
    in Airflow's metadata database, which a task may not open (Airflow 3 blocks it in task
    processes); the deployment names a database account that may read FAB's ``ab_*`` tables
    as the Airflow connection ``tidemark_auth_db`` (``TIDEMARK_AUTH_DB_CONN_ID``): type
    postgres, or sqlite with the file as its host. The permissions are computed by FAB's own
    ``User.perms`` from the user's roles, read once; FAB's ``is_authorized_dag`` then decides
    on them as it does for the api-server (``auth_manager`` is that manager).
    """
    from airflow.providers.fab.auth_manager.models import User
    from airflow.sdk import BaseHook
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session
    from sqlalchemy.pool import NullPool

    engine = create_engine(_auth_db_url(BaseHook.get_connection(conn_id), conn_id), poolclass=NullPool)
    try:
        with Session(engine) as session:
            user = session.scalars(select(User).where(User.username == name)).one_or_none()
            if user is None or not user.is_active:
                return None
            _ = user.perms  # computed here, from the roles, while the session can load them; then cached
            session.expunge(user)
            return user
    finally:
        engine.dispose()


def _auth_db_url(conn: Any, conn_id: str) -> Any:
    """The SQLAlchemy URL of the connection that reads FAB's tables (postgres, or sqlite: host = the file)."""
    from sqlalchemy.engine import URL

    if conn.conn_type in ("postgres", "postgresql"):
        return URL.create("postgresql+psycopg", username=conn.login or None, password=conn.password or None,
                          host=conn.host or None, port=conn.port or None, database=conn.schema or None)  # fmt: skip
    if conn.conn_type == "sqlite" and conn.host:
        return URL.create("sqlite", database=conn.host)
    raise ConfigError(
        f"Airflow connection '{conn_id}' has type '{conn.conn_type}': the FAB user lookup of the replay and "
        "backfill DAGs reads FAB's users and roles through a connection of type postgres (or sqlite with the "
        "database file as its host); see docs/deploy.md, 'Team-per-feed deployment'"
    )


# The triggering user Airflow records for ``airflow dags test`` and ``dag.test()`` (airflow.sdk.definitions.dag).
DAG_TEST_USER = "dag_test"


def refuse_unless_allowed(
    feed: str, mode: str, params: Mapping[str, Any], user_name: str | None, team: str | None = None
) -> None:
    """Raise :class:`ConfigError` unless ``user_name`` may replay (and, to commit, run) ``feed``, and is a
    member of ``team`` when the feed's file names one.

    A run with no triggering user was started by the scheduler or another DAG: code the
    deployment already trusts, outside the auth manager's reach. So is ``airflow dags test`` /
    ``dag.test()``, which Airflow records as the user ``dag_test`` (when no such user exists in
    the auth manager): it runs the DAG in the caller's own process, with the DAG files and the
    connections already in hand. ``airflow dags trigger`` records the operating-system user,
    checked like any other name.
    """
    if user_name is None:
        log.info("the %s of feed '%s' has no triggering user (a DAG or the scheduler): no user to check",
                 mode, feed)  # fmt: skip
        return
    from airflow.api_fastapi.app import create_auth_manager
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    manager = create_auth_manager()
    all_admins = conf.getboolean("core", "simple_auth_manager_all_admins", fallback=False)
    if all_admins and isinstance(manager, SimpleAuthManager):
        return  # SimpleAuthManager's development setting: every user is an admin there (FAB and others ignore it)
    needed: list[Action] = ["replay", "commit"] if flag(params, "commit") else ["replay"]
    # A manager that cannot look the name up raises here, for ``dag_test`` as for anyone: a check that cannot be
    # made does not pass. Only a manager that knows no user ``dag_test`` lets ``airflow dags test`` through.
    user = run_user(user_name)
    if user is None and user_name == DAG_TEST_USER:
        log.info("the %s of feed '%s' runs in `airflow dags test`: no user to check", mode, feed)
        return

    def lacks(action: Action, owners: Mapping[str, str | None] | None = None) -> bool:
        return user is None or not allowed_feeds(manager, user, action, [feed], teams=False, feed_teams=owners)

    # The DAG's rights first (their refusal names the right missing), then the feed's team.
    missing = [a for a in needed if lacks(a)]
    if not missing and team is not None and any(lacks(a, {feed: team}) for a in needed):
        raise ConfigError(
            f"user {user_name!r} may not {mode} feed '{feed}': it belongs to team {team!r} (its file's `team`), "
            "and the auth manager does not count the user in that team; nothing was read or committed"
        )
    if missing:
        right = "run the DAG" if missing[0] == "commit" else "edit the DAG"
        why = " (a committing run moves the feed's group, as the feed's own runs do)" if missing[0] == "commit" else ""
        raise ConfigError(
            f"user {user_name!r} may not {'commit ' if 'commit' in needed else ''}{mode} feed '{feed}': that needs "
            f"the right to {right} {dag_id(feed)}{why} in Airflow's auth manager; nothing was read or committed. "
            "Ask an admin for access to that DAG, or have its team trigger the run"
        )
