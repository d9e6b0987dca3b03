"""The commit task's metrics from a run's files: dead letters counted per reason code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tidemark.orchestration import metrics


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any, dict[str, str]]] = []

    def incr(self, name: str, count: int = 1, tags: dict[str, str] | None = None) -> None:
        self.calls.append(("incr", name, count, tags or {}))

    def gauge(self, name: str, value: Any, tags: dict[str, str] | None = None) -> None:
        self.calls.append(("gauge", name, value, tags or {}))

    def timing(self, name: str, value: Any, tags: dict[str, str] | None = None) -> None:
        self.calls.append(("timing", name, value, tags or {}))


RULE = "expect_column_values_to_match_regex(value)"


@pytest.mark.parametrize("committed", [True, False])
def test_a_committed_runs_dead_letters_are_counted_per_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, committed: bool
) -> None:
    recorder = Recorder()
    monkeypatch.setattr(metrics, "stats", recorder)
    job = {"records_read": 30, "records_published": 21, "records_quarantined": 9,
           "validation": {"counts": {"decode_errors": 6, "by_rule": {RULE: 3, "expect_column_values_to_not_be_null"
                                                                               "(key)": 0}}}}  # fmt: skip
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "report.json").write_text(json.dumps({"events": []}))
    metrics.finished("orders", str(tmp_path), str(tmp_path / "report.json"), committed=committed)
    dead = {c[3]["reason"]: c[2] for c in recorder.calls if c[1] == "tidemark.dead_letters"}
    assert dead == ({"decode_error": 6, RULE: 3} if committed else {})
    assert all(c[3]["feed"] == "orders" for c in recorder.calls if c[1] == "tidemark.dead_letters")


def test_no_quarantine_no_dead_letter_counts() -> None:
    assert metrics.dead_letter_reasons({"records_quarantined": 0, "validation": {"counts": {"decode_errors": 0}}}) == {}
    assert metrics.dead_letter_reasons({"records_quarantined": 2, "validation": {"counts": {
        "decode_errors": 0, "by_rule": {f"{RULE}#1": 1, f"{RULE}#2": 2}}}}) == {RULE: 3}  # fmt: skip
