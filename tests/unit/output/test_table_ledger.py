"""The table ledger's rules (tidemark.output.ledger): ends per topic id, a bounded set of recent plans, overlaps."""

from __future__ import annotations

from typing import Any

import pytest

from tidemark.output.ledger import RECENT_PLANS, Ledger, LedgerPlan, SnapshotFacts, overlap, reconcile


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


def _facts(n: int, ms: int, *ranges: dict[str, Any], plan_id: str | None = None, added: int = 0,
           tidemark: bool = True) -> SnapshotFacts:  # fmt: skip
    return SnapshotFacts(1000 + n, ms, plan_id=plan_id, ranges=ranges, tidemark=tidemark, added_records=added)


def _two_plans() -> tuple[Ledger, LedgerPlan, LedgerPlan]:
    a = LedgerPlan("plan-a", "run-a", 5, 0, 1001, committed_ms=100)
    b = LedgerPlan("plan-b", "run-b", 10, 0, 1002, committed_ms=200)
    ledger = Ledger("f", "g").with_plan([r(0, 0, 5), r(1, 0, 7)], a, "g").with_plan([r(0, 5, 15), r(1, 7, 7)], b, "g")
    return ledger, a, b


def test_a_ledger_the_ancestry_bears_out_is_returned_as_it_is() -> None:
    ledger, _, _ = _two_plans()
    ancestry = [_facts(2, 200, r(0, 5, 15), plan_id="plan-b"), _facts(1, 100, r(0, 0, 5), plan_id="plan-a")]
    checked = reconcile(ledger, ancestry, {})
    assert checked.agrees and checked.ledger is ledger and checked.foreign == ()


@pytest.mark.parametrize(("committed_ms", "rolled"), [(149, False), (150, True)])
def test_a_plan_missing_from_the_ancestry_is_rolled_back_from_the_oldest_kept_ancestor_on(
    committed_ms: int, rolled: bool
) -> None:
    """Its snapshot expired (metadata no longer has it): committed before the oldest kept ancestor, it was expired
    on the current line and stands; at or after it, it would be an ancestor, so it was rolled back."""
    ledger, a, _ = _two_plans()
    b = LedgerPlan("plan-b", "run-b", 10, 0, 1002, committed_ms=committed_ms)
    ledger = Ledger("f", "g").with_plan([r(0, 0, 5), r(1, 0, 7)], a, "g").with_plan([r(0, 5, 15)], b, "g")
    ancestry = [_facts(3, 150, tidemark=False, added=0)]  # a keyed delete, say: the only snapshot kept
    checked = reconcile(ledger, ancestry, {})
    assert checked.rolled_back == ((b,) if rolled else ())
    if rolled:  # its ranges are gone with its snapshot and nothing kept shows partition 0's end: not placed
        assert [(u.partition, u.recorded) for u in checked.unplaced] == [(0, 15), (1, 7)]
        assert checked.ledger.find("plan-b") is None and checked.ledger.end("orders", 0, "id-a") == 15
    else:
        assert checked.ledger is ledger


def test_a_rolled_back_plan_whose_snapshot_is_kept_gives_its_starts_back() -> None:
    ledger, _, b = _two_plans()
    ancestry = [_facts(1, 100, r(0, 0, 5), r(1, 0, 7), plan_id="plan-a")]
    detached = {1002: _facts(2, 200, r(0, 5, 15), r(1, 7, 7), plan_id="plan-b")}
    checked = reconcile(ledger, ancestry, detached)
    assert checked.rolled_back == (b,) and checked.unplaced == ()
    assert checked.ledger.positions() == {("orders", 0): 5, ("orders", 1): 7}
    assert checked.ledger.find("plan-b") is None and checked.ledger.find("plan-a") is not None
    assert overlap(checked.ledger, [r(0, 5, 15)]) == [] and overlap(checked.ledger, [r(0, 4, 15)]) != []
    # The ancestry's own plans on the rolled-back line's partition, without plan-a's snapshot: its start.
    only = reconcile(ledger, [_facts(3, 150, tidemark=False)], detached)
    assert only.ledger.positions() == {("orders", 0): 5, ("orders", 1): 7} and only.unplaced == ()


def test_a_snapshot_that_added_records_with_no_tidemark_property_is_named_and_moves_nothing() -> None:
    ledger, _, _ = _two_plans()
    ancestry = [_facts(3, 300, added=4, tidemark=False), _facts(2, 200, r(0, 5, 15), plan_id="plan-b"),
                _facts(4, 250, added=9, tidemark=True)]  # fmt: skip
    checked = reconcile(ledger, ancestry, {})
    assert checked.agrees and [s.snapshot_id for s in checked.foreign] == [1003]
    assert checked.ledger is ledger
