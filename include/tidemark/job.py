"""The Spark job's steps: read a saved plan, check, decode, validate, publish, report.

``spark_jobs/tidemark_job.py`` is the thin ``spark-submit`` entry point around
:func:`main`; the benchmark calls :func:`run` directly. Kafka is read exactly once:
the DataFrame from :func:`tidemark.source.read_plan` is persisted, the per-range
statistics are its first action, and decoding, validation and the Parquet write all
work from the cached copy.

Validation seam. If ``tidemark.validation`` defines ``validate``, the job calls
``validate(df, plan, feed, run_dir, decode_failed=..., positions=...)`` (the keyword
arguments only when its signature takes them) with ``df`` the decoded records and
``decode_failed`` the records that did not decode. It may return ``None`` (publish
``df``), a DataFrame (publish it), or an object with ``good`` and optionally
``quarantined`` DataFrames and a ``summary`` dict; it fails the run by raising. Without
that module the job applies its built-in checks (every record inside its range, no
more records than offsets) and the feed's bad-record policy to decode failures.

The job writes ``<run_dir>/job.json`` in every case: ``published`` (bool), ``error``
(on failure), the manifest, counts, timings and the per-range statistics. The
pipeline reads it before committing. Nothing here imports Airflow or commits offsets.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import sys
import tempfile
import time
import traceback
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidemark.config import Feed, load_feed
from tidemark.connection import KafkaConnection, from_env
from tidemark.errors import ConfigError, TidemarkError, ValidationFailedError
from tidemark.plan import Plan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

JOB_FILE = "job.json"
SHIP_ENV = "TIDEMARK_SHIP_PACKAGE"
VALIDATION_MODULE = "tidemark.validation"
VALIDATION_HOOK = "validate"


@dataclass
class JobResult:
    plan_id: str
    feed: str
    published: bool = False
    reused: bool = False
    error: str | None = None
    error_type: str | None = None
    manifest: dict[str, Any] | None = None
    records_read: int = 0
    records_published: int = 0
    records_quarantined: int = 0
    decode_failures: int = 0
    validation: dict[str, Any] | None = None
    validator: str = "builtin"
    ranges: list[dict[str, Any]] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    finished_at: str | None = None
    spark: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


class _Timer:
    def __init__(self, result: JobResult) -> None:
        self.result = result

    def step(self, name: str, fn: Callable[[], Any]) -> Any:
        started = time.monotonic()
        try:
            return fn()
        finally:
            self.result.timings_s[name] = round(time.monotonic() - started, 3)


def find_validator() -> Callable[..., Any] | None:
    """``tidemark.validation.validate`` if that module exists (written separately), else ``None``."""
    try:
        module = importlib.import_module(VALIDATION_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != VALIDATION_MODULE:
            raise  # the module exists but one of its imports is missing: a real error
        return None
    hook = getattr(module, VALIDATION_HOOK, None)
    return hook if callable(hook) else None


def _call_validator(
    hook: Callable[..., Any], good: DataFrame, bad: DataFrame, plan: Plan, feed: Feed, run_dir: Path
) -> tuple[DataFrame, DataFrame | None, dict[str, Any] | None]:
    params = inspect.signature(hook).parameters
    kwargs: dict[str, Any] = {}
    if "decode_failed" in params:
        kwargs["decode_failed"] = bad
    if "positions" in params:
        # The reader raises unless every range reached its end, so a finished read is at the plan's ends.
        kwargs["positions"] = plan.ends()
    outcome = hook(good, plan, feed, run_dir, **kwargs)
    if outcome is None:
        return good, None, None
    if hasattr(outcome, "good"):
        summary = getattr(outcome, "summary", None)
        if isinstance(summary, Mapping) and summary.get("success") is False:
            raise ValidationFailedError(f"validation of plan {plan.plan_id} failed: {summary.get('failure')}")
        return outcome.good, getattr(outcome, "quarantined", None), dict(summary) if summary else None
    if hasattr(outcome, "columns"):
        return outcome, None, None
    raise TypeError(f"{VALIDATION_MODULE}.{VALIDATION_HOOK} returned {type(outcome).__name__}; see tidemark.job")


def _builtin_decode_policy(feed: Feed, failures: int, total: int, bad: DataFrame, plan: Plan) -> None:
    if not failures:
        return
    policy = feed.validation
    sample = ", ".join(f"{r.topic}[{r.partition}]@{r.offset}: {r.decode_error}" for r in bad.limit(5).collect())
    if policy.on_bad_records == "fail":
        raise ValidationFailedError(
            f"plan {plan.plan_id}: {failures} of {total} records failed to decode and feed '{feed.name}' "
            f"has on_bad_records: fail (e.g. {sample})"
        )
    ratio = failures / total if total else 0.0
    if ratio > policy.quarantine_max_ratio:
        raise ValidationFailedError(
            f"plan {plan.plan_id}: {failures} of {total} records ({ratio:.2%}) failed to decode, above "
            f"quarantine_max_ratio {policy.quarantine_max_ratio:.2%} (e.g. {sample})"
        )


def run(
    spark: SparkSession,
    plan: Plan,
    feed: Feed,
    connection: KafkaConnection | None,
    run_dir: Path,
    *,
    output_dir: Path | None = None,
    use_validation: bool = True,
    result: JobResult | None = None,
) -> JobResult:
    """Read ``plan``, check, decode, validate and publish it; fill and return the result."""
    from pyspark import StorageLevel

    from tidemark.decode import decode
    from tidemark.sink import load_manifest, publish
    from tidemark.source import check_complete, range_stats, read_plan

    if plan.feed != feed.name:
        raise ConfigError(f"plan {plan.plan_id} was made for feed '{plan.feed}', not '{feed.name}'")
    res = result or JobResult(plan.plan_id, feed.name)
    res.spark = {"master": spark.sparkContext.master, "version": spark.version}
    timer = _Timer(res)
    run_dir.mkdir(parents=True, exist_ok=True)

    done = load_manifest((output_dir or feed.output_dir()).resolve(), plan.plan_id)
    if done is not None:  # published by an earlier attempt: do not read Kafka again
        res.manifest, res.reused, res.published = done.to_dict(), True, True
        res.records_published, res.records_quarantined = done.records, done.quarantined
        res.ranges = [dict(r) for r in done.ranges]
        res.records_read = sum(int(r.get("records", 0)) for r in done.ranges)
        return res

    raw = read_plan(spark, plan, connection).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        stats = timer.step("read", lambda: range_stats(raw, plan))  # the one read of Kafka
        res.ranges = [s.to_dict() for s in stats]
        res.records_read = sum(s.records for s in stats)
        problems = check_complete(stats)
        if problems:
            raise ValidationFailedError(f"built-in checks failed for plan {plan.plan_id}: " + "; ".join(problems))

        decoded = decode(raw, feed.deserialization)
        res.decode_failures = timer.step("decode", lambda: decoded.bad.count())
        hook = find_validator() if use_validation else None
        quarantine: dict[str, DataFrame] = {}
        if hook is not None:
            res.validator = f"{VALIDATION_MODULE}.{VALIDATION_HOOK}"
            good, rejected, res.validation = timer.step(
                "validate", lambda: _call_validator(hook, decoded.good, decoded.bad, plan, feed, run_dir)
            )
            if rejected is not None:
                quarantine["validation"] = rejected
        else:
            _builtin_decode_policy(feed, res.decode_failures, res.records_read, decoded.bad, plan)
            good = decoded.good
            if res.decode_failures:
                quarantine["decode"] = decoded.bad
        expected = None
        if res.validation and isinstance(res.validation.get("good_records"), int):
            expected = res.validation["good_records"]
        elif hook is None:
            expected = res.records_read - res.decode_failures
        manifest = timer.step(
            "publish",
            lambda: publish(
                good, plan, feed, quarantine=quarantine, stats=stats, output_dir=output_dir,
                expect_records=expected, extra={"validator": res.validator},
            ),
        )  # fmt: skip
    finally:
        raw.unpersist()
    res.manifest = manifest.to_dict()
    res.reused = manifest.reused
    res.records_published = manifest.records
    res.records_quarantined = manifest.quarantined
    res.published = True
    return res


# -- entry point -------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tidemark_job", description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--plan", required=True, help="path of the saved plan JSON")
    parser.add_argument("--feed", help="feed name or YAML path (default: the plan's feed)")
    parser.add_argument("--run-dir", required=True, help="folder for job.json, validation output and logs")
    parser.add_argument("--output", help="override the feed's output location")
    parser.add_argument(
        "--ship-package",
        action="store_true",
        default=os.environ.get(SHIP_ENV, "") not in ("", "0", "false"),
        help=f"zip the tidemark package and add it to the executors' Python path (or set {SHIP_ENV}=1)",
    )
    return parser.parse_args(argv)


def session(app_name: str) -> SparkSession:
    """The spark-submit session when there is one, else a local session."""
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # started by spark-submit: its master and conf apply
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.appName(app_name).config("spark.sql.session.timeZone", "UTC").getOrCreate()
        return spark
    from tidemark.spark_session import local_session

    return local_session(app_name)


def ship_package(spark: SparkSession) -> Path:
    """Zip the ``tidemark`` package and ``addPyFile`` it, for executors that lack it."""
    import tidemark

    root = Path(tidemark.__file__).resolve().parent
    target = Path(tempfile.mkdtemp(prefix="tidemark-pkg-")) / "tidemark.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                zf.write(path, str(Path("tidemark") / path.relative_to(root)))
    spark.sparkContext.addPyFile(str(target))
    return target


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


def write_result(run_dir: Path, result: JobResult) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / JOB_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result.to_dict(), indent=2, sort_keys=True, default=str))
    tmp.replace(path)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job; 0 on success, 1 on any failure (with ``job.json`` saying why)."""
    args = parse_args(argv)
    run_dir = Path(args.run_dir)
    result = JobResult(plan_id="?", feed=args.feed or "?")
    spark = None
    try:
        plan = Plan.from_json(Path(args.plan).read_text())
        result.plan_id, result.feed = plan.plan_id, plan.feed
        feed = load_feed(args.feed or plan.feed)
        result.feed = feed.name
        connection = from_env()
        spark = session(f"tidemark-{feed.name}")
        if args.ship_package:
            ship_package(spark)
        run(spark, plan, feed, connection, run_dir, output_dir=Path(args.output) if args.output else None,
            result=result)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - every failure must end as job.json + non-zero exit
        result.error_type, result.error = root_cause(exc)
        result.published = False
        print(f"tidemark job failed: {result.error_type}: {result.error}", file=sys.stderr)
        if not isinstance(exc, TidemarkError):
            traceback.print_exc()
    finally:
        result.finished_at = datetime.now(UTC).isoformat()
        write_result(run_dir, result)
    status = "published" if result.published else "failed"
    print(f"tidemark job {status}: plan {result.plan_id}, {result.records_read} records read, "
          f"{result.records_published} published, {result.records_quarantined} quarantined")  # fmt: skip
    return 0 if result.published else 1
