"""The pure parts of ``tidemark verify``: offsets held twice, spans, the offsets events name, what owns a file."""

from __future__ import annotations

import numpy as np
import pytest

from tidemark.output.audit import Claims, owner
from tidemark.runs.verify import event_spans, held_twice, spans
from tidemark.storage import Location


def arr(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


@pytest.mark.parametrize(
    ("data", "quarantined", "redriven", "twice"),
    [
        (arr(1, 2, 3), arr(4), arr(), []),  # each once
        (arr(1, 2, 2, 3), arr(), arr(), [2]),  # one offset published twice
        (arr(1, 2), arr(2), arr(), [2]),  # published and quarantined
        (arr(1), arr(2, 2), arr(), [2]),  # quarantined twice
        (arr(1), arr(2), arr(2), []),  # a dead letter re-driven: once
        (arr(1, 2), arr(2), arr(2), [2]),  # re-driven and published as well
        (arr(1), arr(2), arr(2, 2), [2]),  # re-driven twice
        (arr(), arr(), arr(), []),
    ],
)
def test_held_twice(data: np.ndarray, quarantined: np.ndarray, redriven: np.ndarray, twice: list[int]) -> None:
    assert held_twice(data, quarantined, redriven).tolist() == twice


def test_spans_join_consecutive_offsets_only() -> None:
    assert spans(arr(7, 3, 4, 5, 9, 10)) == ((3, 6), (7, 8), (9, 11))
    assert spans(arr()) == ()
    assert spans(arr(5, 5)) == ((5, 6),)


def test_events_name_their_ranges() -> None:
    assert event_spans({"kind": "data_loss", "topic": "t", "partition": 1,
                        "details": {"lost_start": 0, "lost_end": 5}}) == [(("t", 1), (0, 5))]  # fmt: skip
    assert event_spans({"kind": "offsets_skipped", "topic": "t", "partition": 0,
                        "details": {"start": 3, "end": 8}}) == [(("t", 0), (3, 8))]  # fmt: skip
    assert event_spans({"kind": "not_shown", "details": {"ranges": [
        {"topic": "t", "partition": 2, "start": 10, "end": 20}]}}) == [(("t", 2), (10, 20))]  # fmt: skip
    assert event_spans({"kind": "reset", "topic": "t", "partition": 0, "details": {"offset": 4}}) == [
        (("t", 0), (0, 4))
    ]
    assert event_spans({"kind": "capped", "topic": "t", "partition": 0, "details": {"limit": 4}}) == []


def test_what_owns_a_file() -> None:
    out = Location.of("/data/out")
    listed = frozenset({"/data/out/plan_id=a/topic=t/date=d/part-0.parquet", "/data/out/plan_id=a/_manifest.json"})
    claims = Claims(listed=listed, open_runs=frozenset({"r1"}), open_plans=frozenset({"p1"}))
    assert owner("/data/out/plan_id=a/_manifest.json", out, claims) == "referenced"
    assert owner("/data/out/plan_id=a/topic=t/date=d/.part-0.parquet.crc", out, claims) == "sidecar"
    assert owner("/data/out/plan_id=a/topic=t/date=d/part-1.parquet", out, claims) is None  # listed by no manifest
    assert owner("/data/out/plan_id=a/topic=t/date=d/.part-1.parquet.crc", out, claims) is None
    assert owner("/data/out/_pending/r1/plan_id=p1/_manifest.json", out, claims) == "pending"
    assert owner("/data/out/_pending/r10/plan_id=p1/_manifest.json", out, claims) is None  # a prefix of an open run
    assert owner("/data/out/_staging/p1.abc/x.parquet", out, claims) == "staging"
    assert owner("/data/out/_staging/p10.abc/x.parquet", out, claims) is None
    assert owner("/data/out/stray.txt", out, claims) is None
    assert owner("/data/tbl/data/date=d/p1-0a1b2c3d-00000.parquet", Location.of("/data/tbl"), claims) == "leftover"
    assert owner("/data/tbl/data/date=d/p10-0a1b2c3d-00000.parquet", Location.of("/data/tbl"), claims) is None
    pending = Location.of("/data/tbl.pending")
    assert owner("/data/tbl.pending/r1/plan_id=p1.json", pending, claims) == "pending"
    assert owner("/data/tbl.pending/r2/plan_id=p2.json", pending, claims) is None
    quarantine = Location.of("/data/tbl.quarantine")
    shown = Claims(shown_plans=frozenset({"s"}))
    assert owner("/data/tbl.quarantine/plan_id=s/topic=t/x.parquet", quarantine, shown) == "quarantine"
    assert owner("/data/tbl.quarantine/plan_id=s2/topic=t/x.parquet", quarantine, shown) is None


def test_a_runs_staging_folder_and_its_lock_are_the_runs_while_it_is_open() -> None:
    out = Location.of("/data/out")
    claims = Claims(open_runs=frozenset({"20261207T101010Z-ab"}), open_plans=frozenset({"p1"}))
    run = "20261207T101010Z-ab"
    assert owner(f"/data/out/_staging/{run}.n1/part-0.parquet", out, claims) == "staging"
    assert owner(f"/data/out/_staging/{run}.n1.lock", out, claims) == "staging"
    assert owner(f"/data/out/_staging/{run}0.n1/part-0.parquet", out, claims) is None  # a run id it is a prefix of
    assert owner(f"/data/out/_staging/{run}0.n1.lock", out, claims) is None  # another run's lock
    assert owner("/data/out/_staging/20261207T101010Z-a.n1.lock", out, claims) is None  # a prefix of the run id
    assert owner("/data/out/_staging/p1.n1/part-0.parquet", out, claims) == "staging"  # a job outside any run
    assert owner("/data/out/_staging/p1.n1.lock", out, claims) == "staging"
    assert owner("/data/out/_staging/p10.n1.lock", out, claims) is None
    assert owner(f"/data/out/_staging/{run}.n1.lock", out, Claims()) is None  # the run is closed: a leftover


def test_a_runs_quarantine_folder_is_the_runs_while_open_and_the_plans_once_shown_as_that_run_published_it() -> None:
    q = Location.of("/data/tbl.quarantine")
    path = "/data/tbl.quarantine/run_id={}/plan_id={}/topic=t/date=d/part-0.parquet"
    open_ = Claims(open_runs=frozenset({"r1"}), open_plans=frozenset({"p1"}))
    assert owner(path.format("r1", "p1"), q, open_) == "quarantine"
    assert owner(path.format("r10", "p1"), q, open_) is None  # a run id r1 is a prefix of
    assert owner(path.format("r", "p1"), q, open_) is None  # a prefix of r1
    assert owner("/data/tbl.quarantine/run_id=r1/stray.txt", q, open_) is None  # no plan folder
    shown = Claims(shown_plans=frozenset({"p1"}), shown_runs=frozenset({("r1", "p1")}))
    assert owner(path.format("r1", "p1"), q, shown) == "quarantine"
    assert owner(path.format("r2", "p1"), q, shown) is None  # another run of the shown plan, closed: its discard's
    assert owner(path.format("r1", "p10"), q, shown) is None
    assert owner(path.format("r10", "p1"), q, shown) is None
    # The older layout, <quarantine>/plan_id=<id>/, still read: a shown or open plan's.
    assert owner("/data/tbl.quarantine/plan_id=p1/topic=t/part-0.parquet", q, shown) == "quarantine"
    assert owner("/data/tbl.quarantine/plan_id=p1/topic=t/part-0.parquet", q, open_) == "quarantine"
    assert owner("/data/tbl.quarantine/plan_id=p10/topic=t/part-0.parquet", q, shown) is None
