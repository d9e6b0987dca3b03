"""``job.json``: the job writes a JobResult whole and the pipeline and the report read the same JobResult back."""

from __future__ import annotations

import json
from pathlib import Path

from tidemark.config.models import parse_feed
from tidemark.job.result import JOB_FILE, JobResult, read_result, run_without_spark, write_result
from tidemark.planning.plan import PartitionPlan, Plan, compute_plan_id


def empty_plan() -> Plan:
    parts = (PartitionPlan("orders", 0, 1, 7, None, 0, 7, 7, 7, 7, "committed"),)
    return Plan(compute_plan_id("orders", "g", "scheduled", "read_committed", parts),
                "orders", "g", "scheduled", True, "read_committed", "2026-01-01T00:00:00+00:00", parts, ())  # fmt: skip


def test_a_result_reads_back_as_written(tmp_path: Path) -> None:
    result = JobResult("p1", "orders", published=True, reader="driver", staged_by="spark", records_read=3,
                       ranges=[{"topic": "orders", "partition": 0, "records": 3}], timings_s={"write": 1.25},
                       events=[{"kind": "gap", "message": "m"}], finished_at="2026-01-01T00:00:01+00:00")  # fmt: skip

    write_result(tmp_path, result)

    assert read_result(tmp_path) == result
    assert set(json.loads((tmp_path / JOB_FILE).read_text())) == set(result.to_dict())


def test_no_result_is_none_and_keys_of_other_versions_are_left_out(tmp_path: Path) -> None:
    assert read_result(tmp_path) is None
    doc = {"plan_id": "p1", "feed": "orders", "started_at": "2026-01-01T00:00:00+00:00", "outputs": {"output": "/x"}}
    (tmp_path / JOB_FILE).write_text(json.dumps(doc))
    assert read_result(tmp_path) == JobResult("p1", "orders", started_at="2026-01-01T00:00:00+00:00")


def test_an_empty_plan_fails_only_when_the_feed_expects_records() -> None:
    feed = parse_feed("orders", {"topics": ["orders"], "group": "g"}, "orders.yaml")
    assert run_without_spark(empty_plan(), feed).published
    strict = parse_feed(
        "orders", {"topics": ["orders"], "group": "g", "validation": {"expect_records": True}}, "o.yaml"
    )
    failed = run_without_spark(empty_plan(), strict)
    assert not failed.published and failed.error_type == "ValidationFailedError" and "orders[0]@7" in str(failed.error)
