"""The Tidemark view behind Airflow's own auth, on a real Airflow (the session's shared one).

Anonymous requests get 401 on every page and endpoint; the admin and the viewer read
the pages and JSON by Bearer token and by the UI's ``_token`` cookie; only a user who
may trigger ``tidemark_replay`` may replay (the viewer gets 403); a forged token is refused.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import FEED, SECRET, RunningAirflow

pytestmark = pytest.mark.integration

READS = ["/tidemark/", f"/tidemark/feeds/{FEED}", f"/tidemark/api/feeds/{FEED}", "/tidemark/api/feeds"]
POSTS = [f"/tidemark/api/feeds/{FEED}/replay/preview", f"/tidemark/api/feeds/{FEED}/replay"]


@pytest.mark.parametrize("path", READS + POSTS)
def test_anonymous_requests_are_refused(airflow: RunningAirflow, path: str) -> None:
    status, _ = airflow.request(path, user=None, body={} if path in POSTS else None)
    assert status == 401


def test_logged_in_users_read_the_view(airflow: RunningAirflow) -> None:
    for user in ("admin", "viewer"):
        status, text = airflow.request("/tidemark/", user=user)
        assert status == 200, (user, text)
        assert "Tidemark feeds" in text and FEED in text
        status, doc = airflow.request(f"/tidemark/api/feeds/{FEED}", user=user, cookie=True)  # the UI's cookie
        assert status == 200, (user, doc)
        assert {p["partition"] for p in doc["status"]["partitions"]} == {0, 1, 2}
    airflow.tokens["forged"] = "not-a-token"
    status, _ = airflow.request("/tidemark/", user="forged")
    assert status in (401, 403)  # Airflow answers a forged token with 403


def test_a_viewer_may_preview_but_not_trigger_a_replay(airflow: RunningAirflow) -> None:
    body = {"start_from": "earliest", "partitions": [0]}
    status, doc = airflow.request(f"/tidemark/api/feeds/{FEED}/replay/preview", user="viewer", body=body)
    assert status == 200, doc
    assert doc["dry_run"] is True and [r["partition"] for r in doc["ranges"]] == [0]
    before = airflow.request("/api/v2/dags/tidemark_replay/dagRuns")[1]["total_entries"]
    status, doc = airflow.request(f"/tidemark/api/feeds/{FEED}/replay", user="viewer", body=body, cookie=True)
    assert status == 403, doc
    assert airflow.request("/api/v2/dags/tidemark_replay/dagRuns")[1]["total_entries"] == before  # no run made


def test_bad_replay_parameters_are_refused_by_name(airflow: RunningAirflow) -> None:
    status, doc = airflow.request(f"/tidemark/api/feeds/{FEED}/replay", body={"start_from": "offset"})
    assert status == 400 and "start_offset" in doc["detail"]
    status, doc = airflow.request(f"/tidemark/api/feeds/{FEED}/replay/preview", body={"partitions": [9]})
    assert status == 400 and "partitions" in doc["detail"]


def test_no_credential_in_the_view(airflow: RunningAirflow) -> None:
    secrets = [SECRET, *airflow.airflow.passwords().values(), (airflow.airflow.home / "jwt_secret").read_text()]
    for path in READS:
        status, body = airflow.request(path)
        assert status == 200
        text = body if isinstance(body, str) else json.dumps(body)
        assert not [s for s in secrets if s in text], path
    status, doc = airflow.request(f"/tidemark/api/feeds/{FEED}/replay/preview", body={"start_from": "earliest"})
    assert status == 200 and not [s for s in secrets if s in json.dumps(doc)]
