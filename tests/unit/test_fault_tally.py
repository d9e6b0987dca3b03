"""The faults table's headline: the records the oracle compared are the good ones plus the quarantined ones."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict

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
