"""SparkSession construction for the CLI, the Spark job and the tests.

``local[*]`` by default; ``TIDEMARK_SPARK_MASTER`` (or an explicit master) points at a
cluster instead. Python workers run the same interpreter as the driver so that
``tidemark`` and its pinned dependencies are importable in them.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def local_session(app_name: str = "tidemark", master: str | None = None) -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    master = master or os.environ.get("TIDEMARK_SPARK_MASTER", "local[*]")
    if master.startswith("local"):
        # Keep a local session on loopback (Spark otherwise binds the host's first interface).
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.memory", os.environ.get("TIDEMARK_SPARK_DRIVER_MEMORY", "2g"))
        .config("spark.sql.session.timeZone", "UTC")
    )
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
