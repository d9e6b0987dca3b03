"""The re-drive job's folder (:mod:`tidemark.job.redrive_job`): dead letters round-trip byte for byte, verdicts
are matched by key, and a job that failed is an error naming the phase and the job's own reason."""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tidemark.job.redrive_job import (
    ANSWER_FILE,
    RedriveJob,
    RedriveJobError,
    job_folder,
    read_letters,
    write_request,
)
from tidemark.output.deadletters import DeadLetter
from tidemark.storage import Location

LETTERS = [
    DeadLetter("t", 0, 7, datetime(2026, 11, 20, 8, 0, tzinfo=UTC), b"\x00k", b"\xff\xfe not utf-8",
               (("h", b"\x01"), ("empty", None)), "plan-a", "run-1", ("decode_error",), "bad bytes", 1),
    DeadLetter("t", 1, 3, None, None, None, (), "plan-b", None, ("rule(value)",), "refused", rechecked_by="rd-1"),
]  # fmt: skip


def test_dead_letters_round_trip_through_the_folder_byte_for_byte(tmp_path: Path) -> None:
    write_request(tmp_path, {"phase": "recheck", "feed": "f"}, LETTERS)
    assert read_letters(tmp_path) == LETTERS
    with job_folder() as folder:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # raw record bytes: this user only
    assert not folder.exists()


def test_verdicts_come_back_by_key_and_a_failed_job_names_its_reason(tmp_path: Path) -> None:
    def answers(folder: Path, records: int) -> None:
        assert records == 2 and len(read_letters(folder)) == 2
        verdicts = [[list(LETTERS[1].key_of), False, ["rule(value)"], "rule(value): 'y' is refused"],
                    [list(LETTERS[0].key_of), True, [], ""]]  # fmt: skip
        (folder / ANSWER_FILE).write_text(json.dumps({"verdicts": verdicts}))

    first, second = RedriveJob(answers).recheck(_feed(), LETTERS)
    assert (first.letter, first.passes, second.passes, second.reason_codes) == (LETTERS[0], True, False,
                                                                                ("rule(value)",))  # fmt: skip
    assert second.reason == "rule(value): 'y' is refused"  # the reason's text, as a local re-check gives it

    def silent(folder: Path, records: int) -> None:
        """A submitter whose driver ran elsewhere (cluster deploy mode): exit 0, nothing in this folder."""

    with pytest.raises(RedriveJobError, match=r"gave no answer in its folder on this machine"):
        RedriveJob(silent).stage(_feed(), SimpleNamespace(to_dict=dict), LETTERS, run_id="r",  # type: ignore[arg-type]
                                 run_dir=Location.of(tmp_path))  # fmt: skip

    def fails(folder: Path, records: int) -> None:
        (folder / ANSWER_FILE).write_text(json.dumps({"error": "the registry cannot be reached"}))
        raise RuntimeError("spark-submit exited 1")

    with pytest.raises(RedriveJobError, match=r"\(recheck, 2 dead letters of feed 'f', on m\) failed: the registry"):
        RedriveJob(fails, "on m").recheck(_feed(), LETTERS)


def _feed() -> Any:
    return SimpleNamespace(name="f")  # the job's handle reads the feed's name only; the job loads the feed itself
