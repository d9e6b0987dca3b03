"""Airflow DAG factories: one DAG per feed, a backfill DAG, a replay DAG and a re-drive DAG.

Every feed, backfill and replay DAG has the same three steps: ``plan`` (a task that finishes any published but
uncommitted plan, then plans and saves the run's plan), ``read_validate_publish`` (the
Spark job, submitted through the Spark provider so that ``local[*]`` becomes a cluster
by changing the ``tidemark_spark`` connection) and ``commit`` (the only place offsets
move). Kafka settings come from the ``tidemark_kafka`` connection (the Kafka provider's
connection type: librdkafka keys in its extra) and reach the Spark job as environment
variables set at execution time, so they never appear in rendered templates, XCom,
plans or reports. Only this module and ``dags/`` import Airflow.

Task bodies import the parts of Tidemark they run inside the function: the DAG processor
parses every feed's DAG file again and again, and a parse needs only the feed files and
Airflow; the Kafka client, the stores and the run's steps load on the worker that runs the
task (``tests/unit/test_layers.py`` checks that parsing loads no pyspark).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import (
    DAG,
    Asset,
    AssetOrTimeSchedule,
    AssetWatcher,
    BaseHook,
    CronTriggerTimetable,
    DeltaTriggerTimetable,
    Param,
    get_current_context,
    task,
)
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from tidemark.checkpoints.store import CheckpointStore
from tidemark.config.durations import schedule_interval
from tidemark.config.masking import MASKING_KEY_ENV
from tidemark.config.models import Feed, dag_id, load_feed, package_root, scan_feeds
from tidemark.errors import ConfigError, OffsetsMovedError, PlanningError, ValidationFailedError
from tidemark.kafka.connection import is_secret
from tidemark.kafka.registry import RegistryConnection
from tidemark.kafka.registry import from_env as registry_from_env
from tidemark.orchestration.connections import KAFKA_CONN_ID, kafka_connection
from tidemark.orchestration.lag_trigger import LagTrigger
from tidemark.planning.plan import Plan
from tidemark.planning.requests import (
    END_CHOICES,
    MAX_OFFSET,
    MAX_PARTITION,
    OUTPUT_ROOTS_ENV,
    START_CHOICES,
    run_request,
)

log = logging.getLogger(__name__)
_T = TypeVar("_T")
SPARK_CONN_ID = os.environ.get("TIDEMARK_SPARK_CONN_ID", "tidemark_spark")
CHECKPOINT_CONN_ID = os.environ.get("TIDEMARK_CHECKPOINT_CONN_ID", "tidemark_checkpoints")
STORAGE_CONN_ID = os.environ.get("TIDEMARK_STORAGE_CONN_ID", "tidemark_storage")
ICEBERG_CONN_ID = os.environ.get("TIDEMARK_ICEBERG_CONN_ID", "tidemark_iceberg")
REGISTRY_CONN_ID = os.environ.get("TIDEMARK_SCHEMA_REGISTRY_CONN_ID", "tidemark_schema_registry")
MASKING_CONN_ID = os.environ.get("TIDEMARK_MASKING_CONN_ID", "tidemark_masking")
START_DATE = datetime(2026, 1, 1, tzinfo=UTC)
WATCHDOG_SCHEDULE = os.environ.get("TIDEMARK_WATCHDOG_SCHEDULE", "*/10 * * * *")
DEFAULT_ARGS: dict[str, Any] = {
    "owner": "data-platform",
    "retries": 2,
    "retry_delay": timedelta(minutes=2),
}


def spark_job_path() -> str:
    return os.environ.get("TIDEMARK_SPARK_JOB", str(package_root().parent / "spark_jobs" / "tidemark_job.py"))


def checkpoint_store(conn_id: str = CHECKPOINT_CONN_ID) -> CheckpointStore | None:
    """The shared checkpoint store from an Airflow connection of type postgres, if one is defined.

    ``None`` means "not configured in Airflow": the pipeline then uses
    ``TIDEMARK_CHECKPOINT_URL``, else SQLite under the state dir (one machine only).
    """
    from tidemark.checkpoints.store import open_store

    url = _postgres_url(conn_id, "the checkpoint store", "postgresql")
    return None if url is None else open_store(url)


def _postgres_url(conn_id: str, needed_by: str, drivername: str) -> str | None:
    """The SQLAlchemy URL (password included) of an Airflow connection of type postgres; ``None`` if undefined."""
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception:  # noqa: BLE001 - any lookup failure means "not configured in Airflow"
        return None
    if conn.conn_type not in ("postgres", "postgresql"):
        raise ConfigError(
            f"Airflow connection '{conn_id}' has type '{conn.conn_type}'; {needed_by} needs type postgres"
        )
    from sqlalchemy.engine import URL

    url = URL.create(
        drivername, username=conn.login or None, password=conn.password or None, host=conn.host or None,
        port=conn.port or None, database=conn.schema or None,
    )  # fmt: skip
    rendered = url.render_as_string(hide_password=False)
    _mask_url(rendered)
    return rendered


def _mask_url(url: str) -> None:
    """Register ``url`` and its password as written in it (percent-encoded, which Airflow's masker, knowing
    only the connection's raw password, misses) with the secrets masker."""
    from airflow.sdk.log import mask_secret

    netloc = urlsplit(url).netloc
    if "@" not in netloc or ":" not in netloc.rpartition("@")[0]:
        return
    written = netloc.rpartition("@")[0].partition(":")[2]
    for value in (url, written, unquote(written)):
        if len(value) >= 3:
            mask_secret(value)


def registry_env(conn_id: str = REGISTRY_CONN_ID) -> dict[str, str]:
    """The schema registry from an Airflow connection (type http: host = the registry's URL, login, password),
    as the variables :mod:`tidemark.kafka.registry` reads. Empty when no such connection exists (the
    environment then applies)."""
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception:  # noqa: BLE001 - any lookup failure means "not configured in Airflow"
        return {}
    url = str(conn.host or "").strip()
    if not url:
        raise ConfigError(f"Airflow connection '{conn_id}' has no host: give the schema registry's URL there")
    if "://" not in url:
        url = f"{conn.schema or 'http'}://{url}" + (f":{conn.port}" if conn.port else "")
    _mask_url(url)  # credentials written into the host field
    return RegistryConnection(url.rstrip("/"), conn.login or None, conn.password or None).to_env()


def masking_env(conn_id: str = MASKING_CONN_ID) -> dict[str, str]:
    """The HMAC key of masked feeds' ``hash`` treatments from an Airflow connection (its password), as
    ``TIDEMARK_MASKING_KEY`` (:mod:`tidemark.spark.masking`); registered with the secrets masker. Empty when no
    such connection exists (the environment then applies)."""
    from airflow.sdk.log import mask_secret

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception:  # noqa: BLE001 - any lookup failure means "not configured in Airflow"
        return {}
    if not conn.password:
        raise ConfigError(f"Airflow connection '{conn_id}' has no password: give the masking key there")
    mask_secret(conn.password)
    return {MASKING_KEY_ENV: conn.password}


def storage_env(conn_id: str = STORAGE_CONN_ID) -> dict[str, str]:
    """Object-store settings from an Airflow connection of type ``aws``, as the variables ``tidemark.storage`` reads.

    login/password → ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``; extra ``region_name``
    → ``AWS_REGION``, ``endpoint_url`` → ``TIDEMARK_S3_ENDPOINT``, ``aws_session_token`` →
    ``AWS_SESSION_TOKEN``. Empty when no such connection exists (the environment then applies).
    """
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception:  # noqa: BLE001 - any lookup failure means "not configured in Airflow"
        return {}
    if conn.conn_type != "aws":
        raise ConfigError(f"Airflow connection '{conn_id}' has type '{conn.conn_type}'; object storage needs type aws")
    extra = conn.extra_dejson
    pairs = {
        "AWS_ACCESS_KEY_ID": conn.login, "AWS_SECRET_ACCESS_KEY": conn.password,
        "AWS_SESSION_TOKEN": extra.get("aws_session_token"), "AWS_REGION": extra.get("region_name"),
        "TIDEMARK_S3_ENDPOINT": extra.get("endpoint_url"),
    }  # fmt: skip
    return {k: str(v) for k, v in pairs.items() if v}


def iceberg_env(conn_id: str = ICEBERG_CONN_ID) -> dict[str, str]:
    """The Iceberg catalog from an Airflow connection of type postgres, as ``TIDEMARK_ICEBERG_CATALOG_URI``.

    Empty when no such connection exists (the environment, else SQLite in the state dir, applies).
    """
    from tidemark.output.iceberg import CATALOG_URI_ENV

    url = _postgres_url(conn_id, "the Iceberg catalog", "postgresql+psycopg")
    return {} if url is None else {CATALOG_URI_ENV: url}


@contextmanager
def _storage_settings() -> Iterator[None]:
    """The storage and Iceberg catalog connections' variables in this task's environment while it runs."""
    with _environ({**storage_env(), **iceberg_env()}):
        yield


@contextmanager
def _environ(settings: Mapping[str, str | None]) -> Iterator[None]:
    """``settings`` in this process's environment for the block (``None``: unset), then as they were."""
    saved = {k: os.environ.get(k) for k in settings}
    for key, value in settings.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def airflow_auth() -> list[Any]:
    """FastAPI dependencies that let only authenticated Airflow users read Tidemark's pages.

    Airflow mounts plugin apps with no auth of their own. These are Airflow's own checks:
    the user comes from the ``Authorization: Bearer`` header or the UI's ``_token``
    cookie (anonymous → 401), and must be allowed to see plugin views (else → 403). The
    user is kept on the request for the per-feed checks (:mod:`tidemark.orchestration.access`).
    """
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from airflow.api_fastapi.core_api.security import requires_access_view
    from fastapi import Depends

    from tidemark.orchestration.access import remember_user

    return [Depends(requires_access_view(AccessView.PLUGINS)), remember_user()]


def airflow_trigger_auth(dag: str = "tidemark_replay") -> list[Any]:
    """FastAPI dependencies for the view's replay trigger: the user may create runs of the replay DAG (or ``dag``:
    ``tidemark_redrive`` for the re-drive form).

    The same check Airflow's own ``POST /api/v2/dags/{dag_id}/dagRuns`` makes, here so that
    a viewer gets a 403 from the view itself (the forwarded REST call would refuse too).
    """
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag
    from fastapi import Depends

    return [Depends(requires_access_dag("POST", DagAccessEntity.RUN, param_dag_id=dag))]


def airflow_api_base() -> str | None:
    """Airflow's ``[api] base_url`` (where its REST API is reached), or ``None`` when not configured."""
    from airflow.configuration import conf

    base = conf.get("api", "base_url", fallback=None)
    return str(base) if base else None


def feed_asset(feed: Feed) -> Asset:
    """The Airflow Asset a feed publishes: its output location; downstream DAGs schedule on it.

    Emitted by the feed DAG's commit task (the run's data is published and its offsets
    committed), with the plan id and record count in the event's extra.
    """
    return Asset(name=f"tidemark_{feed.name}", uri=output_uri(feed), group="tidemark")


def lag_asset(feed: Feed) -> Asset:
    """The Asset a lag-triggered feed's DAG is scheduled on, watched by its :class:`LagTrigger` in the triggerer.

    Building it costs nothing at parse time: the trigger only keeps the feed's plain values
    and the Kafka connection's id; it looks Kafka up once the triggerer runs it.
    """
    name = f"tidemark_lag_{feed.name}"
    watcher = AssetWatcher(name=name, trigger=LagTrigger.for_feed(feed, KAFKA_CONN_ID))
    return Asset(name=name, uri=f"x-tidemark-lag://{feed.name}", group="tidemark", watchers=[watcher])


def feed_schedule(feed: Feed) -> Any:
    """A feed DAG's schedule: its ``schedule`` alone; with ``trigger:`` its lag Asset, or both (either one runs it)."""
    if feed.trigger is None:
        return feed.schedule
    asset = lag_asset(feed)
    if feed.schedule is None:
        return [asset]
    timetable: Any
    if feed.schedule.startswith("@") or " " in feed.schedule.strip():
        timetable = CronTriggerTimetable(feed.schedule, timezone="UTC")
    else:  # "6h"-style
        timetable = DeltaTriggerTimetable(feed.interval)
    return AssetOrTimeSchedule(timetable=timetable, assets=asset)


def output_uri(feed: Feed) -> str:
    """The feed's output as a URI: ``file://`` for a local folder, the URL itself for an object store."""
    where = feed.output_location()
    return where.local_path().resolve().as_uri() if where.is_local else where.url


@contextmanager
def job_secrets(own: Mapping[str, str]) -> Iterator[None]:
    """For a ``spark-submit`` in this block: the connections its driver needs, ``own`` and the Airflow connections'.

    Read at execution, so the values never reach the rendered-fields table. They reach the driver
    through a private file whose path alone is in spark-submit's environment: never as env_vars,
    which the provider turns into --conf arguments (and logs) on YARN and Kubernetes. Connection
    variables of the worker's own environment go the same way, out of spark-submit's for the while.
    """
    from tidemark.spark.secrets import SECRETS_FILE_ENV, secrets_file, split_env

    inherited = split_env(os.environ)[1]
    secrets_env = {**inherited, **own, **storage_env(), **iceberg_env(), **registry_env(), **masking_env()}
    with (
        secrets_file(secrets_env) as path,
        _environ({**dict.fromkeys(inherited), **({SECRETS_FILE_ENV: path} if path else {})}),
    ):
        yield


class TidemarkSparkSubmitOperator(SparkSubmitOperator):  # type: ignore[misc]
    """SparkSubmitOperator that hands the Kafka connection to the job at execution time."""

    template_fields = (*SparkSubmitOperator.template_fields, "lineage")

    def __init__(
        self,
        *,
        kafka_conn_id: str = KAFKA_CONN_ID,
        lineage: str = "{{ ti.xcom_pull(task_ids='plan', key='lineage') | tojson }}",
        **kwargs: Any,
    ) -> None:
        from tidemark.spark.session import SUBMIT_CONF

        # Same as the CLI's spark-submit: Tidemark's secret names redacted. The package is
        # shipped by the job itself whenever the connection's master is not local[...].
        kwargs["conf"] = {**SUBMIT_CONF, **(kwargs.get("conf") or {})}
        super().__init__(**kwargs)
        self.kafka_conn_id = kafka_conn_id
        self.lineage = lineage

    def conf_for_run(self, records: int, class_archive: str = "") -> dict[str, Any]:
        """The Spark settings of a run of ``records``: a small run's driver JVM options, as ``tidemark run``.

        Known only once the plan exists (at execution), so added here; the DAG's own
        ``conf`` wins where it sets the same key.
        """
        from tidemark.spark.session import small_run_conf

        own = dict(self.conf or {})
        if own.get("spark.driver.extraClassPath") or self.driver_class_path:
            class_archive = ""  # folders may be on it; see driver_class_archive
        return {**small_run_conf(records, class_archive=class_archive), **own}

    def conf_for_feed(self, feed: str) -> dict[str, str]:
        """``from_avro`` for an Avro feed and OpenLineage's Spark listener when turned on.

        Nothing when the DAG's own ``packages`` or ``jars`` are set: spark-submit's
        ``--packages``/``--jars`` would replace these jars, so those must name them.
        """
        from tidemark.runs.pipeline import decodes_avro
        from tidemark.spark.session import avro_conf, merge_conf, openlineage_conf

        if self.packages or self.jars:
            return {}
        return merge_conf(avro_conf() if decodes_avro(feed) else {}, openlineage_conf())

    def execute(self, context: Any) -> None:
        from tidemark.runs.pipeline import RunHandle, run_empty

        handle = RunHandle.from_xcom(context["ti"].xcom_pull(task_ids="plan"))
        if handle.dry_run:
            raise AirflowSkipException(
                f"dry run: plan {handle.plan_id} ({handle.records} records) is only planned, nothing is read; "
                "the plan is in the plan task's log and in the run's report"
            )
        if handle.records == 0:
            # Nothing to read: no Spark application. job.json records the (empty) result;
            # the commit task still runs and re-commits the idle partitions.
            with _storage_settings():
                _no_retry_for_refusals(
                    lambda: run_empty(handle, kafka_connection(self.kafka_conn_id), progress=log.info)
                )
            raise AirflowSkipException(
                f"plan {handle.plan_id} has no records to read: Spark was not started; "
                "the commit task re-commits the group's offsets"
            )
        from tidemark.spark.secrets import split_env
        from tidemark.spark.session import driver_class_archive, merge_conf

        own_env, own_connections = split_env(dict(getattr(self, "env_vars", None) or {}))
        self.env_vars = own_env  # the DAG's other variables, which the provider passes on as it does
        self._hook = None  # rebuilt with the conf below
        with (
            driver_class_archive() as class_archive,
            job_secrets({**own_connections, **kafka_connection(self.kafka_conn_id).to_env()}),
        ):
            run_conf = self.conf_for_run(handle.records, class_archive.option)
            self.conf = merge_conf(self.conf_for_feed(handle.feed), run_conf)
            # The provider adds the parent job ([openlineage] spark_inject_parent_job_info) to this conf.
            super().execute(context)  # raises when spark-submit fails
            class_archive.succeeded = True

    def _get_hook(self) -> Any:
        # [openlineage] spark_inject_transport_info puts an HTTP transport's API key into the conf, and the
        # hook logs the spark-submit command: the task log shows such values masked, as a connection's password.
        from airflow.sdk.log import mask_secret

        # The same for a DAG's own env_vars with secret names, which the provider turns into --conf arguments.
        for key, value in {**(self.conf or {}), **(getattr(self, "env_vars", None) or {})}.items():
            if value and is_secret(str(key)):
                mask_secret(str(value))
        return super()._get_hook()

    # OpenLineage (the provider's DefaultExtractor calls these): the datasets the plan task described
    # (tidemark.orchestration.lineage), rendered into ``lineage`` before the START event.
    def get_openlineage_facets_on_start(self) -> Any:
        from tidemark.orchestration.lineage import operator_lineage

        return operator_lineage(json.loads(self.lineage or "null") or {})

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return self.get_openlineage_facets_on_start()


# Refusals that a retry cannot change: bad feed files or trigger parameters, data loss
# under policy fail, offsets moved by someone else. They fail the task at once instead
# of waiting out the retries; broker hiccups and a group in use still retry.
PERMANENT_ERRORS: tuple[type[Exception], ...] = (
    ConfigError, PlanningError, OffsetsMovedError, ValidationFailedError,
)  # fmt: skip


def _no_retry_for_refusals(call: Callable[[], _T]) -> _T:
    try:
        return call()
    except PERMANENT_ERRORS as exc:
        raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc


def team_of(feed_name: str) -> str | None:
    """The ``team`` of the feed's file; ``None`` when it names none or does not load (the run then stops at its
    own load of the feed, before reading anything)."""
    try:
        return load_feed(feed_name).team
    except ConfigError:
        return None


@task(task_id="plan")
def plan_step(feed_name: str, mode: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Finish any pending commit of the feed, then plan this run and save the plan.

    A backfill or replay first checks that the user who triggered it may replay (and, to
    commit, run) the feed it names: those DAGs serve every feed.
    """
    from tidemark.orchestration import metrics
    from tidemark.orchestration.access import refuse_unless_allowed
    from tidemark.runs.pipeline import Run, start_run

    if mode != "scheduled":
        user = get_current_context()["dag_run"].triggering_user_name
        _no_retry_for_refusals(
            lambda: refuse_unless_allowed(feed_name, mode, dict(params or {}), user, team_of(feed_name))
        )

    def plan() -> Run:
        request = run_request(mode, dict(params or {}))  # refused before the feed is loaded
        return start_run(load_feed(feed_name), kafka_connection(), request, progress=log.info,
                         checkpoints=checkpoint_store(), registry=registry_from_env(registry_env()))  # fmt: skip

    with _storage_settings():
        run = _no_retry_for_refusals(plan)
        _record_airflow_run(run.handle.run_dir)
        if mode == "scheduled":
            metrics.started(feed_name, _record_cause(run.handle.run_dir))
        metrics.planned(run.plan)
        _describe_lineage(run.feed, run.plan)
    return run.handle.to_xcom()


def _describe_lineage(feed: Feed, plan: Plan) -> None:
    """The run's datasets for the Spark task's OpenLineage events (see TidemarkSparkSubmitOperator)."""
    from tidemark.orchestration.lineage import describe

    doc = describe(feed, plan, kafka_connection().bootstrap_servers)
    get_current_context()["ti"].xcom_push(key="lineage", value=doc)


def _record_airflow_run(run_dir: str) -> None:
    """Name the Airflow DAG run beside Tidemark's run, so the Tidemark view can link to it."""
    from tidemark.storage import Location

    ctx = get_current_context()
    doc = {"dag_id": ctx["ti"].dag_id, "dag_run_id": ctx["dag_run"].run_id}
    (Location.of(run_dir) / "airflow.json").write_text(json.dumps(doc))


def _record_cause(run_dir: str) -> str:
    """Write why this feed run started beside the run (``trigger.json``) and in the log; return the cause.

    ``lag``: the feed's lag trigger fired (the asset event's payload: the lag and overdue
    partitions it saw, the rule's reason); ``schedule``: its cron; ``manual``: a person.
    """
    from tidemark.orchestration.lag import record_cause

    ctx = get_current_context()
    kind = getattr(ctx["dag_run"], "run_type", "") or ""
    run_type = str(getattr(kind, "value", kind))  # asset_triggered, scheduled, manual
    fired = []
    for events in (ctx.get("triggering_asset_events") or {}).values():
        for event in events:
            payload = (getattr(event, "extra", None) or {}).get("payload")
            if isinstance(payload, dict) and "lag_records" in payload:
                fired.append(payload)
    cause = "lag" if fired else ("manual" if "manual" in run_type else "schedule")
    record_cause(run_dir, cause, fired, run_type)
    log.info("run started by %s%s", cause, f": {fired[-1].get('reason')}" if fired else "")
    return cause


# none_failed: the commit also runs after the Spark task skipped an empty plan.
@task(task_id="commit", trigger_rule="none_failed")
def commit_step(handle: dict[str, Any]) -> dict[str, Any]:
    """Commit the plan's ends for the group (when the run asks for it) and write the report."""
    from tidemark.orchestration import metrics
    from tidemark.runs.pipeline import RunHandle, commit_run

    def commit() -> dict[str, Any]:
        try:
            return commit_run(
                RunHandle.from_xcom(handle), kafka_connection(), progress=log.info, checkpoints=checkpoint_store()
            ).to_xcom()
        except OffsetsMovedError:
            metrics.commit_refused(handle["feed"])
            raise

    with _storage_settings():
        outcome = _no_retry_for_refusals(commit)
        metrics.finished(handle["feed"], handle["run_dir"], outcome["report_path"], committed=outcome["committed"])
    ctx = get_current_context()
    for outlet in ctx["task"].outlets or []:  # feed DAGs: the feed's Asset (see feed_asset)
        ctx["outlet_events"][outlet].extra = {
            "plan_id": outcome["plan_id"], "run_id": outcome["run_id"], "records": handle["records"],
        }  # fmt: skip
    return outcome


@task(task_id="check")
def check_step(handle: dict[str, Any], outcome: dict[str, Any]) -> None:
    """Apply the feed's ``alerts`` after the commit: its lag in time, and its run's data-loss and expiry events.

    A broken rule fails this task (not the commit: the run's data and offsets stand), so the
    deployment's failure callbacks and notifiers fire; a ``warn`` policy only logs.
    """
    from tidemark.checkpoints.store import open_store
    from tidemark.config.models import load_feed
    from tidemark.kafka.adapter import KafkaAdapter
    from tidemark.orchestration import metrics
    from tidemark.runs.alerts import check_alerts
    from tidemark.runs.status import feed_status
    from tidemark.storage import Location

    feed = load_feed(handle["feed"])
    with _storage_settings():
        status = feed_status(
            feed, KafkaAdapter(kafka_connection()), checkpoint_store() or open_store(), lag_times=True
        )  # fmt: skip
        report = json.loads(Location.of(outcome["report_path"]).read_text())
    metrics.lagging(status)
    found = check_alerts(feed, status, report.get("events") or [])
    for warning in found.warnings:
        log.warning("alert (warn): %s", warning)
    if found.failures:
        raise AirflowFailException("; ".join(found.failures))


@task(task_id="verify")
def verify_step(handle: dict[str, Any], outcome: dict[str, Any]) -> None:
    """Audit the run's plan after the commit (``tidemark verify FEED --plan ID``, docs/verify.md): read-only.

    Scoped to the plan: Kafka and the output are read in its ranges only, so a run costs what it read (the whole
    feed is ``tidemark verify FEED``'s, on a schedule of its own).

    Findings fail this task, not the commit: the run's data and offsets stand, nothing is
    touched, and the deployment's failure callbacks fire. Each finding is logged with its
    topic, partition and offsets or its file.
    """
    from tidemark.runs.verify import show_spans, verify_feed

    with _storage_settings():
        report = verify_feed(handle["feed"], connection=kafka_connection(), checkpoints=checkpoint_store(),
                             progress=log.info, plan=handle["plan_id"])  # fmt: skip
    for note in report.notes:
        log.info("verify: %s", note)
    # A file owned by nothing is what a crashed attempt left (an upload before its commit, a killed worker's
    # staging) until maintenance or the next settle removes it: logged, not failed; `tidemark verify` lists it.
    failing = [f for f in report.findings if f.kind != "unowned_file"]
    for f in report.findings:
        where = f.path if f.path else f"{f.topic}[{f.partition}] offsets {show_spans(f.offsets)}"
        (log.error if f in failing else log.warning)("verify: %s: %s: %s", f.kind, where, f.message)
    log.info("verify: %s records read from Kafka, %s in the output, %.1f s", report.kafka_records,
             report.output_records, report.seconds)  # fmt: skip
    if failing:
        raise AirflowFailException(
            f"tidemark verify found {len(failing)} findings in feed '{handle['feed']}' (see the log); the "
            "run's commit and output are untouched"
        )


@task(task_id="stale_feeds")
def stale_step() -> None:
    """Fail naming every feed whose last committed run is older than its ``alerts.stale_after``."""
    from tidemark.orchestration import metrics
    from tidemark.runs.alerts import last_commit_at, stale_feeds

    # Every feed that loads: a bad feed file (an import error of its own) must not stop watching the others.
    feeds = [f for f in scan_feeds().feeds.values() if f.alerts is not None and f.alerts.stale_after]
    # The present, not the DAG run's logical time: a watchdog run that starts late must not understate an age.
    now = datetime.now(UTC)
    with _storage_settings():
        last = {f.name: last_commit_at(f.name) for f in feeds}
    metrics.commit_ages(last, now)
    found = stale_feeds(feeds, last, now)
    if found:  # a retry cannot make a feed fresh: fail at once, so notifiers fire now
        raise AirflowFailException("; ".join(found))
    log.info("every feed with alerts.stale_after committed a run recently enough: %s", sorted(last))


def watchdog_dag() -> DAG:
    """Checks on a schedule of its own whether feeds stopped committing: their own DAGs cannot say so when paused."""
    with DAG(
        dag_id=dag_id("watchdog"),
        description="Fails naming every feed whose last committed run is older than its alerts.stale_after",
        doc_md=(
            "Every 10 minutes, reads each feed's newest committed run (feeds that set `alerts.stale_after`) and "
            "fails naming the feeds whose last commit is older than that, so the deployment's failure callbacks "
            "and notifiers fire: a paused feed DAG, runs that keep failing, or runs no longer scheduled. It also "
            "sends `tidemark.last_commit_age_seconds` per feed. It runs in the same scheduler: a stopped "
            "scheduler stops it too (watch Airflow's own `scheduler_heartbeat` metric for that)."
        ),
        schedule=WATCHDOG_SCHEDULE,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args=DEFAULT_ARGS,
        tags=["tidemark", "watchdog"],
    ) as dag:
        stale_step()
    return dag


@task(task_id="maintain")
def maintain_step(feed_name: str) -> dict[str, Any]:
    """Compact the feed's table, expire its snapshots, remove its orphan files; the record goes to the run history.

    Safe beside the feed's own runs: each commit is a compare-and-set, retried on the table
    as another writer left it (:mod:`tidemark.output.maintenance`).
    """
    from tidemark.output.maintenance import maintain

    with _storage_settings():
        report = _no_retry_for_refusals(lambda: maintain(load_feed(feed_name)))
    log.info("maintenance of %s: %s", report.table, report.summary())
    for note in report.notes:
        log.warning("maintenance of %s: %s", report.table, note)
    return report.to_dict()


def maintenance_dag_id(feed: Feed) -> str:
    """``tidemark_<feed>.maintenance``: a feed's DAG id has no dot, so no feed's DAG can take this id."""
    return f"{dag_id(feed.name)}.maintenance"


def _maintenance_schedule(schedule: str) -> Any:
    """A cron or preset as Airflow takes it; ``6h``-style as a timetable of that interval."""
    if schedule.startswith("@") or " " in schedule.strip():
        return schedule
    return DeltaTriggerTimetable(schedule_interval(schedule))


def maintenance_dag(feed: Feed) -> DAG:
    """The maintenance DAG of an Iceberg feed with a ``maintenance:`` section, on that section's schedule."""
    assert feed.maintenance is not None
    m = feed.maintenance
    with DAG(
        dag_id=maintenance_dag_id(feed),
        description=f"Table maintenance of {feed.iceberg_table} (feed {feed.name})",
        doc_md=(
            f"Compacts the Iceberg table `{feed.iceberg_table}` (partitions with at least {m.min_input_files} files "
            f"under 3/4 of {m.target_file_mb} MB are rewritten into files near {m.target_file_mb} MB), expires "
            f"snapshots older than {m.snapshot_max_age} (keeping the newest {m.keep_snapshots}) and removes files "
            f"nothing references, older than {m.orphan_min_age}. Each commit is a compare-and-set retried on the "
            "table as the feed's runs left it; the feed's guarantees live in the table's ledger property, which "
            "maintenance keeps. The record shows on the feed's page in the Tidemark view."
        ),
        schedule=_maintenance_schedule(m.schedule),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args=DEFAULT_ARGS,
        tags=["tidemark", "maintenance", feed.name],
    ) as dag:
        maintain_step(feed.name)
    return dag


def _pipeline(
    feed_name: str, mode: str, outlets: list[Asset] | None = None, *, alerts: bool = False, verify: bool = False
) -> None:
    # feed_name may be a template ("{{ params.feed }}"): TaskFlow arguments are rendered.
    planned = plan_step(feed_name, mode)
    job = TidemarkSparkSubmitOperator(
        task_id="read_validate_publish",
        application=spark_job_path(),
        conn_id=SPARK_CONN_ID,
        name="tidemark",
        application_args=[
            "--plan",
            "{{ ti.xcom_pull(task_ids='plan')['plan_path'] }}",
            "--run-dir",
            "{{ ti.xcom_pull(task_ids='plan')['run_dir'] }}",
        ],
    )
    committed = commit_step.override(outlets=outlets or [])(planned)
    planned >> job >> committed
    if alerts:  # feed DAGs whose feed sets alerts
        check_step(planned, committed)
    if verify:  # feed DAGs, unless the feed or the deployment turns it off (verifies)
        verify_step(planned, committed)


VERIFY_ENV = "TIDEMARK_DAG_VERIFY"  # "0": no feed DAG ends with the verify task


def verifies(feed: Feed) -> bool:
    """Whether ``feed``'s DAG ends with ``verify``: the feed's ``verify`` key and the deployment's setting."""
    return feed.verify and os.environ.get(VERIFY_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _trigger_doc(feed: Feed) -> str:
    if feed.trigger is None:
        return ""
    t = feed.trigger
    limits = [f"lag >= {t.lag_records} records"] if t.lag_records else []
    limits += [f"an unread record older than {t.oldest_unread_age}"] if t.oldest_unread_age else []
    return (
        f" Also runs when its lag trigger (the Asset `tidemark_lag_{feed.name}`, checked every {t.check_every} in "
        f"the triggerer) sees {' or '.join(limits)}, at most once per {t.min_interval}; the run's `plan` task logs why."
    )


def feed_dag(feed: Feed) -> DAG:
    with DAG(
        dag_id=dag_id(feed.name),
        description=f"Scheduled consumption of {feed.topics_label} for group {feed.group}",
        doc_md=(
            f"Reads what group `{feed.group}` has not read yet from {feed.topics_label}, validates it, "
            "publishes it and then commits the group's offsets. Failures before the commit leave offsets unchanged. "
            f"Each successful run emits an event on the Asset `tidemark_{feed.name}` (its output): schedule "
            "downstream DAGs on it." + _trigger_doc(feed)
        ),
        schedule=feed_schedule(feed),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,  # one run of a feed at a time: runs of one group must not overlap
        default_args=DEFAULT_ARGS,
        tags=["tidemark", "feed", feed.name],
    ) as dag:
        _pipeline(feed.name, "scheduled", outlets=[feed_asset(feed)], alerts=feed.alerts is not None,
                  verify=verifies(feed))  # fmt: skip
    return dag


def _feed_param(feeds: Mapping[str, Feed]) -> Param:
    names = sorted(feeds)
    return Param(names[0] if names else "", type="string", enum=names, title="Feed", description="The feed to read")


def _window_params() -> dict[str, Param]:
    """Form fields for timestamp bounds: exact windows (default) or Kafka's offset cut."""
    return {
        "window_mode": Param(
            None, type=["null", "string"], enum=[None, "exact", "offset_cut"], title="Time window mode",
            values_display={"exact": "Exact: only records stamped inside the window",
                             "offset_cut": "Offset cut: first offset at/after start to first at/after end"},
            description="Empty: the feed's time_windows.mode (exact unless set)", section="Time window",
        ),
        "max_skew": Param(
            None, type=["null", "string"], title="Timestamp skew bound", section="Time window",
            description="Exact windows: how far a record's timestamp may lag behind an earlier one's "
            "(30s, 10m, PT10M). Empty: the feed's time_windows.max_skew (10m unless set)",
        ),
    }  # fmt: skip


def _commit_params() -> dict[str, Param]:
    """Form fields for moving the group: a committing run is the feed's next run (``planning.committing``)."""
    return {
        "commit": Param(False, type="boolean", title="Commit the group's offsets afterwards",
                        description="Publishes to the feed's own output and must start at the committed offsets"),
        "allow_gap": Param(False, type="boolean", title="Allow skipping offsets (commit only)",
                           description="A committing run starting past the committed offsets skips those records; "
                           "refused unless set, and then each skipped range is an event"),
    }  # fmt: skip


def _selection_params(mode: str, dry_run_default: bool) -> dict[str, Param]:
    """Form fields choosing partitions, where the run publishes, and whether it only plans."""
    return {
        "topics": Param(None, type=["null", "array"], items={"type": "string"}, title="Topics",
                        description="Empty: every topic of the feed", section="Scope"),
        "partitions": Param(None, type=["null", "array"],
                            items={"type": "integer", "minimum": 0, "maximum": MAX_PARTITION},
                            title="Partitions", description="Empty: every partition", section="Scope"),
        "output": Param(None, type=["null", "string"], title="Output location", section="Scope",
                        description=f"Empty: the feed's {mode} location beside its output (never the output itself; "
                        "a committing run publishes to the feed's output); otherwise a place under it or under "
                        f"{OUTPUT_ROOTS_ENV}"),
        "dry_run": Param(dry_run_default, type="boolean", title="Dry run (plan only, read nothing)"),
    }  # fmt: skip


def _triggered_dag(mode: str, description: str, doc_md: str, params: dict[str, Param]) -> DAG:
    """A DAG that people trigger from the UI form (no schedule), running one pipeline."""
    with DAG(
        dag_id=dag_id(mode),
        description=description,
        doc_md=doc_md,
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        default_args=DEFAULT_ARGS,
        tags=["tidemark", mode],
        params=params,
    ) as dag:
        _pipeline("{{ params.feed }}", mode)
    return dag


def backfill_dag(feeds: Mapping[str, Feed]) -> DAG:
    return _triggered_dag(
        "backfill",
        "Read a feed's records between two timestamps",
        "Reads every record of the feed's topics whose timestamp is in `[start, end)`. Exact windows (the "
        "default) read past the end by the skew bound and keep exactly the records stamped inside the window, "
        "counting the ones dropped; `offset_cut` reads from the first offset at or after `start` to the first "
        "at or after `end`. Does not move the group's offsets unless `commit` is set; a committing backfill "
        "publishes to the feed's output, must start at the committed offsets (or set `allow_gap`) and reports "
        "the records it drops outside the window as events.",
        {
            "feed": _feed_param(feeds),
            "start_timestamp": Param(type="string", format="date-time", title="Window start (inclusive)"),
            "end_timestamp": Param(type="string", format="date-time", title="Window end (exclusive)"),
            **_commit_params(),
            **_window_params(),
            **_selection_params("backfill", dry_run_default=False),
        },
    )


def replay_dag(feeds: Mapping[str, Feed]) -> DAG:
    return _triggered_dag(
        "replay",
        "Re-read a feed from any start to any end",
        "Manual replay: choose where to start and end, which topics and partitions, and where to publish "
        "(default: the feed's replay location beside its output). A dry run (the default) only plans: the "
        "ranges are in the plan task's log and the run's report, nothing is read. Offsets move only if `commit` "
        "is set; a committing replay publishes to the feed's output and must start at the committed offsets "
        "(or set `allow_gap`); a rewind is refused.",
        {
            "feed": _feed_param(feeds),
            "start_from": Param(
                "committed",
                type="string",
                enum=list(START_CHOICES),
                values_display={
                    "committed": "Group's committed offset",
                    "earliest": "Earliest retained offset",
                    "latest": "Latest offset (read nothing old)",
                    "timestamp": "First offset at/after a timestamp",
                    "offset": "An explicit offset (every partition)",
                    "shift_by": "Committed offset shifted by N records",
                    "by_duration": "First offset at/after now minus a duration",
                },
                title="Start from",
                section="Start",
            ),
            "start_timestamp": Param(None, type=["null", "string"], format="date-time", section="Start"),
            "start_offset": Param(None, type=["null", "integer"], minimum=0, maximum=MAX_OFFSET, section="Start"),
            "shift_by": Param(
                None,
                type=["null", "integer"],
                minimum=-MAX_OFFSET,
                maximum=MAX_OFFSET,
                section="Start",
                description="Negative rewinds",
            ),
            "duration": Param(None, type=["null", "string"], section="Start", description="ISO 8601, e.g. PT6H"),
            "end_at": Param("latest", type="string", enum=list(END_CHOICES), title="End at", section="End"),
            "end_timestamp": Param(None, type=["null", "string"], format="date-time", section="End"),
            "end_offset": Param(None, type=["null", "integer"], minimum=0, maximum=MAX_OFFSET, section="End"),
            **_commit_params(),
            **_window_params(),
            **_selection_params("replay", dry_run_default=True),
        },
    )


@task(task_id="redrive")
def redrive_step() -> dict[str, Any]:
    """Re-drive the feed the form names (:func:`tidemark.runs.redrive.redrive_feed`), after checking that the
    triggering user may run that feed's DAG: a re-drive publishes into the feed's output, as its own runs do.

    The re-check and the staging are ``spark-submit`` jobs on the ``tidemark_spark`` connection
    (:func:`redrive_submitter`), as a run's job; settling, choosing, showing and the report run in this task. A
    retry settles what a crashed or failed attempt left first.
    """
    from tidemark.job.redrive_job import RedriveJob
    from tidemark.orchestration.access import refuse_unless_allowed
    from tidemark.runs.redrive import redrive_feed

    ctx = get_current_context()
    params = dict(ctx["params"])
    feed_name = str(params["feed"])
    user = ctx["dag_run"].triggering_user_name
    _no_retry_for_refusals(lambda: refuse_unless_allowed(feed_name, "redrive", {"commit": True}, user,
                                                         team_of(feed_name)))  # fmt: skip
    since = datetime.fromisoformat(str(params["since"])) if params.get("since") else None
    with _storage_settings():
        job = RedriveJob(redrive_submitter(_no_retry_for_refusals(lambda: load_feed(feed_name))),
                         f"connection {SPARK_CONN_ID}")  # fmt: skip
        outcome = _no_retry_for_refusals(lambda: redrive_feed(
            job, feed_name, since=since, reason=params.get("reason") or None,
            dry_run=params.get("dry_run", True) is not False, checkpoints=checkpoint_store(),
            registry=registry_from_env(registry_env()), progress=log.info,
        ))  # fmt: skip
    for v in outcome.verdicts:
        log.info("%s[%d]@%d (plan %s): %s", v.letter.topic, v.letter.partition, v.letter.offset, v.letter.plan_id,
                 "passes" if v.passes else "; ".join(v.reason_codes))  # fmt: skip
    if outcome.error is not None:
        raise AirflowFailException(outcome.error)
    return {"run_id": outcome.run_id, "redrive_id": outcome.redrive_id, "state": outcome.state,
            "dead_letters": len(outcome.verdicts), "passing": outcome.passing,
            "published": outcome.published}  # fmt: skip


def redrive_submitter(feed: Feed, conn_id: str = SPARK_CONN_ID) -> Callable[[Path, int], None]:
    """A re-drive job's submission (:mod:`tidemark.job.redrive_job`) through the Spark provider's hook on
    ``conn_id``, with a run's job's settings: :data:`~tidemark.spark.session.SUBMIT_CONF`, ``from_avro`` for an Avro
    feed, a small run's driver options, and the connections in the private secrets file (:func:`job_secrets`)."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.sdk.log import mask_secret

    from tidemark.runs.submit import redrive_job_path
    from tidemark.spark.session import (
        SUBMIT_CONF,
        avro_conf,
        driver_class_archive,
        merge_conf,
        openlineage_conf,
        small_run_conf,
    )

    def submit(folder: Path, records: int) -> None:
        with driver_class_archive() as class_archive, job_secrets({}):
            run_conf = {**small_run_conf(records, class_archive=class_archive.option), **SUBMIT_CONF}
            feed_conf = merge_conf(avro_conf() if feed.deserialization.decodes_avro else {}, openlineage_conf())
            conf = merge_conf(feed_conf, run_conf)
            for key, value in conf.items():  # the hook logs its command: such values show masked
                if value and is_secret(str(key)):
                    mask_secret(str(value))
            hook = SparkSubmitHook(conf=conf, conn_id=conn_id, name=f"tidemark-redrive-{feed.name}",
                                   application_args=["--work", str(folder)])  # fmt: skip
            hook.submit(redrive_job_path())  # raises when spark-submit fails
            class_archive.succeeded = True

    return submit


def redrive_dag(feeds: Mapping[str, Feed]) -> DAG:
    """``tidemark_redrive``: one task, :func:`redrive_step`; triggered by the Tidemark view's form or Airflow's."""
    with DAG(
        dag_id=dag_id("redrive"),
        description="Publish a feed's dead letters that its current rules pass, once",
        doc_md="Re-checks a feed's dead letters (records its runs quarantined) with the feed's current decoding "
        "and row rules, and publishes those that now pass into the feed's output exactly once, as a run with its "
        "own report (mode `redrive`); the rest keep their new reasons. A dry run (the default) only logs the "
        "verdicts. Needs the right to run the feed's own DAG.",
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        default_args=DEFAULT_ARGS,
        max_active_runs=1,  # re-drives of one feed take turns anyway (the group's commit lock): one at a time
        tags=["tidemark", "redrive"],
        params={
            "feed": _feed_param(feeds),
            "since": Param(None, type=["null", "string"], format="date-time", title="Only records stamped since"),
            "reason": Param(None, type=["null", "string"], maxLength=300, title="Only this reason code",
                            description="decode_error, or a rule's label such as "
                            "expect_column_values_to_match_regex(value); empty: every reason"),
            "dry_run": Param(True, type="boolean", title="Dry run (list the verdicts, publish nothing)"),
        },
    ) as dag:  # fmt: skip
        redrive_step()
    return dag


def all_dags(feeds_directory: Path | None = None) -> dict[str, DAG]:
    """A DAG per feed plus backfill, replay and redrive (and the watchdog when a feed sets ``alerts.stale_after``, and a
    maintenance DAG per Iceberg feed with ``maintenance:``), by DAG id.

    Each feed file loads on its own (:func:`tidemark.config.models.scan_feeds`): a malformed,
    invalid or colliding file gets no DAG while every other feed and the built-in DAGs load;
    ``dags/tidemark_feed_errors.py`` (:func:`check_feed_files`) shows it as an import error.
    """
    feeds = scan_feeds(feeds_directory).feeds
    dags = {d.dag_id: d for d in (feed_dag(f) for f in feeds.values())}
    for extra in (backfill_dag(feeds), replay_dag(feeds), redrive_dag(feeds)):
        dags[extra.dag_id] = extra
    for feed in feeds.values():
        if feed.maintenance is not None:
            dags[maintenance_dag_id(feed)] = maintenance_dag(feed)
    if any(f.alerts is not None and f.alerts.stale_after for f in feeds.values()):
        dags[dag_id("watchdog")] = watchdog_dag()
    return dags


def check_feed_files(feeds_directory: Path | None = None) -> None:
    """Raise :class:`ConfigError` naming every feed file that gets no DAG, with its error and the remedy.

    Called by a DAG file of its own, so that Airflow lists the bad files among its import
    errors (the UI's banner, ``/api/v2/importErrors``) while :func:`all_dags`, in another
    file, loads every good feed: one team's typo stops only that team's feed.
    """
    problems = scan_feeds(feeds_directory).problems
    if problems:
        raise ConfigError(
            f"{len(problems)} feed file(s) load no DAG: " + "; ".join(dict.fromkeys(p.message for p in problems))
        )
