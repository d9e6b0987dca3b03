"""Airflow cluster policy for the distributed test (tests/integration/test_celery_workers.py).

On ``PYTHONPATH`` of that test's Airflow only. The plan task goes to the queue only worker 1
serves, so each run's plan is on worker 1 while its Spark task and commit go to whichever
worker takes them; a failed try is retried after a second (the DAGs wait two minutes),
so a test killing a worker mid-task does not wait out the delay.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

PLAN_QUEUE = "tidemark_plan"


def task_policy(task: Any) -> None:
    if task.task_id == "plan":
        task.queue = PLAN_QUEUE
    task.retry_delay = timedelta(seconds=1)
