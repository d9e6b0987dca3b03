"""The Tidemark view in a real browser (Debian's Chromium driven by Playwright) on the shared Airflow.

Log in through Airflow's login form, open the view from Airflow's navigation (it is an
iframe), check the feed's partitions against ``tidemark status``'s numbers (the library's
``feed_status``), see the runs chart, preview a replay of one partition, trigger it (a
dry run) and watch the run succeed. Screenshots go to ``test-artifacts/`` (gitignored).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import keyed_records
from tests.e2e.conftest import CHROMIUM, FEED, RunningAirflow
from tidemark.checkpoints.store import SqliteCheckpointStore
from tidemark.config.models import load_feed
from tidemark.runs.status import feed_status

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"


def _dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def test_view_in_a_browser(airflow: RunningAirflow) -> None:
    from playwright.sync_api import expect, sync_playwright

    tps = [(airflow.topic, p) for p in range(3)]
    if None in {c.offset for c in airflow.kafka.adapter.committed(airflow.group, tps).values()}:
        # run without test_view_runs: one feed run, so the group has offsets and the chart a run
        run_id = airflow.trigger(f"tidemark_{FEED}")
        assert airflow.wait_run(f"tidemark_{FEED}", run_id) == "success", airflow.task_logs(f"tidemark_{FEED}", run_id)
    # Fresh records an hour old on partition 0: a lag in records and in time to see.
    airflow.kafka.produce(airflow.topic, keyed_records(4, partition=0, prefix="late"))
    ARTIFACTS.mkdir(exist_ok=True)
    feed = load_feed(str(airflow.state.parent / "feeds" / f"{FEED}.yaml"))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1300})
        airflow.login(page)

        page.goto(airflow.base + "/plugin/tidemark")  # the nav entry's route: the view in Airflow's iframe
        view = page.frame_locator("iframe")
        view.get_by_role("link", name=FEED, exact=True).click()
        expect(view.locator("#partitions")).to_be_visible(timeout=60_000)

        status = feed_status(
            feed, airflow.kafka.adapter, SqliteCheckpointStore(airflow.state / "checkpoints.sqlite"), lag_times=True
        )
        for p in status.partitions:
            row = view.locator(f"#partitions tr[data-partition='{p.label}']")
            cells = {c: row.locator(f"td[data-col='{c}']").inner_text() for c in
                     ("committed", "checkpoint", "log_start", "end", "lag")}  # fmt: skip
            assert cells == {
                "committed": _dash(p.committed), "checkpoint": _dash(p.checkpoint), "log_start": str(p.log_start),
                "end": str(p.end), "lag": _dash(p.lag),
            }, p.label  # fmt: skip
        assert view.locator("#total-lag").inner_text() == str(status.total_lag)
        assert status.total_lag >= 4
        lag_time = view.locator(f"#partitions tr[data-partition='{feed.topics[0]}[0]'] td[data-col='lag_time']")
        assert lag_time.inner_text().endswith(("h", "m")) or "h " in lag_time.inner_text()  # about an hour

        chart = view.locator("svg#runs-chart")
        expect(chart).to_be_visible()
        runs_listed = view.locator("#runs tbody tr").count()
        assert chart.locator("rect.bar").count() == min(runs_listed, 30)
        page.screenshot(path=str(ARTIFACTS / "tidemark-view.png"))

        view.locator(f"#partitions tr[data-partition='{feed.topics[0]}[0]'] button.replay-row").click()
        assert view.locator("#replay-scope").inner_text() == f"{feed.topics[0]}[0]"
        view.locator("#preview-btn").click()
        expect(view.locator("#preview-summary")).to_be_visible(timeout=60_000)
        assert "dry run" in view.locator("#preview-summary").inner_text()
        rows = view.locator("#preview-ranges tbody tr")
        assert rows.count() == 1
        p0 = status.partitions[0]
        assert rows.first.locator("td").nth(1).inner_text() == str(p0.committed)  # starts at the committed offset
        assert rows.first.locator("td").nth(3).inner_text() == str(p0.lag)
        view.locator("#preview").scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "tidemark-replay-preview.png"))

        view.locator("#trigger-btn").click()
        state = view.locator("#run-state")
        expect(state).to_be_visible(timeout=60_000)
        expect(state).to_have_attribute("data-state", "success", timeout=300_000)
        height = int(view.locator("body").evaluate("b => b.scrollHeight"))
        page.set_viewport_size({"width": 1400, "height": min(height + 60, 2400)})  # the whole view
        expect(view.locator("#run-state")).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "tidemark-replay-run.png"))
        browser.close()
