"""Run reports: built from plan + job + commit, stored per run, listed, printed, never holding secrets."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from tidemark.cli import main
from tidemark.errors import ConfigError
from tidemark.job.events import gap_events
from tidemark.job.result import JobResult
from tidemark.kafka.connection import KafkaConnection
from tidemark.planning.plan import Event, PartitionPlan, Plan, compute_plan_id
from tidemark.runs.commit import CommitResult
from tidemark.runs.report import RunReport, build_report, list_runs, load_report, redact, save_report, secret_values
from tidemark.spark.stats import RangeStats

SECRET = "hunter2-very-secret"


@dataclass(frozen=True)
class Handle:
    run_id: str
    feed: str
    plan_id: str
    run_dir: str
    mode: str = "scheduled"
    commit: bool = True
    resumed: str | None = None


def make_plan() -> Plan:
    parts = (
        PartitionPlan("orders", 0, 1, 10, None, 0, 20, 20, 10, 20, "committed"),
        PartitionPlan("orders", 1, 2, None, 5, 0, 8, 8, 5, 8, "checkpoint"),
    )
    return Plan(
        compute_plan_id("orders", "g", "scheduled", "read_committed", parts),
        "orders", "g", "scheduled", True, "read_committed", "2026-01-01T00:00:00+00:00", parts, (),
        events=(Event("group_offsets_expired", "resumed from checkpoint", "orders", 1),),
    )  # fmt: skip


def write_run(root: Path, run_id: str, feed: str = "orders", *, error: str | None = None) -> tuple[Handle, Plan]:
    plan = make_plan()
    run_dir = root / "runs" / feed / run_id
    run_dir.mkdir(parents=True)
    handle = Handle(run_id, feed, plan.plan_id, str(run_dir))
    status = {"handle": {"plan_id": plan.plan_id, "mode": "scheduled", "commit": True, "records": 13},
              "planned_at": "2026-01-01T00:00:00+00:00"}  # fmt: skip
    if error:
        status |= {"error": error, "failed_at": "2026-01-01T00:01:00+00:00"}
    (run_dir / "run.json").write_text(json.dumps(status))
    validation = {
        "success": True,
        "counts": {"rows": 12, "good": 11, "quarantined": 1},
        "partitions": [{"topic": "orders", "partition": 0, "gaps": 1}, {"topic": "orders", "partition": 1, "gaps": 0}],
        "data_docs": str(run_dir / "gx" / "validations" / "page.html"),
    }
    (run_dir / "validation.json").write_text(json.dumps(validation))
    return handle, plan


def commit_result(plan: Plan) -> CommitResult:
    return CommitResult(plan.plan_id, "run-1", plan.group, "committed", plan.ends(), "2026-01-01T00:02:00+00:00",
                        "2026-01-01T00:02:01+00:00")  # fmt: skip


def test_report_holds_plan_counts_gaps_events_validation_outputs_and_commit(tmp_path: Path) -> None:
    handle, plan = write_run(tmp_path, "20260101T000000000000Z-aaaa")
    manifest = {"location": "/data/orders/plan_id=x", "records": 11, "quarantined": 1}
    job = JobResult(
        plan.plan_id, "orders", published=True, manifest=manifest,
        records_read=12, records_published=11, records_quarantined=1,
        events=gap_events([RangeStats("orders", 0, 10, 20, 9, 10, 19, 1, None, None, 90, "")]),
        started_at="2026-01-01T00:01:00", finished_at="2026-01-01T00:01:30",
    )  # fmt: skip

    report = build_report(handle=handle, plan=plan, job=job, commit=commit_result(plan))
    path = save_report(report, Path(handle.run_dir))

    assert path == Path(handle.run_dir) / "report.json"
    doc = json.loads(path.read_text())
    assert doc["plan_id"] == plan.plan_id and doc["status"] == "succeeded" and doc["group"] == "g"
    assert [(r["topic"], r["partition"], r["start"], r["end"]) for r in doc["ranges"]] == [
        ("orders", 0, 10, 20),
        ("orders", 1, 5, 8),
    ]
    assert doc["counts"] == {"planned": 13, "read": 12, "published": 11, "rows": 12, "good": 11, "quarantined": 1}
    assert doc["gaps"] == {"orders[0]": 1, "orders[1]": 0}
    assert [e["source"] for e in doc["events"]] == ["plan", "job"]
    assert doc["events"][1]["message"].startswith("orders[0] offsets [10, 20): 1 of 10 offsets hold no record")
    assert doc["data_docs"].endswith("page.html")
    assert doc["outputs"] == {"manifest": manifest}
    assert doc["commit"]["status"] == "committed"
    assert doc["commit"]["offsets"] == [
        {"topic": "orders", "partition": 0, "offset": 20},
        {"topic": "orders", "partition": 1, "offset": 8},
    ]
    assert {"planned_at", "started_at", "committed_at", "finished_at"} <= set(doc["timestamps"])
    assert doc["timestamps"]["started_at"] == "2026-01-01T00:01:00"
    assert load_report(handle.run_id, root=tmp_path) == RunReport.model_validate(doc)


def test_skipped_commit_is_reported(tmp_path: Path) -> None:
    handle, plan = write_run(tmp_path, "r1")
    report = build_report(handle=handle, plan=plan, job=None, skipped_reason="mode replay does not commit unless asked")
    assert report.commit == {"status": "skipped", "reason": "mode replay does not commit unless asked"}


def test_no_credential_ever_reaches_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEMARK_KAFKA_SSL_KEY_PASSWORD", "env-secret-value")
    conn = KafkaConnection("b:9092", {"sasl.username": "svc", "sasl.password": SECRET, "security.protocol": "SASL_SSL"})
    handle, plan = write_run(tmp_path, "r2")
    job = JobResult(plan.plan_id, "orders", error=f"auth failed with sasl.password={SECRET} and env-secret-value",
                    events=[{"message": SECRET}])  # fmt: skip

    report = build_report(handle=handle, plan=plan, job=job, connection=conn)
    text = save_report(report, Path(handle.run_dir), connection=conn).read_text()

    assert SECRET not in text and "env-secret-value" not in text
    doc = json.loads(text)
    assert doc["connection"] == {"bootstrap.servers": "b:9092", "sasl.username": "svc", "sasl.password": "***",
                                 "security.protocol": "SASL_SSL"}  # fmt: skip
    assert doc["status"] == "failed" and "sasl.password=***" in doc["error"]


def test_redact_walks_nested_values() -> None:
    assert redact({"a": [f"x{SECRET}y", {"b": SECRET}], "n": 3}, {SECRET}) == {"a": ["x***y", {"b": "***"}], "n": 3}
    assert secret_values(KafkaConnection("b", {"sasl.password": "ab"}), environ={}) == set()  # too short to scrub


def test_list_runs_newest_first_including_runs_that_failed_before_reporting(tmp_path: Path) -> None:
    for run_id in ("20260101T000000000000Z-a", "20260102T000000000000Z-b"):
        handle, plan = write_run(tmp_path, run_id)
        save_report(build_report(handle=handle, plan=plan, job=None, commit=commit_result(plan)), Path(handle.run_dir))
    write_run(tmp_path, "20260103T000000000000Z-c", error="the Spark job failed: validation failed")

    runs = list_runs("orders", root=tmp_path)

    assert [r.run_id for r in runs] == [
        "20260103T000000000000Z-c",
        "20260102T000000000000Z-b",
        "20260101T000000000000Z-a",
    ]
    assert [r.status for r in runs] == ["failed", "succeeded", "succeeded"]
    assert runs[0].error == "the Spark job failed: validation failed"
    assert runs[0].counts == {"planned": 13}
    assert [r.run_id for r in list_runs("orders", limit=1, root=tmp_path)] == ["20260103T000000000000Z-c"]
    assert list_runs("nothing", root=tmp_path) == []


def test_load_report_errors_name_the_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no run 'missing'"):
        load_report("missing", root=tmp_path)
    write_run(tmp_path, "same", feed="a")
    write_run(tmp_path, "same", feed="b")
    with pytest.raises(ConfigError, match=r"several feeds \(a, b\)"):
        load_report("same", root=tmp_path)
    assert load_report("same", "b", root=tmp_path).feed == "b"


def test_cli_runs_and_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TIDEMARK_STATE_DIR", str(tmp_path))
    handle, plan = write_run(tmp_path, "20260101T000000000000Z-a")
    save_report(build_report(handle=handle, plan=plan, job=None, commit=commit_result(plan)), Path(handle.run_dir))

    assert main(["runs", "orders"]) == 0
    out = capsys.readouterr().out
    assert "20260101T000000000000Z-a" in out and "succeeded" in out and "committed" in out and plan.plan_id in out

    assert main(["report", "20260101T000000000000Z-a"]) == 0
    assert json.loads(capsys.readouterr().out)["plan_id"] == plan.plan_id

    assert main(["report", "nope"]) == 2
    assert "no run 'nope'" in capsys.readouterr().err


def test_lag_in_time_at_plan_is_the_age_of_the_oldest_record_read_and_zero_where_nothing_was_left(
    tmp_path: Path,
) -> None:
    parts = (
        PartitionPlan("orders", 0, 1, 10, None, 0, 20, 20, 10, 20, "committed"),
        PartitionPlan("orders", 1, 2, 8, None, 0, 8, 8, 8, 8, "committed"),  # nothing left to read
        PartitionPlan("orders", 2, 2, 3, None, 0, 9, 9, 3, 9, "committed"),  # the job said nothing about it
    )
    plan = Plan(compute_plan_id("orders", "g", "scheduled", "read_committed", parts),
                "orders", "g", "scheduled", True, "read_committed", "2026-01-01T00:00:00+00:00", parts, ())  # fmt: skip
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    planned_ms = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    read = RangeStats("orders", 0, 10, 20, 10, 10, 19, 0, planned_ms - 90_500, planned_ms - 1, 90, "")
    job = JobResult(plan.plan_id, "orders", ranges=[read.to_dict()], records_read=10, records_published=9,
                    records_quarantined=1, timings_s={"read": 1.5})  # fmt: skip
    handle = Handle("run-1", "orders", plan.plan_id, str(run_dir))

    report = build_report(handle=handle, plan=plan, job=job, timestamps={"planned_at": "2026-01-01T00:00:00+00:00"})

    assert report.lag_ms_at_plan() == {("orders", 0): 90_500, ("orders", 1): 0}
    assert {k: report.counts[k] for k in ("read", "published", "quarantined")} == {"read": 10, "published": 9,
                                                                                     "quarantined": 1}  # fmt: skip
    assert report.timings_s == {"read": 1.5}
    again = RunReport.model_validate_json(report.model_dump_json())  # as the view and the metrics read it back
    assert again.lag_ms_at_plan() == report.lag_ms_at_plan()
