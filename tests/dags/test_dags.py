"""DAG integrity: the DAG folder imports cleanly and every DAG follows the team rules."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dagbag(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    os.environ.setdefault("AIRFLOW_HOME", str(tmp_path_factory.mktemp("airflow")))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"))


def test_dags_import_without_errors(dagbag) -> None:  # type: ignore[no-untyped-def]
    assert dagbag.import_errors == {}


def test_one_dag_per_feed_plus_backfill_and_replay(dagbag) -> None:  # type: ignore[no-untyped-def]
    from tidemark.config.models import load_feeds

    expected = {f"tidemark_{name.replace('.', '_')}" for name in load_feeds()} | {
        "tidemark_backfill",
        "tidemark_replay",
        "tidemark_redrive",
    }
    assert set(dagbag.dag_ids) == expected


def test_team_rules(dagbag) -> None:  # type: ignore[no-untyped-def]
    for dag_id, dag in dagbag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"
        assert "tidemark" in dag.tags
        for t in dag.tasks:
            assert t.owner == "data-platform", f"{dag_id}.{t.task_id} owner"
            assert t.retries >= 1, f"{dag_id}.{t.task_id} has no retries"


def test_commit_is_the_last_task(dagbag) -> None:  # type: ignore[no-untyped-def]
    for dag_id, dag in dagbag.dags.items():
        ids = {t.task_id for t in dag.tasks}
        if dag_id == "tidemark_redrive":  # publishes dead letters into the feed's output: no group to commit
            assert ids == {"redrive"}
            continue
        commit = dag.get_task("commit")
        if "feed" in dag.tags:  # a feed's DAG ends with its read-only audit, after the commit
            assert ids == {"plan", "read_validate_publish", "commit", "verify"}, dag_id
            assert commit.downstream_task_ids == {"verify"}, dag_id
            assert dag.get_task("verify").downstream_task_ids == set(), dag_id
        else:
            assert ids == {"plan", "read_validate_publish", "commit"}, dag_id
            assert commit.downstream_task_ids == set(), dag_id
        assert "read_validate_publish" in commit.upstream_task_ids, dag_id


def test_feed_dags_never_overlap_and_ui_dags_have_forms(dagbag) -> None:  # type: ignore[no-untyped-def]
    for dag_id, dag in dagbag.dags.items():
        if dag_id in ("tidemark_backfill", "tidemark_replay"):
            assert type(dag.timetable).__name__ == "NullTimetable"  # triggered by people only
            assert {"feed", "commit", "window_mode", "max_skew"} <= set(dag.params.keys())
        else:
            assert dag.max_active_runs == 1, dag_id


def test_trigger_forms_take_exactly_the_declared_request_parameters(dagbag) -> None:  # type: ignore[no-untyped-def]
    """The replay DAG's Params are the names the request parser, the view and the CLI use."""
    from tidemark.planning.requests import COMMIT_PARAMS, REPLAY_PARAMS, SELECTION_PARAMS, WINDOW_PARAMS

    assert set(dagbag.dags["tidemark_replay"].params) == {"feed", *REPLAY_PARAMS}
    backfill = {"feed", "start_timestamp", "end_timestamp", *COMMIT_PARAMS, *WINDOW_PARAMS, *SELECTION_PARAMS}
    assert set(dagbag.dags["tidemark_backfill"].params) == backfill
    from tidemark.web.app import REDRIVE_KEYS  # the view's re-drive form sends exactly these (and the feed)

    assert set(dagbag.dags["tidemark_redrive"].params) == {"feed", *REDRIVE_KEYS}


def test_dag_files_do_not_import_heavy_libraries_at_top_level() -> None:
    for path in (ROOT / "dags").glob("*.py"):
        text = path.read_text()
        for banned in ("import pyspark", "from pyspark", "import confluent_kafka", "from confluent_kafka"):
            assert banned not in text, f"{path.name} imports {banned}"


def test_feed_dags_publish_their_output_as_an_asset(dagbag) -> None:  # type: ignore[no-untyped-def]
    from tidemark.config.models import load_feeds

    feeds = {f"tidemark_{name.replace('.', '_')}": feed for name, feed in load_feeds().items()}
    for dag_id, dag in dagbag.dags.items():
        if dag_id == "tidemark_redrive":  # one DAG for every feed: it names its feed per run, so no static outlet
            assert not dag.get_task("redrive").outlets
            continue
        outlets = dag.get_task("commit").outlets
        if dag_id in feeds:  # published and committed: downstream DAGs can be scheduled on it
            [asset] = outlets
            assert asset.name == f"tidemark_{feeds[dag_id].name}"
            assert asset.uri == feeds[dag_id].output_dir().resolve().as_uri()  # a local output: file://
        else:  # backfills and replays publish elsewhere, on request: no asset event
            assert not outlets, dag_id


def test_a_feed_publishing_to_object_storage_gets_its_dag_and_asset(tmp_path: Path) -> None:
    """An s3:// output (no local folder) must not break the DAG file: its asset is the URL."""
    import yaml

    from tidemark.orchestration.dags import all_dags

    (tmp_path / "lake.yaml").write_text(
        yaml.safe_dump({"topics": ["orders"], "group": "g", "output": "s3://lake/orders"})
    )
    dags = all_dags(tmp_path)
    [asset] = dags["tidemark_lake"].get_task("commit").outlets
    assert (asset.name, asset.uri) == ("tidemark_lake", "s3://lake/orders")


def feed_folder_dagbag(folder: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Tidemark's DAG folder parsed by Airflow's DagBag with ``folder`` as the feeds folder."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path_factory.mktemp("airflow")))
    monkeypatch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    monkeypatch.setenv("TIDEMARK_FEEDS_DIR", str(folder))
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"))


BAD_FEED_FILES = {
    "malformed-yaml": ("topics: [orders\ngroup: g-bad\n", "not valid YAML"),
    "invalid-by-model": ("topics: [orders]\ngroup: g-bad\nmax_records_per_run: many\n", "field 'max_records_per_run'"),
    "unknown-field": ("topcs: [orders]\ngroup: g-bad\n", "field 'topcs'"),
}


@pytest.mark.parametrize("case", BAD_FEED_FILES)
def test_a_bad_feed_file_stops_only_its_own_dag_and_is_an_import_error_naming_file_and_field(
    case: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    text, expected = BAD_FEED_FILES[case]
    (tmp_path / "good.yaml").write_text(f"topics: [orders]\ngroup: g-good\noutput: {tmp_path / 'out'}\n")
    (tmp_path / "bad.yaml").write_text(text)

    dagbag = feed_folder_dagbag(tmp_path, tmp_path_factory, monkeypatch)

    assert set(dagbag.dag_ids) == {"tidemark_good", "tidemark_backfill", "tidemark_replay", "tidemark_redrive"}
    assert dagbag.dags["tidemark_replay"].params.get_param("feed").schema["enum"] == ["good"]
    [(path, error)] = dagbag.import_errors.items()
    assert path.endswith("tidemark_feed_errors.py")
    assert str(tmp_path / "bad.yaml") in error and expected in error
    assert "'tidemark_bad'" in error and "every other feed loads" in error
    assert str(tmp_path / "good.yaml") not in error


def test_feeds_with_colliding_dag_ids_leave_the_others_loading_and_give_an_import_error_naming_both_files(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("orders.v1", "orders_v1", "replay", "good"):
        (tmp_path / f"{name}.yaml").write_text(f"topics: [orders]\ngroup: g-{name}\noutput: {tmp_path / name}\n")

    dagbag = feed_folder_dagbag(tmp_path, tmp_path_factory, monkeypatch)

    # Neither colliding feed loads (nothing says which one is meant), nor does the replay DAG yield to a feed.
    assert set(dagbag.dag_ids) == {"tidemark_good", "tidemark_backfill", "tidemark_replay", "tidemark_redrive"}
    assert dagbag.dags["tidemark_replay"].params.get_param("feed").schema["enum"] == ["good"]
    [(path, error)] = dagbag.import_errors.items()
    assert path.endswith("tidemark_feed_errors.py")
    assert str(tmp_path / "orders.v1.yaml") in error and str(tmp_path / "orders_v1.yaml") in error
    assert "'tidemark_orders_v1'" in error
    assert str(tmp_path / "replay.yaml") in error and "'tidemark_replay'" in error


def test_feeds_whose_paths_overlap_load_no_dag_and_give_an_import_error_naming_both_files(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A feed whose output lies inside another feed's Iceberg table: maintenance of one would delete the other's
    files. Neither loads (nothing says which one owns the place); the others do."""
    monkeypatch.setenv("TIDEMARK_STATE_DIR", str(tmp_path / "state"))
    lake = tmp_path / "lake"
    (tmp_path / "orders.yaml").write_text(f"topics: [orders]\ngroup: g-orders\noutput: {lake / 'orders'}\n"
                                          "output_format: iceberg\n")  # fmt: skip
    (tmp_path / "eu.yaml").write_text(f"topics: [orders]\ngroup: g-eu\noutput: {lake / 'orders' / 'eu'}\n")
    (tmp_path / "good.yaml").write_text(f"topics: [orders]\ngroup: g-good\noutput: {lake / 'orders2'}\n")

    dagbag = feed_folder_dagbag(tmp_path, tmp_path_factory, monkeypatch)

    assert set(dagbag.dag_ids) == {"tidemark_good", "tidemark_backfill", "tidemark_replay", "tidemark_redrive"}
    [(path, error)] = dagbag.import_errors.items()
    assert path.endswith("tidemark_feed_errors.py")
    assert f"feed file {tmp_path / 'eu.yaml'} and feed file {tmp_path / 'orders.yaml'} overlap" in error
    assert (
        f"output {lake / 'orders'} of 'orders'" in error and "'tidemark_eu'" in error and "'tidemark_orders'" in error
    )
    assert str(tmp_path / "good.yaml") not in error


def test_a_folder_of_good_feed_files_has_no_import_error(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "good.yaml").write_text(f"topics: [orders]\ngroup: g-good\noutput: {tmp_path / 'out'}\n")

    dagbag = feed_folder_dagbag(tmp_path, tmp_path_factory, monkeypatch)

    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == {"tidemark_good", "tidemark_backfill", "tidemark_replay", "tidemark_redrive"}


def test_a_feed_with_alerts_checks_them_after_the_commit(tmp_path: Path) -> None:
    from tidemark.config.models import Alerts, Feed
    from tidemark.orchestration.dags import feed_dag

    dag = feed_dag(Feed(name="al", topics=("t",), group="g", output=str(tmp_path), alerts=Alerts(max_lag="30m")))

    assert {t.task_id for t in dag.tasks} == {"plan", "read_validate_publish", "commit", "check", "verify"}
    assert dag.get_task("commit").downstream_task_ids == {"check", "verify"}  # neither gates the commit
    assert dag.get_task("check").downstream_task_ids == set()


@pytest.mark.parametrize(
    ("key", "setting", "verified"),
    [(True, None, True), (False, None, False), (True, "0", False), (True, "off", False), (True, "1", True)],
)
def test_the_verify_task_follows_the_feed_key_and_the_deployment_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: bool, setting: str | None, verified: bool
) -> None:
    from tidemark.config.models import Feed
    from tidemark.orchestration.dags import VERIFY_ENV, feed_dag

    if setting is None:
        monkeypatch.delenv(VERIFY_ENV, raising=False)
    else:
        monkeypatch.setenv(VERIFY_ENV, setting)
    dag = feed_dag(Feed(name="v", topics=("t",), group="g", output=str(tmp_path), verify=key))

    assert ("verify" in {t.task_id for t in dag.tasks}) is verified
    assert dag.get_task("commit").downstream_task_ids == ({"verify"} if verified else set())


def test_the_watchdog_dag_exists_when_a_feed_sets_stale_after(tmp_path: Path) -> None:
    from tidemark.orchestration.dags import all_dags

    feeds = tmp_path / "feeds"
    feeds.mkdir()
    (feeds / "calm.yaml").write_text(f"topics: [t]\ngroup: g1\noutput: {tmp_path / 'calm'}\n")
    assert "tidemark_watchdog" not in all_dags(feeds)
    watched = f"topics: [t]\ngroup: g2\noutput: {tmp_path / 'w'}\nalerts: {{stale_after: 6h}}\n"
    (feeds / "watched.yaml").write_text(watched)

    watchdog = all_dags(feeds)["tidemark_watchdog"]

    assert [t.task_id for t in watchdog.tasks] == ["stale_feeds"] and watchdog.schedule == "*/10 * * * *"


def test_an_iceberg_feed_with_maintenance_gets_a_maintenance_dag(tmp_path: Path) -> None:
    from tidemark.orchestration.dags import all_dags

    feeds = tmp_path / "feeds"
    feeds.mkdir()
    (feeds / "plain.yaml").write_text(f"topics: [t]\ngroup: g1\noutput: {tmp_path / 'p'}\noutput_format: iceberg\n")
    kept = (f"topics: [t]\ngroup: g2\noutput: {tmp_path / 'k'}\noutput_format: iceberg\n"
            "maintenance: {schedule: '6h', target_file_mb: 256}\n")  # fmt: skip
    (feeds / "kept.yaml").write_text(kept)

    dags = all_dags(feeds)

    assert "tidemark_plain.maintenance" not in dags
    maintenance = dags["tidemark_kept.maintenance"]
    assert [t.task_id for t in maintenance.tasks] == ["maintain"]
    assert "maintenance" in maintenance.tags and maintenance.max_active_runs == 1
    assert "256 MB" in (maintenance.doc_md or "")
    assert all(t.retries >= 1 and t.owner == "data-platform" for t in maintenance.tasks)
