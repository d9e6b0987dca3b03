"""The faults table's headline: the records the oracle compared are the good ones plus the quarantined ones."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.faults import harness
from tests.faults.harness import GOOD, QUARANTINED, Row, Tally
from tests.faults.table import render


def test_records_compared_are_good_plus_quarantined_counted_as_distinct_rows() -> None:
    good: Row = ("t", 0, 0, "a")
    bad: Row = ("t", 0, 1, "b")
    recreated: Row = ("t", 0, 0, "c")  # the same offset in a topic recreated under the same name
    tally = Tally()
    tally.compared(Counter({good: 1, bad: 1}), {good: GOOD, bad: QUARANTINED})
    # A row the expected set holds twice (old + new scans) still counts once in every column.
    tally.compared(Counter({good: 2, recreated: 1}), {good: GOOD, recreated: GOOD})

    assert (tally.checks, tally.records_checked, tally.good_checked, tally.quarantined_checked) == (2, 4, 3, 1)
    counts = {"scenarios_run": 1, **asdict(tally), "by_test": {"test_x": asdict(tally)}}
    headline = render(counts).split("**What the last run compared:**")[1].splitlines()[0]
    assert "2 oracle checks compared 4 records, each distinct" in headline
    assert "3 that the feed's expectations put in the output + 1 in its quarantine" in headline


def test_the_workers_counts_are_merged_and_an_older_file_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under xdist the fault suite and the other oracle-checked tests run on different workers."""
    monkeypatch.setattr(harness, "LAST_RUN", tmp_path / "last-run.json")
    old = tmp_path / "last-run.gw7.json"
    harness.write_scoreboard({"stale": harness.Tally(checks=9, records_checked=99)}, old)
    os.utime(old, (1, 1))
    boards = {
        "gw0": {"a": harness.Tally(checks=2, records_checked=10, good_checked=10)},
        "gw1": {"b": harness.Tally(checks=1, records_checked=5, quarantined_checked=5)},
    }
    for worker, board in boards.items():
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        harness.write_scoreboard(board)

    doc = harness.merge_scoreboards(since=time.time() - 60)

    assert doc is not None
    assert (doc["scenarios_run"], doc["checks"], doc["records_checked"]) == (2, 3, 15)
    assert sorted(doc["by_test"]) == ["a", "b"]
    assert json.loads((tmp_path / "last-run.json").read_text()) == doc
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last-run.gw7.json", "last-run.json"]
