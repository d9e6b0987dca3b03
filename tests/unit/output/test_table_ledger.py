"""The table ledger's rules (tidemark.output.ledger): ends per topic id, a bounded set of recent plans, overlaps."""

from __future__ import annotations

from typing import Any

import pytest

from tidemark.output.ledger import RECENT_PLANS, Ledger, LedgerPlan, overlap


def plan(n: int) -> LedgerPlan:
    return LedgerPlan(f"plan-{n}", f"run-{n}", records=n, quarantined=0, snapshot_id=1000 + n, committed_ms=n)


def r(partition: int, start: int, end: int, topic_id: str | None = "id-a", topic: str = "orders") -> dict[str, Any]:
    return {"topic": topic, "partition": partition, "start": start, "end": end, "topic_id": topic_id}


def test_ends_only_move_forward_and_a_recreated_topic_starts_a_new_entry() -> None:
    ledger = Ledger("f", "g").with_plan([r(0, 0, 10), r(1, 0, 4)], plan(1), "g")
    ledger = ledger.with_plan([r(0, 10, 12), r(1, 2, 2)], plan(2), "g")  # an empty range behind the end
    assert ledger.positions() == {("orders", 0): 12, ("orders", 1): 4}
    ledger = ledger.with_plan([r(0, 0, 3, "id-b")], plan(3), "g")
    assert ledger.positions() == {("orders", 0): 3}  # the new topic's only
    assert ledger.end("orders", 0, "id-a") == 12 and ledger.end("orders", 1, "id-a") == 4
    assert ledger.end("orders", 0, "id-b") == 3 and ledger.end("orders", 1, "id-b") is None


def test_recent_plans_are_bounded_and_the_document_round_trips() -> None:
    ledger = Ledger("f", "g")
    for n in range(RECENT_PLANS + 50):
        ledger = ledger.with_plan([r(0, n, n + 1)], plan(n), "g")
    assert len(ledger.recent) == RECENT_PLANS and ledger.plans == RECENT_PLANS + 50
    assert ledger.find("plan-49") is None and ledger.find(f"plan-{RECENT_PLANS + 49}") == plan(RECENT_PLANS + 49)
    again = Ledger.from_json(ledger.to_json())
    assert again == ledger
    assert len(ledger.to_json()) < 200 * 130  # bounded however many plans were committed


@pytest.mark.parametrize(
    ("ranges", "refused"),
    [
        ([r(0, 10, 14)], []),  # starts at the end: new records
        ([r(0, 12, 14)], []),  # past the end (a gap named elsewhere): not a repeat
        ([r(0, 8, 14)], ["orders[0] [8, 14) with the table holding up to 10"]),
        ([r(0, 4, 8)], ["orders[0] [4, 8) with the table holding up to 10"]),  # an old plan replayed
        ([r(0, 5, 5)], []),  # no records
        ([r(0, 0, 4, "id-b")], []),  # a recreated topic: another id, its own offsets
        ([r(0, 4, 8, None)], ["orders[0] [4, 8) with the table holding up to 10"]),  # a plan without ids
        ([r(3, 0, 4)], []),  # a partition the table holds nothing of
    ],
)
def test_overlap_refuses_ranges_starting_below_the_tables_end(ranges: list[dict[str, Any]], refused: list[str]) -> None:
    ledger = Ledger("f", "g").with_plan([r(0, 0, 10)], plan(1), "g")
    assert overlap(ledger, ranges) == refused


def test_a_refused_version_names_itself() -> None:
    with pytest.raises(ValueError, match="version 9"):
        Ledger.from_json('{"v": 9}')
