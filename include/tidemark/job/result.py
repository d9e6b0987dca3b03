"""The job's result, ``<run_dir>/job.json``: written and read here only, and nothing here imports Spark.

The Spark job (:mod:`tidemark.job.steps`) fills a :class:`JobResult` and writes it in every
case, published or failed (:func:`write_result`); the run's later steps
(:mod:`tidemark.runs.submit`, :mod:`tidemark.runs.finish`) and the run report
(:mod:`tidemark.runs.report`) read it back as a :class:`JobResult` (:func:`read_result`),
never as a dict. A plan with no records gets its result without
Spark (:func:`run_without_spark`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from tidemark.config.models import Feed
from tidemark.errors import TidemarkError
from tidemark.planning.plan import Plan
from tidemark.staged import Reader, StagedBy
from tidemark.storage import Location, Where

JOB_FILE = "job.json"


@dataclass
class JobResult:
    """What one run of the job did: filled step by step while it runs, written whole at its end."""

    plan_id: str
    feed: str
    published: bool = False
    reused: bool = False  # the plan was published (or staged by this run) already: nothing was read
    error: str | None = None
    error_type: str | None = None
    manifest: dict[str, Any] | None = None
    records_read: int = 0
    records_published: int = 0
    records_quarantined: int = 0
    decode_failures: int = 0
    validation: dict[str, Any] | None = None  # validation.json's summary
    validator: str = "builtin"
    reader: Reader | None = None
    staged_by: StagedBy | None = None
    ranges: list[dict[str, Any]] = field(default_factory=list)  # RangeStats.to_dict() per planned range
    timings_s: dict[str, float] = field(default_factory=dict)
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    finished_at: str | None = None
    spark: dict[str, str] = field(default_factory=dict)
    spark_skipped: str | None = None  # why no Spark application was started (a plan with no records)
    window: list[dict[str, Any]] = field(default_factory=list)  # exact windows: per-partition counts
    events: list[dict[str, Any]] = field(default_factory=list)
    schemas: dict[str, Any] | None = None  # Schema Registry feeds: reader schema, writer ids seen (schemas_report)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> JobResult:
        """A result from its document; keys this version does not write (an older job's) are left out."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in known})

    @classmethod
    def from_json(cls, text: str) -> JobResult:
        return cls.from_dict(json.loads(text))

    def log_lines(self) -> list[str]:
        """The job's exact-window counts and events, as the commit step's log says them."""
        lines = [
            f"window {w['topic']}[{w['partition']}]: read {w['read']} ({w['read_in_margin']} in the end margin), "
            f"kept {w['kept']} ({w['kept_in_margin']} from the margin), dropped {w['dropped']} stamped outside, "
            f"largest skew {w['largest_skew_ms']} ms"
            for w in self.window
        ]
        return lines + [f"event {e.get('kind')}: {e.get('message')}" for e in self.events]

    @property
    def timestamps(self) -> dict[str, str]:
        """``started_at`` and ``finished_at``, where set."""
        return {k: v for k, v in (("started_at", self.started_at), ("finished_at", self.finished_at)) if v}


def write_result(run_dir: Where, result: JobResult) -> Location:
    """Write ``job.json`` into ``run_dir`` (a local folder or an object-store location), whole."""
    path = Location.of(run_dir) / JOB_FILE
    path.write_text(result.to_json())
    return path


def read_result(run_dir: Where) -> JobResult | None:
    """The ``job.json`` of ``run_dir``, or ``None`` when the job wrote none (it never ran, or died first)."""
    path = Location.of(run_dir) / JOB_FILE
    return JobResult.from_json(path.read_text()) if path.exists() else None


def run_without_spark(plan: Plan, feed: Feed) -> JobResult:
    """The job's result for a plan with no records: nothing to read, validate or publish.

    Starting Spark for it would cost tens of seconds to learn nothing. The one check that
    still applies is the feed's ``validation.expect_records``: an empty run must fail
    instead of passing vacuously (the same rule the Spark job applies). The commit step
    then re-commits every partition's offset, so idle partitions do not expire.
    """
    if plan.total_records:
        raise TidemarkError(f"plan {plan.plan_id} has {plan.total_records} records; it needs the Spark job")
    res = JobResult(plan.plan_id, feed.name, spark_skipped="the plan has no records to read")
    res.finished_at = res.started_at
    if feed.validation.expect_records:
        ranges = ", ".join(f"{p.topic}[{p.partition}]@{p.start}" for p in plan.partitions)
        res.error_type = "ValidationFailedError"
        res.error = (
            f"plan {plan.plan_id} of feed '{feed.name}' has no records ({ranges}) and validation.expect_records "
            "is true: an empty run fails. Check the producers of the feed's topics, or set expect_records: false; "
            "the group's offsets were not committed"
        )
        return res
    res.published = True
    return res
