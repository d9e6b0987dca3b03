"""The dead-letter summary by reason code and day, over plain rows, and a quarantine file read as dead-letter rows
(the reader itself is tested on the cluster)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tidemark.output.dead_letter_table import file_rows
from tidemark.output.deadletters import DeadLetter, summarize
from tidemark.staged import reason_codes
from tidemark.storage import Location

RULE = "expect_column_values_to_match_regex(value)"


def letter(offset: int, day: int, *codes: str) -> DeadLetter:
    return DeadLetter(
        topic="t", partition=0, offset=offset, timestamp=datetime(2026, 11, day, 23, 59, tzinfo=UTC),
        key=None, value=b"\xff", headers=(), plan_id="p", run_id="r", reason_codes=codes, reason="; ".join(codes),
    )  # fmt: skip


def test_a_summary_counts_each_reason_per_day_most_first_with_a_few_examples() -> None:
    rows = [letter(o, 20, "decode_error") for o in range(5)] + [
        letter(9, 21, RULE, "expect_x(n)"),
        letter(10, 20, RULE),
    ]
    groups = summarize(rows, examples=2)
    assert [(g.reason, g.day and g.day.isoformat(), g.count) for g in groups] == [
        ("decode_error", "2026-11-20", 5), (RULE, "2026-11-20", 1), (RULE, "2026-11-21", 1),
        ("expect_x(n)", "2026-11-21", 1),
    ]  # fmt: skip
    assert [e.offset for e in groups[0].examples] == [0, 1]
    assert groups[0].to_dict()["examples"][0]["value"] == "\\xff"  # bytes that are not UTF-8, escaped


def test_reason_codes_from_an_older_quarantines_text() -> None:
    assert reason_codes("decode_error: value is not valid UTF-8; or so") == ("decode_error",)
    assert reason_codes(f"{RULE}; expect_x(n)") == (RULE, "expect_x(n)")
    assert reason_codes("") == ()


def test_a_quarantine_file_of_a_masked_feed_with_a_record_key_gives_rows_with_that_key_as_json(tmp_path: Path) -> None:
    """A masked feed nulls the raw bytes (``_raw_key``, ``_raw_value``); a registry-format key is then a decoded record
    in the quarantine, and its dead letter holds the record's JSON text, not a crash."""
    schema = pa.schema([
        pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
        pa.field("key", pa.struct([pa.field("id", pa.int64()), pa.field("email", pa.string())])),
        pa.field("value", pa.string()), pa.field("_raw_key", pa.binary()), pa.field("_raw_value", pa.binary()),
        pa.field("_reason", pa.string()),
    ])  # fmt: skip
    rows = [{"partition": 0, "offset": 7, "key": {"id": 3, "email": "d41d8c"}, "value": "x-7", "_raw_key": None,
             "_raw_value": None, "_reason": RULE}]  # fmt: skip
    folder = tmp_path / "topic=orders" / "date=2026-11-20"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / "part-0.parquet")
    [row] = file_rows(Location.of(str(folder / "part-0.parquet")), "topic=orders/date=2026-11-20/part-0.parquet",
                      feed="f", plan_id="p", run_id="r", dead_lettered_at=None)  # fmt: skip
    assert (row["topic"], row["offset"], row["value"], row["reason_codes"]) == ("orders", 7, b"x-7", [RULE])
    assert json.loads(row["key"]) == {"email": "d41d8c", "id": 3}
