"""spark-submit entry point: read a saved plan from Kafka, validate, publish, report.

    spark-submit [--master local[*] | spark://... | yarn | k8s://... ] spark_jobs/tidemark_job.py \\
        --plan PLAN.json --run-dir DIR [--feed NAME_OR_PATH] [--output DIR] [--ship-package]

The Kafka connection comes from ``TIDEMARK_BOOTSTRAP_SERVERS`` / ``TIDEMARK_KAFKA_*`` in
the driver's environment and travels to the executors as data source options. With
``--ship-package`` (or ``TIDEMARK_SHIP_PACKAGE=1``), and by default whenever the master is
not ``local[...]``, the ``tidemark`` package is zipped and added to the executors' Python
path (its dependencies — confluent-kafka, pyarrow — must be installed there). Writes ``<run-dir>/job.json`` and
exits non-zero on any failure, so nothing downstream commits offsets. Imports nothing
from Airflow; the work is in :mod:`tidemark.job.entry` and :mod:`tidemark.job.steps`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path


def _ensure_importable() -> None:
    """Make ``tidemark`` importable from a checkout where it is not installed."""
    try:
        import tidemark  # noqa: F401
    except ModuleNotFoundError:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "include"))


def main(argv: Sequence[str] | None = None) -> int:
    _ensure_importable()
    from tidemark.job.entry import main as job_main

    return job_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
