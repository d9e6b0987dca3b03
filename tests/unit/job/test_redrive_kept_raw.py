"""A masked feed's dead letters joined to the raw bytes its ``keep_raw`` location holds (no Spark, no Kafka)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tidemark.config.models import load_feed_file
from tidemark.job.redrive import RAW_MISSING, kept_raw
from tidemark.output.deadletters import DeadLetter

FEED = (
    "topics: [orders]\ngroup: orders-batch\ndeserialization:\n  format: json\n  fields: [{name: email, type: string}]\n"
    "masking:\n  fields: {email: hash}\n  keep_raw: KEEP\n"
)
HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def letter(plan_id: str, topic: str, partition: int, offset: int) -> DeadLetter:
    """A dead letter as a masked feed lists it: the masked key, no value, the masked header."""
    return DeadLetter(topic, partition, offset, datetime(2026, 11, 20, tzinfo=UTC), b"0f3a" * 16, None,
                      (("x-user", b"[masked]"),), plan_id, "run-1", ("decode_error",), "decode_error: ...")  # fmt: skip


def test_each_letter_gets_the_raw_bytes_kept_for_its_plan_and_a_letter_without_them_stays_failing(
    tmp_path: Path,
) -> None:
    keep = tmp_path / "secured"
    (tmp_path / "orders.yaml").write_text(FEED.replace("KEEP", str(keep)))
    feed = load_feed_file(tmp_path / "orders.yaml")
    # As the job's quarantine writer lays it out: by topic (Spark escapes the name) and date, Spark's markers beside.
    folder = keep / "plan_id=p1" / "topic=orders%3Aeu" / "date=2026-11-20"
    folder.mkdir(parents=True)
    rows = pa.table({
        "partition": pa.array([0, 1], pa.int32()), "offset": pa.array([5, 7], pa.int64()),
        "key": pa.array([b"secret-key-5", None], pa.binary()),
        "value": pa.array([b'{"email": "secret@x"}', b"{not json"], pa.binary()),
        "headers": pa.array([[{"key": "x-user", "value": b"secret-h"}], []], HEADERS),
    })  # fmt: skip
    pq.write_table(rows, folder / "part-00000.parquet")
    (keep / "plan_id=p1" / "_SUCCESS").write_text("")
    (folder / ".part-00000.parquet.crc").write_bytes(b"\x00")

    letters = [letter("p1", "orders:eu", 0, 5), letter("p2", "orders:eu", 0, 5), letter("p1", "orders:eu", 1, 7),
               letter("p1", "orders:eu", 1, 8)]  # fmt: skip
    got = kept_raw(feed, letters)

    assert [(d.plan_id, d.partition, d.offset, d.key, d.value, d.headers) for d in got.found] == [
        ("p1", 0, 5, b"secret-key-5", b'{"email": "secret@x"}', (("x-user", b"secret-h"),)),
        ("p1", 1, 7, None, b"{not json", ()),
    ]
    assert [(v.letter, v.passes) for v in got.missing] == [(letters[1], False), (letters[3], False)]
    for v, plan, where in zip(got.missing, ("p2", "p1"), ("orders:eu[0] offset 5", "orders:eu[1] offset 8"),
                              strict=True):  # fmt: skip
        [code] = v.reason_codes
        assert code.startswith(f"{RAW_MISSING}(plan {plan}, {where}: ")
        assert f"{keep}/plan_id={plan}" in code and "stays a dead letter" in code
