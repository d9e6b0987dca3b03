"""The Tidemark view probed as an attacker would, on the shared real Airflow (Chromium driven by Playwright).

Record data in Data Docs runs no script on Airflow's origin; pages on other origins
(another host name, another port of this host) cannot start a replay with the victim's
login cookie; replays write only under the allowed roots; every bad input gets a 4xx
from the preview and the trigger alike, before any run starts.
"""

from __future__ import annotations

import http.server
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import DOCS_FEED, FEED, RunningAirflow

pytestmark = [pytest.mark.integration, pytest.mark.spark]

REPLAY = f"/tidemark/api/feeds/{FEED}/replay"
PREVIEW = f"/tidemark/api/feeds/{FEED}/replay/preview"


@pytest.fixture
def other_site(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A plain web server on another port of this host: the attacker's pages (a folder to write them in)."""
    folder = tmp_path / "site"
    folder.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield folder, int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_markup_in_data_docs_runs_no_script_on_airflows_origin(airflow: RunningAirflow, browser: Any) -> None:
    run_id = airflow.trigger(f"tidemark_{DOCS_FEED}")
    state = airflow.wait_run(f"tidemark_{DOCS_FEED}", run_id)
    assert state == "success", airflow.task_logs(f"tidemark_{DOCS_FEED}", run_id)
    status, doc = airflow.request(f"/tidemark/api/feeds/{DOCS_FEED}")
    assert status == 200, doc
    docs_url = doc["run_rows"][0]["docs_url"]
    assert docs_url, doc["run_rows"][0]

    page = browser.new_page()
    airflow.login(page)
    requested: list[str] = []
    failed: dict[str, str | None] = {}
    page.on("request", lambda r: requested.append(r.url))
    page.on("requestfailed", lambda r: failed.update({r.url: r.failure}))
    response = page.goto(airflow.base + docs_url)
    assert response is not None and response.status == 200
    page.wait_for_load_state("load")
    # The injected script would mark the page ("cookie" when it could read the login cookie): it did
    # not run, and the page's origin is opaque, so nothing in it could act as the user on Airflow's origin.
    assert page.evaluate("document.documentElement.dataset.xss || 'no script ran'") == "no script ran"
    assert page.evaluate("window.origin") == "null"
    csp = response.headers["content-security-policy"]
    assert "sandbox" in csp and "allow-same-origin" not in csp and "default-src 'none'" in csp
    assert response.headers["x-content-type-options"] == "nosniff"
    text = page.inner_text("body")
    assert "match this regular expression" in text and "^v-" in text, text[:2000]  # the failure, still shown
    # GX's pages ask for scripts and styles from CDNs: the sandbox keeps scripts from being fetched at
    # all, the policy blocks the rest before it reaches the network.
    foreign = [u for u in requested if not u.startswith(airflow.base)]
    assert [(u, failed.get(u)) for u in foreign if failed.get(u) != "csp"] == []
    assert not [u for u in foreign if u.endswith(".js")]


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])  # another site; the same host on another port
def test_a_form_on_another_origin_cannot_start_a_replay(
    airflow: RunningAirflow, browser: Any, other_site: tuple[Path, int], host: str
) -> None:
    folder, port = other_site
    (folder / "attack.html").write_text(
        f'<form method="POST" action="{airflow.base}{REPLAY}"></form>'
        f'<form method="POST" action="{airflow.base}{REPLAY}" enctype="text/plain">'
        '<input name=\'{"start_from":"earliest","dry_run":true,"x":"\' value=\'"}\'></form>'
        "<script>document.forms[Number(location.hash.slice(1))].submit()</script>"
    )
    before = airflow.runs("tidemark_replay")
    page = browser.new_page()
    airflow.login(page)
    for form in (0, 1):  # an empty body; a JSON-looking text/plain body
        with page.expect_response(lambda r: r.url.endswith(REPLAY)) as answer:
            page.goto(f"http://{host}:{port}/attack.html#{form}")
        assert answer.value.status in (403, 415), (form, answer.value.status, answer.value.text())
    assert airflow.runs("tidemark_replay") == before  # no run was created


def test_json_from_another_origin_is_refused(airflow: RunningAirflow) -> None:
    body = {"start_from": "earliest", "partitions": [0]}
    other_port = airflow.base.rsplit(":", 1)[0] + ":1"
    for headers in ({"Origin": other_port}, {"Origin": "null"}, {"Sec-Fetch-Site": "same-site"}):
        for path in (PREVIEW, REPLAY):
            status, doc = airflow.request(path, body=body, cookie=True, headers=headers)
            assert status == 403, (path, headers, doc)
    same = {"Origin": airflow.base, "Sec-Fetch-Site": "same-origin"}
    status, doc = airflow.request(PREVIEW, body=body, cookie=True, headers=same)
    assert status == 200, doc
    status, doc = airflow.request(PREVIEW, cookie=True, method="POST")  # no body: no default conf any more
    assert status == 415, doc


def test_replay_outputs_stay_under_the_allowed_roots(airflow: RunningAirflow) -> None:
    replays = str(airflow.output.with_name(f"{FEED}.replays"))
    allowed = str(airflow.state.parent / "replays")
    outside = str(airflow.state.parent / "elsewhere")
    for output in (outside, "~/x", "~nosuchuser/x", "/proc/self/cwd/x", f"{allowed}/../elsewhere", "s3://other/x",
                   f"{replays}x", "relative/x"):  # fmt: skip
        status, doc = airflow.request(PREVIEW, body={"start_from": "earliest", "output": output}, user="viewer")
        assert status == 400, (output, doc)
        assert "'output'" in doc["detail"], doc
    status, doc = airflow.request(PREVIEW, body={"start_from": "earliest", "output": outside})
    assert replays in doc["detail"] and allowed in doc["detail"] and "TIDEMARK_REPLAY_OUTPUT_ROOTS" in doc["detail"]
    for output in (f"{replays}/mine", f"{allowed}/mine", "s3://replays/allowed/mine"):
        status, doc = airflow.request(PREVIEW, body={"start_from": "earliest", "output": output})
        assert status == 200 and doc["output"] == output, doc
    before = airflow.runs("tidemark_replay")
    status, doc = airflow.request(REPLAY, body={"start_from": "earliest", "output": outside})
    assert status == 400 and allowed in doc["detail"], doc
    assert airflow.runs("tidemark_replay") == before

    # Airflow's own trigger (its form, its API) reaches the DAG's task, which refuses the same way.
    run_id = airflow.trigger("tidemark_replay", {"feed": FEED, "start_from": "earliest", "output": outside})
    assert airflow.wait_run("tidemark_replay", run_id) == "failed"
    logs = airflow.task_logs("tidemark_replay", run_id)
    assert "outside the places" in logs and allowed in logs, logs[-3000:]
    assert not Path(outside).exists()


BIG = 2**63
BAD_BODIES: list[Any] = [
    [], "text", 1, None,
    {"start_from": "offset"}, {"start_from": "offset", "start_offset": BIG},
    {"start_from": "offset", "start_offset": -1},
    {"start_from": "offset", "start_offset": 10**30}, {"start_from": "offset", "start_offset": "abc"},
    {"start_from": "offset", "start_offset": 1.5}, {"end_at": "offset", "end_offset": 2**64},
    {"start_from": "shift_by", "shift_by": BIG + 5}, {"start_from": "shift_by", "shift_by": "9" * 5000},
    {"start_from": "nope"}, {"start_from": ["committed"]}, {"start_from": {"a": 1}}, {"end_at": 3},
    {"start_from": "by_duration", "duration": "P99999999999999999999D"}, {"start_from": "by_duration", "duration": 5},
    {"start_from": "by_duration", "duration": "soon"}, {"start_from": "timestamp", "start_timestamp": "yesterday"},
    {"start_from": "timestamp", "start_timestamp": "2026-01-01T00:00:00"},
    {"start_from": "timestamp", "start_timestamp": 7},
    {"start_from": "timestamp", "start_timestamp": "2026-01-02T00:00:00Z", "end_at": "timestamp",
     "end_timestamp": "2026-01-01T00:00:00Z"},
    {"topics": ["nope"]}, {"topics": "x" * 100_000}, {"topics": [1]}, {"topics": {"a": 1}},
    {"partitions": [9]}, {"partitions": [-1]}, {"partitions": [BIG]}, {"partitions": ["x"]}, {"partitions": [True]},
    {"partitions": 5}, {"partitions": [[1]]}, {"partitions": "1,x"},
    {"output": "relative/path"}, {"output": "~nosuchuser/x"}, {"output": "/tmp/a\u0000b"}, {"output": "s3://"},
    {"output": "ftp://host/x"}, {"output": 5}, {"output": ["/tmp"]},
    {"dry_run": "no"}, {"commit": "yes"}, {"window_mode": "x"}, {"max_skew": "forever"},
    {"feed": "other"}, {"k" * 1000: 1}, {"start_from": "s" * 1_000_000},
]  # fmt: skip


def test_every_bad_input_is_a_short_4xx_from_the_preview_and_the_trigger_alike(airflow: RunningAirflow) -> None:
    before = airflow.runs("tidemark_replay")
    for body in BAD_BODIES:
        answers = [airflow.request(path, body=body) for path in (PREVIEW, REPLAY)]
        for status, doc in answers:
            assert 400 <= status < 500, (repr(body)[:200], status, str(doc)[:500])
            assert len(str(doc)) < 800, (repr(body)[:200], str(doc)[:900])  # inputs are quoted in part only
        assert answers[0][0] == answers[1][0], (repr(body)[:200], answers)
    assert airflow.runs("tidemark_replay") == before  # nothing the preview refuses was started


def test_the_lower_items_have_their_4xx(airflow: RunningAirflow) -> None:
    before = airflow.runs("tidemark_replay")
    for conf in ({"start_from": "offset", "start_offset": BIG}, {"end_at": "offset", "end_offset": BIG},
                 {"partitions": [2**31]}):  # fmt: skip
        # Airflow's own trigger checks the DAG's Params: no such number reaches a task.
        status, doc = airflow.request("/api/v2/dags/tidemark_replay/dagRuns",
                                      body={"logical_date": None, "conf": {"feed": FEED, **conf}})  # fmt: skip
        assert 400 <= status < 500, (conf, doc)
    assert airflow.runs("tidemark_replay") == before
    for user in (None, "admin"):
        assert airflow.request("/tidemark/openapi.json", user=user)[0] in (401, 404)
    docs = f"/tidemark/runs/{FEED}/x/files/gx/"
    for path in (docs + "a%00b.html", docs + "..%2F..%2Fairflow.cfg", f"/tidemark/runs/{FEED}/..%2F..%00/files/gx/a"):
        status, doc = airflow.request(path)
        assert 400 <= status < 500, (path, status, doc)
    status, headers = _headers(airflow, f"/tidemark/feeds/{FEED}")
    assert status == 200
    assert "frame-ancestors 'self'" in headers["content-security-policy"]


def _headers(airflow: RunningAirflow, path: str) -> tuple[int, dict[str, str]]:
    import urllib.request

    req = urllib.request.Request(airflow.base + path, headers={"Authorization": f"Bearer {airflow.tokens['admin']}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status, {k.lower(): v for k, v in resp.headers.items()}


def test_the_pages_script_escapes_quotes_for_the_attributes_it_builds(airflow: RunningAirflow, browser: Any) -> None:
    """The polling code writes run ids and states into quoted attributes: its escaping covers quotes."""
    status, html = airflow.request(f"/tidemark/feeds/{FEED}")
    assert status == 200
    esc = re.search(r"function esc\(v\) \{.*?return [^;]*;\s*\}", html, re.S)
    assert esc, "the page's esc() helper"
    page = browser.new_page()
    hostile = "x' onmouseover='alert(1)\" data-y=\""
    out = page.evaluate("([src, v]) => new Function('return ' + src)()(v)", [esc.group(0), hostile])
    assert "'" not in out and '"' not in out and "&#39;" in out and "&quot;" in out, out
