"""A publishing re-drive of an Avro feed on the real cluster and a real schema registry (the ``registry`` fixture).

Records are produced with confluent-kafka's ``AvroSerializer`` (version 1 of the subject);
some break the feed's row rule (an ``id`` out of range), one has a body that does not
decode. The run quarantines them as dead letters (a writer that does not resolve to the
reader fails the run instead, so it leaves none). Then both the rule and the schema are
fixed: the rule takes the ids, and version 2 of the subject (an added field with a default,
``id`` promoted to long) becomes the reader. The re-drive must decode the dead letters'
raw bytes with their writer ids resolved to that *current* reader, publish exactly those
now passing once, as an independent ``read_committed`` scan decoded by confluent-kafka
with version 2 reads them, keep the undecodable one with its new reason, and a second
re-drive must publish nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KafkaTestCluster
from tests.integration.job.test_avro import (
    ORDER_BAD,
    ORDER_V1,
    ORDER_V2,
    AvroEnv,
    _as_published,
    _published_value,
    _schema,
    env_of,
    order,
)
from tidemark.config.models import load_feed
from tidemark.output.deadletters import dead_letters
from tidemark.runs.redrive import redrive_feed

pytestmark = [pytest.mark.integration, pytest.mark.spark]

RULE = {"type": "expect_column_values_to_be_between", "kwargs": {"column": "id", "min_value": 0, "max_value": 100}}
FIXED = {"type": "expect_column_values_to_be_between", "kwargs": {"column": "id", "min_value": 0, "max_value": 1000}}


@pytest.fixture
def env(kafka: KafkaTestCluster, registry: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch) -> AvroEnv:
    return env_of(AvroEnv, kafka, registry, tmp_path, spark, monkeypatch)


def redriven_output(env: AvroEnv) -> dict[tuple[int, int], dict[str, Any]]:
    """The records the re-drives published (their own folders: their rows carry the current reader's columns)."""
    import pyarrow.dataset as ds

    files = [str(f) for f in sorted(env.output.glob("plan_id=redrive-*/topic=*/date=*/*.parquet"))]
    if not files:
        return {}
    rows = ds.dataset(files, format="parquet").to_table().to_pylist()
    return {(r["partition"], r["offset"]): r for r in rows}


def published_keys(env: AvroEnv) -> list[tuple[int, int]]:
    """Every published record's partition and offset, over all plans' folders (whatever each one's columns)."""
    import pyarrow.parquet as pq

    keys = []
    for f in sorted(env.output.glob("plan_id=*/topic=*/date=*/*.parquet")):
        t = pq.read_table(f, columns=["partition", "offset"])
        keys += list(zip(t["partition"].to_pylist(), t["offset"].to_pylist(), strict=True))
    return keys


def _evolving(env: AvroEnv) -> None:
    """The feed lets the re-drive add version 2's column to its Parquet output's one schema."""
    feed_file = env.feeds / "orders.yaml"
    feed_file.write_text(feed_file.read_text() + "schema_change: evolve\n")


def test_an_avro_feeds_dead_letters_are_redriven_with_the_current_reader_schema_once(env: AvroEnv) -> None:
    env.write_feed(expectations=[RULE])
    _evolving(env)
    ser = env.serializer(ORDER_V1)
    for partition in range(2):
        docs = [order(i) for i in range(partition, 20, 2)] + [order(500 + partition * 10 + j) for j in range(2)]
        env.produce([ser(d) for d in docs], partition)
    corrupt = ser(order(99))[:5] + b"\xff\xff\xff\xff"  # a known writer id, a body that does not decode
    env.produce([corrupt], 1)
    env.run()

    letters = dead_letters(load_feed("orders"))
    assert {(d.partition, d.offset) for d in letters} == {(0, 10), (0, 11), (1, 10), (1, 11), (1, 12)}
    first_good = published_keys(env)
    assert len(first_good) == 20

    # The fix: the rule takes the ids, and version 2 of the subject is the reader now (the feed pins none: latest).
    env.sr.register_schema(f"{env.topic}-value", _schema(ORDER_V2))
    env.write_feed(expectations=[FIXED])
    _evolving(env)
    first = redrive_feed(env.spark, "orders", root=env.root)
    assert (first.state, first.published, first.passing) == ("shown", 4, 4)

    scanned = env.scan(ORDER_V2, undecodable=[(1, 12)])  # the oracle: read with version 2 by confluent-kafka
    assert scanned.pop((1, 12)) == corrupt
    want = {k: _as_published(v) for k, v in scanned.items() if v["id"] >= 500}
    assert len(want) == 4 and all(v["channel"] == "web" for v in want.values())  # v1 records: v2's default
    names = [f["name"] for f in ORDER_V2["fields"]]
    assert {k: _published_value(r, names) for k, r in redriven_output(env).items()} == want
    assert sorted(published_keys(env)) == sorted([*first_good, *want])  # each once, beside the run's own

    (left,) = dead_letters(load_feed("orders"))
    assert (left.partition, left.offset, left.reason_codes) == (1, 12, ("decode_error",))
    assert left.rechecked_by == first.run_id and left.value == corrupt

    second = redrive_feed(env.spark, "orders", root=env.root)
    assert (second.state, second.published, second.passing) == ("shown", 0, 0)
    assert {k: _published_value(r, names) for k, r in redriven_output(env).items()} == want


def test_dead_letters_whose_writer_does_not_resolve_to_the_current_reader_stay_with_their_new_reason(
    env: AvroEnv,
) -> None:
    """The reader now adds a field without a default: version 1's records cannot be read with it. The re-drive does
    not fail; it publishes nothing and the dead letters stay, re-checked, with a decode error as their reason."""
    env.write_feed(expectations=[RULE])
    ser = env.serializer(ORDER_V1)
    env.produce([ser(order(i)) for i in (1, 2, 501, 502)], 0)
    env.run()
    assert {d.offset for d in dead_letters(load_feed("orders"))} == {2, 3}

    env.sr.register_schema(f"{env.topic}-value", _schema(ORDER_BAD))
    env.write_feed(expectations=[FIXED])
    dry = redrive_feed(env.spark, "orders", root=env.root, dry_run=True)
    assert [(v.letter.offset, v.passes, v.reason_codes) for v in dry.verdicts] == [
        (2, False, ("decode_error",)),
        (3, False, ("decode_error",)),
    ]
    # The CLI's own Spark session (another process) has from_avro too, and the same verdicts.
    proc = subprocess.run([sys.executable, "-m", "tidemark.cli", "redrive", "orders", "--dry-run", "--json"],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = json.loads(proc.stdout)
    assert [(r["offset"], r["passes"], r["reason_codes_now"]) for r in shown["records"]] == [
        (2, False, ["decode_error"]),
        (3, False, ["decode_error"]),
    ]
    done = redrive_feed(env.spark, "orders", root=env.root)
    assert (done.state, done.published, done.passing) == ("shown", 0, 0)
    assert len(published_keys(env)) == 2 and redriven_output(env) == {}
    left = dead_letters(load_feed("orders"))
    assert [(d.offset, d.reason_codes, d.rechecked_by) for d in left] == [
        (2, ("decode_error",), done.run_id),
        (3, ("decode_error",), done.run_id),
    ]
