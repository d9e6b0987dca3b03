"""SparkSession construction for the CLI, the Spark job and the tests.

``local[*]`` by default; ``TIDEMARK_SPARK_MASTER`` (or an explicit master) points at a
cluster instead. Python workers run the same interpreter as the driver so that
``tidemark`` and its pinned dependencies are importable in them.

:data:`SUBMIT_CONF` is what every Tidemark application sets, whichever way it starts
(``spark-submit`` from the CLI or the Airflow operator, or an in-process session):
Spark's redaction pattern widened to every name Tidemark treats as secret, so a Kafka
setting that reaches Spark's configuration (``spark.executorEnv.TIDEMARK_KAFKA_*``, an
option in a plan description) shows as ``*********(redacted)`` in the UI's environment
page, the event log and Spark's own logs.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from tidemark.connection import SECRET_MARKERS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Spark's default spark.redaction.regex, plus Tidemark's secret markers (tidemark.connection.is_secret).
SPARK_DEFAULT_REDACTION = ("secret", "password", "token", r"access[.]?key")
# The Iceberg catalog's URL holds its database password (spark.*Env.TIDEMARK_ICEBERG_CATALOG_URI on YARN/Kubernetes).
URL_SECRETS = ("catalog_uri",)
REDACTION_REGEX = "(?i)" + "|".join(dict.fromkeys((*SPARK_DEFAULT_REDACTION, *SECRET_MARKERS, *URL_SECRETS)))
SUBMIT_CONF = {"spark.redaction.regex": REDACTION_REGEX}

# A small run's driver JVM (in local mode: the whole application) lives for seconds, and on
# a 2-core machine the C2 JIT compiler's and the parallel GC's threads take cores from the
# work: C1 only and the serial collector cut the CPU of a 1,000- and a 100,000-record run
# by a third or more (docs/read-publish.md, "Small runs"). A long run needs C2, so only
# runs of at most SMALL_RUN_MAX_RECORDS get them.
SMALL_RUN_JAVA_OPTIONS_ENV = "TIDEMARK_SMALL_RUN_JAVA_OPTIONS"
SMALL_RUN_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SMALL_RUN_MAX_RECORDS = 250_000


def small_run_conf(records: int, max_records: int = SMALL_RUN_MAX_RECORDS) -> dict[str, str]:
    """Extra ``spark-submit`` conf for a run of ``records``: the driver's JVM options when it is small.

    ``TIDEMARK_SMALL_RUN_JAVA_OPTIONS`` replaces the options; set empty, it turns them off
    (then ``spark.driver.extraJavaOptions`` from a deployment's ``spark-defaults.conf`` is
    left alone, as it is for every larger run).
    """
    if not 0 < records <= max_records:
        return {}
    options = os.environ.get(SMALL_RUN_JAVA_OPTIONS_ENV, SMALL_RUN_JAVA_OPTIONS).strip()
    return {"spark.driver.extraJavaOptions": options} if options else {}


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
    for key, value in SUBMIT_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
