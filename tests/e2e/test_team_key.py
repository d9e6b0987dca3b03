"""A feed file's ``team:`` on the shared real Airflow: DAG rights on both feeds, yet each user reaches its team's only.

``erin`` (team red) and ``frank`` (team blue) may run both feeds' DAGs, ``tidemark_replay`` and
``tidemark_redrive`` (``tests/e2e/conftest.py``, ``TEAM_MEMBERS``); the feed ``view``'s file says
``team: red``, ``docs``'s ``team: blue``. The attacker's probes: each lists, reads, previews and
opens the dead letters of its own team's feed only; the other team's pages, JSON, dead letters,
previews, replays and re-drives answer 403 naming nothing; and Airflow's own trigger of the shared
replay and re-drive DAGs for the other team's feed fails at their first task, naming the team.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import DOCS_FEED, FEED, FEED_TEAMS, SECRET, TEAM_MEMBERS, RunningAirflow

pytestmark = [pytest.mark.integration, pytest.mark.spark]

OTHER = {"erin": DOCS_FEED, "frank": FEED}


def _foreign(feed: str) -> list[tuple[str, object]]:
    """Every route of ``feed`` a member of the other team may try (GET, or POST with a body)."""
    body = {"start_from": "earliest"}
    return [
        (f"/tidemark/feeds/{feed}", None), (f"/tidemark/api/feeds/{feed}", None),
        (f"/tidemark/feeds/{feed}/deadletters", None), (f"/tidemark/api/feeds/{feed}/deadletters", None),
        (f"/tidemark/api/feeds/{feed}/replay/preview", body), (f"/tidemark/api/feeds/{feed}/replay", body),
        (f"/tidemark/api/feeds/{feed}/redrive", {"dry_run": False}),
    ]  # fmt: skip


@pytest.mark.parametrize("user", sorted(TEAM_MEMBERS))
def test_a_member_of_one_team_reaches_none_of_the_other_teams_feed(airflow: RunningAirflow, user: str) -> None:
    own, other = TEAM_MEMBERS[user], OTHER[user]
    # Its DAG rights reach both feeds: Airflow's own list shows both DAGs (the team key is Tidemark's check).
    status, doc = airflow.request("/api/v2/dags?limit=100", user=user)
    assert status == 200 and {f"tidemark_{FEED}", f"tidemark_{DOCS_FEED}"} <= {d["dag_id"] for d in doc["dags"]}
    status, doc = airflow.request("/tidemark/api/feeds", user=user)
    assert status == 200 and [f["name"] for f in doc] == [own], (user, doc)
    for path in (f"/tidemark/api/feeds/{own}", f"/tidemark/api/feeds/{own}/deadletters"):
        status, doc = airflow.request(path, user=user)
        assert status == 200, (user, path, doc)
    before = (airflow.runs("tidemark_replay"), airflow.runs("tidemark_redrive"))
    other_topic = airflow.topic if other == FEED else airflow.docs_topic
    for path, body in _foreign(other):
        status, doc = airflow.request(path, user=user, body=body)
        assert status == 403 and doc == {"detail": "Forbidden"}, (user, path, doc)
        assert not [t for t in (other, other_topic, FEED_TEAMS[other], SECRET) if t in json.dumps(doc)]
    assert (airflow.runs("tidemark_replay"), airflow.runs("tidemark_redrive")) == before  # nothing was started


@pytest.mark.parametrize(("dag", "conf"), [
    ("tidemark_replay", {"start_from": "earliest", "dry_run": False, "commit": True}),
    ("tidemark_redrive", {"dry_run": False}),
], ids=["replay", "redrive"])  # fmt: skip
def test_the_shared_dags_refuse_a_feed_of_a_team_the_user_is_not_in(airflow: RunningAirflow, dag: str,
                                                                    conf: dict[str, object]) -> None:  # fmt: skip
    """frank may start the shared DAG (Airflow's own REST API, as its trigger form does) naming ``view``, whose DAG
    he may run; ``view`` belongs to team red: the DAG's first task refuses him, naming the team."""
    status, doc = airflow.request(f"/api/v2/dags/{dag}/dagRuns", user="frank",
                                  body={"logical_date": None, "conf": {"feed": FEED, **conf}})  # fmt: skip
    assert status == 200, doc
    run_id = doc["dag_run_id"]
    assert airflow.wait_run(dag, run_id) == "failed"
    logs = airflow.task_logs(dag, run_id)
    assert "user 'frank' may not" in logs and f"feed '{FEED}': it belongs to team 'red'" in logs, logs[-3000:]
    assert "nothing was read or committed" in logs
