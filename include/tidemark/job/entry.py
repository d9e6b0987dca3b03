"""The job's ``spark-submit`` program: arguments, the session, shipping the package, ``job.json`` in every case.

``spark_jobs/tidemark_job.py`` is the thin entry point around :func:`main`, which loads the
plan and the feed, starts (or joins) the Spark session, ships the ``tidemark`` package to
executors that lack it, runs :func:`tidemark.job.steps.run`, and writes ``job.json``
(:mod:`tidemark.job.result`) whatever happens, uploading the run folder when the run dir is
on an object store. It exits non-zero on any failure, so nothing downstream commits.
Nothing here imports Airflow or commits offsets.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import traceback
import zipfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import tidemark
from tidemark.config.models import load_feed, load_feeds
from tidemark.errors import TidemarkError
from tidemark.job import steps
from tidemark.job.result import JOB_FILE, JobResult, write_result
from tidemark.job.steps import Timer, preload_great_expectations, run
from tidemark.kafka.connection import from_env
from tidemark.output.base import check_replay_output
from tidemark.planning.plan import Plan
from tidemark.planning.requests import output_roots
from tidemark.spark.secrets import load_secrets
from tidemark.spark.session import local_session
from tidemark.storage import Location

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SHIP_ENV = "TIDEMARK_SHIP_PACKAGE"


def _steps_doc() -> str:
    """The job's one-line description, as its steps module states it."""
    return (steps.__doc__ or "").splitlines()[0]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tidemark_job", description=_steps_doc())
    parser.add_argument("--plan", required=True, help="path of the saved plan JSON")
    parser.add_argument("--feed", help="feed name or YAML path (default: the plan's feed)")
    parser.add_argument("--run-dir", required=True, help="folder for job.json, validation output and logs")
    parser.add_argument("--output", help="override the feed's output location")
    parser.add_argument(
        "--ship-package",
        action="store_true",
        default=_ship_setting(os.environ.get(SHIP_ENV, "")),
        help=(
            "zip the tidemark package and add it to the executors' Python path; by default only when "
            f"the master is not local[...] ({SHIP_ENV}=1 always, {SHIP_ENV}=0 never)"
        ),
    )
    return parser.parse_args(argv)


def session(app_name: str, *, avro: bool = False) -> SparkSession:
    """The spark-submit session when there is one, else a local session (with ``from_avro`` when ``avro``)."""
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # started by spark-submit: its master and conf apply
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.appName(app_name).config("spark.sql.session.timeZone", "UTC").getOrCreate()
        return spark
    return local_session(app_name, avro=avro)


def _ship_setting(value: str) -> bool | None:
    """``TIDEMARK_SHIP_PACKAGE``: unset means decide by the master (None)."""
    value = value.strip().lower()
    if not value:
        return None
    return value not in ("0", "false", "no")


def should_ship(master: str, requested: bool | None) -> bool:
    """Ship the package to executors when asked, else whenever the master is not ``local[...]``.

    A local master's executors are threads of the driver's JVM whose Python workers share
    the driver's interpreter and path; a cluster's executors run wherever its workers do.
    """
    return requested if requested is not None else not master.startswith("local")


# Subpackages no executor imports: the layers above the job (import-linter checks that the
# job and everything below never import them) and the local stand-ins.
NOT_SHIPPED = frozenset({"cli", "devtools", "orchestration", "web"})


def package_zip(folder: Path) -> Path:
    """``folder/tidemark.zip``: the ``tidemark`` package as executors import it, without :data:`NOT_SHIPPED`."""
    root = Path(tidemark.__file__).resolve().parent
    target = folder / "tidemark.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(root.rglob("*")):
            inside = path.relative_to(root)
            if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            if len(inside.parts) > 1 and inside.parts[0] in NOT_SHIPPED:
                continue
            zf.write(path, str(Path("tidemark") / inside))
    return target


def ship_package(spark: SparkSession) -> Path:
    """Zip the ``tidemark`` package (:func:`package_zip`) and ``addPyFile`` it, for executors that lack it."""
    target = package_zip(Path(tempfile.mkdtemp(prefix="tidemark-pkg-")))
    spark.sparkContext.addPyFile(str(target))
    return target


def _package_origin(_: object) -> str:
    """Run on an executor: where its Python imported ``tidemark`` from."""
    return str(tidemark.__file__)


def executor_package_origin(spark: SparkSession) -> str:
    """Where an executor's Python imports ``tidemark`` from (one one-record task)."""
    origin: str = spark.sparkContext.parallelize([0], 1).map(_package_origin).collect()[0]
    return origin


def root_cause(exc: BaseException) -> tuple[str, str]:
    """The Tidemark error behind ``exc`` when a Spark task raised one, else ``exc`` itself."""
    if isinstance(exc, TidemarkError):
        return type(exc).__name__, str(exc)
    text = str(exc)
    for line in text.splitlines():
        if line.startswith("tidemark.errors."):
            name, _, message = line[len("tidemark.errors.") :].partition(": ")
            return name, message.strip()
    return type(exc).__name__, text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def upload_run_dir(local: Path, target: Location) -> bool:
    """Copy the job's local run folder to the state location, with local paths rewritten to URLs."""
    for name in (JOB_FILE, "validation.json"):
        path = local / name
        if path.exists():
            path.write_text(path.read_text().replace(str(local), target.url))
    try:
        target.upload_tree(local)
    except TidemarkError as exc:
        print(f"tidemark job: could not upload its run folder to {target}: {exc}", file=sys.stderr)
        return False
    shutil.rmtree(local, ignore_errors=True)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job; 0 on success, 1 on any failure (with ``job.json`` saying why)."""
    args = parse_args(argv)
    target = Location.of(args.run_dir)
    # On an object store the job works in a local folder and uploads it at the end
    # (job.json, validation.json, the Data Docs), wherever this driver runs.
    run_dir = target.local_path() if target.is_local else Path(tempfile.mkdtemp(prefix="tidemark-run-"))
    result = JobResult(plan_id="?", feed=args.feed or "?")
    spark = None
    try:
        load_secrets()  # the connections, handed over in a private file (tidemark.spark.secrets), first
        plan = Plan.from_json(Location.of(args.plan).read_text())
        result.plan_id, result.feed = plan.plan_id, plan.feed
        feed = load_feed(args.feed or plan.feed)
        result.feed = feed.name
        if plan.output:  # checked at planning; again where the records are written, symlinks followed here
            roots = output_roots([feed.output_for(plan.mode)])
            check_replay_output(Location.of(plan.output), {**load_feeds(), feed.name: feed}, roots)
        connection = from_env()
        if plan.total_records:  # while the JVM starts the session, the main thread mostly waits
            preload_great_expectations()
        spark = Timer(result).step(
            "spark_session", lambda: session(f"tidemark-{feed.name}", avro=feed.deserialization.decodes_avro)
        )
        if should_ship(spark.sparkContext.master, args.ship_package):
            ship_package(spark)
            result.spark["executor_package"] = executor_package_origin(spark)
        run(spark, plan, feed, connection, run_dir, output_dir=args.output or None, result=result, run_id=target.name)
    except Exception as exc:  # noqa: BLE001 - every failure must end as job.json + non-zero exit
        result.error_type, result.error = root_cause(exc)
        result.published = False
        print(f"tidemark job failed: {result.error_type}: {result.error}", file=sys.stderr)
        if not isinstance(exc, TidemarkError):
            traceback.print_exc()
    finally:
        result.finished_at = datetime.now(UTC).isoformat()
        write_result(run_dir, result)
        if not target.is_local and not upload_run_dir(run_dir, target):
            result.published = False
    status = "published" if result.published else "failed"
    print(f"tidemark job {status}: plan {result.plan_id}, {result.records_read} records read, "
          f"{result.records_published} published, {result.records_quarantined} quarantined")  # fmt: skip
    return 0 if result.published else 1
