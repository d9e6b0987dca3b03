"""Step 2 of a run: the Spark job reads exactly the plan's ranges, validates, stages the publication.

The job itself is ``spark_jobs/tidemark_job.py`` (:mod:`tidemark.job`); it writes
``job.json`` into the run dir in every case. :func:`submit` runs it with ``spark-submit``
for the CLI (the DAGs use the Spark provider with :func:`spark_submit_command`'s settings);
a plan with no records needs no Spark: :func:`run_empty` writes its ``job.json``. A job
that fails is recorded as a failed run (status and report) before the error is raised.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidemark.config.models import Feed, load_feed, package_root
from tidemark.errors import ConfigError, TidemarkError, ValidationFailedError
from tidemark.job.result import read_result, run_without_spark, write_result
from tidemark.kafka.connection import KafkaConnection
from tidemark.runs.report import record_failure
from tidemark.runs.run import Progress, Run, RunHandle, silent
from tidemark.spark.secrets import SECRETS_FILE_ENV, secrets_file, split_env
from tidemark.spark.session import (
    SUBMIT_CONF,
    avro_conf,
    driver_class_archive,
    merge_conf,
    openlineage_conf,
    s3a_jars,
    small_run_conf,
)

if TYPE_CHECKING:
    from tidemark.job.redrive_job import SubmitJob


def decodes_avro(feed: str) -> bool:
    """Whether ``feed``'s job needs ``from_avro``; a feed that does not load is the job's to report."""
    try:
        return load_feed(feed).deserialization.decodes_avro
    except ConfigError:
        return False


def spark_submit_command(
    handle: RunHandle, master: str | None = None, *, class_archive: str = "", avro: bool = False
) -> list[str]:
    """The ``spark-submit`` command of a run, for ``local[*]`` or any cluster master.

    A small run's driver gets the JVM options of :func:`~tidemark.spark.session.small_run_conf`
    (with ``class_archive``, from :func:`~tidemark.spark.session.driver_class_archive`).

    On a cluster (``spark://``, ``yarn``, ``k8s://``) the job zips the ``tidemark`` package
    and ships it to the executors itself (:func:`tidemark.job.entry.should_ship`); the connections reach
    the driver in a private file (:mod:`tidemark.spark.secrets`, never an argument here), Kafka settings
    travel inside the read's tasks, never as Spark configuration, and
    :data:`~tidemark.spark.session.SUBMIT_CONF` widens Spark's redaction to Tidemark's secret names.
    ``avro``: the feed decodes Avro (``from_avro``'s package is added).
    """
    return job_command(_run_job_path(), ["--plan", handle.plan_path, "--run-dir", handle.run_dir],
                       name=f"tidemark-{handle.feed}", records=handle.records, master=master,
                       class_archive=class_archive, avro=avro)  # fmt: skip


def _run_job_path() -> str:
    """``spark_jobs/tidemark_job.py``, or the job ``TIDEMARK_SPARK_JOB`` names."""
    return os.environ.get("TIDEMARK_SPARK_JOB", str(package_root().parent / "spark_jobs" / "tidemark_job.py"))


def redrive_job_path() -> str:
    """``spark_jobs/tidemark_redrive.py``, beside the run's job (``TIDEMARK_SPARK_JOB`` moves both)."""
    return str(Path(_run_job_path()).with_name("tidemark_redrive.py"))


def job_command(job: str, args: Sequence[str], *, name: str, records: int, master: str | None,
                class_archive: str = "", avro: bool = False) -> list[str]:  # fmt: skip
    """``spark-submit`` of ``job`` with ``args``: the settings of :func:`spark_submit_command`, for any Tidemark job."""
    spark_submit = str(Path(sys.executable).with_name("spark-submit"))
    conf = {"spark.ui.enabled": "false", "spark.pyspark.python": sys.executable, **SUBMIT_CONF}
    conf.update(small_run_conf(records, class_archive=class_archive))
    jars = s3a_jars()
    extra = merge_conf(avro_conf() if avro else {}, openlineage_conf())
    jars += [jar for jar in extra.pop("spark.jars", "").split(",") if jar]  # --jars would replace them otherwise
    conf.update(extra)
    return [
        spark_submit,
        "--master",
        master or os.environ.get("TIDEMARK_SPARK_MASTER", "local[*]"),
        "--name",
        name,
        *(["--jars", ",".join(jars)] if jars else []),
        *(arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")),
        job,
        *args,
    ]


def redrive_submitter(feed: Feed, *, master: str | None, progress: Progress = silent) -> SubmitJob:
    """The CLI's way to run a re-drive's job (:mod:`tidemark.job.redrive_job`): ``spark-submit`` with ``master``.

    As :func:`submit`: the connection variables of this process's environment reach the driver in the
    private secrets file, never on the command line; the job's log goes into its folder.
    """

    # Heavy (pyspark, through the re-check): only a re-drive needs it, not a run's CLI.
    from tidemark.job.redrive_job import LOG_FILE

    def run(folder: Path, records: int) -> None:
        def command(class_archive: str) -> list[str]:
            return job_command(redrive_job_path(), ["--work", str(folder)], name=f"tidemark-redrive-{feed.name}",
                               records=records, master=master, class_archive=class_archive,
                               avro=feed.deserialization.decodes_avro)  # fmt: skip

        cmd, proc = _spark_submit(os.environ, command, f"re-checking {records} dead letters", progress)
        (folder / LOG_FILE).write_text(shlex.join(cmd) + "\n" + proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise TidemarkError(f"spark-submit exited {proc.returncode}: {_last_error_line(proc.stderr)}")

    return run


def submit(run: Run, connection: KafkaConnection, *, master: str | None, progress: Progress = silent) -> dict[str, Any]:
    """Step 2 for the CLI: submit the Spark job and wait for it; its ``job.json`` as a dict.

    The connections (Kafka's, the registry's, the object store's and the Iceberg catalog's variables) reach
    the driver through a private file (:mod:`tidemark.spark.secrets`): spark-submit's command line and
    environment hold only its path.
    """
    handle = run.handle
    started = time.monotonic()

    def command(class_archive: str) -> list[str]:
        return spark_submit_command(handle, master, class_archive=class_archive,
                                    avro=run.feed.deserialization.decodes_avro)  # fmt: skip

    _, proc = _spark_submit({**os.environ, **connection.to_env()}, command, f"reading {handle.records} records",
                            progress)  # fmt: skip
    log = run.dir / "spark-submit.log"
    log.write_text(proc.stdout + proc.stderr)
    job = read_result(run.dir)
    if proc.returncode != 0:
        reason = (job.error if job is not None else None) or _last_error_line(proc.stderr)
        record_failure(handle, run.plan, job, reason, connection)
        raise TidemarkError(
            f"the Spark job for plan {handle.plan_id} failed (exit {proc.returncode}): {reason}\n"
            f"full log: {log}. Offsets were not committed; rerun to retry the same plan."
        )
    if job is None:
        raise TidemarkError(f"the Spark job exited 0 but wrote no {handle.run_dir}/job.json; see {log}")
    progress(f"read, validated and published in {time.monotonic() - started:.1f}s")
    return job.to_dict()


def run_empty(run: Run, connection: KafkaConnection, progress: Progress = silent) -> dict[str, Any]:
    """Step 2 for a plan with no records: no Spark application; ``job.json`` says so.

    Raises :class:`~tidemark.errors.ValidationFailedError` (after recording the failed
    run) when the feed expects records. The DAGs call this instead of submitting Spark.
    """
    result = run_without_spark(run.plan, run.feed)
    write_result(run.handle.run_dir, result)
    if result.error is not None:
        record_failure(run.handle, run.plan, result, result.error, connection)
        raise ValidationFailedError(result.error)
    progress(f"nothing to read in plan {run.plan.plan_id}: no Spark application started")
    return result.to_dict()


def _spark_submit(
    environ: Mapping[str, str], command: Callable[[str], list[str]], doing: str, progress: Progress
) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    """Run the ``spark-submit`` that ``command`` builds (given the driver's class archive option) and wait for it.

    The connection variables of ``environ`` reach the driver in the private secrets file
    (:mod:`tidemark.spark.secrets`): spark-submit's command line and environment hold only its
    path. A local master stays on loopback. ``doing`` says what the job does, for ``progress``.
    """
    env, connections = split_env({**environ, "PYSPARK_PYTHON": sys.executable})
    with driver_class_archive() as class_archive, secrets_file(connections) as path:
        if path:
            env[SECRETS_FILE_ENV] = path
        cmd = command(class_archive.option)
        if cmd[2].startswith("local"):
            env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # keep a local job on loopback
        progress(f"{doing} with Spark ({cmd[2]})")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        class_archive.succeeded = proc.returncode == 0
    return cmd, proc


def _last_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if "Error" in ln or "error" in ln]
    return lines[-1].strip() if lines else "see the log"
