"""spark-submit entry point of a re-drive: dead letters re-checked with the feed's rules now, the passing ones staged.

    spark-submit [--master local[*] | spark://... | yarn | k8s://... ] spark_jobs/tidemark_redrive.py \\
        --work FOLDER [--ship-package]

``FOLDER`` holds the request and the dead letters the submitting side wrote
(:mod:`tidemark.job.redrive_job`); the job writes its answer there and exits non-zero on
any failure. The connections reach the driver as a run's job's do (a private file named by
``TIDEMARK_SECRETS_FILE``). Imports nothing from Airflow.
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
    from tidemark.job.redrive_job import main as job_main

    return job_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
