"""The dead-letter summary by reason code and day, over plain rows (the reader itself is tested on the cluster)."""

from __future__ import annotations

from datetime import UTC, datetime

from tidemark.output.deadletters import DeadLetter, summarize
from tidemark.staged import reason_codes

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
