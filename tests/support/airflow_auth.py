"""An Airflow auth manager with per-DAG grants, for the team-per-feed tests (``[core] auth_manager``).

Airflow's SimpleAuthManager knows roles only: its ``is_authorized_dag`` ignores the DAG's id
(a team is expressible only in multi-team mode, per DAG bundle). FAB's manager has per-DAG
permissions (``tests/e2e/test_team_per_feed_fab.py`` runs it), but its users and roles live in
the metadata database and are made through its CLI, one slow call each. For the shared e2e
Airflow and the in-process tests, this subclass keeps SimpleAuthManager's users, roles, login
and tokens and adds what FAB's ``DAG:<dag_id>`` permissions express: per user, per DAG, ``read`` (GET),
``edit`` (and change it: PUT, DELETE) or ``run`` (and create its runs: POST). A user
without an entry in ``TIDEMARK_TEST_DAG_GRANTS`` keeps the role's access to every DAG.

``TIDEMARK_TEST_DAG_GRANTS`` is JSON: ``{"alice": {"tidemark_alpha": "run", ...}, ...}``.

Teams (a feed file's ``team:``) are asked of ``is_authorized_team``, which SimpleAuthManager answers
from its users' teams in multi-team mode only; here ``TIDEMARK_TEST_TEAMS`` (JSON, user → its teams:
``{"alice": ["red"]}``) says, outside it, who is in which team (admins are in every team).
"""

from __future__ import annotations

import json
import os
from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails, TeamDetails
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

GRANTS_ENV = "TIDEMARK_TEST_DAG_GRANTS"
TEAMS_ENV = "TIDEMARK_TEST_TEAMS"
LEVELS = ("read", "edit", "run")
PATH = "tests.support.airflow_auth.DagGrantsAuthManager"


def _needed(method: str, access_entity: DagAccessEntity | None) -> str:
    if method == "GET":
        return "read"
    return "run" if method == "POST" and access_entity is DagAccessEntity.RUN else "edit"


class DagGrantsAuthManager(SimpleAuthManager):  # type: ignore[misc]
    """SimpleAuthManager plus per-user, per-DAG grants (see the module docstring)."""

    @staticmethod
    def grants() -> dict[str, dict[str, str]]:
        doc: dict[str, dict[str, str]] = json.loads(os.environ.get(GRANTS_ENV) or "{}")
        return doc

    def is_authorized_dag(
        self,
        *,
        method: Any,
        user: SimpleAuthManagerUser,
        access_entity: DagAccessEntity | None = None,
        details: DagDetails | None = None,
    ) -> bool:
        if not super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details):
            return False
        grants = self.grants().get(user.username)
        if grants is None:
            return True
        if details is None or details.id is None:  # "any DAG" (Airflow's lists, then filtered per DAG)
            return bool(grants)
        level = grants.get(details.id)
        return level is not None and LEVELS.index(level) >= LEVELS.index(_needed(method, access_entity))

    def is_authorized_team(
        self, *, method: Any, user: SimpleAuthManagerUser, details: TeamDetails | None = None
    ) -> bool:
        if details is None or details.name is None:
            return False
        if self._is_admin(user):
            return True
        teams: dict[str, list[str]] = json.loads(os.environ.get(TEAMS_ENV) or "{}")
        return details.name in teams.get(user.username, ())
