"""Team per feed on the shared real Airflow: each user sees and moves only its own feed, over the API and in Chromium.

``alice`` may run feed ``view``'s DAG, ``bob`` feed ``docs``'s (``tests/e2e/conftest.py``,
``TEAMS``), both through the auth manager Airflow itself uses for its UI and REST API. The
other team's feed answers 403 with Airflow's bare ``Forbidden`` everywhere: pages, JSON,
previews, replays and run files; lists leave it out; and Airflow's own trigger of the replay
DAG for it starts a run whose first task refuses, naming the user and the DAG right missing.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import DOCS_FEED, FEED, SECRET, TEAMS, RunningAirflow, answer_in_browser

pytestmark = [pytest.mark.integration, pytest.mark.spark]

OTHER = {"alice": DOCS_FEED, "bob": FEED}
RUN_FILE = "gx/index.html"


def _foreign_paths(feed: str) -> list[tuple[str, Any]]:
    """Every route of ``feed`` (GET, or POST with a body) a user of the other team may try."""
    body = {"start_from": "earliest"}
    return [
        (f"/tidemark/feeds/{feed}", None), (f"/tidemark/api/feeds/{feed}", None),
        (f"/tidemark/api/feeds/{feed}/replay/preview", body), (f"/tidemark/api/feeds/{feed}/replay", body),
        (f"/tidemark/api/feeds/{feed}/replay", {**body, "commit": True, "dry_run": False}),
        (f"/tidemark/runs/{feed}/team-run/files/{RUN_FILE}", None), (f"/tidemark/runs/{feed}/team-run/docs", None),
    ]  # fmt: skip


def _hidden(airflow: RunningAirflow, feed: str) -> list[str]:
    """What a refusal must not contain: the feed's name, topic, group, and the values in its run files."""
    topic = airflow.topic if feed == FEED else airflow.docs_topic
    group = airflow.group if feed == FEED else ""
    return [t for t in (feed, topic, group, f"record of {feed}", SECRET) if t]


@pytest.fixture(scope="module")
def run_files(airflow: RunningAirflow) -> Iterator[None]:
    """A run folder with a Data Docs page for each feed, holding a value only that feed's team may read.

    Removed afterwards: the shared Airflow's other tests read these feeds' newest runs.
    """
    folders = [airflow.state / "runs" / feed / "team-run" for feed in (FEED, DOCS_FEED)]
    for folder in folders:
        page = folder / RUN_FILE
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(f"<p>record of {folder.parent.name}</p>")
    yield
    for folder in folders:
        shutil.rmtree(folder)


def test_each_user_lists_and_reads_only_its_own_feed(airflow: RunningAirflow, run_files: None) -> None:
    for user, own in TEAMS.items():
        status, doc = airflow.request("/tidemark/api/feeds", user=user)
        assert status == 200 and [f["name"] for f in doc] == [own], (user, doc)
        status, page = airflow.request("/tidemark/", user=user, cookie=True)
        assert status == 200 and f'href="feeds/{own}"' in page and OTHER[user] not in page
        status, doc = airflow.request(f"/tidemark/api/feeds/{own}", user=user)
        assert status == 200 and doc["status"]["partitions"], doc
        status, text = airflow.request(f"/tidemark/runs/{own}/team-run/files/{RUN_FILE}", user=user)
        assert status == 200 and f"record of {own}" in text
    status, doc = airflow.request("/tidemark/api/feeds", user="admin")
    assert {FEED, DOCS_FEED} <= {f["name"] for f in doc}


@pytest.mark.parametrize("user", sorted(TEAMS))
def test_the_other_teams_feed_answers_403_and_leaks_nothing(airflow: RunningAirflow, run_files: None,
                                                             user: str) -> None:  # fmt: skip
    before = airflow.runs("tidemark_replay")
    other = OTHER[user]
    for path, body in [*_foreign_paths(other), ("/tidemark/api/feeds/no-such-feed", None)]:
        for cookie in (False, True):
            status, doc = airflow.request(path, user=user, body=body, cookie=cookie)
            assert status == 403, (user, path, doc)
            assert doc == {"detail": "Forbidden"}, (user, path, doc)
            assert not [h for h in _hidden(airflow, other) if h in json.dumps(doc)]
    assert airflow.runs("tidemark_replay") == before  # nothing was started


def test_airflows_own_api_refuses_the_other_teams_dag(airflow: RunningAirflow) -> None:
    """The same auth manager answers for Airflow itself: bob may not trigger or read alice's feed DAG."""
    status, _ = airflow.request(f"/api/v2/dags/tidemark_{FEED}/dagRuns", user="bob", body={"logical_date": None})
    assert status == 403
    status, doc = airflow.request("/api/v2/dags?limit=100", user="bob")
    assert status == 200, doc
    assert {d["dag_id"] for d in doc["dags"]} == {f"tidemark_{DOCS_FEED}", "tidemark_replay"}


def test_each_user_replays_its_own_feed_and_the_dag_refuses_the_other(airflow: RunningAirflow) -> None:
    # Through the view: alice's dry-run replay of her own feed runs to success.
    status, doc = airflow.request(f"/tidemark/api/feeds/{FEED}/replay", user="alice",
                                  body={"start_from": "earliest", "partitions": [0]})  # fmt: skip
    assert status == 200, doc
    run_id = doc["dag_run_id"]
    assert airflow.wait_run("tidemark_replay", run_id) == "success", airflow.task_logs("tidemark_replay", run_id)
    # Through Airflow's own trigger (its form, its REST API): bob may start tidemark_replay, naming alice's feed;
    # its first task refuses him, so nothing is read or committed.
    status, doc = airflow.request("/api/v2/dags/tidemark_replay/dagRuns", user="bob",
                                  body={"logical_date": None, "conf": {"feed": FEED, "start_from": "earliest",
                                                                        "dry_run": False}})  # fmt: skip
    assert status == 200, doc
    refused = doc["dag_run_id"]
    assert airflow.wait_run("tidemark_replay", refused) == "failed"
    logs = airflow.task_logs("tidemark_replay", refused)
    assert f"user 'bob' may not replay feed '{FEED}'" in logs and f"edit the DAG tidemark_{FEED}" in logs, logs[-3000:]


def test_in_a_browser_each_user_sees_and_replays_only_its_own_feed(airflow: RunningAirflow, run_files: None,
                                                                   browser: Any) -> None:  # fmt: skip
    from playwright.sync_api import expect

    for user, own in TEAMS.items():
        context = browser.new_context()
        page = context.new_page()
        airflow.login(page, user)
        page.goto(airflow.base + "/plugin/tidemark")  # the nav entry's route: the view in Airflow's iframe
        view = page.frame_locator("iframe")
        expect(view.get_by_role("link", name=own, exact=True)).to_be_visible(timeout=60_000)
        assert view.get_by_role("link", name=OTHER[user], exact=True).count() == 0
        other_topic = airflow.topic if OTHER[user] == FEED else airflow.docs_topic
        assert other_topic not in view.locator("body").inner_text()
        view.get_by_role("link", name=own, exact=True).click()
        expect(view.locator("#partitions")).to_be_visible(timeout=60_000)
        view.locator("#preview-btn").click()
        expect(view.locator("#preview-summary")).to_be_visible(timeout=60_000)
        view.locator("#trigger-btn").click()  # a dry run of the user's own feed, started as that user
        expect(view.locator("#run-state")).to_have_attribute("data-state", "success", timeout=300_000)

        for path, body in _foreign_paths(OTHER[user]):
            status, text = answer_in_browser(page, airflow.base, path, body)
            assert status == 403, (user, path, text)
            assert json.loads(text) == {"detail": "Forbidden"}, (user, path, text)
        context.close()
