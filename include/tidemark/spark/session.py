"""SparkSession construction for the CLI, the Spark job and the tests.

``local[*]`` by default; ``TIDEMARK_SPARK_MASTER`` (or an explicit master) points at a
cluster instead. Python workers run the same interpreter as the driver so that
``tidemark`` and its pinned dependencies are importable in them.

:data:`SUBMIT_CONF` is what every Tidemark application sets, whichever way it starts
(``spark-submit`` from the CLI or the Airflow operator, or an in-process session):
Spark's redaction pattern widened to every name Tidemark treats as secret, so a Kafka
setting that reaches Spark's configuration (``spark.executorEnv.TIDEMARK_KAFKA_*``, an
option in a plan description) shows as ``*********(redacted)`` in the UI's environment
page, the event log and Spark's own logs. The pipeline and the DAG's tasks import this module
for what they hand to ``spark-submit`` (:data:`SUBMIT_CONF`, :func:`small_run_conf`,
:func:`driver_class_archive`) and must not load Spark, so ``pyspark`` is imported inside the
functions that start or inspect it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tidemark.errors import ConfigError
from tidemark.kafka.connection import SECRET_MARKERS, SECRET_SETTING_PATTERNS
from tidemark.settings import cache_root
from tidemark.storage import s3_settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Spark's default spark.redaction.regex, plus Tidemark's secret markers (tidemark.kafka.connection.is_secret).
SPARK_DEFAULT_REDACTION = ("secret", "password", "token", r"access[.]?key")
# The Iceberg catalog's URL holds its database password (spark.*Env.TIDEMARK_ICEBERG_CATALOG_URI on YARN/Kubernetes).
URL_SECRETS = ("catalog_uri",)
REDACTION_REGEX = "(?i)" + "|".join(
    dict.fromkeys((*SPARK_DEFAULT_REDACTION, *SECRET_MARKERS, *SECRET_SETTING_PATTERNS, *URL_SECRETS))
)
SUBMIT_CONF = {"spark.redaction.regex": REDACTION_REGEX}

# Avro feeds decode with Spark's from_avro, which lives in the spark-avro package (not in pyspark's jars).
# No build for Spark 4.3 is on Maven Central; 4.1.1's works on pyspark 4.3 (4.2.0's, served since, decoded the
# Avro benchmark no faster: A3/A3b 0.71 on 2026-11-26, not moved to without a reason). Spark fetches it (and
# caches it under ~/.ivy2) for the driver and the executors; TIDEMARK_SPARK_AVRO_JAR names a local copy instead.
AVRO_PACKAGE = "org.apache.spark:spark-avro_2.13:4.1.1"
AVRO_JAR_ENV = "TIDEMARK_SPARK_AVRO_JAR"


def avro_conf() -> dict[str, str]:
    """The Spark conf that puts ``from_avro`` on the class path: a local jar when given, else the package."""
    jar = os.environ.get(AVRO_JAR_ENV, "").strip()
    return {"spark.jars": jar} if jar else {"spark.jars.packages": AVRO_PACKAGE}


# OpenLineage's Spark listener, which the deployment turns on (TIDEMARK_SPARK_OPENLINEAGE=on): the job's own
# lineage events, which hang under the Airflow task's run when Airflow's OpenLineage provider injects the
# parent job ([openlineage] spark_inject_parent_job_info). 1.53.0 supports Spark 4 and runs on pyspark 4.3.0.
# Spark fetches the package like spark-avro; TIDEMARK_SPARK_OPENLINEAGE_JAR names a local copy instead.
OPENLINEAGE_PACKAGE = "io.openlineage:openlineage-spark_2.13:1.53.0"
OPENLINEAGE_LISTENER = "io.openlineage.spark.agent.OpenLineageSparkListener"
OPENLINEAGE_ENV = "TIDEMARK_SPARK_OPENLINEAGE"
OPENLINEAGE_JAR_ENV = "TIDEMARK_SPARK_OPENLINEAGE_JAR"
# Kept off whatever spark-defaults.conf says: ``debug`` carries the listener's own configuration (its
# transport's settings), the plan facets the query plan, whose data source options hold the Kafka
# connection's settings on the executors' read.
OPENLINEAGE_UNSAFE_FACETS = ("debug", "spark.logicalPlan", "spark_unknown")
# Spark settings that hold comma-separated lists: two sources of conf add to them instead of replacing.
LIST_SETTINGS = ("spark.jars", "spark.jars.packages", "spark.extraListeners")


def openlineage_conf() -> dict[str, str]:
    """The Spark conf that turns OpenLineage's Spark listener on; ``{}`` while the deployment has it off."""
    setting = os.environ.get(OPENLINEAGE_ENV, "").strip().lower()
    if setting in ("", "off", "false", "0"):
        return {}
    if setting not in ("on", "true", "1"):
        raise ConfigError(f"{OPENLINEAGE_ENV}={setting!r}: use 'on' to start OpenLineage's Spark listener, or 'off'")
    jar = os.environ.get(OPENLINEAGE_JAR_ENV, "").strip()
    conf = {"spark.extraListeners": OPENLINEAGE_LISTENER}
    conf.update({"spark.jars": jar} if jar else {"spark.jars.packages": OPENLINEAGE_PACKAGE})
    conf.update({f"spark.openlineage.facets.{facet}.disabled": "true" for facet in OPENLINEAGE_UNSAFE_FACETS})
    return conf


def merge_conf(*confs: dict[str, str]) -> dict[str, str]:
    """``confs`` in order (a later one wins), the :data:`LIST_SETTINGS` joined instead, without repeats."""
    merged: dict[str, str] = {}
    for conf in confs:
        for key, value in conf.items():
            if key in LIST_SETTINGS and merged.get(key):
                items = [item.strip() for item in f"{merged[key]},{value}".split(",") if item.strip()]
                value = ",".join(dict.fromkeys(items))
            merged[key] = value
    return merged


# A small run's driver JVM (in local mode: the whole application) lives for seconds, and on
# a 2-core machine the C2 JIT compiler's and the parallel GC's threads take cores from the
# work: C1 only and the serial collector cut the CPU of a 1,000- and a 100,000-record run
# by a third or more (docs/benchmarks/read.md, "Small runs"). A long run needs C2, so only
# runs of at most SMALL_RUN_MAX_RECORDS get them.
SMALL_RUN_JAVA_OPTIONS_ENV = "TIDEMARK_SMALL_RUN_JAVA_OPTIONS"
SMALL_RUN_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SMALL_RUN_MAX_RECORDS = 250_000


def small_run_conf(
    records: int, max_records: int = SMALL_RUN_MAX_RECORDS, *, class_archive: str = ""
) -> dict[str, str]:
    """Extra ``spark-submit`` conf for a run of ``records``: the driver's JVM options when it is small.

    ``class_archive`` is :func:`driver_class_archive`'s option, added to them.
    ``TIDEMARK_SMALL_RUN_JAVA_OPTIONS`` replaces the options; set empty, it turns them all
    off (then ``spark.driver.extraJavaOptions`` from a deployment's ``spark-defaults.conf``
    is left alone, as it is for every larger run).
    """
    if not 0 < records <= max_records:
        return {}
    options = os.environ.get(SMALL_RUN_JAVA_OPTIONS_ENV, SMALL_RUN_JAVA_OPTIONS).strip()
    return {"spark.driver.extraJavaOptions": f"{options} {class_archive}".strip()} if options else {}


# A Spark driver JVM spends seconds loading the same ten thousand classes at every start.
# Java's class-data sharing maps them from an archive instead: the first small run on a
# machine writes one (-XX:ArchiveClassesAtExit; that run takes about 40 s longer), every
# later one starts from it (-XX:SharedArchiveFile), which cuts a 1,000-record run's wall
# and CPU time by about a fifth (docs/benchmarks/read.md, "Small runs"). The archive is
# keyed by the Java binary and Spark's jars; one that no longer matches them (a changed
# classpath, say) is ignored by the JVM, which then starts as it would without it.
CLASS_ARCHIVE_ENV = "TIDEMARK_CLASS_ARCHIVE_DIR"  # "off" (or empty): no archive
STALE_ARCHIVE_S = 3600.0  # a half-written archive older than this belongs to a run that died


def class_archive_path(cache: Path) -> Path:
    """The archive for the Java that ``spark-submit`` starts and the installed Spark's jars."""
    import pyspark

    java_home = os.environ.get("JAVA_HOME")
    java = Path(java_home, "bin", "java") if java_home else Path(shutil.which("java") or "java")
    java = java.resolve()
    jars = Path(pyspark.__file__).parent / "jars"
    # The JVM checks the archive's classpath against its own: its folders are part of the key.
    stamp = [str(java), *(str(java.stat()[i]) for i in (6, 8) if java.exists())]
    stamp += [str(jars.resolve()), os.environ.get("SPARK_CONF_DIR", ""), *sorted(p.name for p in jars.glob("*.jar"))]
    key = hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:16]
    return cache / f"spark-{pyspark.__version__}-driver-{key}.jsa"


def classpath_has_folders() -> bool:
    """Whether ``spark-submit``'s driver classpath may hold a folder with files in it.

    Besides Spark's jars it holds the Spark configuration folder and, when set, Hadoop's
    and YARN's, plus ``SPARK_DIST_CLASSPATH``. A JVM cannot archive classes with a folder
    that has files on its classpath (it fails at exit), so Tidemark then uses no archive.
    """
    import pyspark

    spark_home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
    conf = Path(os.environ.get("SPARK_CONF_DIR") or spark_home / "conf")
    if conf.is_dir() and any(conf.iterdir()):
        return True
    return any(os.environ.get(name) for name in ("HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH"))


@dataclass
class ClassArchive:
    """What :func:`driver_class_archive` yields: the driver's JVM option, and the run's outcome."""

    option: str
    succeeded: bool = False  # set by the caller once spark-submit exited 0


@contextmanager
def driver_class_archive() -> Iterator[ClassArchive]:
    """The driver JVM option that starts it from the class-data archive, or has it write one.

    Used around one ``spark-submit``: when the archive is missing, the JVM writes a new one
    under a name of its own at exit, and leaving the block moves that into place if the
    caller marked the run ``succeeded`` (atomic: concurrent first runs each write their
    own, and one of them wins; a JVM that died while writing leaves nothing behind).
    The option is ``""`` when ``TIDEMARK_CLASS_ARCHIVE_DIR`` is ``off``, the folder cannot
    be written, or the classpath has folders (:func:`classpath_has_folders`; a
    ``spark-submit`` given more classpath, such as ``spark.driver.extraClassPath``, must
    not get the option either).
    """
    setting = os.environ.get(CLASS_ARCHIVE_ENV, str(cache_root() / "jvm")).strip()
    if setting.lower() in ("", "off") or classpath_has_folders():
        yield ClassArchive("")
        return
    try:
        archive = class_archive_path(Path(setting))
        archive.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        yield ClassArchive("")
        return
    quiet = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # warnings about classes it cannot archive
    if archive.exists():
        yield ClassArchive(f"-XX:SharedArchiveFile={archive} {quiet}")
        return
    for stale in archive.parent.glob(f"{archive.name}.*.tmp"):
        with suppress(OSError):  # another run may be removing it too
            if time.time() - stale.stat().st_mtime > STALE_ARCHIVE_S:
                stale.unlink()
    partial = archive.with_name(f"{archive.name}.{uuid.uuid4().hex[:12]}.tmp")
    run = ClassArchive(f"-XX:ArchiveClassesAtExit={partial} {quiet}")
    try:
        yield run
        if run.succeeded and partial.exists() and partial.stat().st_size > 0:
            os.replace(partial, archive)
    finally:
        partial.unlink(missing_ok=True)


S3A_JARS_ENV = "TIDEMARK_S3A_JARS"


def s3a_jars() -> list[str]:
    """The jars of Hadoop's s3a connector named by ``TIDEMARK_S3A_JARS`` (comma-separated jars or folders of jars).

    ``spark-submit --jars`` puts them on the driver's classpath and ships them to the
    executors, so no worker needs them installed. Unset: the cluster's own classpath must
    have s3a wherever executors stage on the object store (EMR and Dataproc images do).
    """
    found: list[str] = []
    for item in filter(None, (part.strip() for part in os.environ.get(S3A_JARS_ENV, "").split(","))):
        path = Path(item).expanduser()
        if path.is_dir():
            found += sorted(str(jar) for jar in path.glob("*.jar"))
        elif path.is_file():
            found.append(str(path))
        else:
            raise ConfigError(f"{S3A_JARS_ENV}: {item} is neither a jar nor a folder of jars")
    return found


def configure_s3a(spark: SparkSession) -> None:
    """Point Hadoop's s3a connector (Spark's way to ``s3://`` staging) at the store :mod:`tidemark.storage` uses.

    Endpoint, region and credentials come from the same environment (``AWS_*``,
    ``TIDEMARK_S3_ENDPOINT``). They are set on the running context's Hadoop configuration,
    not as Spark configuration: the executors receive them inside the write's and the
    read's tasks, as the Kafka settings travel, so they never reach the environment page
    or the event log's Spark properties. Without keys in the environment s3a's own chain
    (instance profile, web identity) applies. The s3a jars must be on the driver's and the
    executors' classpath (``TIDEMARK_S3A_JARS``, or the cluster's own).
    """
    endpoint, region, key_id = s3_settings()
    settings = {"fs.s3a.endpoint.region": region or "us-east-1"}
    if endpoint:
        settings.update({
            "fs.s3a.endpoint": endpoint,
            "fs.s3a.path.style.access": "true",
            "fs.s3a.connection.ssl.enabled": str(endpoint.startswith("https")).lower(),
            # s3proxy 2.6 answers the SDK's bulk delete (DeleteObjects) with 501 NotImplemented.
            "fs.s3a.multiobjectdelete.enable": "false",
        })  # fmt: skip
    secret = os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key_id and secret:
        settings.update({"fs.s3a.access.key": key_id, "fs.s3a.secret.key": secret})
        token = os.environ.get("AWS_SESSION_TOKEN")
        if token:
            settings["fs.s3a.session.token"] = token
            settings["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    for key, value in settings.items():
        hadoop.set(key, value)


@contextmanager
def session_conf(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    """``key`` set to ``value`` in ``spark``'s session for the block, then back to what it was."""
    before = spark.conf.get(key)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        spark.conf.set(key, before)


def local_session(app_name: str = "tidemark", master: str | None = None, *, avro: bool = False) -> SparkSession:
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
    extra = avro_conf() if avro else {}
    local_jars = [jar for jar in extra.pop("spark.jars", "").split(",") if jar]
    for key, value in {**SUBMIT_CONF, **extra}.items():
        builder = builder.config(key, value)
    s3a = s3a_jars()
    if s3a:  # for an in-process session: staging on the object store needs s3a in the driver's JVM
        builder = builder.config("spark.driver.extraClassPath", ":".join(s3a))
    if jars := [*s3a, *local_jars]:
        builder = builder.config("spark.jars", ",".join(jars))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
