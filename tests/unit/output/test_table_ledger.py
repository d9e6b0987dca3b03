"""The table ledger's rules (tidemark.output.ledger): ends per topic id, a bounded set of recent plans, overlaps."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tidemark.output.ledger import RECENT_PLANS, Ledger, LedgerPlan, SnapshotFacts, Unplaced, overlap, reconcile


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


def test_plans_without_topic_ids_keep_their_ends_under_no_id_or_the_topics_current_one() -> None:
    ledger = Ledger("f", "g").with_plan([r(0, 0, 10, None)], plan(1), "g")
    assert ledger.ends == {"orders": {"": {0: 10}}} and ledger.current == {"orders": ""}
    ledger = Ledger("f", "g").with_plan([r(0, 0, 10)], plan(1), "g").with_plan([r(0, 10, 12, None)], plan(2), "g")
    assert ledger.ends == {"orders": {"id-a": {0: 12}}} and ledger.current == {"orders": "id-a"}


def test_a_commit_records_the_group_it_committed_for_and_a_rebuilt_ledger_becomes_the_ledger() -> None:
    ledger = Ledger("f", "g", source="history").with_plan([r(0, 0, 10)], plan(1), "g2")
    assert (ledger.group, ledger.source) == ("g2", "ledger")


def test_the_document_is_compact_with_sorted_keys_and_its_missing_parts_are_empty() -> None:
    ledger = Ledger("f", "g").with_plan([r(0, 0, 10)], plan(1), "g")
    assert ledger.to_json() == (
        '{"current":{"orders":"id-a"},"ends":{"orders":{"id-a":{"0":10}}},"feed":"f","group":"g","plans":1,'
        '"recent":[["plan-1","run-1",1,0,1001,1]],"v":1}'
    )
    assert Ledger.from_json('{"v": 1, "feed": "f", "group": "g"}') == Ledger("f", "g")


def test_the_end_of_a_plan_without_ids_is_the_topics_only_id_and_none_among_several() -> None:
    """A plan without topic ids (an old plan) asks for the topic's current id; where the ledger names none (rebuilt
    from history), the one id its ends have, and nothing when they have several (which topic is unknown)."""
    one = Ledger("f", "g", current={}, ends={"orders": {"id-a": {0: 10}}})
    assert one.end("orders", 0, None) == 10 and one.end("orders", 0, "id-b") is None
    two = Ledger("f", "g", current={}, ends={"orders": {"id-a": {0: 10}, "id-b": {0: 3}}})
    assert two.end("orders", 0, None) is None and two.end("orders", 0, "id-a") == 10
    recreated = Ledger("f", "g").with_plan([r(0, 0, 10)], plan(1), "g").with_plan([r(0, 0, 3, "id-b")], plan(2), "g")
    assert recreated.end("orders", 0, None) == 3 and recreated.end("orders", 0, "") == 3
    assert Ledger("f", "g").end("orders", 0, None) is None


def test_positions_skip_a_topic_whose_current_id_has_no_ends() -> None:
    ledger = Ledger("f", "g", current={"orders": "id-b", "other": "x"}, ends={"orders": {"id-a": {0: 10}}})
    assert ledger.positions() == {}


def test_only_snapshots_that_added_at_least_one_record_are_foreign() -> None:
    ledger, _, b = _two_plans()
    ancestry = [_facts(5, 400, added=1, tidemark=False), _facts(6, 350, added=0, tidemark=False),
                _facts(1, 100, r(0, 0, 5), plan_id="plan-a")]  # fmt: skip
    checked = reconcile(ledger, ancestry, {})
    assert checked.rolled_back == (b,)  # committed after the oldest kept ancestor, not in the ancestry
    assert [s.snapshot_id for s in checked.foreign] == [1005]


def _three_plans() -> tuple[Ledger, LedgerPlan, LedgerPlan, LedgerPlan]:
    """Plans a, b, c: [0, 5), [5, 15), [15, 20) of partition 0 (their ranges' topic ids not in the summaries,
    as an older Tidemark wrote them); partition 1 only by a, [0, 7)."""
    a, b, c = (LedgerPlan(f"plan-{n}", f"run-{n}", 5, 0, 1000 + i, committed_ms=100 * i)
               for i, n in enumerate("abc", start=1))  # fmt: skip
    ledger = (Ledger("f", "g").with_plan([r(0, 0, 5), r(1, 0, 7)], a, "g").with_plan([r(0, 5, 15)], b, "g")
              .with_plan([r(0, 15, 20)], c, "g"))  # fmt: skip
    return ledger, a, b, c


def test_rolled_back_plans_give_back_their_lowest_start_and_kept_plans_their_highest_end() -> None:
    ledger, _, b, c = _three_plans()
    fa = _facts(1, 100, r(0, 0, 5, None), r(1, 0, 7, None), plan_id="plan-a")
    # b's empty range of partition 1 is behind that partition's end: it gives nothing back
    fb = _facts(2, 200, r(0, 5, 15, None), r(1, 4, 4, None), plan_id="plan-b")
    fc = _facts(3, 300, r(0, 15, 20, None), plan_id="plan-c")
    both = reconcile(ledger, [fa], {1002: fb, 1003: fc})  # b and c rolled back, their snapshots kept
    assert both.rolled_back == (b, c) and both.unplaced == () and both.foreign == ()
    assert both.ledger.positions() == {("orders", 0): 5, ("orders", 1): 7}
    assert both.rolled_back_ranges == {"plan-b": fb.ranges, "plan-c": fc.ranges}
    gone = reconcile(ledger, [fb, fa], {})  # c rolled back, its snapshot expired: the kept plans' highest end
    assert gone.rolled_back == (c,) and gone.rolled_back_ranges == {"plan-c": None} and gone.unplaced == ()
    assert gone.ledger.positions() == {("orders", 0): 15, ("orders", 1): 7}


def test_a_plan_committed_before_the_oldest_ancestor_is_rolled_back_when_its_snapshot_is_kept_off_the_line() -> None:
    ledger, _, b, _ = _three_plans()
    fb = _facts(2, 200, r(0, 5, 15), plan_id="plan-b")
    checked = reconcile(ledger, [_facts(3, 300, r(0, 15, 20), plan_id="plan-c", added=5)], {1002: fb})
    assert checked.rolled_back == (b,)  # committed at 200, before the oldest kept ancestor (300), but detached
    assert reconcile(ledger, [_facts(3, 300, r(0, 15, 20), plan_id="plan-c")], {}).rolled_back == ()


def test_with_no_kept_ancestor_every_plan_with_a_snapshot_is_rolled_back_and_unplaced_names_each_partition() -> None:
    ledger, a, b, c = _three_plans()
    fresh = replace(ledger, recent=(*ledger.recent, LedgerPlan("plan-d", "run-d", 0, 0, None, 400)))
    checked = reconcile(fresh, [], {})
    assert checked.rolled_back == (a, b, c) and checked.foreign == ()
    assert checked.unplaced == (Unplaced("orders", "id-a", 0, 20), Unplaced("orders", "id-a", 1, 7))
    assert [p.plan_id for p in checked.ledger.recent] == ["plan-d"]


def test_rolled_back_plans_on_no_kept_plan_give_back_the_lowest_start_of_ranges_with_records_only() -> None:
    """Nothing kept holds a plan (a maintenance snapshot only): each partition goes back to the lowest start of the
    rolled-back ranges with records on it; an empty range behind the end gives nothing back."""
    ledger, _, b, c = _three_plans()
    fb = _facts(2, 200, r(0, 5, 15, None), r(1, 4, 4, None), plan_id="plan-b")
    fc = _facts(3, 300, r(0, 15, 20, None), plan_id="plan-c")
    checked = reconcile(ledger, [_facts(1, 100)], {1002: fb, 1003: fc})
    assert checked.rolled_back == (b, c) and checked.unplaced == ()
    assert checked.ledger.positions() == {("orders", 0): 5, ("orders", 1): 7}


def test_a_rolled_back_plan_of_a_topic_since_recreated_gives_back_its_own_topic_ids_ends() -> None:
    a = LedgerPlan("plan-a", "run-a", 10, 0, 1001, committed_ms=100)
    b = LedgerPlan("plan-b", "run-b", 3, 0, 1002, committed_ms=200)
    ledger = Ledger("f", "g").with_plan([r(0, 0, 10)], a, "g").with_plan([r(0, 0, 3, "id-b")], b, "g")
    fa = _facts(1, 100, r(0, 0, 10), plan_id="plan-a")
    checked = reconcile(ledger, [_facts(2, 200, r(0, 0, 3, "id-b"), plan_id="plan-b")], {1001: fa})
    assert checked.rolled_back == (a,)
    assert checked.ledger.end("orders", 0, "id-a") == 0 and checked.ledger.end("orders", 0, "id-b") == 3
