"""The dead-letter page's count pass on a quarantine laid out as the job lays it (``tests/bench/deadletters_view``):
counts by reason and UTC day, and the first examples of each group, equal the whole read's (``dead_letters`` and
``summarize``, the oracle); the examples fetched by position are those letters, whole."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.bench import deadletters_view as bench
from tidemark.checkpoints.store import SqliteCheckpointStore
from tidemark.config.models import Feed
from tidemark.output import deadletters
from tidemark.output.deadletters import count_dead_letters, dead_letters, fetch_dead_letters, summarize


def test_counts_and_examples_equal_the_whole_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "FILE_ROWS", 1_500)  # three files
    monkeypatch.setattr(deadletters, "COUNT_BATCH", 700)  # several batches a file: groups cross batches
    output = bench.write_letters(tmp_path, 4_000)
    feed = Feed(name=bench.FEED, topics=(bench.TOPIC,), group="g-bench", output=str(output))
    store = SqliteCheckpointStore(tmp_path / "cp.sqlite")
    letters = dead_letters(feed, store=store)
    oracle = summarize(sorted(letters, key=lambda d: d.offset), examples=2)  # file order: by offset here
    counted = count_dead_letters(feed, store=store, examples=2)
    assert counted.records == len(letters) == 4_000
    assert [(g.reason, g.day, g.count) for g in counted.groups] == [(g.reason, g.day, g.count) for g in oracle]
    assert [[p.key for p in g.examples] for g in counted.groups] == [[d.key_of for d in g.examples] for g in oracle]
    wanted = [p for g in counted.groups for p in g.examples]
    by_key = {d.key_of: d for d in letters}
    assert fetch_dead_letters(feed, counted, wanted, store=store) == [by_key[p.key] for p in wanted]


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_days_are_utc_days(unit: str) -> None:
    stamps = pa.array([datetime(2026, 11, 1, 23, 59, 59, tzinfo=UTC), None, datetime(1969, 12, 31, 12, tzinfo=UTC),
                       datetime(1970, 1, 1, tzinfo=UTC), datetime(2026, 11, 2, tzinfo=UTC)],
                      pa.timestamp(unit, tz="UTC"))  # fmt: skip
    assert deadletters._days(stamps).to_pylist() == pc.cast(stamps, pa.date32()).to_pylist()
