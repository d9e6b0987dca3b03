"""The keyed table equals the fold of its change history by the documented order, whatever order plans read it in.

Hypothesis draws a history of changes to a few keys, split across three partitions (a key
moves between partitions at will), and a read order: plans, each reading a random number of
the next records of each partition (every partition in every plan's ranges, as a real plan
lists them, most with nothing to read). Each plan is applied to a real pyiceberg table
(SQLite catalog, local files) by the merge a run commits with. After the last plan the
table must equal the fold written here from the whole history and nothing of the merge's:

- Debezium: each change has a PostgreSQL source position (the LSN, unique, increasing in
  the order the history is drawn, so that each partition holds its changes in source
  order, as a connector writes them); the change with the highest LSN per key decides;
- ``state``: each record has a Kafka timestamp that may go backwards; the order is the
  running maximum of the timestamps along each partition, then partition and offset.

A delete is final until a newer change of its key: a key deleted by one plan never comes
back by an older change that a later plan reads from another partition.
"""

from __future__ import annotations

import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemark.output.changes import ChangeSpec, apply_changes
from tidemark.output.iceberg import FEED_KEY, GROUP_KEY, PLAN_KEY, RANGES_KEY, RECORDS_KEY

PARTITIONS = 3
TS = pa.timestamp("us", tz="UTC")
IMAGE = pa.struct([("id", pa.int64()), ("name", pa.string())])
STAGED = {
    "debezium": pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                           ("timestamp", TS), ("key", pa.string()), ("before", IMAGE), ("after", IMAGE),
                           ("op", pa.string()), ("source", pa.struct([("lsn", pa.int64())]))]),
    "state": pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                        ("timestamp", TS), ("key", pa.string()), ("name", pa.string())]),
}  # fmt: skip
POSITIONS = [("_kafka_topic", pa.string()), ("_kafka_partition", pa.int32()), ("_kafka_offset", pa.int64()),
             ("_kafka_timestamp", TS), ("_kafka_topic_id", pa.string()), ("_change_order", pa.string())]  # fmt: skip
TABLE = {
    "debezium": pa.schema([("id", pa.int64()), ("name", pa.string()), *POSITIONS]),
    "state": pa.schema([("key", pa.string()), ("name", pa.string()), *POSITIONS]),
}
SPECS = {"debezium": ChangeSpec("f", ("id",), "debezium", ()), "state": ChangeSpec("f", ("key",), "state", ())}

# (partition, key, delete?, timestamp s)
events = st.lists(
    st.tuples(st.integers(0, PARTITIONS - 1), st.integers(0, 3), st.booleans(), st.integers(0, 40)),
    min_size=1,
    max_size=24,
)
# each plan: how many of the next records of each partition it reads
read_orders = st.lists(st.lists(st.integers(0, 4), min_size=PARTITIONS, max_size=PARTITIONS), max_size=5)


def history(fmt: str, drawn: list[tuple[int, int, bool, int]]) -> dict[int, list[dict[str, Any]]]:
    """Each partition's records, in offset order, as the job stages them."""
    parts: dict[int, list[dict[str, Any]]] = {p: [] for p in range(PARTITIONS)}
    for lsn, (p, k, delete, ts) in enumerate(drawn, start=1):
        base = {"topic": "t", "partition": p, "offset": len(parts[p]), "timestamp": datetime.fromtimestamp(ts, UTC),
                "key": f"k{k}"}  # fmt: skip
        name = None if delete else f"v{lsn}"
        if fmt == "debezium":
            image = {"id": k, "name": name}
            parts[p].append({**base, "op": "d" if delete else "u", "before": image if delete else None,
                             "after": None if delete else image, "source": {"lsn": 1000 + lsn}})  # fmt: skip
        else:
            parts[p].append({**base, "name": name})
    return parts


def expected(fmt: str, parts: dict[int, list[dict[str, Any]]]) -> dict[Any, str]:
    """The fold by the documented order, from the whole history."""
    ordered = []
    for p, records in parts.items():
        clock = -1
        for r in records:
            if fmt == "debezium":
                key, name, at = (
                    r["after"]["id"] if r["after"] else r["before"]["id"],
                    (r["after"] or {}).get("name"),
                    (r["source"]["lsn"],),
                )
            else:
                clock = max(clock, int(r["timestamp"].timestamp()))
                key, name, at = r["key"], r["name"], (clock, p, r["offset"])
            ordered.append((at, key, name))
    state: dict[Any, str | None] = {}
    for _, key, name in sorted(ordered, key=lambda e: e[0]):
        state[key] = name
    return {k: v for k, v in state.items() if v is not None}


def run(
    fmt: str,
    parts: dict[int, list[dict[str, Any]]],
    order: list[list[int]],
    staged_schema: pa.Schema | None = None,
    rest: bool = True,
) -> dict[Any, str]:
    """Apply the history plan by plan in ``order`` (then, with ``rest``, one plan reading the rest) to a fresh
    table."""
    from pyiceberg.catalog.sql import SqlCatalog

    with tempfile.TemporaryDirectory() as tmp:
        catalog = SqlCatalog("t", uri=f"sqlite:///{Path(tmp) / 'c.db'}", warehouse=f"file://{Path(tmp) / 'w'}")
        catalog.create_namespace("ns")
        table = catalog.create_table("ns.t", schema=TABLE[fmt], properties={"commit.retry.num-retries": "0"})
        cursor = dict.fromkeys(parts, 0)
        for n, counts in enumerate([*order, *([[10**6] * PARTITIONS] if rest else [])]):
            ranges, staged = [], []
            for p, count in enumerate(counts):
                start, end = cursor[p], min(cursor[p] + count, len(parts[p]))
                ranges.append({"topic": "t", "partition": p, "start": start, "end": end})
                staged += parts[p][start:end]
                cursor[p] = end
            props = {PLAN_KEY: f"p{n}", FEED_KEY: "f", GROUP_KEY: "g", RECORDS_KEY: str(len(staged)),
                     RANGES_KEY: json.dumps(ranges)}  # fmt: skip
            records = pa.Table.from_pylist(staged, schema=staged_schema or STAGED[fmt])
            apply_changes(table, SPECS[fmt], records, props, "ns.t", None)
        rows = table.refresh().scan().to_arrow().to_pylist()
    key = SPECS[fmt].key[0]
    assert len({r[key] for r in rows}) == len(rows), rows
    return {r[key]: r["name"] for r in rows}


@pytest.mark.parametrize("fmt", ["debezium", "state"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=events, order=read_orders)
def test_the_table_equals_the_fold_by_the_order_whatever_the_read_order(
    fmt: str, drawn: list[tuple[int, int, bool, int]], order: list[list[int]]
) -> None:
    parts = history(fmt, drawn)
    assert run(fmt, parts, order) == expected(fmt, parts)


@pytest.mark.parametrize("fmt", ["debezium", "state"])
def test_a_key_deleted_in_one_partition_does_not_come_back_by_an_older_change_read_later(fmt: str) -> None:
    """The case the property covers, spelled out: k0 updated in partition 2 (older), deleted in partition 0 (newer);
    the first plan reads partition 0 (the delete), the next reads partition 2 (the older update)."""
    parts = history(fmt, [(2, 0, False, 5), (0, 0, False, 6), (0, 0, True, 7), (1, 1, False, 8)])
    assert expected(fmt, parts) == {"k1" if fmt == "state" else 1: "v4"}
    assert run(fmt, parts, [[2, 1, 0]]) == expected(fmt, parts)


def test_a_delete_marker_is_dropped_only_once_every_partitions_clock_is_strictly_past_it() -> None:
    """A partition's later records are placed at or after its clock: a marker below every clock can no longer be
    contradicted; one equal to a clock can (a later record there ties, then wins or loses by its partition)."""
    from tidemark.output.changes import prune_markers

    markers = {
        "below": ((3, 9), "t", 0, 1, None),
        "at": ((3, 10), "t", 1, 4, None),
        "above": ((3, 11), "t", 0, 2, None),
    }
    clocks = {("t", 0): (3, 12), ("t", 1): (3, 10)}
    assert set(prune_markers(markers, clocks, [("t", 0), ("t", 1)])) == {"at", "above"}
    # A partition of the feed without a clock (nothing read from it yet) may hold anything: every marker stays.
    assert set(prune_markers(markers, clocks, [("t", 0), ("t", 1), ("t", 2)])) == set(markers)
    assert set(prune_markers(markers, {}, [])) == set(markers)


SEQUENCED = pa.schema([*(f for f in STAGED["debezium"] if f.name != "source"),
                       ("source", pa.struct([("lsn", pa.int64()), ("sequence", pa.string())]))])  # fmt: skip


def re_sent(parts: dict[int, list[dict[str, Any]]], sequence: bool) -> dict[int, list[dict[str, Any]]]:
    """Each partition's records, then all of them again at the next offsets (a restarted Connect worker re-sending
    what it sent since its last offset flush); with ``sequence``, each source also has Debezium's PostgreSQL
    ``source.sequence`` (the last committed LSN, then the change's LSN, as JSON text)."""
    out = {}
    for p, records in parts.items():
        if sequence:
            records = [{**r, "source": {**r["source"], "sequence": json.dumps([str(r["source"]["lsn"] - 1),
                                                                                str(r["source"]["lsn"])])}}
                       for r in records]  # fmt: skip
        out[p] = [*records, *({**r, "offset": len(records) + i} for i, r in enumerate(records))]
    return out


@pytest.mark.parametrize("sequence", [False, True], ids=["lsn", "sequence"])
def test_a_deleted_key_stays_deleted_when_a_restarted_worker_re_sends_its_insert_below_every_clock(
    sequence: bool,
) -> None:
    """Issue 58: k5 inserted and deleted in partition 0, then a later change in every partition, all read by one
    plan (every partition's clock is now past the delete). The worker re-sends it all; the next plan reads one
    record a partition: partition 0's is the re-sent insert of k5, older than its delete. k5 must stay deleted."""
    original = history("debezium", [(0, 5, False, 1), (0, 5, True, 2), (0, 1, False, 3), (1, 2, False, 4),
                                     (2, 3, False, 5)])  # fmt: skip
    parts = re_sent(original, sequence)
    assert expected("debezium", parts) == {1: "v3", 2: "v4", 3: "v5"}
    first = [len(original[p]) for p in range(PARTITIONS)]
    staged = SEQUENCED if sequence else None
    assert run("debezium", parts, [first, [1] * PARTITIONS], staged, rest=False) == expected("debezium", parts)


def test_only_markers_no_change_below_the_clock_can_contradict_are_dropped() -> None:
    """A PostgreSQL change ordered by ``source.sequence`` (a snapshot's has no last committed LSN: its LSN stands for
    it) can be dropped past every clock; one ordered by its LSN alone is kept for good (issue 58)."""
    from tidemark.output.changes import prune_markers, source_position

    snapshot = source_position({"source": {"lsn": 700, "sequence": '[null,"700"]'}})
    streamed = source_position({"source": {"lsn": 810, "sequence": '["800","810"]'}, "transaction": {"total_order": 2}})
    assert (snapshot, streamed) == ((4, 700, 700, 0), (4, 800, 810, 2))
    lsn_only = source_position({"source": {"lsn": 810}})
    assert lsn_only == (0, 810, 0)
    markers = {"seq": (streamed, "t", 0, 1, None), "lsn": (lsn_only, "t", 0, 2, None)}
    clocks = {("t", 0): (4, 900, 901, 0), ("t", 1): (4, 850, 860, 0)}
    assert set(prune_markers(markers, clocks, [("t", 0), ("t", 1)])) == {"lsn"}


@settings(max_examples=25, deadline=None)
@given(drawn=events, order=read_orders, resent=st.integers(0, 24))
def test_ordered_by_source_sequence_the_table_equals_the_fold_with_the_last_changes_sent_again(
    drawn: list[tuple[int, int, bool, int]], order: list[list[int]], resent: int
) -> None:
    """The property above for changes with ``source.sequence``, after a restarted worker sent the history's last
    ``resent`` changes again (each partition's share, in order, at its next offsets): dropping a change below its
    partition's clock as sent again loses nothing, and the re-sent changes change nothing."""
    parts = history("debezium", [*drawn, *drawn[len(drawn) - min(resent, len(drawn)) :]])
    for records in parts.values():
        for r in records:
            lsn = r["source"]["lsn"]
            original = lsn if lsn - 1000 <= len(drawn) else lsn - min(resent, len(drawn))
            r["source"] = {"lsn": original, "sequence": json.dumps([str(original - 1), str(original)])}
            if r["after"]:
                r["after"] = {**r["after"], "name": f"v{original - 1000}"}
    assert run("debezium", parts, order, SEQUENCED) == expected("debezium", parts)
