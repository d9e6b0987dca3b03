"""Lag-triggered feed DAGs: scheduled on their lag Asset (and their cron), the watcher's trigger carrying no secret."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def feeds(tmp_path: Path, **files: str) -> Path:
    folder = tmp_path / "feeds"
    folder.mkdir()
    for name, text in files.items():
        (folder / f"{name}.yaml").write_text(f"topics: [orders]\ngroup: g-{name}\noutput: {tmp_path / name}\n{text}")
    return folder


def test_a_lag_feed_is_scheduled_on_its_lag_asset_watched_by_the_trigger(tmp_path: Path) -> None:
    from airflow.sdk import Asset

    from tidemark.orchestration.dags import all_dags
    from tidemark.orchestration.lag_trigger import LagTrigger

    dag = all_dags(feeds(tmp_path, burst="trigger: {lag_records: 500, oldest_unread_age: 10m}\n"))["tidemark_burst"]

    assert dag.max_active_runs == 1
    [asset] = (
        dag.timetable.asset_condition.objects
        if hasattr(dag.timetable.asset_condition, "objects")
        else [dag.timetable.asset_condition]
    )
    assert isinstance(asset, Asset) and asset.name == "tidemark_lag_burst"
    [watcher] = asset.watchers
    trigger = watcher.trigger
    assert isinstance(trigger, LagTrigger)
    classpath, kwargs = trigger.serialize()
    assert classpath == "tidemark.orchestration.lag_trigger.LagTrigger"
    assert kwargs == {
        "feed": "burst", "topics": ["orders"], "group": "g-burst", "isolation": "read_committed",
        "on_missing": "earliest", "lag_records": 500, "oldest_unread_age_ms": 600_000, "min_interval_s": 60.0,
        "check_every_s": 30.0, "kafka_conn_id": "tidemark_kafka", "topic_pattern": None,
    }  # fmt: skip
    # What the trigger row keeps: plain values, the connection's id only (resolved in the triggerer).
    assert "password" not in json.dumps(kwargs) and "sasl" not in json.dumps(kwargs)
    # The feed's output Asset is still what its commit emits; the lag Asset is only its schedule.
    [outlet] = dag.get_task("commit").outlets
    assert outlet.name == "tidemark_burst"


def test_a_lag_feed_with_a_cron_runs_on_either(tmp_path: Path) -> None:
    from airflow.sdk import AssetOrTimeSchedule

    from tidemark.orchestration.dags import all_dags

    folder = feeds(tmp_path, both="schedule: '*/15 * * * *'\ntrigger: {lag_records: 5}\n", cron="schedule: '@hourly'\n")
    dags = all_dags(folder)

    assert isinstance(dags["tidemark_both"].timetable, AssetOrTimeSchedule)
    assert dags["tidemark_both"].timetable.timetable.expression == "*/15 * * * *"
    assert dags["tidemark_cron"].schedule == "@hourly"  # no trigger: as before


def test_building_the_dags_never_calls_kafka(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The DAG file stays cheap to parse: the probe is only built when the triggerer runs the trigger."""
    from tidemark.orchestration import lag
    from tidemark.orchestration.dags import all_dags

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("a Kafka client was built while parsing DAGs")

    monkeypatch.setattr(lag.LagProbe, "__init__", refuse)
    monkeypatch.setattr(lag, "KafkaAdapter", refuse)
    assert "tidemark_lazy" in all_dags(feeds(tmp_path, lazy="trigger: {lag_records: 1}\n"))


def test_a_pattern_feeds_dag_names_its_pattern_and_its_trigger_carries_it(tmp_path: Path) -> None:
    from tidemark.orchestration.dags import all_dags

    folder = tmp_path / "feeds"
    folder.mkdir()
    (folder / "orders.yaml").write_text(
        "topics: {pattern: 'orders\\..*', exclude: ['orders\\.dlq']}\ngroup: g\n"
        f"output: {tmp_path / 'out'}\ntrigger: {{lag_records: 5}}\n"
    )
    dag = all_dags(folder)["tidemark_orders"]

    assert dag.description == "Scheduled consumption of pattern 'orders\\..*' (excluding 'orders\\.dlq') for group g"
    [asset] = dag.timetable.asset_condition.objects
    [watcher] = asset.watchers
    _, kwargs = watcher.trigger.serialize()
    assert kwargs["topics"] == [] and kwargs["topic_pattern"] == {"pattern": "orders\\..*", "exclude": ["orders\\.dlq"]}
